"""Training speed of algos/ppo_mujoco.py (each sampler mode) against Stable-Baselines3 PPO with VecNormalize, same
hyperparameters, same env, measured in this run. SB3 is installed for the benchmark only (pip install
stable-baselines3).

Hyperparameters: the PPO paper's MuJoCo settings, the script's default preset and SB3's PPO defaults (2048 steps
per rollout, 10 epochs, minibatches of 64, clip 0.2, lr 3e-4, gamma 0.99, lambda 0.95, separate 64x64 tanh policy
and value networks, state-independent log-std), observations and rewards normalised. SPS is env steps per second
of the training loop from the end of the first rollout (start-up and the first rollout left out, for both).
--device (default cpu) is given to both sides: our script's --device and SB3's device=, for the same comparison on
a GPU.

    python benchmarks/speed/ppo_mujoco_vs_sb3.py [--env-id HalfCheetah-v5] [--steps 20480] [--num-envs 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages import from it

from benchmarks.script_speed import device_name, mean_sps, run_script


def ours(env_id: str, steps: int, num_envs: int, sampler: str, device: str, extra: tuple = ()) -> float:
    """SPS of ppo_mujoco.py from the end of its first rollout to its end."""
    flags = [
        *("--env-id", env_id, "--total-timesteps", str(steps), "--num-envs", str(num_envs)),
        *("--num-steps", str(2048 // num_envs), "--sampler", sampler, "--eval-episodes", "0", "--device", device),
    ]
    return mean_sps(run_script("ppo_mujoco.py", [*flags, *extra]))


def sb3(env_id: str, steps: int, num_envs: int, subprocesses: bool, device: str) -> float:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    from benchmarks.speed.ppo_atari_vs_sb3 import sb3_sps

    vec_env_cls = SubprocVecEnv if subprocesses else DummyVecEnv
    env = VecNormalize(make_vec_env(env_id, n_envs=num_envs, seed=1, vec_env_cls=vec_env_cls), gamma=0.99)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=2048 // num_envs,
        batch_size=64,
        n_epochs=10,
        learning_rate=3e-4,
        clip_range=0.2,
        ent_coef=0.0,
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="HalfCheetah-v5")
    p.add_argument("--steps", type=int, default=20480, help="env steps per measurement (2048 per rollout)")
    p.add_argument("--num-envs", type=int, default=1, help="envs per rollout (2048 / num_envs steps each)")
    p.add_argument(
        "--device", default="cpu", help="auto, cpu, cuda or cuda:N: our scripts' --device and SB3's device= (default: cpu)"
    )
    a = p.parse_args()
    print(f"{a.env_id}, {a.num_envs} env(s), {a.steps} env steps per run, 2048 per rollout, device {device_name(a.device)}")
    base = {
        "DummyVecEnv": sb3(a.env_id, a.steps, a.num_envs, False, a.device),
        "SubprocVecEnv": sb3(a.env_id, a.steps, a.num_envs, True, a.device),
    }
    for name, sps in base.items():
        print(f"Stable-Baselines3 PPO, {name:<14}  {sps:7.1f} SPS", flush=True)
    # Each mode beside SB3's counterpart: envs in worker processes against SubprocVecEnv, the others against the
    # envs in the training process (SB3 has no asynchronous sampler).
    for sampler, peer in (("serial", "DummyVecEnv"), ("parallel", "SubprocVecEnv"), ("async", "DummyVecEnv")):
        sps = ours(a.env_id, a.steps, a.num_envs, sampler, a.device)
        print(
            f"ppo_mujoco.py --sampler {sampler:<8}      {sps:7.1f} SPS  {sps / base[peer]:5.2f}x SB3 with {peer}", flush=True
        )


if __name__ == "__main__":
    main()
