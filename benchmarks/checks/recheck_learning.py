"""The cheap learning figures, re-measured: every preset that learns in minutes on one core, several seeds each,
today's figure printed beside the published one, so that a change that moves them (a last-bit change in the
float order included) is seen before it lands.

    taskset -c 0 python benchmarks/checks/recheck_learning.py                        # every figure, the published seeds
    taskset -c 0 python benchmarks/checks/recheck_learning.py --figures ppo_lstm_cartpole --seeds 1 2 3 4 5 6 7 8 9 10
    taskset -c 0 python benchmarks/checks/recheck_learning.py --record               # today's become the published figures

The figure of a run: the mean return of the episodes that end in the last tenth of its steps (training episodes,
the true returns; from progress.csv, each row's mean standing for the episodes that ended since the row before).
A figure is the mean over seeds, with a 95% percentile-bootstrap interval over the seeds (2,000 resamples). The
published figures, with the commit and command that produced them and every seed's value, are in
``benchmarks/results/recheck.json``; the table in benchmarks/results/README.md is printed by ``--markdown``.
Run it pinned to one core (``taskset -c N``): the scripts then use one torch thread, and the figures depend on
the thread count (and on the CPU: last-bit differences grow into different runs).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "benchmarks" / "results" / "recheck.json"

# name: (script, flags). Each is a preset's whole budget, no early stop, no evaluation.
FIGURES = {
    "ppo_cartpole": ("ppo_atari.py", ["--preset", "cartpole"]),
    "a2c_cartpole": ("a2c_atari.py", ["--preset", "cartpole"]),
    "dqn_cartpole": ("dqn_atari.py", ["--preset", "cartpole"]),
    "c51_cartpole": ("catdqn_atari.py", ["--preset", "cartpole"]),
    "ppo_invertedpendulum": ("ppo_mujoco.py", ["--preset", "pendulum"]),
    "ddpg_pendulum": ("ddpg_mujoco.py", ["--preset", "pendulum"]),
    "td3_pendulum": ("td3_mujoco.py", ["--preset", "pendulum"]),
    "sac_pendulum": ("sac_mujoco.py", ["--preset", "pendulum"]),
    "ppo_lstm_cartpole": ("ppo_lstm.py", ["--preset", "cartpole"]),
    "ppo_lstm_pendulum": ("ppo_lstm.py", ["--preset", "pendulum"]),
    "r2d1_memory": ("r2d1_atari.py", ["--preset", "memory"]),
}


def last_tenth(progress_csv: Path) -> float:
    """Mean return of the episodes ending in the last tenth of the run's steps (nan if none did)."""
    with open(progress_csv) as f:
        rows = list(csv.DictReader(f))
    total = int(rows[-1]["global_step"])
    returns, weights, seen = [], [], 0
    for r in rows:
        n, seen = int(r["episodes"]) - seen, int(r["episodes"])
        if n and r["return_mean"] and int(r["global_step"]) > 0.9 * total:
            returns.append(float(r["return_mean"]))
            weights.append(n)
    return float(np.average(returns, weights=weights)) if weights else float("nan")


def one_run(name: str, seed: int, log: Path | None) -> tuple[float, float]:
    """(figure, wall seconds) of one seed of ``name``."""
    script, flags = FIGURES[name]
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            str(ROOT / "algos" / script),
            *flags,
            "--seed",
            str(seed),
            "--eval-episodes",
            "0",
            "--out-dir",
            out,
            "--run-name",
            "r",
        ]
        t = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t
        if log is not None:
            log.write_text(done.stdout[-20000:] + done.stderr[-20000:])
        if done.returncode != 0:
            raise RuntimeError(f"{name} seed {seed}: exit {done.returncode}\n{done.stderr[-3000:]}")
        return last_tenth(Path(out) / "r" / "progress.csv"), wall


def interval(values: list[float], resamples: int = 2000) -> tuple[float, float, float]:
    """Mean and a 95% percentile-bootstrap interval of the mean over the seeds."""
    v = np.asarray(values, float)
    if len(v) < 2:
        return float(v.mean()), float("nan"), float("nan")
    means = np.random.default_rng(0).choice(v, (resamples, len(v))).mean(1)
    return float(v.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def fmt(values: list[float]) -> str:
    mean, lo, hi = interval(values)
    return f"{mean:.1f}" + ("" if np.isnan(lo) else f" [{lo:.1f}, {hi:.1f}]")


def verdict(published: list[float], today: list[float]) -> str:
    """'holds' when today's mean lies inside the published interval or the two intervals overlap."""
    p, t = interval(published), interval(today)
    if np.isnan(p[1]) or np.isnan(t[1]):
        return "-"
    return "holds" if (p[1] <= t[0] <= p[2]) or (t[1] <= p[2] and t[2] >= p[1]) else "MOVED"


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "algos", "shared"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return (head.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def cpu() -> str:
    """The CPU's model name: the figures depend on it (last-bit differences of its kernels)."""
    try:
        return next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def markdown(published: dict) -> str:
    lines = ["| figure | command | seeds | mean [95% interval] | per seed | commit |", "| --- | --- | --- | --- | --- | --- |"]
    for name, rec in published.items():
        lines.append(
            f"| {name} | `{rec['command']}` | {len(rec['values'])} | {fmt(rec['values'])} | "
            f"{', '.join(f'{v:.0f}' for v in rec['values'])} | {rec['commit']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figures", nargs="+", choices=sorted(FIGURES), default=list(FIGURES))
    parser.add_argument("--seeds", nargs="+", type=int, help="default: the published figure's seeds, or 1-5")
    parser.add_argument("--record", action="store_true", help="write today's figures as the published ones")
    parser.add_argument("--markdown", action="store_true", help="print the published table and stop")
    parser.add_argument("--logs", type=Path, help="keep each run's console output in this folder")
    args = parser.parse_args()
    published = json.loads(PUBLISHED.read_text()) if PUBLISHED.exists() else {}
    if args.markdown:
        print(markdown(published))
        return 0
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    today_commit = commit()
    print(f"{'figure':<22} {'published':<32} {'today (' + today_commit + ')':<32} verdict   per seed today")
    for name in args.figures:
        pub = published.get(name)
        seeds = args.seeds or (pub["seeds"] if pub else [1, 2, 3, 4, 5])
        values, walls = [], []
        for s in seeds:
            v, wall = one_run(name, s, args.logs / f"{name}-{s}.log" if args.logs else None)
            values.append(v)
            walls.append(wall)
        shown = f"{fmt(pub['values'])} ({len(pub['values'])}, {pub['commit']})" if pub else "-"
        print(
            f"{name:<22} {shown:<32} {fmt(values):<32} {verdict(pub['values'], values) if pub else '-':<9} "
            f"{', '.join(f'{v:.0f}' for v in values)}  ({np.mean(walls):.0f} s a run)",
            flush=True,
        )
        if args.record:  # read again first: another recheck may have recorded other figures meanwhile
            script, flags = FIGURES[name]
            published = json.loads(PUBLISHED.read_text()) if PUBLISHED.exists() else {}
            published[name] = {
                "command": f"python algos/{script} {' '.join(flags)} --seed S",
                "seeds": seeds,
                "values": [round(v, 2) for v in values],
                "commit": today_commit,
                "date": time.strftime("%Y-%m-%d"),
                "cpu": cpu(),
                "cores": len(os.sched_getaffinity(0)),
                "seconds_a_run": round(float(np.mean(walls))),
            }
            PUBLISHED.write_text(json.dumps(published, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
