"""Prioritized replay bookkeeping at capacity 1M: shared.sum_tree against a per-sample Python loop.

One cycle is what a prioritized learner does per step: append one row of B=16 new priorities (the oldest row's
leaves switched off, the newest switched on), sample a batch stratified over the total, then update the
batch's priorities. The baseline is a plain binary sum tree over a Python list (faster than a numpy array for
element-by-element access) driven one sample at a time, measured in the same run on the same operations.
Both take their new priorities from a pool drawn beforehand (a learner's come from TD errors; drawing them here
would time numpy's generator: about 3 us of a 14 us cycle of ours) and draw the sampling uniforms themselves.

The two are measured in alternating slices (--rounds of --seconds each) and the medians reported, so that a
slow phase of a shared machine falls on both rather than on one.

    python benchmarks/speed/sum_tree.py [--capacity 1000000] [--seconds 1] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from shared.sum_tree import SumTree


class LoopSumTree:
    """The textbook binary sum tree, one leaf at a time (the baseline)."""

    def __init__(self, capacity: int):
        self.size = 1
        while self.size < capacity:
            self.size *= 2
        self.tree = [0.0] * (2 * self.size)

    def set(self, i: int, p: float) -> None:
        i += self.size
        self.tree[i] = p
        i //= 2
        while i >= 1:
            self.tree[i] = self.tree[2 * i] + self.tree[2 * i + 1]
            i //= 2

    def find(self, u: float) -> int:
        i = 1
        while i < self.size:
            left = self.tree[2 * i]
            if u < left or self.tree[2 * i + 1] == 0.0:
                i = 2 * i
            else:
                u -= left
                i = 2 * i + 1
        return i - self.size

    def sample(self, n: int) -> list[int]:
        total = self.tree[1]
        return [self.find((k + random.random()) * total / n) for k in range(n)]


POOL = 4096  # pre-drawn priority sets, cycled through: a learner gets its priorities from TD errors, not an RNG


def make_ours(T: int, B: int):
    tree = SumTree(T, B)
    rng = np.random.default_rng(0)
    tree.set_pending(0, rng.random((T, B)) + 0.1)
    tree.move_window(0, T - 1)
    new_rows = list(rng.random((POOL, 1, B)) + 0.1)  # [1, B] each
    return {"tree": tree, "rng": rng, "cursor": T, "new_rows": new_rows, "updates": {}}


def run_ours(state: dict, T: int, B: int, batch: int, seconds: float) -> float:
    tree, rng, cursor, new_rows = state["tree"], state["rng"], state["cursor"], state["new_rows"]
    if batch not in state["updates"]:
        state["updates"][batch] = list(rng.random((POOL, batch)) + 0.1)  # [batch] each
    updates = state["updates"][batch]
    cycles, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        i = cursor % POOL
        # One row leaves the window and one enters it (an n-step lag of 1), as a replay's append does it.
        tree.append(cursor, new_rows[i], cursor - T + 2, cursor)
        cursor += 1
        rows, b, _ = tree.sample(batch, rng)  # the uniforms of the stratified draws come from rng
        tree.update(rows, b, updates[i])
        cycles += 1
    state["cursor"] = cursor
    return cycles / (time.perf_counter() - t0)


def make_loop(T: int, B: int):
    tree = LoopSumTree(T * B)
    rnd = random.Random(0)
    for i in range(T * B):
        tree.tree[tree.size + i] = rnd.random() + 0.1
    for i in range(tree.size - 1, 0, -1):
        tree.tree[i] = tree.tree[2 * i] + tree.tree[2 * i + 1]
    pool = [rnd.random() + 0.1 for _ in range(POOL)]  # pre-drawn priorities, as for ours
    return {"tree": tree, "cursor": T, "pool": pool}


def run_loop(state: dict, T: int, B: int, batch: int, seconds: float) -> float:
    tree, cursor, pool = state["tree"], state["cursor"], state["pool"]
    cycles, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        row_in, row_out = (cursor - 1) % T, (cursor - T + 1 - 1) % T
        for b in range(B):
            tree.set(row_out * B + b, 0.0)
            tree.set(row_in * B + b, pool[(cursor + b) % POOL])
        cursor += 1
        idx = tree.sample(batch)  # the uniforms of the stratified draws come from random.random
        for k, i in enumerate(idx):
            tree.set(i, pool[(cursor + k) % POOL])
        cycles += 1
    state["cursor"] = cursor
    return cycles / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", type=int, default=1_000_000, help="leaves (transitions)")
    parser.add_argument("--envs", type=int, default=16, help="B: leaves per row")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one measured slice")
    parser.add_argument("--rounds", type=int, default=5, help="alternating slices of each implementation")
    args = parser.parse_args()
    T = args.capacity // args.envs
    print(
        f"capacity {T * args.envs:,} leaves ({T} rows x {args.envs} envs); "
        f"one cycle = append 1 row + sample + update;"
        f" medians of {args.rounds} alternating slices"
    )
    print(f"{'batch':>6} {'ours cycles/s':>14} {'loop cycles/s':>14} {'ratio':>7}   {'ours samples/s':>15}")
    ours_state, loop_state = make_ours(T, args.envs), make_loop(T, args.envs)
    for batch in (32, 512):
        run_ours(ours_state, T, args.envs, batch, 0.2)  # warm-up (compiles the kernels for this batch's types)
        ours, loop, ratio = [], [], []
        for _ in range(args.rounds):
            ours.append(run_ours(ours_state, T, args.envs, batch, args.seconds))
            loop.append(run_loop(loop_state, T, args.envs, batch, args.seconds))
            ratio.append(ours[-1] / loop[-1])
        o, lp, r = np.median(ours), np.median(loop), np.median(ratio)
        print(
            f"{batch:>6} {o:>14,.0f} {lp:>14,.0f} {r:>6.1f}x   {o * batch:>15,.0f}   "
            f"(ratio per round {min(ratio):.1f}x to {max(ratio):.1f}x)",
            flush=True,
        )


if __name__ == "__main__":
    main()
