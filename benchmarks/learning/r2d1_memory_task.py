"""Learning curves of algos/r2d1_atari.py on the memory task (CartPole-v1 with the velocities removed) in every
sampler mode, and of its feed-forward ablation (--no-recurrent, serial), with the test suite's settings. Saves a
PNG and prints each run's mean return over its last 6k steps. matplotlib is needed for the plot only.

    python benchmarks/learning/r2d1_memory_task.py [--steps 30000]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.test_r2d1 import MEMORY_TASK  # the settings the test suite uses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30_000)
    a = p.parse_args()
    curves = {}
    for label, extra in (
        ("LSTM serial", ["--sampler", "serial"]),
        ("LSTM parallel", ["--sampler", "parallel"]),
        ("LSTM async", ["--sampler", "async"]),
        ("feed-forward serial", ["--no-recurrent"]),
    ):
        with tempfile.TemporaryDirectory() as out:
            subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "algos" / "r2d1_atari.py"),
                    *MEMORY_TASK,
                    *extra,
                    "--total-timesteps",
                    str(a.steps),
                    "--log-every",
                    "2000",
                    "--out-dir",
                    out,
                    "--run-name",
                    "m",
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            with open(Path(out) / "m" / "progress.csv") as f:
                rows = [(int(r["global_step"]), float(r["return_mean"])) for r in csv.DictReader(f) if r["return_mean"]]
        last = sum(r for _, r in rows[-3:]) / len(rows[-3:])
        print(f"{label:<22} mean return over the last 6k steps {last:6.1f}", flush=True)
        curves[label] = rows
    from experiments.plot import curve, figure, save

    fig, (ax,) = figure(width=8)
    for label, rows in curves.items():
        curve(ax, label, [rows])
    save(
        fig,
        ROOT / "benchmarks" / "results" / "r2d1_memory_task.png",
        ylabel="mean episode return (per 2k steps)",
        title="R2D1 memory task: CartPole-v1 without velocities",
    )


if __name__ == "__main__":
    main()
