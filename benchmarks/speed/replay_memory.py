"""Resident memory of a frame-wise Atari replay buffer filled with frames, against a stacked-observation buffer,
and of algos/dqn_atari.py holding one.

The frame-wise buffer (shared.replay.ReplayBuffer with frame_stack=4, built with dqn_atari.py's own row structure
and arguments) stores each 84x84 frame once. A stacked
buffer stores every [4, 84, 84] observation (as a CleanRL/SB3-style buffer does, which also stores the next
observation unless told to optimise memory). Both are filled the same way here and measured in the same run at
a capacity where the stacked one fits (``--compare-capacity``); at ``--capacity`` (1M by default) the stacked
size is computed, because it would not fit in this machine's memory. The script's own footprint (python, torch,
its two networks and the envs) is measured in a child process and added for the total of dqn_atari.py.

    python benchmarks/speed/replay_memory.py [--capacity 1000000] [--compare-capacity 100000] [--shared]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))
from dqn_atari import Step  # the row dqn_atari.py appends

from shared.replay import ReplayBuffer

FRAME = (84, 84)
GB = 1e9


def rss_bytes() -> int:
    """Resident set size of this process (anonymous, file and shared pages)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def chunk(t0: int, Tc: int, B: int, rng: np.random.Generator) -> Step:
    # Frames differ per row (written pages, not shared zero pages); episodes end now and then.
    obs = np.empty((Tc, B, 4) + FRAME, np.uint8)
    obs[:] = ((t0 + np.arange(Tc)) % 251).astype(np.uint8)[:, None, None, None, None]
    done = rng.random((Tc, B)) < 0.001
    return Step(obs, rng.integers(0, 18, (Tc, B)), rng.random((Tc, B), np.float32), done, np.zeros((Tc, B), bool), done)


def fill_framewise(capacity: int, B: int, shared: bool) -> tuple[int, float]:
    gc.collect()
    before = rss_bytes()
    ex = Step(np.zeros((4,) + FRAME, np.uint8), np.int64(0), np.float32(0), False, False, False)
    buf = ReplayBuffer(ex, capacity, B, discount=0.99, n_step_return=1, frame_stack=4, shared=shared)
    rng = np.random.default_rng(0)
    Tc, t, t0 = 128, 0, time.perf_counter()
    while t < buf.T + 10:  # past one full wrap: every row written
        buf.append(chunk(t, Tc, B, rng))
        t += Tc
    batch, _ = buf.sample(32)
    assert batch.observation.shape == (32, 4) + FRAME
    used = rss_bytes() - before
    del buf, batch
    gc.collect()
    return used, time.perf_counter() - t0


def fill_stacked(capacity: int) -> int:
    gc.collect()
    before = rss_bytes()
    obs = np.zeros((capacity, 4) + FRAME, np.uint8)
    next_obs = np.zeros((capacity, 4) + FRAME, np.uint8)
    rest = [np.zeros(capacity, np.int64), np.zeros(capacity, np.float32), np.zeros(capacity, bool)]
    for i in range(0, capacity, 4096):
        obs[i : i + 4096] = i % 251
        next_obs[i : i + 4096] = (i + 1) % 251
    for r in rest:
        r[:] = 1
    used = rss_bytes() - before
    del obs, next_obs, rest
    gc.collect()
    return used


SCRIPT_FOOTPRINT = """
import sys, numpy as np, torch
sys.path.insert(0, {algos!r})
import dqn_atari as D
args = D.Args(num_envs={B})
q, t = D.QNetwork((4, 84, 84), 4, False), D.QNetwork((4, 84, 84), 4, False)
from shared.envs import make_envs
envs = make_envs(args, D.make_env, "serial")
envs.reset(seed=0)
for _ in range(50):
    envs.step(np.zeros({B}, int))
print(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])
"""


def script_footprint(B: int) -> int:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", SCRIPT_FOOTPRINT.format(algos=str(ROOT / "algos"), B=B)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[-1]) * 1024


def stacked_bytes(capacity: int, with_next: bool) -> int:
    per = 4 * FRAME[0] * FRAME[1] * (2 if with_next else 1) + 8 + 4 + 1
    return capacity * per


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--capacity", type=int, default=1_000_000, help="transitions in the frame-wise buffer")
    p.add_argument("--compare-capacity", type=int, default=100_000, help="capacity measured for both buffers")
    p.add_argument("--envs", type=int, default=16, help="B: environments per appended row")
    p.add_argument("--shared", action="store_true", help="allocate the frame-wise buffer in shared memory")
    args = p.parse_args()
    frames_only = args.capacity * FRAME[0] * FRAME[1]

    print(f"side by side at {args.compare_capacity:,} transitions (both filled and measured):")
    ours_small, _ = fill_framewise(args.compare_capacity, args.envs, args.shared)
    stacked_small = fill_stacked(args.compare_capacity)
    print(f"  frame-wise        {ours_small / GB:7.3f} GB")
    print(f"  stacked obs+next  {stacked_small / GB:7.3f} GB   ratio {ours_small / stacked_small:.3f}")

    print(f"\nat {args.capacity:,} transitions:")
    ours, secs = fill_framewise(args.capacity, args.envs, args.shared)
    print(
        f"  frame-wise (measured RSS)   {ours / GB:7.3f} GB   (frames alone {frames_only / GB:.3f} GB; "
        f"filled in {secs:.0f} s; target <= 7.5 GB: {'met' if ours <= 7.5 * GB else 'NOT met'})"
    )
    footprint = script_footprint(args.envs)
    total = ours + footprint
    print(
        f"  dqn_atari.py total: buffer {ours / GB:.3f} GB + the script's own process {footprint / GB:.3f} GB "
        f"= {total / GB:.3f} GB (target <= 7.5 GB: {'met' if total <= 7.5 * GB else 'NOT met'})"
    )
    for with_next in (False, True):
        s = stacked_bytes(args.capacity, with_next)
        label = "stacked obs+next (computed)" if with_next else "stacked obs (computed)     "
        print(f"  {label}  {s / GB:7.3f} GB   frame-wise is {ours / s:.3f} of it")


if __name__ == "__main__":
    main()
