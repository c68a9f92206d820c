"""Recurrent PPO: algos/ppo_lstm.py against sb3-contrib's RecurrentPPO on the two memory tasks, same settings, side
by side in this run (sb3-contrib is installed for the benchmark only: pip install sb3-contrib).

The tasks, the script's presets: CartPole-v1 with the velocities removed (observation entries 0 and 2, the zoo's
CartPoleNoVel-v1) and Pendulum-v1 with the angular velocity removed (entries 0 and 1: cos and sin of the angle,
the zoo's PendulumNoVel-v1). The same filter (gymnasium's TransformObservation) feeds both sides.

Settings, both sides: rl-baselines3-zoo's hyperparams/ppo_lstm.yml for CartPoleNoVel-v1 (8 envs x 32 steps, one
minibatch of 256, 20 epochs, lr 1e-3 annealed linearly, clip 0.2, gamma 0.98, lambda 0.8, no entropy bonus, 100k
steps) and PendulumNoVel-v1 (10 epochs, lr 1e-3, clip 0.2, gamma 0.9, lambda 0.95, 4096 steps a rollout, laid out
as the preset does: 16 envs x 256 steps; 200k steps); observations and rewards normalised (ours: the presets'
--normalize-obs --normalize-reward; theirs: VecNormalize). Network: one LSTM of 64 units shared by the policy and
value heads on both sides (RecurrentPPO: lstm_hidden_size=64, shared_lstm=True, enable_critic_lstm=False); ours
puts a 64x64 tanh torso before the LSTM, RecurrentPPO its default 64x64 tanh networks after it. What differs by
design: the minibatches (ours: whole env sequences, on Pendulum 8 of 2 envs; RecurrentPPO: its batch_size of
steps, sequences cut and padded: 128 on Pendulum, the zoo's default) and exploration on Pendulum (the zoo's gSDE
is off on both sides: a state-independent log-std, as ours).

Learning: the mean return of the episodes that end in each tenth of the run, per seed, and the mean over the last
tenth. SPS: env steps per second of training from the end of the first rollout (start-up and the first rollout
left out, for both sides), CartPole task, each sampling mode of ours beside its RecurrentPPO counterpart (envs in
worker processes against SubprocVecEnv; serial and async against DummyVecEnv: RecurrentPPO has no asynchronous
sampler).

    taskset -c 0 python benchmarks/learning/ppo_lstm_vs_recurrentppo.py             # both tasks, 3 seeds, speed (50 min)
    taskset -c 0 python benchmarks/learning/ppo_lstm_vs_recurrentppo.py --seeds 1 2 --sps-steps 0    # learning runs
    taskset -c 0 python benchmarks/learning/ppo_lstm_vs_recurrentppo.py --no-learning --sps-steps 20480  # speed runs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages import from it

from benchmarks.script_speed import mean_sps, run_script

TASKS = {  # preset: (env id, observed entries, zoo settings for RecurrentPPO, steps)
    "cartpole": (
        "CartPole-v1",
        [0, 2],
        dict(
            n_steps=32,
            batch_size=256,
            n_epochs=20,
            learning_rate=1e-3,
            anneal=True,
            clip_range=0.2,
            gamma=0.98,
            gae_lambda=0.8,
        ),
        8,
    ),
    "pendulum": (
        "Pendulum-v1",
        [0, 1],
        dict(
            n_steps=256,
            batch_size=128,
            n_epochs=10,
            learning_rate=1e-3,
            anneal=False,
            clip_range=0.2,
            gamma=0.9,
            gae_lambda=0.95,
        ),
        16,
    ),
}


STEPS = {"cartpole": 100_000, "pendulum": 200_000}  # the presets' budgets


def curve(ends: list[tuple[int, float]], steps: int, bins: int = 10) -> list[float]:
    """Mean return of the episodes ending in each of ``bins`` equal stretches of the run (nan where none did)."""
    out = []
    for i in range(bins):
        lo, hi = steps * i / bins, steps * (i + 1) / bins
        r = [ret for step, ret in ends if lo < step <= hi]
        out.append(float(np.mean(r)) if r else float("nan"))
    return out


def ours(task: str, steps: int, seed: int, sampler: str = "serial", extra: tuple[str, ...] = ()) -> tuple:
    """(SPS from the end of the first rollout, [(global step, return)] of its episodes) of one ppo_lstm.py run."""
    flags = ["--preset", task, "--total-timesteps", str(steps), "--seed", str(seed), "--sampler", sampler]
    rows = run_script("ppo_lstm.py", [*flags, "--eval-episodes", "0", *extra])
    sps = mean_sps(rows)
    # Each row's mean stands for the episodes that ended since the row before, at that row's step.
    ends, seen = [], 0
    for r in rows:
        n = int(r["episodes"]) - seen
        seen = int(r["episodes"])
        if n and r["return_mean"]:
            ends += [(int(r["global_step"]), float(r["return_mean"]))] * n
    return sps, ends


def recurrent_ppo(task: str, steps: int, seed: int, subprocesses: bool = False) -> tuple:
    """(SPS from the end of the first rollout, [(step, return)] of its episodes) of one RecurrentPPO run."""
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    env_id, keep, zoo, num_envs = TASKS[task]
    s = dict(zoo)
    anneal, lr = s.pop("anneal"), s.pop("learning_rate")
    env = VecNormalize(
        make_vec_env(
            filtered_env,
            n_envs=num_envs,
            seed=seed,
            env_kwargs={"env_id": env_id, "keep": keep},
            vec_env_cls=SubprocVecEnv if subprocesses else DummyVecEnv,
        ),
        gamma=s["gamma"],
    )
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        learning_rate=(lambda f: f * lr) if anneal else lr,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        seed=seed,
        device="cpu",
        verbose=0,
        policy_kwargs=dict(lstm_hidden_size=64, shared_lstm=True, enable_critic_lstm=False),
        **s,
    )

    class Record(BaseCallback):
        def __init__(self):
            super().__init__()
            self.t_first, self.steps_first, self.ends = None, 0, []

        def _on_rollout_end(self) -> None:
            if self.t_first is None:
                self.t_first, self.steps_first = time.perf_counter(), self.num_timesteps

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # Monitor's true return (VecNormalize scales only what the agent sees)
                    self.ends.append((self.num_timesteps, float(info["episode"]["r"])))
            return True

    rec = Record()
    model.learn(total_timesteps=steps, callback=rec)
    sps = (model.num_timesteps - rec.steps_first) / (time.perf_counter() - rec.t_first)
    env.close()
    return sps, rec.ends


def filtered_env(env_id: str, keep: list[int], render_mode=None):
    """The memory task as ppo_lstm.py's make_env builds it: only the ``keep`` entries of each observation."""
    import gymnasium as gym

    env = gym.make(env_id, render_mode=render_mode)
    space, idx = env.observation_space, np.array(keep)
    return gym.wrappers.TransformObservation(
        env, lambda o: o[idx], gym.spaces.Box(space.low[idx], space.high[idx], dtype=space.dtype)
    )


def fmt(xs) -> str:
    return ", ".join("-" if np.isnan(x) else f"{x:.0f}" for x in xs)


def learning(tasks: list[str], seeds: list[int], steps: dict[str, int]) -> None:
    for task in tasks:
        n = steps[task]
        results = {"ppo_lstm.py": [], "RecurrentPPO": [], "ppo_lstm.py --no-lstm": []}
        for seed in seeds:  # interleaved, so that load drifts touch both alike
            results["ppo_lstm.py"].append(ours(task, n, seed))
            results["RecurrentPPO"].append(recurrent_ppo(task, n, seed))
            results["ppo_lstm.py --no-lstm"].append(ours(task, n, seed, extra=("--no-lstm",)))
        print(
            f"\n{task} ({TASKS[task][0]}, entries {TASKS[task][1]}), {n} steps, seeds {seeds}: mean return of "
            f"the episodes ending in each tenth of the run (mean over seeds), and the last tenth per seed"
        )
        print("| implementation | curve, tenths 1-10 | last tenth (per seed) | SPS |")
        print("| --- | --- | --- | --- |")
        for name, rs in results.items():
            curves = np.array([curve(ends, n) for _, ends in rs])
            mean = np.nanmean(curves, 0) if np.isfinite(curves).any() else curves[0]
            last = curves[:, -1]
            print(
                f"| {name} | {fmt(mean)} | {np.nanmean(last):.1f} ({fmt(last)}) | {np.mean([s for s, _ in rs]):.0f} |",
                flush=True,
            )


def speed(sps_steps: int) -> None:
    print(f"\nTraining SPS, cartpole task (8 envs x 32 steps, 20 epochs), {sps_steps} steps per run, one seed")
    base = {
        "DummyVecEnv": recurrent_ppo("cartpole", sps_steps, 1)[0],
        "SubprocVecEnv": recurrent_ppo("cartpole", sps_steps, 1, subprocesses=True)[0],
    }
    for name, sps in base.items():
        print(f"| RecurrentPPO, {name} | {sps:.0f} SPS | |", flush=True)
    for sampler, peer in (("serial", "DummyVecEnv"), ("parallel", "SubprocVecEnv"), ("async", "DummyVecEnv")):
        sps = ours("cartpole", sps_steps, 1, sampler)[0]
        print(
            f"| ppo_lstm.py --sampler {sampler} | {sps:.0f} SPS | {sps / base[peer]:.2f}x RecurrentPPO with {peer} |",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="env steps of each learning run (default: the preset's, cartpole 100k, pendulum 200k)",
    )
    p.add_argument("--sps-steps", type=int, default=20_480, help="env steps of each speed run (0: no speed runs)")
    p.add_argument("--no-learning", action="store_true", help="the speed runs alone")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)  # as our script has on one core
    if not a.no_learning:
        learning(a.tasks, a.seeds, {t: a.steps or STEPS[t] for t in a.tasks})
    if a.sps_steps:
        speed(a.sps_steps)


if __name__ == "__main__":
    main()
