"""Training speed of algos/ppo_atari.py (each sampler mode) against Stable-Baselines3 PPO, same hyperparameters,
same env, measured in this run. SB3 is installed for the benchmark only (pip install stable-baselines3).

Hyperparameters: the PPO paper's Atari settings (8 envs x 128 steps, 4 epochs, 4 minibatches of 256, clip 0.1,
lr 2.5e-4, gamma 0.99, lambda 0.95, entropy 0.01, value 0.5, grad-norm 0.5). SPS is agent steps per second of
the training loop (env creation excluded for SB3, included for ours). --device (default cpu) is given to both
sides: our scripts' --device and SB3's device=, so the same comparison can be taken on a GPU.

    python benchmarks/speed/ppo_atari_vs_sb3.py [--env-id BreakoutNoFrameskip-v4] [--steps 10240] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages import from it

from benchmarks.script_speed import device_name, mean_sps, run_script


def ours(env_id: str, steps: int, sampler: str, extra: list[str], device: str) -> float:
    """SPS of ppo_atari.py from the end of its first rollout to its end (start-up and the first rollout left out)."""
    flags = ["--env-id", env_id, "--total-timesteps", str(steps), "--sampler", sampler, "--eval-episodes", "0"]
    return mean_sps(run_script("ppo_atari.py", [*flags, "--device", device, *extra]))


def sb3(env_id: str, steps: int, device: str) -> float:
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    env = VecFrameStack(make_atari_env(env_id, n_envs=8, seed=1), n_stack=4)
    model = PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        batch_size=256,
        n_epochs=4,
        learning_rate=2.5e-4,
        clip_range=0.1,
        ent_coef=0.01,
        vf_coef=0.5,
        gae_lambda=0.95,
        gamma=0.99,
        max_grad_norm=0.5,
        seed=1,
        device=device,
        verbose=0,
    )
    sps = sb3_sps(model, steps)
    env.close()
    return sps


def sb3_sps(model, steps: int) -> float:
    """Train an SB3 on-policy model for ``steps`` and return its env steps per second from the end of the first
    rollout, as ours are timed (start-up and the first rollout left out)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Clock(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t_first, self.steps_first = None, 0

        def _on_rollout_end(self) -> None:
            if self.t_first is None:
                self.t_first, self.steps_first = time.perf_counter(), self.num_timesteps

        def _on_step(self) -> bool:
            return True

    clock = Clock()
    model.learn(total_timesteps=steps, callback=clock)
    return (model.num_timesteps - clock.steps_first) / (time.perf_counter() - clock.t_first)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--steps", type=int, default=10240, help="agent steps per measurement (1024 per rollout)")
    p.add_argument(
        "--device", default="cpu", help="auto, cpu, cuda or cuda:N: our scripts' --device and SB3's device= (default: cpu)"
    )
    a = p.parse_args()
    base = sb3(a.env_id, a.steps, a.device)
    print(f"{a.env_id}, {a.steps} agent steps per run, device {device_name(a.device)}")
    print(f"Stable-Baselines3 PPO                 {base:7.1f} SPS")
    for sampler in ("serial", "parallel", "async"):
        for extra, label in (([], "fp32"), (["--bf16"], "bf16")):
            sps = ours(a.env_id, a.steps, sampler, extra, a.device)
            print(f"ppo_atari.py --sampler {sampler:<8} {label}  {sps:7.1f} SPS  {sps / base:5.2f}x SB3")


if __name__ == "__main__":
    main()
