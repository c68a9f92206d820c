"""Learning curves of algos/ddpg_mujoco.py, td3_mujoco.py and sac_mujoco.py on Pendulum-v1 in every sampler mode
(the test suite's settings, whole budget, no early stop), and of those and ppo_mujoco.py on HalfCheetah-v5
(defaults, serial) for a wall-clock budget, each on one CPU. Saves one PNG per env and prints, per run, the step
at which the last 10 episodes first averaged the threshold (Pendulum: -250) and the final mean return.

    python benchmarks/learning/continuous_curves.py pendulum --steps 20000
    python benchmarks/learning/continuous_curves.py halfcheetah --minutes 30     # each script on one CPU
    python benchmarks/learning/continuous_curves.py halfcheetah --scripts ppo_mujoco.py --out ppo.png
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["ddpg_mujoco.py", "td3_mujoco.py", "sac_mujoco.py"]  # Pendulum (replay scripts' flags)
HALFCHEETAH = [*SCRIPTS, "ppo_mujoco.py"]


def episodes(folder: Path) -> list[tuple[int, float]]:
    """(global_step, return) of every episode, from the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("charts/episodic_return")]


def first_reached(eps: list[tuple[int, float]], threshold: float, window: int = 10) -> int | None:
    for i in range(window, len(eps) + 1):
        if sum(r for _, r in eps[i - window : i]) / window >= threshold:
            return eps[i - 1][0]
    return None


def pendulum(steps: int, out_png: Path) -> None:
    curves = {}
    for script in SCRIPTS:
        for sampler in ("serial", "parallel", "async"):
            n = "2" if sampler == "parallel" else "1"
            with tempfile.TemporaryDirectory() as out:
                subprocess.run(
                    [
                        sys.executable,
                        str(ROOT / "algos" / script),
                        "--env-id",
                        "Pendulum-v1",
                        "--sampler",
                        sampler,
                        "--num-envs",
                        n,
                        "--min-steps-learn",
                        "1000",
                        "--total-timesteps",
                        str(steps),
                        "--log-every",
                        "1000",
                        "--eval-episodes",
                        "0",
                        "--out-dir",
                        out,
                        "--run-name",
                        "p",
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                eps = episodes(Path(out) / "p")
            reached = first_reached(eps, -250.0)
            last = sum(r for _, r in eps[-10:]) / len(eps[-10:])
            print(
                f"Pendulum-v1  {script:<15} {sampler:<8} mean of 10 >= -250 at step "
                f"{reached if reached else 'never':>6}  last 10 episodes {last:8.1f}",
                flush=True,
            )
            curves[f"{script} {sampler}"] = eps
    plot(curves, "Pendulum-v1 (episode returns, mean of 10)", out_png)


def halfcheetah(minutes: float, scripts: list[str], out_png: Path) -> None:
    """Each script serial with its defaults for `minutes` of wall clock (or its 1M steps, if sooner), pinned to one
    CPU of its own (so a script trains with one torch thread); as many at once as there are CPUs, the rest after
    them."""
    out = Path(tempfile.mkdtemp())
    cpus = sorted(os.sched_getaffinity(0))
    curves = {}
    for first in range(0, len(scripts), len(cpus)):
        group = scripts[first : first + len(cpus)]
        procs = {
            s: subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "algos" / s),
                    "--total-timesteps",
                    "1000000",
                    "--log-every",
                    "5000",
                    "--eval-episodes",
                    "0",
                    "--out-dir",
                    str(out),
                    "--run-name",
                    s,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=lambda c=cpu: os.sched_setaffinity(0, {c}),
            )
            for s, cpu in zip(group, cpus)
        }
        deadline = time.time() + minutes * 60
        while time.time() < deadline and any(p.poll() is None for p in procs.values()):
            time.sleep(1.0)
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in procs.values():
            p.wait()
        for s in group:
            eps = episodes(out / s)
            with open(out / s / "progress.csv") as f:
                rows = list(csv.DictReader(f))
            returns = [r for _, r in eps]
            last = sum(returns[-5:]) / max(len(returns[-5:]), 1)
            best = max((sum(returns[i - 5 : i]) / 5 for i in range(5, len(returns) + 1)), default=0.0)
            steps = int(rows[-1]["global_step"]) if rows else 0
            took = float(rows[-1]["wall_time_s"]) / 60 if rows else 0.0
            print(
                f"HalfCheetah-v5  {s:<15} {steps:>7} steps in {took:4.1f} min "
                f"(one CPU)  last 5 episodes {last:8.1f}  best mean of 5 {best:8.1f}",
                flush=True,
            )
            curves[s] = eps
    plot(curves, f"HalfCheetah-v5, {minutes:.0f} minutes each on one CPU (episode returns, mean of 5)", out_png, window=5)


def plot(curves: dict, title: str, out_png: Path, window: int = 10) -> None:
    from experiments.plot import curve, figure, save

    fig, (ax,) = figure(width=9, height=5)
    for label, eps in curves.items():
        curve(ax, label, [eps], window=window)
    save(fig, out_png, title=title)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("env", choices=["pendulum", "halfcheetah"])
    p.add_argument("--steps", type=int, default=20_000, help="Pendulum: env steps per run")
    p.add_argument("--minutes", type=float, default=30.0, help="HalfCheetah: wall-clock minutes")
    p.add_argument("--scripts", nargs="+", default=HALFCHEETAH, choices=HALFCHEETAH, help="HalfCheetah: which")
    p.add_argument("--out", type=Path, default=None, help="the PNG (default benchmarks/results/{env}_continuous.png)")
    a = p.parse_args()
    results = ROOT / "benchmarks" / "results"
    if a.env == "pendulum":
        pendulum(a.steps, a.out or results / "pendulum_continuous.png")
    else:
        halfcheetah(a.minutes, a.scripts, a.out or results / "halfcheetah_continuous.png")


if __name__ == "__main__":
    main()
