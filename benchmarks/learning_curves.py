"""Learning curves on CartPole-v1 for the on-policy scripts in every sampler mode, saved as one PNG with the
figures printed: steps to a mean return of 450 over the last 20 episodes and the final row's mean return.
matplotlib is needed for the plot only (pip install matplotlib).

    python benchmarks/learning_curves.py [--steps 150000] [--out benchmarks/results/cartpole_onpolicy.png]
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The settings the test suite uses (tests/test_ppo.py, tests/test_a2c.py).
CONFIGS = {
    "ppo_atari.py": ["--num-envs", "8", "--num-steps", "32", "--num-minibatches", "1", "--update-epochs", "20",
                     "--gae-lambda", "0.8", "--gamma", "0.98", "--ent-coef", "0", "--learning-rate", "1e-3",
                     "--clip-coef", "0.2", "--no-clip-vloss"],
    "a2c_atari.py": ["--num-envs", "8", "--num-steps", "8", "--ent-coef", "0", "--gamma", "0.98", "--gae-lambda", "0.9",
                     "--learning-rate", "2e-3", "--norm-adv", "--log-every", "10"],
}


def run(script: str, sampler: str, steps: int, seed: int) -> tuple[list[tuple[int, float]], int | None]:
    """The curve of a full run, and the step at which a run with --stop-at-return 450 stopped (None: never)."""

    def command(out: str, *extra: str) -> list[str]:
        return [sys.executable, str(ROOT / "algos" / script), "--env-id", "CartPole-v1", "--sampler", sampler,
                "--total-timesteps", str(steps), "--seed", str(seed), "--eval-episodes", "0", "--out-dir", out,
                "--run-name", "c", *CONFIGS[script], *extra]

    with tempfile.TemporaryDirectory() as out:
        subprocess.run(command(out), check=True, capture_output=True, text=True)
        with open(Path(out) / "c" / "progress.csv") as f:
            rows = [(int(r["global_step"]), float(r["return_mean"])) for r in csv.DictReader(f) if r["return_mean"]]
    reached = None
    with tempfile.TemporaryDirectory() as out:
        res = subprocess.run(command(out, "--stop-at-return", "450"), check=True, capture_output=True, text=True)
        if re.search(r"mean return of the last 20 episodes", res.stdout):
            with open(Path(out) / "c" / "progress.csv") as f:
                reached = int(list(csv.DictReader(f))[-1]["global_step"])
    return rows, reached


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cartpole_onpolicy.png"))
    a = p.parse_args()
    curves = {}
    print(f"CartPole-v1, {a.steps} steps, seed {a.seed}")
    print(f"{'script':<14} {'sampler':<9} {'steps to 450':>13} {'final return_mean':>18}")
    for script in CONFIGS:
        for sampler in ("serial", "parallel", "async"):
            rows, reached = run(script, sampler, a.steps, a.seed)
            curves[(script, sampler)] = rows
            final = rows[-1][1] if rows else float("nan")
            print(f"{script:<14} {sampler:<9} {reached if reached else 'not reached':>13} {final:>18.1f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CONFIGS), figsize=(11, 4), sharey=True)
    for ax, script in zip(axes, CONFIGS):
        for sampler in ("serial", "parallel", "async"):
            xs, ys = zip(*curves[(script, sampler)]) if curves[(script, sampler)] else ((), ())
            ax.plot(xs, ys, label=sampler)
        ax.axhline(450, color="gray", lw=0.8, ls="--")
        ax.set_title(f"{script} on CartPole-v1")
        ax.set_xlabel("agent steps")
        ax.legend()
    axes[0].set_ylabel("mean episodic return (per progress row)")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(a.out, dpi=100)
    print(f"saved {a.out}")


if __name__ == "__main__":
    main()
