"""Evaluation of one checkpoint, side by side: the one-env evaluation of an older checkout (``--base``) and this
checkout's vector evaluation, each ``--resume RUN --eval-only`` on a copy of the run folder, one after the other
on the same cores. Prints the wall times, their ratio and the per-episode returns of both; a JSON summary with
``--out``.

    python benchmarks/speed/eval_vector.py RUN --base OLD_CHECKOUT [--episodes 100] [--envs 16] [-- SCRIPT FLAGS]

Flags after ``--`` go to both (``--eval-epsilon 0`` for a deterministic policy: then the per-episode returns are
comparable episode by episode where both evaluations play the same games).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def evaluate(checkout: Path, folder: Path, script: str, flags: list[str]) -> tuple[float, list[float]]:
    """Wall seconds of ``--eval-only`` and the returns it wrote."""
    command = [sys.executable, str(checkout / "algos" / script), "--resume", str(folder), "--eval-only", *flags]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds, json.loads((folder / "eval.json").read_text())["returns"]


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="run folder with checkpoint.pt and config.json")
    p.add_argument("--base", type=Path, required=True, help="an older checkout, whose evaluation plays one env")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--envs", type=int, default=16, help="--eval-envs of this checkout")
    p.add_argument(
        "--one-env-too",
        action="store_true",
        help="also this checkout with --eval-envs 1: the same episodes, whatever the number of envs",
    )
    p.add_argument("--out", type=Path, help="write the summary here (JSON)")
    a = p.parse_args(argv)
    script = json.loads((a.run / "config.json").read_text())["script"]
    script = script if script.endswith(".py") else f"{script}.py"
    common = ["--eval-episodes", str(a.episodes), *extra]
    with tempfile.TemporaryDirectory() as tmp:
        copies = {}
        for name in ("before", "after", "one"):
            copies[name] = Path(tmp) / name
            shutil.copytree(a.run, copies[name], ignore=shutil.ignore_patterns("replay.npz", "videos", "*.tfevents*"))
        t_old, old = evaluate(a.base, copies["before"], script, common)
        t_new, new = evaluate(ROOT, copies["after"], script, [*common, "--eval-envs", str(a.envs)])
        t_one, one = evaluate(ROOT, copies["one"], script, [*common, "--eval-envs", "1"]) if a.one_env_too else (None, None)
    head = git("rev-parse", "--short", "HEAD")
    base = subprocess.run(
        ["git", "-C", str(a.base), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"{script} {a.run.name}: {a.episodes} episodes, flags {' '.join(extra) or '(none)'}")
    print(f"before ({base}, one env):          {t_old:8.1f} s  mean return {sum(old) / len(old):.3f}")
    print(f"after  ({head}, --eval-envs {a.envs}): {t_new:8.1f} s  mean return {sum(new) / len(new):.3f}")
    print(
        f"speed-up {t_old / t_new:.2f}x; per-episode returns identical: {old == new} "
        f"({sum(x == y for x, y in zip(old, new))} of {len(old)} equal)"
    )
    if one is not None:
        print(
            f"after  ({head}, --eval-envs 1):  {t_one:8.1f} s  mean return {sum(one) / len(one):.3f}; "
            f"the same per-episode returns as with {a.envs} envs: {one == new}"
        )
    print("episode  before  after" + ("  after-1-env" if one is not None else ""))
    for i, (x, y) in enumerate(zip(old, new)):
        print(f"{i:7d} {x:7g} {y:6g}" + (f" {one[i]:12g}" if one is not None else ""))
    if a.out is not None:
        a.out.write_text(
            json.dumps(
                {
                    "script": script,
                    "run": str(a.run),
                    "episodes": a.episodes,
                    "flags": extra,
                    "base": base,
                    "head": head,
                    "envs": a.envs,
                    "before_s": t_old,
                    "after_s": t_new,
                    "before": old,
                    "after": new,
                    "one_env_s": t_one,
                    "one_env": one,
                },
                indent=1,
            )
        )


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()
