"""Training speed of algos/dqn_atari.py and algos/catdqn_atari.py (each sampler mode) against Stable-Baselines3
DQN, same hyperparameters, same env, measured in this run once learning has started. SB3 is installed for the
benchmark only (pip install stable-baselines3).

Settings for all: 4 envs, replay ratio 8 (one batch of 32 per vector step of 4 envs), Adam 1e-4, target update
every 1,000 env steps, double DQN off (SB3's DQN has none), 100k replay, learning from step 2,000. --device
(default cpu) is given to both sides: our scripts' --device and SB3's device=, for the same comparison on a GPU.

    python benchmarks/speed/dqn_atari_vs_sb3.py [--env-id BreakoutNoFrameskip-v4] [--steps 6000] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages import from it

from benchmarks.script_speed import device_name, mean_sps, run_script

LEARN_FROM = 2000


def ours(script: str, env_id: str, steps: int, sampler: str, extra: list[str], device: str) -> float:
    """SPS of ``script`` from its first row 1,000 steps into learning to its end."""
    flags = [
        *("--env-id", env_id, "--sampler", sampler, "--total-timesteps", str(LEARN_FROM + steps)),
        *("--num-envs", "4", "--replay-ratio", "8", "--batch-size", "32", "--optimizer", "adam", "--learning-rate", "1e-4"),
        *("--target-update-interval", "1000", "--no-double-dqn", "--buffer-size", "100000"),
        *("--min-steps-learn", str(LEARN_FROM), "--log-every", "1000", "--eval-episodes", "0", "--device", device),
    ]
    return mean_sps(run_script(script, [*flags, *extra]), start=LEARN_FROM + 1000)


def sb3(env_id: str, steps: int, device: str) -> float:
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    class Clock(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t0, self.s0 = None, 0

        def _on_step(self) -> bool:
            if self.t0 is None and self.num_timesteps >= LEARN_FROM + 1000:
                self.t0, self.s0 = time.perf_counter(), self.num_timesteps
            return True

    gym.register_envs(ale_py)
    env = VecFrameStack(make_atari_env(env_id, n_envs=4, seed=1), n_stack=4)
    model = DQN(
        "CnnPolicy",
        env,
        buffer_size=100_000,
        learning_starts=LEARN_FROM,
        batch_size=32,
        train_freq=1,
        gradient_steps=1,
        target_update_interval=1000,
        learning_rate=1e-4,
        optimize_memory_usage=False,
        seed=1,
        device=device,
        verbose=0,
    )
    clock = Clock()
    model.learn(total_timesteps=LEARN_FROM + steps, callback=clock)
    sps = (model.num_timesteps - clock.s0) / (time.perf_counter() - clock.t0)
    env.close()
    return sps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--steps", type=int, default=6000, help="env steps measured after learning starts")
    p.add_argument(
        "--device", default="cpu", help="auto, cpu, cuda or cuda:N: our scripts' --device and SB3's device= (default: cpu)"
    )
    a = p.parse_args()
    base = sb3(a.env_id, a.steps, a.device)
    print(f"{a.env_id}: env steps per second once learning runs (replay ratio 8, batch 32), device {device_name(a.device)}")
    print(f"Stable-Baselines3 DQN              {base:7.1f} SPS")
    for script in ("dqn_atari.py", "catdqn_atari.py"):
        for sampler in ("serial", "parallel", "async"):
            for extra, label in (([], "fp32"), (["--bf16"], "bf16")):
                sps = ours(script, a.env_id, a.steps, sampler, extra, a.device)
                print(f"{script:<16} --sampler {sampler:<8} {label}  {sps:7.1f} SPS  {sps / base:5.2f}x SB3")


if __name__ == "__main__":
    main()
