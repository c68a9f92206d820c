"""Evaluation: whole episodes played by a script's act function on a vector of envs, without changing training.

Guarantees
- ``play(make_env, act, episodes, seed, envs, video_dir, atari)`` plays ``episodes`` whole episodes and returns
  their returns in episode order. Episode i is reset with seed ``seed + 100_000 + i`` and draws its random
  choices from its own generator (``Draws``) seeded the same, whichever env plays it: up to ``envs`` episodes are
  played at once, each env taking the next episode when its own ends, none started beyond the count (so no bias
  towards short episodes). The policy's actions come from one batched call per step,
  ``act(obs [n, ...] (a dict of such arrays for a Dict space), draws=..., starts=[n] bool, rewards=[n],
  mask=[n, A] bool)``; the keywords are passed only to an ``act`` that names them: ``starts`` marks the first
  step of an episode (a recurrent policy starts afresh there), ``rewards`` the previous step's rewards,
  ``mask`` the env's ``info["action_mask"]`` (every action where an env gives none; None for continuous
  actions). A row whose env has no
  episode left is still in the batch (static shapes) and its action is not used.
- The envs: ``envs`` games of ``atari()`` when given (a one-game ale-py vector env for the unchanged Atari env,
  ``shared.atari``: the games of a step run at once in their C++ threads, and only the envs that still play
  an episode step), else ``envs`` envs of ``make_env(render)`` stepped in this process. Within one kind of env,
  an episode's return does not depend on ``envs`` (nor on the torchrun ranks) beyond the forward pass's float
  order across batch sizes (exact for greedy actions in practice). The two kinds are not the same episodes:
  ale-py draws the no-ops at reset from its own generator.
- With ``video_dir`` the first episode is recorded there (``make_env(True)``, ``render_mode="rgb_array"``): by the
  env that plays it, or, on ale-py's vector env (which renders nothing), by one more episode with the same seed
  on ``make_env(True)`` after the others, not counted.
- Training is not changed by it: torch's random state (CPU and CUDA) is restored afterwards and the envs are the
  evaluation's own, closed on every path.
- In a torchrun job still in lockstep, rank r plays episodes r, r + ranks, ... and every rank returns all of
  them (gathered with a timeout for slow work: the ranks' episodes take different times); after the loop only
  the caller that asks plays, alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shared import distributed

__all__ = ["Draws", "play"]


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


def play(make_env: Callable[[bool], Callable[[], Any]], act: Callable[..., Any], episodes: int, seed: int,
         envs: int = 1, video_dir: Path | None = None, atari: Callable[[], Any] | None = None) -> list[float]:
    """The returns of ``episodes`` evaluation episodes (see the module docstring)."""
    import torch

    lockstep = distributed.in_lockstep()
    mine = list(range(distributed.rank(), episodes, distributed.world_size()) if lockstep else range(episodes))
    cuda = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []  # this rank's GPU only
    played: list[tuple[int, float]] = []
    if mine:
        n = min(envs, len(mine))
        opened = []  # closed on every path (RecordVideo writes its file when its env closes)
        try:
            if atari is not None:
                opened.append(_AleEnvs(atari, n))
            else:
                opened.append(_GymEnvs([make_env(video_dir is not None and b == 0) for b in range(n)], video_dir))
            with torch.no_grad(), torch.random.fork_rng(devices=cuda):
                played = _play(opened[0], act, mine, seed)
                if video_dir is not None and atari is not None and mine[0] == 0:  # ale-py's envs render nothing
                    opened.append(_GymEnvs([make_env(True)], video_dir))
                    _play(opened[-1], act, [0], seed)  # the video's episode, not counted
        finally:
            for vec in opened:
                vec.close()
    return [r for _, r in sorted(sum(distributed.gather_objects(played, slow=True), []))]


def _play(vec: Any, act: Callable[..., Any], mine: list[int], seed: int) -> list[tuple[int, float]]:
    """Play the episodes ``mine`` on ``vec``'s envs; [(episode, return)] in the order they ended."""
    n = vec.n
    keywords = inspect.signature(act).parameters
    draws = Draws(n)
    queue = iter(mine)
    episode: list[int | None] = [None] * n  # the episode each env plays (None: none left for it)
    totals, starts, rewards = np.zeros(n), np.ones(n, bool), np.zeros(n, np.float32)
    played = []

    def begin(rows: list[int]) -> None:
        """The envs ``rows`` take the next episodes (the ones left without: none)."""
        for b in rows:
            episode[b] = next(queue, None)
        rows = [b for b in rows if episode[b] is not None]
        for b in rows:
            draws.start(b, seed + 100_000 + episode[b])
            totals[b], starts[b], rewards[b] = 0.0, True, 0.0
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
            rewards[b] = reward[b]
            if done[b]:
                played.append((episode[b], float(totals[b])))
        begin([b for b in active if done[b]])
    return played


def _stack(rows: list[Any]) -> Any:
    """[n, ...] of n observations (a dict of such arrays for dict observations)."""
    if isinstance(rows[0], dict):
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    return np.stack([np.asarray(r) for r in rows])


class _GymEnvs:
    """n gymnasium envs (made by ``thunks``) stepped in this process, each reset when it takes an episode; env 0
    records its first episode with ``video_dir``."""

    def __init__(self, thunks: list[Callable[[], Any]], video_dir: Path | None):
        import gymnasium as gym

        self.envs: list[Any] = []
        try:
            for thunk in thunks:
                self.envs.append(thunk())
            if video_dir is not None:
                self.envs[0] = gym.wrappers.RecordVideo(self.envs[0], str(video_dir), episode_trigger=lambda i: i == 0,
                                                        disable_logger=True)
        except BaseException:  # the envs made so far are closed
            self.close()
            raise
        self.n = len(self.envs)
        self._obs: list[Any] = [None] * self.n
        self._infos: list[dict] = [{} for _ in range(self.n)]
        self.obs: Any = None

    def reset(self, rows: list[int], seeds: list[int]) -> None:
        for b, seed in zip(rows, seeds):
            self._obs[b], self._infos[b] = self.envs[b].reset(seed=seed)
        self.obs = _stack(self._obs)

    def mask(self) -> np.ndarray | None:
        space = self.envs[0].action_space
        if not hasattr(space, "n"):  # continuous actions: nothing to mask
            return None
        return np.stack([np.asarray(i.get("action_mask", np.ones(space.n, bool)), bool) for i in self._infos])

    def step(self, actions: np.ndarray, active: list[int]) -> tuple[np.ndarray, np.ndarray]:
        reward, done = np.zeros(self.n), np.zeros(self.n, bool)
        for b in active:
            self._obs[b], reward[b], term, trunc, self._infos[b] = self.envs[b].step(actions[b])
            done[b] = term or trunc
        self.obs = _stack(self._obs)
        return reward, done

    def close(self) -> None:
        for env in self.envs:
            env.close()


class _AleEnvs:
    """n games, each in its own ale-py vector env of one env (one C++ thread each): a step sends the actions of the
    envs that play an episode, then waits for those alone. So an env with no episode left costs nothing (one
    vector env of n steps all n, which for a few long games at the end is most of the work), and the games that
    step run in parallel on the cores. An env that takes an episode is reset alone with its seed."""

    def __init__(self, make: Callable[[], Any], n: int):
        self.envs: list[Any] = []
        try:
            for _ in range(n):
                self.envs.append(make())
        except BaseException:  # the envs made so far are closed
            self.close()
            raise
        self.n = n
        self.obs: Any = None

    def reset(self, rows: list[int], seeds: list[int]) -> None:
        for b, seed in zip(rows, seeds):
            obs, _ = self.envs[b].reset(seed=int(seed))  # ale-py takes a Python int or an array
            if self.obs is None:
                self.obs = np.repeat(obs, self.n, axis=0)
            self.obs[b] = obs[0]

    def mask(self) -> np.ndarray:
        return np.ones((self.n, self.envs[0].single_action_space.n), bool)  # Atari games give no action masks

    def step(self, actions: np.ndarray, active: list[int]) -> tuple[np.ndarray, np.ndarray]:
        actions = np.asarray(actions, np.int64)
        for b in active:  # every game steps at once in its thread
            self.envs[b].send(actions[b : b + 1])
        reward, done = np.zeros(self.n), np.zeros(self.n, bool)
        for b in active:
            obs, r, term, trunc, _ = self.envs[b].recv()
            self.obs[b], reward[b], done[b] = obs[0], r[0], term[0] or trunc[0]
        return reward, done

    def close(self) -> None:
        # ale-py's vector env frees its emulator and thread when collected (its close() does nothing): dropped
        # here, not kept alive by a traceback that holds this object.
        envs, self.envs = self.envs, []
        for env in envs:
            env.close()
