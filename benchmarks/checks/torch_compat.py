"""Every script compiles on a given torch: the README's range (``torch>=2.11``) checked at its low end.

CI installs one torch (requirements.txt's pin); a dynamo that differs from it (2.11 read namedtuple attributes
that 2.13 does not) is invisible there. This runs each of the ten scripts in ``algos/`` briefly with ``--compile``
on the CPU under another interpreter: the short runs and small presets of tests/test_syncs.py (less ``--noisy``,
which ``--compile`` refuses, as tests/test_compile.py does), with ``RL_COMPILE_BACKEND=aot_eager`` (the graphs
inductor would compile, traced without generating code) and ``RL_COMPILE_STRICT=1`` (a graph break or recompile
is an error). A script passes when it exits 0 having compiled at least one graph. One line per script; exit 1 when
any failed.

    python -m venv /work/venv211 && /work/venv211/bin/pip install torch==2.11.0 -r <requirements without torch>
    python benchmarks/checks/torch_compat.py --python /work/venv211/bin/python [--scripts ppo_lstm r2d1_atari]

tests/test_torch_range.py (slow) runs it against ``TORCH_RANGE_PYTHON``.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.test_syncs import COMMON, RUNS

FLAGS = {script: [f for f in flags if f != "--noisy"] for script, flags in RUNS.items()}
STRICT = {"RL_COMPILE_BACKEND": "aot_eager", "RL_COMPILE_STRICT": "1"}
# An exception's own line ("torch._dynamo.exc.Unsupported: ...", "AssertionError"): dynamo ends its message with
# hints, so the last line of stderr is rarely the error.
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Unsupported|Interrupt|Exit)\b")


def torch_version(python: str) -> str:
    out = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise SystemExit(f"{python} cannot import torch:\n{out.stderr[-2000:]}")
    return out.stdout.strip()


def error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line)]
    return (errors or lines or ["(no output on stderr)"])[-1][:300]


def check(python: str, script: str, timeout: float) -> tuple[bool, str, float]:
    """Run ``script`` briefly with ``--compile``: (passed, what to say, seconds)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            python,
            str(ROOT / "algos" / f"{script}.py"),
            *FLAGS[script],
            *COMMON,
            "--compile",
            "--device",
            "cpu",
            "--out-dir",
            out,
            "--run-name",
            "r",
        ]
        start = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **STRICT})
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:.0f} s", time.perf_counter() - start
        seconds = time.perf_counter() - start
        if done.returncode:
            return False, f"exit {done.returncode}: {error_line(done.stderr)}", seconds
        try:
            with open(Path(out) / "r" / "progress.csv") as f:
                graphs = int(list(csv.DictReader(f))[-1]["compiled_graphs"])
        except (OSError, IndexError, KeyError, ValueError) as e:
            return False, f"no compiled_graphs in progress.csv ({e!r})", seconds
        if graphs < 1:
            return False, "exit 0 but no graph compiled", seconds
        return True, f"{graphs} graphs", seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torch is checked")
    parser.add_argument("--scripts", nargs="+", default=list(FLAGS), choices=list(FLAGS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per script")
    args = parser.parse_args()
    print(f"torch {torch_version(args.python)} ({args.python}), {STRICT}", flush=True)
    failed = []
    for script in args.scripts:
        ok, what, seconds = check(args.python, script, args.timeout)
        print(f"{script:<13} {'ok' if ok else 'FAILED':<6} {seconds:6.1f} s  {what}", flush=True)
        if not ok:
            failed.append(script)
    print(
        f"{len(args.scripts) - len(failed)} of {len(args.scripts)} compiled"
        + (f"; failed: {' '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
