"""Two checkouts' sampling loops timed in turns, chunk by chunk: a before/after that a noisy machine cannot skew.

Each side is a process serving one script's loop, as ``loop_overhead.py`` of its own checkout builds and measures it
(its stub env, ``RL_HOST_PATH=dry``, dry graphs): the loop it times first is captured, then run once per request. The
two processes take turns on one core, one chunk each, so that a neighbour who slows this machine down for a minute
slows both sides alike (timing each checkout in a run of its own moved the figures by up to 1.6x here). Printed per
script: each side's quickest chunk in µs per vector step, and the ratio.

    taskset -c 1 python benchmarks/speed/loop_overhead_vs.py OLD_CHECKOUT [SCRIPT ...] [--chunks 30]

Works with any checkout whose ``benchmarks/speed/loop_overhead.py`` has ``measure`` and ``best_us`` (issue 67 on).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def serve(root: Path, script: str) -> None:
    """The side of one checkout: its loop_overhead measures ``script`` once, the first loop it times is kept, and each
    line read from stdin runs it once and answers the seconds it took."""
    os.environ.update(RL_HOST_PATH="dry", RL_COMPILE_GRAPHS="dry", RL_COMPILE_BACKEND="eager")
    sys.path[:0] = [str(root / "benchmarks" / "speed"), str(root)]
    import loop_overhead  # that checkout's: the path above comes first
    import torch

    torch.set_num_threads(1)
    loop_overhead.compiling.WARMUP_CALLS = 0  # as its main() does
    first: list = []
    # Every timing goes through best_us_in_turns (best_us too, since the script's loop is timed in turns with the bare
    # one); a checkout from before that has best_us alone.
    name = "best_us_in_turns" if hasattr(loop_overhead, "best_us_in_turns") else "best_us"
    timed = getattr(loop_overhead, name)

    def keep_first(fns, per, chunks):
        if not first:  # the script's loop: the first that a measure times
            first.append((fns[0] if name == "best_us_in_turns" else fns, per))
        return timed(fns, per, chunks)

    setattr(loop_overhead, name, keep_first)
    out = sys.stdout
    sys.stdout = sys.stderr  # the measure's own prints stay off the answers
    loop_overhead.compiling.enable("cpu")
    with torch.inference_mode(False):
        loop_overhead.SCRIPTS[script](script, 0.0, 1)
        fn, per = first[0]
        out.write(f"{per}\n")
        out.flush()
        for _ in sys.stdin:
            t0 = time.perf_counter()
            fn()
            out.write(f"{time.perf_counter() - t0}\n")
            out.flush()


def side(root: Path, script: str) -> subprocess.Popen:
    command = [sys.executable, __file__, "--serve", str(root), script]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def race(old: Path, script: str, chunks: int) -> tuple[float, float]:
    """The quickest chunk of ``old``'s loop and of this checkout's, in µs per vector step, run in turns."""
    procs = [side(old, script), side(ROOT, script)]
    try:
        pers = [int(p.stdout.readline()) for p in procs]
        best = [float("inf")] * 2
        for _ in range(chunks):
            for i, p in enumerate(procs):
                p.stdin.write("\n")
                p.stdin.flush()
                best[i] = min(best[i], float(p.stdout.readline()) / pers[i] * 1e6)
        return best[0], best[1]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        return serve(Path(sys.argv[2]), sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="the other checkout (a git worktree of the commit before)")
    parser.add_argument("scripts", nargs="*", default=["ppo_atari", "a2c_atari", "sac_mujoco", "td3_mujoco"])
    parser.add_argument("--chunks", type=int, default=30, help="chunks each side runs; the quickest counts")
    a = parser.parse_args()
    if not (a.old / "benchmarks" / "speed" / "loop_overhead.py").exists():
        parser.error(f"{a.old} has no benchmarks/speed/loop_overhead.py")
    print(f"µs per vector step, the quickest of {a.chunks} chunks each, in turns: {a.old} against {ROOT}")
    print(f"{'script':<13}{'old':>10}{'new':>10}{'new/old':>9}")
    for script in a.scripts:
        old_us, new_us = race(a.old.resolve(), script, a.chunks)
        print(f"{script:<13}{old_us:>10.1f}{new_us:>10.1f}{new_us / old_us:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
