"""Evaluation: whole episodes played by a script's act function on a vector of envs, without changing training.

Guarantees
- ``play(make_env, act, episodes, seed, envs, video_dir, procs)`` plays ``episodes`` whole episodes and returns
  their returns and lengths (env steps) in episode order (``Episodes``). Episode i is reset with seed
  ``seed + 100_000 + i`` and draws its random choices from its own generator (``Draws``) seeded the same,
  whichever env plays it: up to ``envs`` episodes are
  played at once, each env taking the next episode when its own ends, none started beyond the count (so no bias
  towards short episodes). The policy's actions come from one batched call per step,
  ``act(obs [n, ...] (a dict of such arrays for a Dict space), draws=..., starts=[n] bool, rewards=[n],
  mask=[n, A] bool)``; the keywords are passed only to an ``act`` that names them: ``starts`` marks the first
  step of an episode (a recurrent policy starts afresh there), ``rewards`` the previous step's rewards,
  ``mask`` the env's ``info["action_mask"]`` (every action where an env gives none; None for continuous
  actions); ``check_act`` refuses an ``act`` with any other parameter (it would never be passed). A row whose env
  has no episode left is still in the batch (static shapes) and its action is not used.
- The envs: ``envs`` envs of ``make_env(render)``, the ones training makes, so the evaluation plays the same
  episodes as the one-env loop it replaced. Only the envs that still play an episode step. With ``procs`` > 1
  they live in ``min(procs, envs)`` worker processes (``shared.procs.Worker``: spawned, dying with this process,
  ignoring SIGINT and SIGTERM: this process stops them), env b in worker ``b % procs``, each worker pinned to
  one CPU, and the workers step their envs at once: worth it for envs whose step costs far more than a message
  (the Atari emulator: ale-py holds the GIL, so threads would not help). A failed, killed or vanished worker
  raises ``EvaluationError`` (its traceback in the message) within about a second; on every path (Ctrl-C
  included) the workers are asked to close their envs and are reaped, ended after ``CLOSE_S`` seconds (a normal
  end: a video may be encoded) or ``QUICK_CLOSE_S`` (an error or a signal) at most. An episode's return does
  not depend on ``envs`` or ``procs`` (nor on the torchrun ranks) beyond the forward pass's float order across
  batch sizes (exact for greedy actions in practice).
- With ``video_dir`` the first episode is recorded there by the env that plays it (``make_env(True)``,
  ``render_mode="rgb_array"``), written when that env resets for another episode or closes (in its worker,
  before the worker ends).
- Training is not changed by it: torch's random state (CPU and CUDA) is restored afterwards and the envs are the
  evaluation's own, closed on every path.
- ``evaluate_run(make_env, act, args, global_step, folder, writes, tb, tracker, video)`` is a run's evaluation
  (``shared.run.Run``'s periodic and final ones and ``--eval-only``): ``play`` with the run's flags
  (``--eval-episodes`` on ``--eval-envs`` envs of ``make_env(args, render)``, seeded with ``--seed``; an Atari
  game's envs in one worker process per available CPU), each return logged to ``tb`` as
  ``eval/episodic_return`` at ``global_step``; where this process ``writes``, ``eval.json`` in ``folder``
  (``global_step``, ``returns``, ``mean``, ``lengths``) and with ``video`` the first episode filmed into
  ``folder/videos``, the newest film also sent to ``tracker`` (W&B). Returns the episodes.
- In a torchrun job still in lockstep, rank r plays episodes r, r + ranks, ... and every rank returns all of
  them (gathered with a timeout for slow work: the ranks' episodes take different times); after the loop only
  the caller that asks plays, alone.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import signal
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from shared import distributed, signals
from shared.affinity import available_cpus
from shared.atari import is_atari
from shared.files import write_text
from shared.procs import CTX, Worker, WorkerError, parent_alive_check
from shared.sync import POLL_S, wait_for

__all__ = [
    "ACT_KEYWORDS",
    "CLOSE_S",
    "QUICK_CLOSE_S",
    "Draws",
    "Episodes",
    "EvaluationError",
    "check_act",
    "evaluate_run",
    "play",
]

# What an act function may take after the observations, by these names (the module docstring).
ACT_KEYWORDS = ("draws", "starts", "rewards", "mask")

CLOSE_S = 600.0  # the longest a worker may take to close its envs after a normal end (a video may be encoded)
QUICK_CLOSE_S = 10.0  # the same after an error or a signal


class EvaluationError(RuntimeError):
    """An evaluation env worker failed, was killed or vanished; the message carries its traceback if it sent one."""


class Episodes(NamedTuple):
    """The evaluation's episodes in episode order."""

    returns: list[float]
    lengths: list[int]


class Draws:
    """The random draws of the episodes being played, row b from the generator of the episode env b plays
    (seeded with that episode's seed): a stochastic policy's episode is the same whichever env plays it."""

    def __init__(self, n: int):
        self._rngs = [np.random.default_rng(0) for _ in range(n)]

    def start(self, row: int, episode_seed: int) -> None:
        self._rngs[row] = np.random.default_rng(episode_seed)

    def random(self) -> np.ndarray:
        """[n] uniform in [0, 1)."""
        return np.array([rng.random() for rng in self._rngs])

    def integers(self, high: int) -> np.ndarray:
        """[n] uniform in [0, high)."""
        return np.array([rng.integers(high) for rng in self._rngs])

    def gumbel(self, k: int) -> np.ndarray:
        """[n, k] float32 standard Gumbel noise: ``argmax(logits + noise)`` samples ``Categorical(logits)``."""
        return np.stack([rng.gumbel(size=k) for rng in self._rngs]).astype(np.float32)


def check_act(act: Callable[..., Any]) -> None:
    """``TypeError`` naming the parameter when ``act`` takes one after the observations that evaluation would never
    pass (a renamed ``mask``, say): the keywords go only by name, so such a parameter would silently keep its default.
    """
    parameters = list(inspect.signature(act).parameters.values())[1:]
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    unknown = [p.name for p in parameters if p.name not in ACT_KEYWORDS and p.kind not in variadic]
    if unknown:
        raise TypeError(f"the evaluation's act takes {unknown}: after the observations it gets only {list(ACT_KEYWORDS)}")


def play(
    make_env: Callable[[bool], Callable[[], Any]],
    act: Callable[..., Any],
    episodes: int,
    seed: int,
    envs: int = 1,
    video_dir: Path | None = None,
    procs: int = 1,
) -> Episodes:
    """The returns and lengths of ``episodes`` evaluation episodes (see the module docstring)."""
    import torch

    lockstep = distributed.in_lockstep()
    mine = list(range(distributed.rank(), episodes, distributed.world_size()) if lockstep else range(episodes))
    cuda = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []  # this rank's GPU only
    played: list[tuple[int, float, int]] = []
    if mine:
        n = min(envs, len(mine))
        thunks = [make_env(video_dir is not None and b == 0) for b in range(n)]
        host, ok = None, False
        try:  # closed on every path (RecordVideo writes its file when its env resets or closes)
            host = _Workers(thunks, video_dir, procs) if min(procs, n) > 1 else _Here(thunks, video_dir)
            with torch.no_grad(), torch.random.fork_rng(devices=cuda):
                played = _play(_Envs(host), act, mine, seed)
            ok = True
        finally:
            if host is not None:
                host.close(ok)
    ordered = sorted(sum(distributed.gather_objects(played, slow=True), []))
    return Episodes([r for _, r, _ in ordered], [t for _, _, t in ordered])


def evaluate_run(
    make_env: Callable[..., Callable[[], Any]],
    act: Callable[..., Any],
    args: Any,
    global_step: int,
    folder: Path,
    writes: bool,
    tb: Any,
    tracker: Any = None,
    video: bool = False,
) -> Episodes:
    """A run's evaluation, played and recorded (see the module docstring)."""
    played = play(
        partial(make_env, args),
        act,
        args.eval_episodes,
        args.seed,
        envs=args.eval_envs,
        video_dir=folder / "videos" if video and writes else None,
        procs=len(available_cpus()) if is_atari(args.env_id) else 1,  # the emulator's steps: worth a process each
    )
    for r in played.returns:
        tb.add_scalar("eval/episodic_return", r, global_step)
    if writes:
        summary = {
            "global_step": global_step,
            "returns": played.returns,
            "mean": float(np.mean(played.returns)),
            "lengths": played.lengths,
        }
        write_text(folder / "eval.json", lambda f: json.dump(summary, f))
    if video and tracker is not None and (folder / "videos").is_dir():
        newest = max((folder / "videos").glob("*.mp4"), key=lambda f: f.stat().st_mtime, default=None)
        if newest is not None:
            tracker.video(newest, global_step)
    return played


def _play(vec: Any, act: Callable[..., Any], mine: list[int], seed: int) -> list[tuple[int, float, int]]:
    """Play the episodes ``mine`` on ``vec``'s envs; [(episode, return, length)] in the order they ended."""
    n = vec.n
    keywords = inspect.signature(act).parameters
    draws = Draws(n)
    queue = iter(mine)
    episode: list[int | None] = [None] * n  # the episode each env plays (None: none left for it)
    totals, steps = np.zeros(n), np.zeros(n, np.int64)
    starts, rewards = np.ones(n, bool), np.zeros(n, np.float32)
    played = []

    def begin(rows: list[int]) -> None:
        """The envs ``rows`` take the next episodes (the ones left without: none)."""
        for b in rows:
            episode[b] = next(queue, None)
        rows = [b for b in rows if episode[b] is not None]
        for b in rows:
            draws.start(b, seed + 100_000 + episode[b])
            totals[b], steps[b], starts[b], rewards[b] = 0.0, 0, True, 0.0
        if rows:
            vec.reset(rows, [seed + 100_000 + episode[b] for b in rows])

    begin(list(range(n)))
    while any(e is not None for e in episode):
        given = {"draws": draws, "starts": starts.copy(), "rewards": rewards.copy()}
        if "mask" in keywords:
            given["mask"] = vec.mask()
        actions = act(vec.obs, **{k: v for k, v in given.items() if k in keywords})
        active = [b for b in range(n) if episode[b] is not None]
        reward, done = vec.step(np.asarray(actions), active)
        starts[:] = False
        for b in active:
            totals[b] += float(reward[b])
            steps[b] += 1
            rewards[b] = reward[b]
            if done[b]:
                played.append((episode[b], float(totals[b]), int(steps[b])))
        begin([b for b in active if done[b]])
    return played


def _stack(rows: list[Any]) -> Any:
    """[n, ...] of n observations (a dict of such arrays for dict observations)."""
    if isinstance(rows[0], dict):
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    return np.stack([np.asarray(r) for r in rows])


def _made(thunk: Callable[[], Any], video_dir: Path | None) -> Any:
    """The env of ``thunk``, recording its first episode in ``video_dir`` when given."""
    env = thunk()
    if video_dir is None:
        return env
    import gymnasium as gym

    return gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda i: i == 0, disable_logger=True)


def _answer(envs: Any, what: str, rows: list[int], values: list[Any]) -> list[Any]:
    """The replies of ``envs[b]`` for each row b: to "reset" with seeds, to "step" with actions."""
    if what == "reset":
        return [envs[b].reset(seed=v) for b, v in zip(rows, values)]
    return [envs[b].step(v) for b, v in zip(rows, values)]


class _Envs:
    """The evaluation's n envs as ``_play`` sees them: ``obs`` [n, ...], ``mask()``, and a reset or a step of
    some rows. The envs themselves answer through ``host``: ``_Here`` (in this process, one after the other)
    or ``_Workers`` (in worker processes, at once)."""

    def __init__(self, host: Any):
        self.host, self.n = host, host.n
        self._obs: list[Any] = [None] * self.n
        self._masks: list[Any] = [None] * self.n  # each env's last info["action_mask"] (None: it gave none)
        space = host.action_space
        self._actions = int(space.n) if hasattr(space, "n") else None  # discrete actions: masks apply
        self.obs: Any = None

    def reset(self, rows: list[int], seeds: list[int]) -> None:
        for b, (obs, info) in self.host.ask("reset", rows, [int(s) for s in seeds]).items():
            self._obs[b], self._masks[b] = obs, info.get("action_mask")
        self.obs = _stack(self._obs)

    def mask(self) -> np.ndarray | None:
        """[n, actions] bool: each env's last ``info["action_mask"]``, every action where it gave none; None for
        continuous actions."""
        if self._actions is None:
            return None
        every = np.ones(self._actions, bool)
        return np.stack([every if m is None else np.asarray(m, bool) for m in self._masks])

    def step(self, actions: np.ndarray, active: list[int]) -> tuple[np.ndarray, np.ndarray]:
        reward, done = np.zeros(self.n), np.zeros(self.n, bool)
        for b, (obs, r, term, trunc, info) in self.host.ask("step", active, [actions[b] for b in active]).items():
            self._obs[b], reward[b], done[b], self._masks[b] = obs, r, term or trunc, info.get("action_mask")
        self.obs = _stack(self._obs)
        return reward, done


class _Here:
    """n gymnasium envs (made by ``thunks``) in this process, answering one after the other; env 0 records its
    first episode with ``video_dir``."""

    def __init__(self, thunks: list[Callable[[], Any]], video_dir: Path | None):
        self.envs: list[Any] = []
        try:
            for b, thunk in enumerate(thunks):
                self.envs.append(_made(thunk, video_dir if b == 0 else None))
        except BaseException:  # the envs made so far are closed
            self.close()
            raise
        self.n, self.action_space = len(self.envs), self.envs[0].action_space

    def ask(self, what: str, rows: list[int], values: list[Any]) -> dict[int, Any]:
        return dict(zip(rows, _answer(self.envs, what, rows, values)))

    def close(self, ok: bool = True) -> None:
        for env in self.envs:
            env.close()


def _env_worker(blob: bytes, rows: list[int], video_dir: Path | None, cpu: int, conn: Any, parent: int, stop: Any) -> None:
    """A worker process of ``_Workers``: makes the envs ``rows`` of the thunks in ``blob`` (cloudpickled: the
    scripts' thunks are closures), sends their action space, then answers ``(what, rows, values)`` requests,
    "reset" with seeds and "step" with actions, by the envs' replies, until asked to stop; its envs are closed on
    every path. It runs on the one CPU ``cpu``: the workers woken at once by one message each would otherwise
    often share a CPU (the scheduler wakes them near the waker) and step one after the other."""
    import cloudpickle

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as SIGINT (shared.procs): the parent stops it, even then
    with contextlib.suppress(AttributeError, OSError):  # no affinity on macOS
        os.sched_setaffinity(0, {cpu})
    thunks, envs = cloudpickle.loads(blob), {}
    try:
        for b in rows:
            envs[b] = _made(thunks[b], video_dir if b == 0 else None)
        conn.send(envs[rows[0]].action_space)
        stopping = parent_alive_check(stop, parent)  # raises SystemExit(0): a clean exit, envs closed
        while True:
            wait_for(conn.poll, stopping)
            conn.send(_answer(envs, *conn.recv()))
    finally:
        for env in envs.values():
            env.close()


class _Workers:
    """The envs of ``_Here`` in ``procs`` worker processes, env b in worker ``b % procs``: ``ask`` sends each
    worker the values of its rows, then waits for the workers' replies."""

    def __init__(self, thunks: list[Callable[[], Any]], video_dir: Path | None, procs: int):
        import cloudpickle

        self.n, blob, cpus = len(thunks), cloudpickle.dumps(thunks), available_cpus()
        procs, first = min(procs, self.n), distributed.rank() * procs  # ranks on one node: other CPUs first
        self._workers: list[tuple[Worker, Any]] = []
        try:
            for w in range(procs):
                mine, theirs = CTX.Pipe()
                args = (blob, list(range(w, self.n, procs)), video_dir, cpus[(first + w) % len(cpus)], theirs, os.getpid())
                signals.defer()  # a started worker is always in the list that close() stops
                try:
                    self._workers.append((Worker(_env_worker, args, name=f"evaluation env worker {w}"), mine))
                finally:
                    signals.undefer()
                theirs.close()
            spaces = [self._reply(w) for w in range(len(self._workers))]  # each once its envs are made
        except BaseException:
            self.close(ok=False)
            raise
        self.action_space = spaces[0]

    def _failed(self, w: int) -> EvaluationError:
        """The error of worker ``w``, whose pipe broke: its own traceback when it sent one."""
        worker = self._workers[w][0]
        time.sleep(POLL_S)  # its exit and its traceback arrive
        try:
            worker.check()
        except WorkerError as e:
            return EvaluationError(str(e))
        return EvaluationError(f"{worker.name} (pid {worker.pid}) closed its pipe")

    def _reply(self, w: int) -> Any:
        worker, conn = self._workers[w]
        try:
            wait_for(conn.poll, worker.check)
            return conn.recv()
        except WorkerError as e:
            raise EvaluationError(str(e)) from None
        except (EOFError, OSError):  # the worker is gone: its own error says why
            raise self._failed(w) from None

    def ask(self, what: str, rows: list[int], values: list[Any]) -> dict[int, Any]:
        """Each worker's rows of ``rows`` with their values, sent at once; the replies by row."""
        procs, asked = len(self._workers), {}
        for w, (_, conn) in enumerate(self._workers):
            own = [(b, v) for b, v in zip(rows, values) if b % procs == w]
            if own:
                try:
                    conn.send((what, [b for b, _ in own], [v for _, v in own]))
                except OSError:  # BrokenPipeError: the worker died since its last reply
                    raise self._failed(w) from None
                asked[w] = [b for b, _ in own]
        return {b: out for w, own in asked.items() for b, out in zip(own, self._reply(w))}

    def close(self, ok: bool = True) -> None:
        """Ask every worker to stop and give them ``CLOSE_S`` seconds (``ok``: the evaluation ended normally, a
        video may be encoded) or ``QUICK_CLOSE_S`` (an error or a signal) to close their envs, reading what they
        still send (a reply to an interrupted step would block its worker); then end and reap what is left. After
        a normal end a worker's error (a video that could not be written) raises, and one that had to be ended
        says so."""
        deadline = time.monotonic() + (CLOSE_S if ok else QUICK_CLOSE_S)
        for worker, _ in self._workers:
            worker.stop_event.set()
        ended = []
        for worker, conn in self._workers:
            with contextlib.suppress(Exception):  # a reply cut by a signal cannot be read whole: stop reading
                while worker.alive() and time.monotonic() < deadline:
                    while conn.poll(0.05):
                        conn.recv()
            worker.join(max(0.0, deadline - time.monotonic()))  # its pipe closes before it has exited
            if worker.alive():
                ended.append(worker.name)
            elif ok:
                try:
                    worker.check(allow_finished=True)
                except WorkerError as e:
                    ended.append(str(e))
            worker.stop(timeout=0)
            conn.close()
        if ok and ended:
            raise EvaluationError(
                f"closing the evaluation envs: {'; '.join(ended)} (ended after {CLOSE_S:.0f} s if it shows no error)"
            )
