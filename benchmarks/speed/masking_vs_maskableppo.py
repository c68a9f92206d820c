"""Invalid-action masking: algos/ppo_atari.py against sb3-contrib's MaskablePPO on the same masked task with the
same settings, measured side by side in this run (sb3-contrib is installed for the benchmark only:
pip install sb3-contrib).

The task is tests/masked_env.py's MaskedChoice (4 states, 5 actions, 16 steps an episode): the action that would
pay most is never valid and one more is invalid in each state, so a policy that leaks any probability onto a
masked action is caught (the env raises), and the best valid action depends on the state, so the return says
whether the masked policy learns. It is tiny on purpose: the SPS compare what each library spends per step
around a small network, not the network.

Settings, both sides: 4 envs x 64 steps, 4 epochs of minibatches of 64, lr 2.5e-3 (constant), gamma 0.99,
lambda 0.95, clip 0.2, entropy 0.01, value 0.5, grad-norm 0.5, normalised advantages; ours shares a 64x64 tanh
torso between the heads, MaskablePPO's MlpPolicy has one 64x64 tanh network per head. Return: the mean over the
episodes of the last 10% of training; SPS: env steps over the training wall time.

    taskset -c 0 python benchmarks/speed/masking_vs_maskableppo.py [--steps 30000] [--seeds 1 2 3]  # one torch thread each
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages import from it

from benchmarks.script_speed import run_script

ENV = "tests.masked_env:MaskedChoice-v0"


def ours(steps: int, seed: int) -> tuple[float, float]:
    """(SPS over the whole run, mean return of the last 10% of steps) of one ppo_atari.py run."""
    flags = [
        *("--env-id", ENV, "--num-envs", "4", "--num-steps", "64", "--num-minibatches", "4", "--update-epochs", "4"),
        *("--learning-rate", "2.5e-3", "--no-anneal-lr", "--ent-coef", "0.01", "--total-timesteps", str(steps)),
        *("--log-every", "1", "--eval-episodes", "0", "--seed", str(seed)),
    ]
    rows = run_script("ppo_atari.py", flags)
    last = [float(r["return_mean"]) for r in rows if r["return_mean"] and int(r["global_step"]) > 0.9 * steps]
    return int(rows[-1]["global_step"]) / float(rows[-1]["wall_time_s"]), float(np.mean(last))


def maskable_ppo(steps: int, seed: int) -> tuple[float, float]:
    from sb3_contrib import MaskablePPO
    from sb3_contrib.common.wrappers import ActionMasker
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    from tests import masked_env

    def make():
        return Monitor(ActionMasker(masked_env.MaskedChoice(), lambda env: env.unwrapped.mask()))

    envs = DummyVecEnv([make for _ in range(4)])
    model = MaskablePPO(
        "MlpPolicy",
        envs,
        learning_rate=2.5e-3,
        n_steps=64,
        batch_size=64,
        n_epochs=4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        seed=seed,
        device="cpu",
    )
    t0 = time.perf_counter()
    model.learn(steps)
    sps = steps / (time.perf_counter() - t0)
    returns, lengths = [], []
    for env in envs.envs:
        returns += env.get_episode_rewards()
        lengths += env.get_episode_lengths()
    ends = np.cumsum(lengths) * len(envs.envs)  # roughly the global step each episode ended at
    last = [r for r, e in zip(returns, ends) if e > 0.9 * steps] or returns[-25:]
    return sps, float(np.mean(last))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)  # as the script sets for itself on one core
    results = {"ppo_atari.py": [], "MaskablePPO": []}
    for seed in a.seeds:  # interleaved, so that load drifts touch both alike
        results["ppo_atari.py"].append(ours(a.steps, seed))
        results["MaskablePPO"].append(maskable_ppo(a.steps, seed))
    print(f"MaskedChoice, {a.steps} steps, seeds {a.seeds} (best return 16; uniform over the valid actions 5.3)")
    print("| implementation | SPS (per seed) | return, last 10% (per seed) |")
    print("| --- | --- | --- |")
    for name, rs in results.items():
        sps, ret = zip(*rs)
        print(
            f"| {name} | {np.mean(sps):.0f} ({', '.join(f'{s:.0f}' for s in sps)}) | {np.mean(ret):.2f} "
            f"({', '.join(f'{r:.2f}' for r in ret)}) |"
        )
    ratio = np.mean([s for s, _ in results["ppo_atari.py"]]) / np.mean([s for s, _ in results["MaskablePPO"]])
    print(f"SPS ratio ppo_atari.py / MaskablePPO: {ratio:.2f}x")


if __name__ == "__main__":
    main()
