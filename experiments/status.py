"""What the runs have reached, read from their files: a run's step, total, latest return and SPS, and the root's
``status.json``.

Guarantees
- ``progress_of(run)`` never fails and never blocks on a run: what it cannot read is None. The step, SPS and
  return come from the run's ``progress.csv`` through ``shared.progress.read_rows`` (its last 16 KiB: cheap on a
  long run's file, and a row the script is writing is never read); the return is the latest non-empty
  ``return_mean``. The total is ``config.json``'s ``total_timesteps``, else the run's ``--total-timesteps``.
- ``write_status`` writes ``status.json`` at the experiment root (atomically): every run's state, exit code,
  error, step, total and return, and the count of each state. A failure to write it is ignored: it is a view,
  the runs' own ``launch.json`` files are the record.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

from experiments.grid import Trial
from experiments.records import STATES, now, write_json
from shared.files import WriteError
from shared.progress import read_rows

__all__ = ["fmt_duration", "fmt_steps", "progress_of", "write_status"]

TAIL_BYTES = 16384  # of progress.csv: a few hundred rows, more than the latest return needs


def progress_of(run: Trial) -> dict:
    """step, total, return (latest), sps of a run, from its progress.csv and config.json."""
    out: dict[str, Any] = {"step": None, "total": None, "return": None, "sps": None}
    folder = run.folder
    try:
        cfg = json.loads((folder / "config.json").read_text())
        out["total"] = int(cfg["args"]["total_timesteps"])
    except (OSError, ValueError, KeyError, TypeError):
        out["total"] = run.total_from_flags()
    try:
        rows = read_rows(folder / "progress.csv", last_bytes=TAIL_BYTES)
    except OSError:
        return out
    if not rows or "global_step" not in rows[-1]:
        return out

    def get(row: dict[str, str], name: str) -> float | None:
        try:
            return float(row[name]) if row.get(name, "") != "" else None
        except ValueError:
            return None

    out["step"] = int(get(rows[-1], "global_step") or 0)
    out["sps"] = get(rows[-1], "sps")
    out["return"] = next((v for r in reversed(rows) if (v := get(r, "return_mean")) is not None), None)
    return out


def fmt_duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def fmt_steps(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{int(n):,}"


def write_status(runs: list[Trial], records: dict[str, dict]) -> None:
    if not runs:
        return
    root = runs[0].root
    status = {"updated": now(), "runs": {}}
    for r in runs:
        rec = records[r.rel]
        p = progress_of(r) if rec["state"] != "queued" else {}
        status["runs"][r.rel] = {"state": rec["state"], "exit_code": rec.get("exit_code"), "error": rec.get("error"),
                                 "step": p.get("step"), "total": p.get("total") or r.total_from_flags(),
                                 "return": p.get("return")}
    status["counts"] = {s: sum(v["state"] == s for v in status["runs"].values()) for s in STATES}
    with contextlib.suppress(OSError, WriteError):
        write_json(root / "status.json", status)
