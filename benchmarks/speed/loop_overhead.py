"""The sampling loop's own host work, counted and timed on a CPU as it runs on a GPU (no GPU needed).

Each script's own loop functions (imported, not copied) run against a stub vector env that has the real env's
spaces and info keys, returns preallocated arrays and costs nothing (or ``--env-cost-us`` of busy waiting), with:

- ``RL_HOST_PATH=dry`` (``shared.device``): uploads packed into staging as on CUDA, ``to_host`` through one joined
  copy, the bytes a GPU's DMA engine would move left out of the host's time (a copy up costs its launch: a ``copy_``
  of one byte);
- ``RL_COMPILE_GRAPHS=dry`` with ``RL_COMPILE_BACKEND=eager`` (``shared.compiling``): every ``@graphed`` call runs its
  key, copy-in (each copy one launch, as above) and copy-out, but from the third call of a key the function itself is
  not called (a replay costs the host only its launch), and no time goes to inductor.

It prints, per vector step (the per-rollout work of the PPO family, per rollout), the host time (µs; the minimum over
chunks, so a busy neighbour only adds noise upward), the ratio to a bare loop on the same stub (copy the observations
into a static input, read the actions back, step, store the observations), the floor's ratio to it (``floor``: the
bare loop through the CUDA host path's three calls, ``upload``, one ``@graphed`` call and ``to_host``, with the
script's updates due as one-input graphs; each script's loop makes those calls and more, which the tests check on
their counts, so its ratio is not expected under the floor's), and counts that do not depend on the
machine: Python calls, C calls (``sys.setprofile``), torch calls (``TorchFunctionMode``), host-device syncs (a read of
a device value: ``one_copy``, ``.item()``, ``.cpu()``, ``.tolist()``, ``bool(t)``, ...), and the bytes copied up and down.
``tests/test_loop_overhead.py`` holds each script to its budget of those counts (``BUDGETS``), so a change that adds
host work to a loop fails there.

    python benchmarks/speed/loop_overhead.py                          # every script
    python benchmarks/speed/loop_overhead.py ppo_atari td3_mujoco     # some
    python benchmarks/speed/loop_overhead.py --json out.json          # also the figures as JSON
    python benchmarks/speed/loop_overhead.py --segments ppo_atari     # also where each step's host time goes
    python benchmarks/speed/loop_overhead.py --ablate ppo_atari       # also what three parts cost inside the loop
    python benchmarks/speed/loop_overhead.py --async ppo_atari        # also async's steady state against parallel's
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # before shared/ is imported: CUDA's host path on this CPU, dry replays (module docstring)
    os.environ.update(RL_HOST_PATH="dry", RL_COMPILE_GRAPHS="dry", RL_COMPILE_BACKEND="eager")

import argparse
import contextlib
import dataclasses
import importlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))

from shared import compiling, device
from shared.device_replay import DeviceReplay
from shared.namedarraytuple import map_structure
from shared.procs import DoubleBuffer
from tests.count_syncs import reads_device

ATARI_OBS = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
CHEETAH_OBS = gym.spaces.Box(-np.inf, np.inf, (17,), np.float64)
CHEETAH_ACT = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)

# Per vector step (per rollout for the ``rollout_`` counts) at most: the counts tests/test_loop_overhead.py holds. Set
# from a run of --counts (torch 2.13, numpy 2.4) with about 5% over the calls; syncs and bytes as they are.
_ON_POLICY = {"syncs": 1.0, "bytes_up": 225_824, "rollout_syncs": 2.0}
_CONTINUOUS = {"python_calls": 154, "torch_calls": 32, "syncs": 1.0, "bytes_up": 464, "bytes_down": 24}
BUDGETS: dict[str, dict[str, float]] = {
    "ppo_atari": {
        **_ON_POLICY,
        "python_calls": 92,
        "torch_calls": 53,
        "bytes_down": 128,
        "rollout_torch_calls": 665,
        "rollout_bytes_up": 287_232,  # the rollout's observations stay on the device: not 29 MB again
    },
    "a2c_atari": {
        **_ON_POLICY,
        "python_calls": 95,
        "torch_calls": 53,
        "bytes_down": 128,
        "rollout_torch_calls": 125,
        "rollout_bytes_up": 226_752,
    },
    "ppo_lstm": {
        **_ON_POLICY,
        "python_calls": 148,
        "torch_calls": 72,
        "syncs": 1.02,
        "bytes_up": 225_832,
        "bytes_down": 256,
        "rollout_torch_calls": 837,
        "rollout_bytes_up": 276_228,
    },
    "ppo_mujoco": {
        "python_calls": 83,
        "torch_calls": 40,
        "syncs": 1.0,
        "bytes_up": 68,
        "bytes_down": 32,
        "rollout_torch_calls": 11030,
        "rollout_syncs": 2.0,
        "rollout_bytes_up": 409_660,
    },
    # 182: 179.4 since the batch comes through shared.device_replay.ReplayBatches (its next and ahead, two calls an update)
    "dqn_atari": {"python_calls": 182, "torch_calls": 43, "syncs": 1.0, "bytes_up": 141_312, "bytes_down": 32},
    "catdqn_atari": {"python_calls": 182, "torch_calls": 43, "syncs": 1.0, "bytes_up": 141_312, "bytes_down": 32},
    "r2d1_atari": {"python_calls": 176, "torch_calls": 70, "syncs": 1.04, "bytes_up": 634_868, "bytes_down": 65_872},
    "sac_mujoco": dict(_CONTINUOUS),
    "td3_mujoco": dict(_CONTINUOUS),
    "ddpg_mujoco": dict(_CONTINUOUS),
}


# ------------------------------------------------------------------------------------------------ the stub env


class StubVectorEnv:
    """``num_envs`` envs of the given spaces that cost ``cost_us`` of busy waiting a step; each env's episode ends
    every ``episode_steps`` steps (staggered), with Atari's ``lives`` in ``info`` where asked."""

    def __init__(self, obs_space, act_space, num_envs: int, cost_us: float = 0.0, episode_steps: int = 1000, lives=False):
        self.single_observation_space, self.single_action_space = obs_space, act_space
        self.num_envs, self.cost, self.episode_steps = num_envs, cost_us * 1e-6, episode_steps
        rng = np.random.default_rng(0)
        low = np.where(np.isfinite(obs_space.low), obs_space.low, -1).astype(obs_space.dtype)
        high = np.where(np.isfinite(obs_space.high), obs_space.high, 1).astype(obs_space.dtype)
        self.obs = (low + (high - low) * rng.random((num_envs, *obs_space.shape))).astype(obs_space.dtype)
        self.reward = np.ones(num_envs, np.float64)
        self.trunc = np.zeros(num_envs, bool)
        self.t = np.arange(num_envs) * (episode_steps // max(num_envs, 1))
        self.lives = lives

    def info(self) -> dict:
        return {"lives": np.full(self.num_envs, 3, np.int64)} if self.lives else {}

    def reset(self, seed: Any = None, options: Any = None) -> tuple:
        return self.obs, self.info()

    def step(self, action: np.ndarray) -> tuple:
        end = time.perf_counter() + self.cost
        while time.perf_counter() < end:
            pass
        self.t += 1
        term = self.t % self.episode_steps == 0
        return self.obs, self.reward, term, self.trunc, self.info()

    def close(self) -> None:
        pass


# -------------------------------------------------------------------------------------------------- counting


class TorchCalls(TorchFunctionMode):
    """Counts torch calls, and the copies to the host among them (``.cpu()``, ``.tolist()``: a sync on a GPU) but for
    those inside ``one_copy``, whose one copy ``Bytes`` counts (into host bytes it keeps, with no ``.cpu()``)."""

    SYNCS = {"cpu", "tolist"}

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.syncs = 0, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        if getattr(func, "__name__", "") in self.SYNCS and not Bytes.inside:
            self.syncs += 1
        return func(*args, **(kwargs or {}))


class DeviceReads(TorchDispatchMode):
    """Counts the operators that read a device value on the host, as tests/count_syncs.py judges them: ``.item()``,
    ``bool(t)``, ``float(t)``, a boolean-mask index, ``nonzero``, ``equal``, ``unique``, ``masked_select``."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.syncs += reads_device(func, args)
        return func(*args, **(kwargs or {}))


class Bytes:
    """Bytes through ``upload`` and ``upload_each`` (up) and ``to_host`` (down), counted by wrapping the copies: what an
    uploader stages (``Uploader._stage``, which its packed copy and ``each`` go through), copies up from a page-locked
    rollout (``through``) or, where it does not pack, its ``__call__``; and one sync for each ``one_copy`` (``to_host``'s
    copy down)."""

    inside = 0  # one_copy calls running: TorchCalls leaves their copies to this count

    def __init__(self) -> None:
        self.up = self.down = self.syncs = 0
        self._saved = device.Uploader.__call__, device.Uploader._stage, device.Uploader.through, device.one_copy

    def __enter__(self) -> Bytes:
        counter = self
        call_, stage_, through_, one_copy_ = self._saved

        def call(uploader, arrays, into=None):
            if not uploader.pack:
                counter.up += sum(np.asarray(a).nbytes for a in arrays.values())
            return call_(uploader, arrays, into)

        def stage(uploader, arrays, dests=None):
            counter.up += sum(np.asarray(a).nbytes for a in arrays.values())
            return stage_(uploader, arrays, dests)

        def through(uploader, arrays, into):  # the arrays a page-locked rollout keeps (the rest: through _stage)
            counter.up += sum(a.nbytes for k, a in arrays.items() if k in into)
            return through_(uploader, arrays, into)

        def one_copy(tensors):
            counter.down += sum(t.numel() * t.element_size() for t in tensors)
            counter.syncs += 1
            Bytes.inside += 1
            try:
                return one_copy_(tensors)
            finally:
                Bytes.inside -= 1

        device.Uploader.__call__, device.Uploader._stage, device.one_copy = call, stage, one_copy
        device.Uploader.through = through
        return self

    def __exit__(self, *exc: Any) -> None:
        device.Uploader.__call__, device.Uploader._stage, device.Uploader.through, device.one_copy = self._saved


def count(fn: Callable[[], Any], per: int) -> dict[str, float]:
    """Python calls, C calls, torch calls, syncs, bytes and ``@graphed`` replays of one ``fn()`` (the operators that
    read the device and the replays: of another), divided by ``per``."""
    calls: Counter = Counter()

    def profile(frame, event, arg):
        calls[event] += 1

    with Bytes() as nbytes, TorchCalls() as torch_calls:
        sys.setprofile(profile)
        try:
            fn()
        finally:
            sys.setprofile(None)
    replay, replays = compiling._Graph.__call__, [0]

    def counted(graph, leaves):
        replays[0] += 1
        return replay(graph, leaves)

    compiling._Graph.__call__ = counted
    try:
        with DeviceReads() as reads:  # a second run, its Python not among the calls counted
            fn()
    finally:
        compiling._Graph.__call__ = replay
    return {
        "graph_calls": replays[0] / per,
        "python_calls": calls["call"] / per,
        "c_calls": calls["c_call"] / per,
        "torch_calls": torch_calls.calls / per,
        "syncs": (torch_calls.syncs + nbytes.syncs + reads.syncs) / per,
        "bytes_up": nbytes.up / per,
        "bytes_down": nbytes.down / per,
    }


def segments(fn: Callable[[], Any], per: int, runs: int = 3) -> dict[str, float]:
    """Where ``fn()``'s host time goes, in µs per ``per``: each call named in ``calls`` timed around itself (the quickest
    of ``runs``) less the named calls inside it (a mirror's sync less its upload), ``rest`` the remainder (the
    script's own Python and numpy, and ``@graphed``'s key)."""
    from shared import replay

    calls = {
        "upload": [(device.Uploader, "packed"), (device.Uploader, "each")],
        "to_host": [(device, "one_copy")],
        "graph": [(compiling._Graph, "__call__")],  # copy-in, replay (dry: nothing) and copy-out
        "sample": [(replay._Base, "sample")],
        "append": [(replay.ReplayBuffer, "append"), (replay.SequenceReplayBuffer, "append"), (DeviceReplay, "sync")],
        "env": [(StubVectorEnv, "step")],
    }
    spent: Counter = Counter()
    inner = [0.0]  # the time of the named calls inside the one running (a sync's upload): counted once, as their own

    def timed(label: str, f: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            outer, inner[0] = inner[0], 0.0
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                spent[label] += took - inner[0]
                inner[0] = outer + took

        return call

    saved = [(owner, attr, owner.__dict__[attr], label) for label, places in calls.items() for owner, attr in places]
    best: dict[str, float] = {}
    try:
        for owner, attr, f, label in saved:
            setattr(owner, attr, timed(label, f))
        for _ in range(runs):
            spent.clear()
            t0 = time.perf_counter()
            fn()
            spent["rest"] = time.perf_counter() - t0 - sum(spent.values())
            for label in [*calls, "rest"]:
                best[label] = min(best.get(label, float("inf")), 1e6 * spent[label] / per)
    finally:
        for owner, attr, f, _ in saved:
            setattr(owner, attr, f)
    return {f"seg_{k}": v for k, v in best.items()}


def ablations(fn: Callable[[], Any], per: int, chunks: int) -> dict[str, float]:
    """What three parts of a step cost inside the loop, in µs per ``per``: ``fn()`` timed in turns as it is and with
    one part left out (the quickest of ``chunks`` runs each; the saving, as it is less the run without): ``launches``,
    the dry protocol's stand-ins for a launch (the copy of one byte an upload and a graph's copy-in make);
    ``to_host``, its first answer per signature returned again instead of the copy; ``copy_out``, each graph's
    outputs returned as they are instead of copied. Inside the loop a part costs more than ``--segments`` times it
    alone: the caches and branch predictors are shared with everything else a step does. The values are wrong while
    a part is left out; every patched method and attribute is put back."""
    graphs = [g for entries, _ in compiling._graphed_entries for g in entries.values() if g.graphs]
    one_copy, answers = device.one_copy, {}

    def answered(tensors: tuple) -> list:
        signature = tuple((t.dtype, t.shape) for t in tensors)
        if signature not in answers:
            answers[signature] = one_copy(tensors)
        return answers[signature]

    parts = {
        "launches": [(device.Uploader, "_launch", lambda self: None), (compiling._Graph, "_copy", lambda self, s, x: None)],
        "to_host": [(device, "one_copy", answered)],
        "copy_out": [(g, "copy_out", lambda g=g: g.out) for g in graphs],
    }
    runs = [[]] + [[part] for part in parts]
    best = [float("inf")] * len(runs)
    for _ in range(chunks):
        for i, left_out in enumerate(runs):
            saved = [(owner, attr, owner.__dict__[attr]) for part in left_out for owner, attr, _ in parts[part]]
            try:
                for part in left_out:
                    for owner, attr, stand_in in parts[part]:
                        setattr(owner, attr, stand_in)
                t0 = time.perf_counter()
                fn()
                best[i] = min(best[i], time.perf_counter() - t0)
            finally:
                for owner, attr, f in saved:
                    setattr(owner, attr, f)
    return {f"abl_{part}": 1e6 * (best[0] - b) / per for part, b in zip(parts, best[1:])}


def optional_parts(fn: Callable[[], Any], per: int, chunks: int) -> dict[str, float]:
    """``segments`` under --segments and ``ablations`` (at least 15 chunks: its differences are small) under --ablate."""
    out = segments(fn, per) if SEGMENTED else {}
    return {**out, **ablations(fn, per, max(chunks, 15))} if ABLATE else out


def best_us(fn: Callable[[], Any], per: int, chunks: int) -> float:
    """The quickest of ``chunks`` runs of ``fn()``, in µs per ``per`` (nan for none: counts only)."""
    return best_us_in_turns([fn], per, chunks)[0]


def best_us_in_turns(fns: list[Callable[[], Any]], per: int, chunks: int) -> list[float]:
    """``best_us`` of each of ``fns``, their chunks run in turns (one of each, then again)."""
    best = [float("inf")] * len(fns)
    for _ in range(chunks):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return [1e6 * b / per if chunks else float("nan") for b in best]


def timed_beside_bare_and_floor(
    loop: Callable[[], Any], envs: StubVectorEnv, per: int, chunks: int, act_dtype: Any, obs_dtype: Any = None, updates=(0, 0)
) -> dict[str, float]:
    """``host_us``, ``bare_us`` and ``floor_us``: the script's loop, the bare loop and the floor (``floor_loop``, with
    the script's observation dtype and its updates due, ``updates``: (every, per_step)) timed in turns, chunk by chunk,
    so that their ratios do not take this machine's drift between separate timings (timed apart, one script's ratio
    moved from 2.8 to 3.6 between runs minutes apart); the floor's counts (``floor_``), which the tests compare, and
    ``updates_per_step``."""
    bare = bare_loop(envs, per, act_dtype)
    floor = floor_loop(envs, per, act_dtype, obs_dtype, *updates)
    for _ in range(3):  # the floor's graphs' warm-up calls and "captures"
        floor()
    host_us, bare_us, floor_us = best_us_in_turns([loop, bare, floor], per, chunks)
    every, per_step = updates
    floor_counts = {f"floor_{k}": v for k, v in count(floor, per).items()}
    return {
        "host_us": host_us,
        "bare_us": bare_us,
        "floor_us": floor_us,
        **floor_counts,
        "floor_envs": envs.num_envs,
        "updates_per_step": per_step / every if every else 0.0,  # the script's, which the floor makes too
    }


def bare_loop(envs: StubVectorEnv, steps: int, act_dtype: Any) -> Callable[[], None]:
    """The least a loop does: observations into a static input, actions back, the step, the observations stored."""
    obs = envs.reset()[0]
    static = torch.empty(obs.shape, dtype=device.torch_dtype(obs.dtype))
    action = torch.zeros((envs.num_envs, *envs.single_action_space.shape), dtype=act_dtype)
    store = np.empty((steps, *obs.shape), obs.dtype)

    def run() -> None:
        nonlocal obs
        for t in range(steps):
            static.copy_(torch.from_numpy(obs))
            obs = envs.step(action.numpy().copy())[0]
            store[t] = obs

    return run


@compiling.graphed
def _floor_act(obs: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """The floor's acting step: ``width`` values an env of ``obs`` [B, ...] as actions [B] (width 1) or [B, width]."""
    return obs.flatten(1)[:, :width].to(dtype).squeeze(1)


@compiling.graphed
def _floor_update(ticks: torch.Tensor) -> torch.Tensor:
    """The floor's update: one graph of one input, copied in at each call (a script's update takes its batch)."""
    return ticks + 1


def floor_loop(envs: StubVectorEnv, steps: int, act_dtype: Any, obs_dtype: Any = None, every=0, per_step=0) -> Callable:
    """The bare loop acting through the CUDA host path's three calls only: the observations (as ``obs_dtype``) up by
    ``upload``, the actions from one ``@graphed`` call, read back by ``to_host``; then ``per_step`` one-input
    ``@graphed`` updates every ``every`` steps, the step, the observations stored. Each script's loop makes these calls
    and more (tests/test_loop_overhead.py compares their counts): the floor's ratio bounds the script's."""
    obs = envs.reset()[0]
    cast = obs_dtype is not None and obs.dtype != obs_dtype  # the scripts that upload float32 (normalised) observations
    width = int(np.prod(envs.single_action_space.shape, dtype=int)) or 1
    ticks = torch.zeros(())
    store = np.empty((steps, *obs.shape), obs.dtype)
    cpu = torch.device("cpu")

    def run() -> None:
        nonlocal obs, ticks
        for t in range(steps):
            action = _floor_act(device.upload(obs.astype(obs_dtype) if cast else obs, cpu), width, act_dtype)
            action = device.to_host(action)  # before the updates, as the scripts read theirs
            if every and t % every == 0:
                for _ in range(per_step):
                    ticks = _floor_update(ticks)
            obs = envs.step(action)[0]
            store[t] = obs

    return run


# ------------------------------------------------------------------------------------------------ the scripts


def load(name: str) -> Any:
    return importlib.import_module(name)


def on_policy(name: str, env_cost_us: float, chunks: int) -> dict[str, Any]:
    """ppo_atari, a2c_atari, ppo_lstm, ppo_mujoco: the script's ``Sampler.rollout`` (its ``collect``) per vector step,
    ``learn_from`` and the row per rollout (8 envs of Breakout's spaces, or one of HalfCheetah's; default settings)."""
    from shared.progress import ProgressLog

    S = load(name)
    atari = name != "ppo_mujoco"
    obs_dtype = None if atari else np.float32  # ppo_mujoco uploads its normalised observations as float32
    args = S.Args(num_envs=8, sampler="parallel") if atari else S.Args()
    obs_space, act_space = (ATARI_OBS, gym.spaces.Discrete(4)) if atari else (CHEETAH_OBS, CHEETAH_ACT)
    envs = StubVectorEnv(obs_space, act_space, args.num_envs, env_cost_us, lives=atari)
    run = _RunStub(obs_space, act_space)
    learner = S.make_learner(args, run)  # (agent, optimizer[, generator[, return_norm]])
    agent, optimizer, tail, extra = learner[0], learner[1], learner[2:3], learner[3:]
    S.make_envs = lambda *a, **k: envs  # the script's sampler steps the stub
    sampler = S.Sampler(args, run, agent, 0, 10**6)
    rollout = [None]
    collect = lambda: rollout.__setitem__(0, sampler.rollout(0, agent, 0))
    progress = ProgressLog(None, 10**9)

    def learn() -> None:
        stats = S.learn_from(agent, *extra, optimizer, *rollout[0], args, run.device, *tail)
        progress.row(0, **stats)

    for _ in range(3):  # the graphs' warm-up calls and "captures"
        collect()
        learn()
    T = args.num_steps
    out = {
        **timed_beside_bare_and_floor(collect, envs, T, chunks, torch.int64 if atari else torch.float32, obs_dtype),
        "rollout_ms": best_us(learn, 1000, chunks),
        **count(collect, T),
        **optional_parts(collect, T, chunks),
        **{f"rollout_{k}": v for k, v in count(learn, 1).items()},
    }
    if ASYNC:  # the sampler process's loop (acting on the learner's device, into a slot of shared memory) and the learner's
        # a slot of the double buffer, page-locked as the sampler process does (procs.sampler_entry), as it writes it
        step = lambda x: np.zeros(tuple(x.shape[2:]), device.numpy_dtype(x.dtype) if torch.is_tensor(x) else x.dtype)
        buffers = DoubleBuffer(map_structure(step, sampler.buf), (T, args.num_envs))
        buffers.pin(run.device)
        host = buffers.writer_acquire(0, lambda: None)
        boot = map_structure(np.copy, sampler.boot)
        sample = lambda: S.collect(envs, agent, sampler.state, host, boot, args, run.device)
        as_async = dataclasses.replace(args, sampler="async")  # what the learner does with a rollout it did not act for
        learn_host = lambda: S.learn_from(agent, *extra, optimizer, host, boot, as_async, run.device, *tail)
        for _ in range(3):
            sample()
            learn_host()
        learner = count(learn_host, 1)  # its time is mostly eager device work (the critic over the rollout): counted
        out.update({f"async_{k}": v for k, v in count(sample, T).items()})
        # in turns with parallel's loop, chunk by chunk: this machine's speed drifts between two separate timings
        parallel_us, async_us = best_us_in_turns([collect, sample], T, chunks)
        out.update(parallel_us=parallel_us, async_us=async_us, async_learner_torch_calls=learner["torch_calls"], steps=T)
    return out


def value_based(name: str, env_cost_us: float, chunks: int) -> dict[str, Any]:
    """dqn_atari, catdqn_atari, r2d1_atari: one step of every env (Breakout's spaces), its append, and the updates its
    replay ratio makes per vector step, as main's loop does (uniform replay; a small one)."""
    S = load(name)
    args = S.Args(sampler="parallel", buffer_size=20_000)
    act_space = gym.spaces.Discrete(4)
    envs = StubVectorEnv(ATARI_OBS, act_space, args.num_envs, env_cost_us, lives=True)
    cpu = torch.device("cpu")
    run = _RunStub(ATARI_OBS, act_space)
    learner = S.make_learner(args, run)
    buffer = S.make_replay(args, run)
    if name == "r2d1_atari":
        net, target_net, optimizer = learner
        stepper = S.EnvStepper(envs, args, net, 0)
        per_update = args.batch_size * args.sequence_length
        act = lambda: None  # its sampler acts inside its step
        step = lambda _: (lambda c, p, _: c is not None and buffer.append(c, p))(*stepper.step(net, cpu))
        update = lambda: S.r2d1_update(net, target_net, optimizer, buffer, args, args.beta, cpu)
    else:
        q_net, target_net, optimizer, noise = learner
        stepper = S.EnvStepper(envs, args, 0, noise)
        eps = np.full(args.num_envs, 0.01)
        per_update = args.batch_size
        act = lambda: stepper.act(q_net, eps, cpu)
        step = lambda action: buffer.append(stepper.step(action)[0])
        learn = S.dqn_update if name == "dqn_atari" else S.c51_update
        batches = S.ReplayBatches(buffer, S.HOST_ONLY, cpu)  # RL_HOST_PATH: the uniform replay's mirror on the "device"
        update = lambda: learn(q_net, target_net, optimizer, batches, args, args.beta, noise)
    updates = args.replay_ratio * args.num_envs / per_update  # per vector step
    every = max(round(1 / updates), 1) if updates < 1 else 1
    per_step = max(round(updates), 1) if updates >= 1 else 1
    steps = every * max(64 // every, 1)  # whole update periods: R2D1 updates every 320 vector steps, not every 64

    def loop() -> None:  # main's order: the actions, the updates due (on a GPU they run while the envs step), the step
        for t in range(steps):
            action = act()
            if t % every == 0:
                for _ in range(per_step):
                    update()
            step(action)

    while len(buffer) < 4 * args.batch_size or buffer.cursor < 2_000 // args.num_envs:  # rows to sample from
        step(act())
    for _ in range(3):  # the graphs' warm-up calls and "captures"
        update()
    return {
        **timed_beside_bare_and_floor(loop, envs, steps, chunks, torch.int64, updates=(every, per_step)),
        **count(loop, steps),
        **optional_parts(loop, steps, chunks),
    }


def off_policy_continuous(name: str, env_cost_us: float, chunks: int) -> dict[str, Any]:
    """sac_mujoco, td3_mujoco, ddpg_mujoco: the actions, one sample and one update, one env step and its append, per
    step."""
    S = load(name)
    args = S.Args(num_envs=1, buffer_size=100_000)
    envs = StubVectorEnv(CHEETAH_OBS, CHEETAH_ACT, 1, env_cost_us)
    cpu = torch.device("cpu")
    run = _RunStub(CHEETAH_OBS, CHEETAH_ACT)
    learner = S.make_learner(args, run)
    obs_norm = learner[-1]
    buffer = S.make_replay(args, run)
    stepper = S.EnvStepper(envs, args, obs_norm, 0)
    update = _continuous_update(S, name, args, learner, buffer, obs_norm, cpu)
    steps = 200

    def loop() -> None:  # main's order: the actions, the update (on a GPU it runs while the envs step), the step
        for _ in range(steps):
            action = stepper.act(learner[0], False, cpu)
            update()
            row, _ = stepper.step(action)
            buffer.append(row)

    for _ in range(1000):  # a replay of some rows
        buffer.append(stepper.step(stepper.act(learner[0], True, cpu))[0])
    for _ in range(2):  # the graphs' warm-up calls and "captures"
        loop()
    return {
        **timed_beside_bare_and_floor(loop, envs, steps, chunks, torch.float32, np.float32, updates=(1, 1)),  # one a step
        **count(loop, steps),
        **optional_parts(loop, steps, chunks),
    }


class _RunStub:
    """What make_learner, make_replay and a Sampler read of a Run."""

    def __init__(self, obs_space: Any, act_space: Any):
        self.obs_space, self.act_space, self.device = obs_space, act_space, torch.device("cpu")
        self.world = 1
        self.affinity = type("Affinity", (), {"learner_cpus": [0]})()

    def hold(self, envs: Any) -> Any:
        return envs

    def episodes(self, episodes: Any, global_step: int) -> None:
        for _ in episodes:  # a generator in some scripts: walked as Run walks it
            pass


def _continuous_update(S: Any, name: str, args: Any, learner: tuple, buffer: Any, obs_norm: Any, cpu: Any) -> Callable:
    """One sample and one update, as the script's main loop makes them (the learner's first five are the update's
    first arguments in every one of the three; TD3 updates its actor every policy_delay-th update)."""
    updates = [0]
    batches = S.ReplayBatches(buffer, S.HOST_ONLY, cpu, obs_norm)  # RL_HOST_PATH: the replay's mirror on the "device"

    def update() -> None:
        b, _ = batches.next(args.batch_size)
        updates[0] += 1
        if name == "td3_mujoco":
            S.td3_update(*learner[:5], b, args, updates[0] % args.policy_delay == 0)
        else:
            getattr(S, name.replace("_mujoco", "_update"))(*learner[:5], b, args)

    return update


SEGMENTED = False  # --segments: each measure also times where a step's host time goes (``segments``)
ABLATE = False  # --ablate: each measure also times what three parts cost inside the loop (``ablations``)
ASYNC = False  # --async: the PPO family's also times its async sampler's loop and learner (``on_policy``)
SCRIPTS: dict[str, Callable[[str, float, int], dict[str, Any]]] = {
    "ppo_atari": on_policy,
    "a2c_atari": on_policy,
    "ppo_lstm": on_policy,
    "ppo_mujoco": on_policy,
    "dqn_atari": value_based,
    "catdqn_atari": value_based,
    "r2d1_atari": value_based,
    "sac_mujoco": off_policy_continuous,
    "td3_mujoco": off_policy_continuous,
    "ddpg_mujoco": off_policy_continuous,
}


def over_budget(name: str, figures: dict[str, float]) -> dict[str, tuple[float, float]]:
    """The counts of ``figures`` above ``name``'s budget: {count: (figure, budget)}."""
    return {k: (figures[k], b) for k, b in BUDGETS[name].items() if figures[k] > b}


def measure(name: str, env_cost_us: float = 0.0, chunks: int = 5) -> dict[str, Any]:
    """One script's figures (module docstring), with compiling enabled on the CPU in the dry protocol."""
    torch.manual_seed(0)
    compiling.enable("cpu")
    try:
        with torch.inference_mode(False), contextlib.redirect_stdout(sys.stderr):
            out = SCRIPTS[name](name, env_cost_us, chunks)
    finally:
        compiling.disable()
    out["ratio"] = out["host_us"] / out["bare_us"]
    out["floor"] = out["floor_us"] / out["bare_us"]
    return out


def print_parts(results: dict[str, dict[str, Any]], prefix: str, title: str) -> None:
    """A table of every script's figures named ``prefix...`` (--segments', --ablate's), under ``title``."""
    names = [k for k in next(iter(results.values())) if k.startswith(prefix)]
    print(f"\n{title}")
    print(f"{'script':<13}" + "".join(f"{k[len(prefix) :]:>10}" for k in names))
    for name, r in results.items():
        print(f"{name:<13}" + "".join(f"{r[k]:>10.1f}" for k in names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scripts", nargs="*", metavar="SCRIPT", help=f"any of {', '.join(SCRIPTS)} (default: all)")
    parser.add_argument("--env-cost-us", type=float, default=0.0, help="busy wait of the stub env's step (µs)")
    parser.add_argument("--chunks", type=int, default=7, help="timed runs of each loop; the quickest counts")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--counts", action="store_true", help="the counts only, no timing (the tests' budgets)")
    parser.add_argument("--segments", action="store_true", help="also where a step's host time goes, call by call (µs)")
    parser.add_argument("--ablate", action="store_true", help="also what three parts cost inside the loop (µs saved)")
    parser.add_argument("--async", dest="async_", action="store_true", help="also the PPO family's async steady state")
    a = parser.parse_args()
    global SEGMENTED, ASYNC, ABLATE
    SEGMENTED, ASYNC, ABLATE = a.segments, a.async_, a.ablate
    if a.counts:
        a.chunks = 0
    unknown = [name for name in a.scripts if name not in SCRIPTS]
    if unknown:
        parser.error(f"unknown script {unknown[0]}: choose from {', '.join(SCRIPTS)}")
    a.scripts = a.scripts or list(SCRIPTS)
    torch.set_num_threads(1)
    # A dry graph is "captured" at its first call: the warm-up calls (optimiser state, cuDNN and inductor on a GPU) only
    # cost time here, R2D1's a minute of real updates; the steady state counted and timed is the same replays.
    compiling.WARMUP_CALLS = 0
    results = {}
    cols = ["host_us", "bare_us", "ratio", "floor", "python_calls", "c_calls", "torch_calls", "syncs"]
    cols += ["bytes_up", "bytes_down"]
    print(f"per vector step (rollout_ms, r_*: per rollout), stub env of {a.env_cost_us:g} µs, torch {torch.__version__}")
    print(f"{'script':<13}" + "".join(f"{c:>13}" for c in cols) + f"{'rollout_ms':>12}{'r_syncs':>9}{'r_torch':>9}")
    for name in a.scripts:
        r = results[name] = measure(name, a.env_cost_us, a.chunks)
        line = f"{name:<13}" + "".join(f"{r[c]:>13.4g}" for c in cols)
        if "rollout_ms" in r:
            line += f"{r['rollout_ms']:>12.3g}{r['rollout_syncs']:>9.0f}{r['rollout_torch_calls']:>9.0f}"
        print(line, flush=True)
    if a.segments:
        title = "per vector step, µs, by the call that spends it (rest: the script's own Python and numpy, @graphed's key)"
        print_parts(results, "seg_", title)
    if a.ablate:
        print_parts(results, "abl_", "per vector step, µs saved inside the loop by leaving one part out (timed in turns)")
    if a.async_:
        print("\nhost µs per vector step of sampling: parallel's, which its update then follows in the same process, and")
        print("async's sampler process (acting on the learner's device, into shared memory), which the learner's update")
        print("does not hold up; ratio >= 1: async's steady state at least parallel's while the learner keeps up. The")
        print("learner's host work is counted (torch calls a rollout), not timed: the dry protocol runs its eager device")
        print("work (the critic over the rollout, parallel's bootstrap) on this CPU.")
        print(f"{'script':<13}{'parallel':>10}{'async':>10}{'ratio':>8}{'learner_torch':>15}")
        for name, r in results.items():
            if "async_us" in r:
                ratio = r["parallel_us"] / r["async_us"]
                learner = r["async_learner_torch_calls"]
                print(f"{name:<13}{r['parallel_us']:>10.1f}{r['async_us']:>10.1f}{ratio:>8.2f}{learner:>15.0f}")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
