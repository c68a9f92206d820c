"""Data-parallel scaling under torchrun: training SPS and returns against env steps for 1, 2, ... ranks of one
script, side by side in this run, on this machine.

Two ways to add ranks, both reported:
- weak scaling: every rank keeps ``--num-envs``, so the job's batch and SPS should grow with the ranks
  (efficiency = SPS(n) / (n x SPS(1)));
- strong scaling: the job's envs stay fixed (``--num-envs`` / n per rank), so the learning problem is the same
  and returns against steps should match one process's (speed-up = SPS(n) / SPS(1)).
Every run uses the whole machine: one rank gets every core, n ranks split them (shared/affinity.py). On a
machine with fewer cores than ranks x (learner + sampler), the ranks compete and the efficiency says so.
SPS is measured from the first progress row to the last (start-up and the first rollout left out).

    python benchmarks/speed/distributed_scaling.py                       # PPO on CartPole, 1 and 2 ranks
    python benchmarks/speed/distributed_scaling.py --script ppo_atari.py --env-id BreakoutNoFrameskip-v4 \\
        --steps 200000 --ranks 1 2 4 --extra --device cuda         # a GPU machine: one GPU per rank
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages import from it

from benchmarks.script_speed import ScriptFailed, mean_sps, run_script

PPO_CARTPOLE = [
    "--num-steps",
    "32",
    "--num-minibatches",
    "1",
    "--update-epochs",
    "20",
    "--gae-lambda",
    "0.8",
    "--gamma",
    "0.98",
    "--ent-coef",
    "0",
    "--learning-rate",
    "1e-3",
    "--clip-coef",
    "0.2",
    "--no-clip-vloss",
]


def train(script: str, env_id: str, steps: int, ranks: int, num_envs: int, seed: int, extra: list[str]) -> dict:
    """One job of ``ranks`` ranks; returns its SPS (first progress row to last), wall time and (step, return_mean)
    rows."""
    flags = [
        *("--env-id", env_id, "--total-timesteps", str(steps), "--num-envs", str(num_envs), "--seed", str(seed)),
        *("--eval-episodes", "0", *extra),
    ]
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    t0 = time.perf_counter()
    try:
        rows = run_script(script, flags, torchrun)
    except ScriptFailed as e:
        raise SystemExit(str(e)) from None
    wall = time.perf_counter() - t0
    curve = [(int(r["global_step"]), float(r["return_mean"])) for r in rows if r["return_mean"]]
    return {"sps": mean_sps(rows), "wall": wall, "curve": curve}


def at(curve: list[tuple[int, float]], step: int, window: int = 5) -> float | None:
    """Mean of the ``window`` return_mean values logged at or before ``step``."""
    before = [r for s, r in curve if s <= step][-window:]
    return sum(before) / len(before) if before else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--script", default="ppo_atari.py")
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--steps", type=int, default=100_000, help="the job's env steps per run")
    p.add_argument("--num-envs", type=int, default=8, help="envs per rank for weak scaling; the job's for strong")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument(
        "--extra",
        nargs=argparse.REMAINDER,
        default=None,
        help="flags passed to the script (default for ppo_atari.py on CartPole: rl-zoo's settings)",
    )
    a = p.parse_args()
    extra = (
        a.extra if a.extra is not None else (PPO_CARTPOLE if a.script == "ppo_atari.py" and a.env_id == "CartPole-v1" else [])
    )
    results: dict[tuple[str, int], list[dict]] = {}
    for seed in a.seeds:
        for n in a.ranks:
            for kind in ("weak", "strong"):
                if kind == "strong" and (n == 1 or a.num_envs % n):
                    continue
                envs = a.num_envs if kind == "weak" else a.num_envs // n
                r = train(a.script, a.env_id, a.steps, n, envs, seed, extra)
                results.setdefault((kind if n > 1 else "one", n), []).append(r)
                print(
                    f"seed {seed}  {n} rank(s)  {kind:>6}  {envs} envs/rank  SPS {r['sps']:.0f}  wall {r['wall']:.0f} s",
                    flush=True,
                )

    mean = lambda xs: sum(xs) / len(xs)
    base = mean([r["sps"] for r in results[("one", 1)]])
    checkpoints = [a.steps // 4, a.steps // 2, a.steps]
    print(f"\n{a.script} on {a.env_id}, {a.steps} job steps, seeds {a.seeds}, this machine's cores split among ranks")
    print(
        f"| ranks | scaling | envs per rank | SPS | vs 1 rank | efficiency | return at "
        f"{' / '.join(f'{c // 1000}k' for c in checkpoints)} |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (kind, n), runs in results.items():
        sps = mean([r["sps"] for r in runs])
        envs = a.num_envs if kind != "strong" else a.num_envs // n
        rets = []
        for c in checkpoints:
            vals = [v for v in (at(r["curve"], c) for r in runs) if v is not None]
            rets.append(f"{mean(vals):.0f}" if vals else "-")
        print(
            f"| {n} | {kind if n > 1 else '-'} | {envs} | {sps:.0f} | {sps / base:.2f}x | "
            f"{sps / base / n:.0%} | {' / '.join(rets)} |"
        )


if __name__ == "__main__":
    main()
