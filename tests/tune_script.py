"""A stand-in for a script of algos/ in the tests of experiments/tune.py: the same command line and contract (one
``error:`` line and exit 2 for a bad flag; under ``RL_CHECK_ONLY`` every check, then exit 0 with nothing created)
and the same run folder (config.json, progress.csv, eval.json, checkpoint.pt), in a fraction of a second and
without torch, so a study's whole loop runs in a test. Its return peaks at ``--learning-rate`` 1e-3.

Its checks beyond each field's declared range are the kind only a script's own parser knows: ``--env-id`` one of
two ids, ``--num-steps`` at most 4096, ``--seed`` in [0, 2**31)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shared.argtypes import Range

ENVS = ("CartPole-v1", "Acrobot-v1")


@dataclasses.dataclass
class Args:
    seed: int = 1
    env_id: str = "CartPole-v1"
    out_dir: str = "runs"
    run_name: str = "run"
    resume: str | None = None
    total_timesteps: Annotated[int, Range(gt=0)] = 1000
    learning_rate: Annotated[float, Range(gt=0, lt=1)] = 3e-4
    num_steps: Annotated[int, Range(gt=0)] = 128
    anneal_lr: bool = True
    sampler: Literal["serial", "parallel"] = "serial"


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message}\n")


def parse(argv: list[str]) -> Args:
    p = Parser()
    for f in dataclasses.fields(Args):
        name = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            p.add_argument(name, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            kind = float if "float" in f.type else int if "int" in f.type else str
            choices = ["serial", "parallel"] if f.name == "sampler" else None
            p.add_argument(name, type=kind, default=f.default, choices=choices)
    args = Args(**vars(p.parse_args(argv)))
    checks = [
        (0 <= args.seed < 2**31, f"--seed must be in [0, 2**31), got {args.seed}"),
        (args.env_id in ENVS, f"--env-id {args.env_id}: no such environment"),
        (0 < args.learning_rate < 1, f"--learning-rate must be in (0, 1), got {args.learning_rate}"),
        (0 < args.num_steps <= 4096, f"--num-steps {args.num_steps}: at most 4096 fit a rollout here"),
        (args.total_timesteps > 0, f"--total-timesteps must be positive, got {args.total_timesteps}"),
    ]
    for ok, message in checks:
        if not ok:
            p.exit(2, f"error: {message}\n")
    return args


def main() -> int:
    args = parse(sys.argv[1:])
    if os.environ.get("RL_CHECK_ONLY"):
        return 0
    folder = Path(args.out_dir) / args.run_name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"args": dataclasses.asdict(args), "script": "tune_script"}))
    ret = 100.0 - 10.0 * abs(math.log10(args.learning_rate) + 3.0) + args.seed * 0.1
    rows = ["global_step,wall_time_s,sps,episodes,return_mean"]
    rows += [f"{s},0.1,1000,{i + 1},{ret}" for i, s in enumerate(range(100, args.total_timesteps + 1, 100))]
    (folder / "progress.csv").write_text("\n".join(rows) + "\n")
    (folder / "eval.json").write_text(
        json.dumps({"global_step": args.total_timesteps, "returns": [ret, ret], "mean": ret, "lengths": [1, 1]})
    )
    (folder / "checkpoint.pt").write_bytes(b"stand-in")
    return 0


if __name__ == "__main__":
    sys.exit(main())
