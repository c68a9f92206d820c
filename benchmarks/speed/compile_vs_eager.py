"""Eager against ``--compile`` for every script, side by side in one run: training SPS once everything is compiled,
and the seconds compiling took (shared/compiling.py's ``compile_s``, the backward included).

Each script runs its small preset (CartPole, Pendulum, the memory task) twice, eager then compiled, with the same
flags. SPS is taken over the same window of progress rows in both runs: from the first row at which the compiled
run has compiled all it will (its ``compiled_graphs`` at the final count; a replay script compiles its loss only
once learning starts) to the last row. On a CPU a compiled step may be no faster: small networks there are bound
by Python and the env, not by kernel launches; the figures say which.

    python benchmarks/speed/compile_vs_eager.py [--scripts ppo_atari dqn_atari ...] [--device cpu] [--backend inductor]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages import from it

from benchmarks.script_speed import mean_sps, run_script

COMMON = ["--eval-episodes", "0", "--checkpoint-minutes", "0", "--seed", "1"]
RUNS = {  # a preset each, long enough for several rows after compiling
    "ppo_atari": ["--preset", "cartpole", "--total-timesteps", "16384"],
    "a2c_atari": ["--preset", "cartpole", "--total-timesteps", "16384", "--log-every", "16"],
    "ppo_mujoco": ["--preset", "pendulum", "--total-timesteps", "16384"],
    "ppo_lstm": ["--preset", "cartpole", "--total-timesteps", "8192"],
    "dqn_atari": ["--preset", "cartpole", "--total-timesteps", "6000", "--min-steps-learn", "1000", "--log-every", "1000"],
    "catdqn_atari": ["--preset", "cartpole", "--total-timesteps", "6000", "--min-steps-learn", "1000", "--log-every", "1000"],
    "r2d1_atari": ["--preset", "memory", "--total-timesteps", "6000", "--min-steps-learn", "1000", "--log-every", "1000"],
    "sac_mujoco": ["--preset", "pendulum", "--total-timesteps", "3000", "--min-steps-learn", "500", "--log-every", "500"],
    "td3_mujoco": ["--preset", "pendulum", "--total-timesteps", "3000", "--min-steps-learn", "500", "--log-every", "500"],
    "ddpg_mujoco": ["--preset", "pendulum", "--total-timesteps", "3000", "--min-steps-learn", "500", "--log-every", "500"],
}


def progress(script: str, device: str, flags: list[str], env: dict) -> list[dict]:
    return run_script(f"{script}.py", [*RUNS[script], *COMMON, "--device", device, *flags], env=env)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scripts", nargs="+", default=list(RUNS), choices=list(RUNS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="inductor", help="RL_COMPILE_BACKEND of the compiled runs")
    a = p.parse_args()
    env = {**os.environ, "RL_COMPILE_BACKEND": a.backend}
    print(f"device {a.device}  backend {a.backend}  torch threads: the scripts' own")
    print(
        f"{'script':<14} {'eager SPS':>10} {'compiled SPS':>13} {'ratio':>7} {'compile s':>10} {'graphs':>7} "
        f"{'window (steps)':>16}"
    )
    for script in a.scripts:
        compiled = progress(script, a.device, ["--compile"], env)
        eager = progress(script, a.device, [], env)
        final = compiled[-1]["compiled_graphs"]
        first = next(i for i, r in enumerate(compiled) if r["compiled_graphs"] == final)
        first = min(first, len(compiled) - 2)  # at least one row's interval
        start = int(compiled[first]["global_step"])  # the same window in both runs
        e, c = mean_sps(eager, start), mean_sps(compiled, start)
        window = f"{compiled[first]['global_step']}..{compiled[-1]['global_step']}"
        print(
            f"{script:<14} {e:>10.0f} {c:>13.0f} {c / e:>7.2f} {float(compiled[-1]['compile_s']):>10.1f} "
            f"{final:>7} {window:>16}",
            flush=True,
        )


if __name__ == "__main__":
    main()
