"""Learning curves on CartPole-v1 for the scripts in every sampler mode, saved as one PNG with the figures
printed: steps until the last 20 episodes average the threshold, and the final row's mean return. matplotlib is
needed for the plot only (pip install matplotlib).

    python benchmarks/learning/cartpole_curves.py --full                        # on-policy scripts, whole budgets
    python benchmarks/learning/cartpole_curves.py --scripts dqn_atari.py catdqn_atari.py \
        --out benchmarks/results/cartpole_dqn.png                       # curves up to the threshold
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DQN_CARTPOLE = [
    "--num-envs",
    "4",
    "--buffer-size",
    "50000",
    "--min-steps-learn",
    "1000",
    "--batch-size",
    "64",
    "--eps-decay-steps",
    "20000",
    "--eps-end",
    "0.02",
    "--n-step-return",
    "3",
    "--replay-ratio",
    "16",
    "--learning-rate",
    "1e-3",
    "--dueling",
    "--target-update-interval",
    "250",
]
# The settings the test suite uses (tests/test_*.py), and each script's step budget and threshold there.
BUDGET = {
    "ppo_atari.py": (150_000, 450),
    "a2c_atari.py": (150_000, 450),
    "dqn_atari.py": (100_000, 475),
    "catdqn_atari.py": (100_000, 475),
}
CONFIGS = {
    "dqn_atari.py": DQN_CARTPOLE + ["--optimizer", "adam", "--log-every", "2000"],
    "catdqn_atari.py": DQN_CARTPOLE + ["--v-min", "0", "--v-max", "100", "--log-every", "2000"],
    "ppo_atari.py": [
        "--num-envs",
        "8",
        "--num-steps",
        "32",
        "--num-minibatches",
        "1",
        "--update-epochs",
        "20",
        "--gae-lambda",
        "0.8",
        "--gamma",
        "0.98",
        "--ent-coef",
        "0",
        "--learning-rate",
        "1e-3",
        "--clip-coef",
        "0.2",
        "--no-clip-vloss",
    ],
    "a2c_atari.py": [
        "--num-envs",
        "8",
        "--num-steps",
        "8",
        "--ent-coef",
        "0",
        "--gamma",
        "0.98",
        "--gae-lambda",
        "0.9",
        "--learning-rate",
        "2e-3",
        "--norm-adv",
        "--log-every",
        "10",
    ],
}


def run(script: str, sampler: str, steps: int, seed: int, threshold: float, full: bool) -> tuple[list, int | None]:
    """The step at which a run with --stop-at-return stopped (None: never) and a curve: that run's, or with
    `full` a second run's over the whole budget."""

    def command(out: str, *extra: str) -> list[str]:
        return [
            sys.executable,
            str(ROOT / "algos" / script),
            "--env-id",
            "CartPole-v1",
            "--sampler",
            sampler,
            "--total-timesteps",
            str(steps),
            "--seed",
            str(seed),
            "--eval-episodes",
            "0",
            "--out-dir",
            out,
            "--run-name",
            "c",
            *CONFIGS[script],
            *extra,
        ]

    def curve(out: str) -> list[tuple[int, float]]:
        with open(Path(out) / "c" / "progress.csv") as f:
            return [(int(r["global_step"]), float(r["return_mean"])) for r in csv.DictReader(f) if r["return_mean"]]

    reached = None
    with tempfile.TemporaryDirectory() as out:
        res = subprocess.run(command(out, "--stop-at-return", str(threshold)), check=True, capture_output=True, text=True)
        m = re.search(r"mean return of the last 20 episodes .*?(?:at step (\d+))?: stopping", res.stdout)
        rows = curve(out)
        if m:
            reached = int(m.group(1)) if m.group(1) else rows[-1][0]
    if full:
        with tempfile.TemporaryDirectory() as out:
            subprocess.run(command(out), check=True, capture_output=True, text=True)
            rows = curve(out)
    return rows, reached


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scripts", nargs="+", default=["ppo_atari.py", "a2c_atari.py"], choices=list(CONFIGS))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--full", action="store_true", help="also run each over its whole budget for the curve")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cartpole_onpolicy.png"))
    a = p.parse_args()
    curves = {}
    print(f"CartPole-v1, seed {a.seed}")
    print(f"{'script':<16} {'sampler':<9} {'budget':>7} {'steps to threshold':>19} {'final return_mean':>18}")
    for script in a.scripts:
        steps, threshold = BUDGET[script]
        for sampler in ("serial", "parallel", "async"):
            rows, reached = run(script, sampler, steps, a.seed, threshold, a.full)
            curves[(script, sampler)] = rows
            final = rows[-1][1] if rows else float("nan")
            where = f"{reached} (>= {threshold})" if reached else "not reached"
            print(f"{script:<16} {sampler:<9} {steps:>7} {where:>19} {final:>18.1f}")
    from experiments.plot import curve, figure, save

    fig, axes = figure(len(a.scripts), width=5.5, height=4)
    for ax, script in zip(axes, a.scripts):
        for sampler in ("serial", "parallel", "async"):
            curve(ax, sampler, [curves[(script, sampler)]])
        ax.axhline(BUDGET[script][1], color="gray", lw=0.8, ls="--")
        ax.set_title(f"{script} on CartPole-v1")
    save(fig, a.out, xlabel="agent steps", ylabel="mean episodic return (per progress row)")


if __name__ == "__main__":
    main()
