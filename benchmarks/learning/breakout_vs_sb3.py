"""Atari learning curves: ppo_atari.py and a2c_atari.py with their Atari defaults beside Stable-Baselines3's PPO
with rl-baselines3-zoo's Atari settings, on the same game and the same agent-step budget, each run pinned to
its own core (two run at once on a 2-core machine; a third waits for a free core).

    python benchmarks/learning/breakout_vs_sb3.py                                   # Breakout, 500k agent steps, 1 seed
    python benchmarks/learning/breakout_vs_sb3.py --steps 50000 --runs ppo ppo_bf16  # --bf16 against fp32, short budget
    python benchmarks/learning/breakout_vs_sb3.py --report-only                     # table and PNG from finished runs

Reported per run: the mean return of the last 100 whole-game episodes (unclipped score, all lives) ending at or
before each report step, the run's agent steps per second, and a PNG of the 100-episode running mean against
agent steps. SB3 is installed for the benchmark only (pip install stable-baselines3).

SB3 PPO, rl-zoo's `atari` entry for PPO: AtariWrapper (30 no-ops, frame skip 4 with max-pool, 84x84 gray,
life loss terminal for training, rewards clipped, FIRE at reset), 4-frame stack, 8 envs x 128 steps, 4 epochs,
batch 256, learning rate and clip range linear from 2.5e-4 and 0.1 to 0, entropy 0.01, value 0.5. Ours differ
in two ways the table names: no FIRE at reset, and a constant clip range (the PPO paper anneals it).
"""

from __future__ import annotations

import argparse
import csv
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RANDOM_BREAKOUT = 1.7  # random-agent score (DQN Nature paper, Extended Data Table 2)
RUNS = {  # name -> how to start it (a script of ours with extra flags, or SB3)
    "ppo": ("ppo_atari.py", []),
    "a2c": ("a2c_atari.py", []),
    "ppo_bf16": ("ppo_atari.py", ["--bf16"]),
    "sb3_ppo": ("sb3", []),
}


def sb3_ppo(env_id: str, steps: int, seed: int, out: Path) -> None:
    """Train SB3 PPO and write every finished game as a row (global_step, return, length) of episodes.csv."""
    import ale_py
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    torch.set_num_threads(len(os.sched_getaffinity(0)))

    class Episodes(BaseCallback):
        """Monitor sits inside AtariWrapper, so info['episode'] is a whole game with its raw score."""

        def __init__(self, writer):
            super().__init__()
            self.writer = writer

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.writer.writerow([self.num_timesteps, info["episode"]["r"], info["episode"]["l"]])
            return True

    def linear(start: float):
        return lambda progress_remaining: progress_remaining * start

    gym.register_envs(ale_py)
    env = VecFrameStack(make_atari_env(env_id, n_envs=8, seed=seed), n_stack=4)
    model = PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        batch_size=256,
        n_epochs=4,
        learning_rate=linear(2.5e-4),
        clip_range=linear(0.1),
        ent_coef=0.01,
        vf_coef=0.5,
        seed=seed,
        device="cpu",
        verbose=0,
    )
    t0 = time.time()
    with open(out / "episodes.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["global_step", "return", "length"])
        model.learn(total_timesteps=steps, callback=Episodes(writer))
    (out / "done.txt").write_text(f"{model.num_timesteps} {time.time() - t0:.1f}\n")
    env.close()


def ours_episodes(run_dir: Path) -> list[tuple[int, float]]:
    """Every finished game of one of our runs, from its TensorBoard events (charts/episodic_return)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("charts/episodic_return")]


def episodes(out: Path, name: str) -> tuple[list[tuple[int, float]], float | None]:
    """(global_step, return) of every finished game, and the run's agent steps per second (None: unfinished)."""
    folder = out / name
    if RUNS[name][0] == "sb3":
        with open(folder / "episodes.csv") as f:
            eps = [(int(r["global_step"]), float(r["return"])) for r in csv.DictReader(f)]
        done = folder / "done.txt"
        sps = None
        if done.exists():
            steps, secs = done.read_text().split()
            sps = int(steps) / float(secs)
        return eps, sps
    eps = ours_episodes(folder / "run")
    sps = None
    progress = folder / "run" / "progress.csv"
    if (folder / "done.txt").exists() and progress.exists():
        with open(progress) as f:
            rows = list(csv.DictReader(f))
        sps = int(rows[-1]["global_step"]) / float(rows[-1]["wall_time_s"])
    return eps, sps


def last100(eps: list[tuple[int, float]], at: int) -> tuple[float | None, int]:
    rets = [r for s, r in eps if s <= at][-100:]
    return (sum(rets) / len(rets) if rets else None), len([1 for s, _ in eps if s <= at])


def launch(name: str, cpu: int, a: argparse.Namespace, out: Path) -> int:
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    script, extra = RUNS[name]
    if script == "sb3":
        cmd = [
            sys.executable,
            __file__,
            "--sb3-worker",
            name,
            "--env-id",
            a.env_id,
            "--steps",
            str(a.steps),
            "--seed",
            str(a.seed),
            "--out-dir",
            str(out),
        ]
    else:
        cmd = [
            sys.executable,
            str(ROOT / "algos" / script),
            "--env-id",
            a.env_id,
            "--total-timesteps",
            str(a.steps),
            "--seed",
            str(a.seed),
            "--eval-episodes",
            "0",
            "--out-dir",
            str(folder),
            "--run-name",
            "run",
            *extra,
        ]
    with open(folder / "log.txt", "w") as log:
        code = subprocess.run(["taskset", "-c", str(cpu), *cmd], stdout=log, stderr=subprocess.STDOUT).returncode
    if code == 0 and script != "sb3":
        (folder / "done.txt").write_text("0\n")
    return code


def report(a: argparse.Namespace, out: Path) -> None:
    marks = sorted({m for m in (100_000, 250_000, 500_000, a.steps) if m <= a.steps})
    print(f"{a.env_id}, {a.steps} agent steps ({4 * a.steps} frames), seed {a.seed} (one seed per run)")
    print(f"mean return of the last 100 games at each step (games counted so far); random agent {RANDOM_BREAKOUT} on Breakout")
    print(f"{'run':<10}" + "".join(f"{m:>20}" for m in marks) + f"{'SPS':>9}")
    curves = {}
    for name in a.runs:
        try:
            eps, sps = episodes(out, name)
        except (OSError, KeyError) as e:
            print(f"{name:<10} no data ({type(e).__name__}: {e})")
            continue
        curves[name] = eps
        cells = []
        for m in marks:
            mean, n = last100(eps, m)
            cells.append(f"{mean:.1f} ({n})" if mean is not None and (eps and eps[-1][0] >= m or sps) else "-")
        print(f"{name:<10}" + "".join(f"{c:>20}" for c in cells) + (f"{sps:>9.0f}" if sps else f"{'-':>9}"))
    if not curves:
        return
    from experiments.plot import curve, figure, save

    fig, (ax,) = figure()
    for name, eps in curves.items():
        curve(ax, name, [eps], window=100)
    ax.axhline(RANDOM_BREAKOUT, color="gray", lw=0.8, ls="--", label="random")
    save(
        fig,
        a.png,
        xlabel="agent steps (4 frames each)",
        ylabel="game score, mean of the last 100 games",
        title=f"{a.env_id}, seed {a.seed}",
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--steps", type=int, default=500_000, help="agent steps per run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", nargs="+", default=["ppo", "sb3_ppo", "a2c"], choices=list(RUNS))
    p.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "out" / "atari_learning"))
    p.add_argument("--png", default=str(ROOT / "benchmarks" / "results" / "atari_breakout.png"))
    p.add_argument("--report-only", action="store_true", help="read finished (or running) runs, start nothing")
    p.add_argument("--sb3-worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    out = Path(a.out_dir).resolve()
    if a.sb3_worker:
        sb3_ppo(a.env_id, a.steps, a.seed, out / a.sb3_worker)
        return
    if not a.report_only:
        cpus = queue.Queue()
        for c in sorted(os.sched_getaffinity(0)):
            cpus.put(c)

        def one(name: str) -> None:
            cpu = cpus.get()
            t0 = time.time()
            print(f"{name}: started on cpu {cpu}", flush=True)
            code = launch(name, cpu, a, out)
            print(f"{name}: exit {code} after {time.time() - t0:.0f} s (log {out / name / 'log.txt'})", flush=True)
            cpus.put(cpu)

        threads = [threading.Thread(target=one, args=(n,)) for n in a.runs]
        for t in threads:  # each waits for a free core, in the order given
            t.start()
            time.sleep(0.5)
        for t in threads:
            t.join()
    report(a, out)


if __name__ == "__main__":
    main()
