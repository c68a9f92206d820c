"""Run one of our scripts and read its speed from its ``progress.csv``: the helper every speed figure of a script
shares (the figures against SB3, R2D1's, compile against eager, the scaling, and the GPU race's).

Guarantees
- ``run_script(script, flags)`` runs ``algos/<script>`` with this interpreter from the repository root, its run
  folder in a temporary folder that is gone when it returns, its output captured (``subprocess.run`` with
  ``capture_output``: the GPU check's figure wrapper copies the end of it into the figure's log), and returns the
  complete rows of its ``progress.csv`` (``shared.progress.read_rows``). A failing script raises ``ScriptFailed``
  (a ``CalledProcessError``) whose message ends with the end of its stderr.
- ``mean_sps(rows, start, end)``: steps per second from the first row at or after step ``start`` to the last row
  at or before ``end``: the window's steps over its seconds, start-up and whatever came before ``start`` left out.
- ``window_sps`` / ``progress_sps``: the median of the SPS between consecutive rows whose interval starts at or
  after a burn-in, beside the window's mean (the GPU race's figure, where one slow or one early row must not move
  it).
Nothing here imports torch: the GPU check's CPU tests and the race's planning use it on any machine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file (python benchmarks/...): shared/ imports from the repository
    sys.path.insert(0, str(ROOT))

from shared.progress import read_rows  # light: no torch

RUN_NAME = "b"


class ScriptFailed(subprocess.CalledProcessError):
    """A script exited non-zero; its message ends with the end of the script's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or '')[-3000:]}"


def run_script(
    script: str, flags: Sequence[str], python_args: Sequence[str] = (), env: dict | None = None
) -> list[dict[str, str]]:
    """The progress rows of one run of ``algos/<script>`` with ``flags`` (``--out-dir`` and ``--run-name`` are
    added). ``python_args`` go before the script's path (``-m torch.distributed.run ...``, or ``-c CODE`` that
    runs it)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, *python_args, str(ROOT / "algos" / script), *flags, "--out-dir", out, "--run-name", RUN_NAME]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if done.returncode:
            raise ScriptFailed(done.returncode, cmd, done.stdout, done.stderr)
        return read_rows(Path(out) / RUN_NAME / "progress.csv")


def mean_sps(rows: list[dict], start: int = 0, end: int | None = None) -> float:
    """Steps per second from the first row at or after step ``start`` to the last at or before ``end``."""
    kept = [r for r in rows if int(r["global_step"]) >= start and (end is None or int(r["global_step"]) <= end)]
    if len(kept) < 2:
        raise ValueError(f"fewer than two progress rows between steps {start} and {end}: no interval to time")
    first, last = kept[0], kept[-1]
    steps = int(last["global_step"]) - int(first["global_step"])
    return steps / (float(last["wall_time_s"]) - float(first["wall_time_s"]))


def device_name(spec: str) -> str:
    """The device a --device value means here, for a printed header: ``auto`` is cuda if available, else cpu."""
    if spec != "auto":
        return spec
    import torch

    return f"{'cuda' if torch.cuda.is_available() else 'cpu'} (auto)"


# --- the median per-interval SPS after a burn-in ----------------------------------------------------------------


def intervals_from_rows(rows: list[dict]) -> list[tuple[int, int, float]]:
    """(from step, to step, seconds) between each pair of consecutive progress rows."""
    out = []
    for prev, cur in zip(rows, rows[1:]):
        out.append((int(prev["global_step"]), int(cur["global_step"]), float(cur["wall_time_s"]) - float(prev["wall_time_s"])))
    return out


def regroup(intervals: list[tuple[int, int, float]], every: int) -> list[tuple[int, int, float]]:
    """Consecutive intervals merged so that each ends on a multiple of ``every`` steps (a trailing part that does
    not reach one is dropped): LeanRL's prints every 100 steps against our rows every 500."""
    out, start, secs = [], None, 0.0
    for a, b, dt in intervals:
        start = a if start is None else start
        secs += dt
        if b % every == 0:
            out.append((start, b, secs))
            start, secs = None, 0.0
    return out


def window_sps(intervals: list[tuple[int, int, float]], burn_in: int, min_steps: int = 0, every: int = 0) -> dict:
    """The median SPS of the intervals that start at or after step ``burn_in`` (regrouped to multiples of
    ``every`` first, if given), with the window's mean (its steps over its seconds), how many intervals, the steps
    they cover, and ``short`` when those are fewer than ``min_steps``. Raises ValueError without such an
    interval."""
    kept = [(a, b, dt) for a, b, dt in intervals if a >= burn_in and b > a]
    if every:
        kept = regroup(kept, every)
    kept = [(a, b, dt) for a, b, dt in kept if dt > 0]
    if not kept:
        raise ValueError(f"no interval starts at or after step {burn_in}")
    rates = [(b - a) / dt for a, b, dt in kept]
    steps, secs = sum(b - a for a, b, _ in kept), sum(dt for _, _, dt in kept)
    return {
        "median": round(statistics.median(rates), 1),
        "mean": round(steps / secs, 1),
        "intervals": len(kept),
        "from": kept[0][0],
        "to": kept[-1][1],
        "steps": steps,
        "min": round(min(rates), 1),
        "max": round(max(rates), 1),
        "short": steps < min_steps,
    }


def progress_sps(path: Path, burn_in: int, min_steps: int = 0) -> dict:
    """``window_sps`` of a run's ``progress.csv`` (its complete rows), with ``compile_s`` from its last row when
    the run compiled (``shared.compiling.report``'s column)."""
    rows = read_rows(path)
    got = window_sps(intervals_from_rows(rows), burn_in, min_steps)
    if rows and rows[-1].get("compile_s"):
        got["compile_s"] = float(rows[-1]["compile_s"])
    return got
