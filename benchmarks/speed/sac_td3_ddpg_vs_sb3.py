"""Training speed of algos/sac_mujoco.py, td3_mujoco.py and ddpg_mujoco.py against Stable-Baselines3's SAC, TD3 and
DDPG with the same hyperparameters, same env, in this run, measured once learning has started. SB3 is installed
for the benchmark only (pip install stable-baselines3).

Settings for all: one env, one update of batch 256 per env step, 256x256 actor and critics, Adam 3e-4, tau
0.005, 100k replay, learning from step 1,000; TD3 with policy delay 2 and smoothing noise 0.2/0.5, SAC with
automatic entropy tuning. --device (default cpu) is given to both sides: our scripts' --device and SB3's
device=, for the same comparison on a GPU.

    python benchmarks/speed/sac_td3_ddpg_vs_sb3.py [--env-id HalfCheetah-v5] [--steps 3000] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages import from it

from benchmarks.script_speed import device_name, mean_sps, run_script

LEARN_FROM = 1000
SCRIPTS = {"sac": "sac_mujoco.py", "td3": "td3_mujoco.py", "ddpg": "ddpg_mujoco.py"}


# The script under cProfile from the first step of the timed window on (compiling, start-up and the first 500
# learning steps are left out: they would fill the table): runpy, not `python -m cProfile`, since the script must be
# sys.modules["__main__"] for tyro to read its Args; a failing script's exit code is kept.
PROFILE_CODE = f"""import cProfile, runpy, sys
sys.path.insert(0, {str(ROOT)!r})
import shared.run
start, out, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.argv = sys.argv[3:]
prof = cProfile.Profile()
periodic = shared.run.Run.periodic
def timed(self, global_step, *args, **kwargs):
    if global_step >= start and not timed.on:
        timed.on = True
        prof.enable()
    return periodic(self, global_step, *args, **kwargs)
timed.on = False
shared.run.Run.periodic = timed
try:
    runpy.run_path(script, run_name="__main__")
finally:
    prof.disable()
    prof.dump_stats(out)
"""


def ours(script: str, env_id: str, steps: int, sampler: str, extra: list[str], device: str, profile_top: int = 0) -> float:
    """SPS of ``script`` after its first 500 learning steps. With ``profile_top``, those steps run under cProfile
    (slower: the figure is not comparable) and the ``profile_top`` functions with the most time of their own are
    printed to stderr: where the host's time per step goes (on a GPU, what sets the pace once the updates are CUDA
    graphs)."""
    start = LEARN_FROM + 500
    flags = [
        *("--env-id", env_id, "--sampler", sampler, "--total-timesteps", str(start + steps), "--buffer-size", "100000"),
        *("--min-steps-learn", str(LEARN_FROM), "--log-every", "500", "--eval-episodes", "0", "--device", device),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        prof = Path(tmp) / "prof.out"
        python_args = ["-c", PROFILE_CODE, str(start), str(prof)] if profile_top else []
        rows = run_script(script, [*flags, *extra], python_args)
        if profile_top:
            import pstats

            pstats.Stats(str(prof), stream=sys.stderr).sort_stats("tottime").print_stats(profile_top)
    return mean_sps(rows, start=start)


def sb3(algo: str, env_id: str, steps: int, device: str) -> float:
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import DDPG, SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    env = gym.make(env_id)
    common = dict(
        learning_starts=LEARN_FROM,
        batch_size=256,
        buffer_size=100_000,
        learning_rate=3e-4,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        seed=1,
        device=device,
        verbose=0,
        policy_kwargs=dict(net_arch=[256, 256]),
    )
    n = env.action_space.shape[0]
    noise = NormalActionNoise(np.zeros(n), 0.1 * np.ones(n))
    if algo == "sac":
        model = SAC("MlpPolicy", env, **common)
    elif algo == "td3":
        model = TD3(
            "MlpPolicy", env, action_noise=noise, policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5, **common
        )
    else:
        model = DDPG("MlpPolicy", env, action_noise=noise, **common)
    model.learn(LEARN_FROM + 500)
    t0 = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    sps = steps / (time.perf_counter() - t0)
    env.close()
    return sps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="HalfCheetah-v5")
    p.add_argument("--steps", type=int, default=3000, help="env steps measured after learning starts")
    p.add_argument(
        "--device", default="cpu", help="auto, cpu, cuda or cuda:N: our scripts' --device and SB3's device= (default: cpu)"
    )
    a = p.parse_args()
    print(
        f"{a.env_id}: env steps per second once learning runs (one update of batch 256 per step), "
        f"device {device_name(a.device)}"
    )
    for algo, script in SCRIPTS.items():
        base = sb3(algo, a.env_id, a.steps, a.device)
        print(f"Stable-Baselines3 {algo.upper():<5}                 {base:7.1f} SPS", flush=True)
        for sampler, extra, label in (
            ("serial", [], "fp32"),
            ("serial", ["--bf16"], "bf16"),
            ("parallel", [], "fp32"),
            ("async", [], "fp32"),
        ):
            sps = ours(script, a.env_id, a.steps, sampler, extra, a.device)
            print(f"{script:<15} --sampler {sampler:<8} {label}  {sps:7.1f} SPS  {sps / base:5.2f}x SB3", flush=True)


if __name__ == "__main__":
    main()
