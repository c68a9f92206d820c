"""Sampling without learning on Atari (16 envs, Nature CNN policy): each sampler mode of ppo_atari.py against
what the emulator and the policy's forward pass allow, all measured in this run.

- emulator alone: random actions, no policy (gymnasium wrappers in one process; ale-py's threaded vector env)
- forward pass alone: the batched [16, 4, 84, 84] forward pass of the policy, no env
- bound: both done one after the other, 1 / (1/emulator + 1/forward) with the faster emulator
- each mode: ppo_atari.collect() filling rollouts exactly as in training (async: a sampler process filling the
  shared double buffer, the main process only handing slots back)

    python benchmarks/speed/ppo_sampling.py [--env-id BreakoutNoFrameskip-v4] [--num-envs 16] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))
import ppo_atari as P

from shared.affinity import make_affinity
from shared.buffer import buffer_from_example
from shared.envs import make_envs
from shared.procs import DoubleBuffer, Worker


def emulator_sps(envs, seconds: float) -> float:
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    n_act = envs.single_action_space.n
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        envs.step(rng.integers(0, n_act, envs.num_envs))
        steps += envs.num_envs
    return steps / (time.perf_counter() - t0)


def envs_only(env_id: str, num_envs: int, mode: str, seconds: float, threads: int | None = None) -> float:
    """Random actions in ppo_atari.py's own envs (``serial``: in the process; ``parallel``: ale-py's threads,
    ``threads`` of them or ``os.cpu_count()``): the bound the env steps alone set on a training run's SPS
    (benchmarks/gpu/check.py's figures)."""
    args = P.Args(env_id=env_id, num_envs=num_envs)
    return emulator_sps(make_envs(args, P.make_env, mode, threads or os.cpu_count() or 1), seconds)


@torch.no_grad()
def forward_sps(agent, n_envs: int, seconds: float) -> float:
    obs = torch.randint(0, 255, (n_envs, 4, 84, 84), dtype=torch.uint8)
    for _ in range(5):
        agent(obs)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        logits, _ = agent(obs)
        torch.distributions.Categorical(logits=logits).sample()
        steps += n_envs
    return steps / (time.perf_counter() - t0)


def mode_sps(args: P.Args, mode: str, seconds: float) -> float:
    example, boot_example = P.rollout_example(P.make_env(args)().observation_space, 4, args.num_envs)  # Breakout: 4 actions
    if mode == "async":
        affinity = make_affinity("async")
        buffers = DoubleBuffer(example, (args.num_steps, args.num_envs), module=P.Agent((4, 84, 84), 4))
        boots = [buffer_from_example(boot_example, (), shared=True) for _ in range(2)]
        worker = Worker(P.sampler_main, (args, buffers, boots, 0, 10**9, affinity, os.getpid()), "sampler")
        try:
            buffers.reader_acquire(0, worker.check)  # start-up done
            buffers.reader_release(0)
            k, t0 = 1, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                buffers.reader_acquire(k, worker.check)
                buffers.reader_release(k)
                k += 1
            return (k - 1) * args.num_steps * args.num_envs / (time.perf_counter() - t0)
        finally:
            worker.stop()
    envs = make_envs(args, P.make_env, mode, n_threads=os.cpu_count() or 1)
    try:
        agent = P.Agent(envs.single_observation_space.shape, envs.single_action_space.n)
        state = P.EnvState(envs, 0)
        buf = buffer_from_example(example, (args.num_steps, args.num_envs))
        boot = buffer_from_example(boot_example, ())
        P.collect(envs, agent, state, buf, boot, args, torch.device("cpu"))  # warm-up
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            P.collect(envs, agent, state, buf, boot, args, torch.device("cpu"))
            n += 1
        return n * args.num_steps * args.num_envs / (time.perf_counter() - t0)
    finally:
        envs.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--num-steps", type=int, default=32, help="rollout length used by the modes")
    p.add_argument("--seconds", type=float, default=10.0, help="time per measurement")
    a = p.parse_args()
    args = P.Args(env_id=a.env_id, num_envs=a.num_envs, num_steps=a.num_steps)
    torch.set_num_threads(len(make_affinity().learner_cpus))
    print(f"{a.env_id}, {a.num_envs} envs, {os.cpu_count()} cpus, torch threads {torch.get_num_threads()}")
    emu_serial = emulator_sps(make_envs(args, P.make_env, "serial"), a.seconds)
    emu_threads = emulator_sps(make_envs(args, P.make_env, "parallel", os.cpu_count() or 1), a.seconds)
    fwd = forward_sps(P.Agent((4, 84, 84), 4), a.num_envs, a.seconds)
    emu = max(emu_serial, emu_threads)
    bound = 1.0 / (1.0 / emu + 1.0 / fwd)
    print(f"emulator alone, gymnasium wrappers (serial)   {emu_serial:9.0f} SPS")
    print(f"emulator alone, ale-py threads                {emu_threads:9.0f} SPS")
    print(f"forward pass alone, batch {a.num_envs:<3}                {fwd:9.0f} SPS")
    print(f"bound: emulator then forward pass            {bound:9.0f} SPS  (overlapped at best: {min(emu, fwd):.0f})")
    for mode in ("serial", "parallel", "async"):
        sps = mode_sps(args, mode, a.seconds)
        print(f"mode {mode:<9} (collect, no learning)           {sps:9.0f} SPS  = {sps / bound:5.2f} of the bound")


if __name__ == "__main__":
    main()
