"""--save-replay: size of ``replay.npz`` and time to save and load it for a full frame-wise Atari replay (1M
transitions, 84x84 frames, prioritized as dqn_atari.py --prioritized builds it), beside the bound that
matters: the bytes the buffer holds in memory, and the time to copy them once in memory.

    python benchmarks/speed/replay_save.py [--capacity 1000000] [--envs 16] [--dir /tmp]

Needs about twice the replay's size in free memory (the load reads each array, then copies it in place) and
its size on disk in --dir.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.speed.replay_memory import FRAME, GB, Step, chunk  # the rows dqn_atari.py appends
from shared.replay import ReplayBuffer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--dir", default=tempfile.gettempdir())
    a = p.parse_args()
    ex = Step(np.zeros((4,) + FRAME, np.uint8), np.int64(0), np.float32(0), False, False, False)
    buf = ReplayBuffer(ex, a.capacity, a.envs, discount=0.99, n_step_return=3, frame_stack=4, prioritized=True)
    rng = np.random.default_rng(0)
    t, Tc = 0, 128
    while t < buf.T + 10:  # past one full wrap: every row written
        buf.append(chunk(t, Tc, a.envs, rng))
        t += Tc
    held = sum(x.nbytes for x in buf.arrays().values())
    t0 = time.perf_counter()
    copies = [np.array(x) for x in buf.arrays().values()]
    copy_s = time.perf_counter() - t0
    del copies
    batch_before, _ = buf.sample(32)

    path = Path(a.dir) / f"replay-bench-{os.getpid()}.npz"
    try:
        t0 = time.perf_counter()
        buf.save(path)
        save_s = time.perf_counter() - t0
        size = path.stat().st_size
        buf2_rng_state = buf.rng.bit_generator.state
        t0 = time.perf_counter()
        buf.load(path)  # into the same buffer: one replay in memory at a time
        load_s = time.perf_counter() - t0
    finally:
        path.unlink(missing_ok=True)
    assert buf.rng.bit_generator.state == buf2_rng_state and batch_before.observation.shape == (32, 4) + FRAME

    print(f"{a.capacity:,} transitions x {a.envs} envs, frame-wise, prioritized")
    print("| | bytes | seconds | GB/s |\n| --- | --- | --- | --- |")
    print(f"| held in memory (the bound) | {held / GB:.2f} GB | copy {copy_s:.1f} | {held / GB / copy_s:.2f} |")
    print(f"| replay.npz written | {size / GB:.2f} GB ({size / held:.3f}x) | {save_s:.1f} | {size / GB / save_s:.2f} |")
    print(f"| replay.npz loaded | | {load_s:.1f} | {size / GB / load_s:.2f} |")


if __name__ == "__main__":
    main()
