"""What an Atari evaluation step costs, part by part, and the speed-up of the vector evaluation this bounds.

    python benchmarks/speed/eval_step_cost.py [--env-id BreakoutNoFrameskip-v4] [--envs 16] [--steps 3000]

Measures, one after the other on the cores this process may use: a step of the gymnasium Atari env (the
one-env evaluation's env), and a step of each of ``--envs`` such envs stepped at once by ``shared.evaluation``
(in one worker process per core, as ``Run.evaluate`` asks for Atari); then ``catdqn_atari.py --preset atari100k``'s
evaluation act (the Data-Efficient Rainbow network, epsilon-greedy) on a batch of 1 and of ``--envs``
observations, with torch's default threads. Prints microseconds per env step for each, and the bound they put on
the vector evaluation's speed-up over the one-env loop when no env ever waits: (gym step + batch-1 act) /
(vector step per env + batch act per observation).
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "algos")]

from shared.affinity import available_cpus
from shared.atari import make_atari_env
from shared.evaluation import Draws, _Envs, _Workers


def per_step(fn, steps: int) -> float:
    """Microseconds per call of ``fn`` over ``steps`` calls."""
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    return 1e6 * (time.perf_counter() - t) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=3000)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    row = {}

    env = make_atari_env(a.env_id)
    env.reset(seed=0)
    n_actions = env.action_space.n

    def gym_step():
        _, _, term, trunc, _ = env.step(int(rng.integers(n_actions)))
        if term or trunc:
            env.reset()

    row["gym env, one step"] = per_step(gym_step, a.steps)
    env.close()

    procs = len(available_cpus())
    envs = _Envs(_Workers([partial(make_atari_env, a.env_id) for _ in range(a.envs)], None, procs))
    every = list(range(a.envs))

    resets = [0.0]

    def step():  # an env whose episode ended takes a new seed: not counted (a seeded reset reloads the game,
        _, done = envs.step(rng.integers(n_actions, size=a.envs), every)  # once an episode in an evaluation)
        if done.any():
            t = time.perf_counter()
            envs.reset([b for b in every if done[b]], [int(rng.integers(1 << 30)) for b in every if done[b]])
            resets[0] += time.perf_counter() - t

    try:
        envs.reset(every, every)
        steps = a.steps // a.envs
        us = per_step(step, steps) - 1e6 * resets[0] / steps
        row[f"{a.envs} gym envs in {procs} processes, per env"] = us / a.envs
    finally:
        envs.host.close()

    import catdqn_atari as C

    from shared.cli import parse_args

    sys.argv = ["catdqn_atari.py", "--preset", "atari100k", "--env-id", a.env_id]
    args = parse_args(C.Args, C.PRESETS, C.check_args)
    spaces = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(n_actions)
    net = C.Policy(C.make_network(args, *spaces).eval())
    for b in (1, a.envs):
        act = partial(
            C.act, net, torch.device("cpu"), args.eval_epsilon, rng.integers(0, 256, (b, 4, 84, 84), dtype=np.uint8), Draws(b)
        )
        with torch.no_grad():
            per_step(act, 30)  # warm-up
            row[f"act, batch {b}, per observation"] = per_step(act, 300) / b
    for name, us in row.items():
        print(f"{name:42s} {us:8.0f} us")
    old = row["gym env, one step"] + row["act, batch 1, per observation"]
    new = row[f"{a.envs} gym envs in {procs} processes, per env"] + row[f"act, batch {a.envs}, per observation"]
    print(
        f"one-env loop {old:.0f} us a step, vector of {a.envs} {new:.0f} us an env step: at most {old / new:.2f}x "
        f"(torch threads {torch.get_num_threads()})"
    )


if __name__ == "__main__":
    main()
