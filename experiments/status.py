"""What the runs have reached, read from their files: a run's step, total, latest return and SPS, the experiment's
ETA, the root's ``status.json``, and ``python experiments/status.py ROOT`` (the same as ``launch.py ROOT --status``).

    python experiments/status.py runs/cartpole      # each run's state, step of total and return; the summary

Guarantees
- ``progress_of(run)`` never fails and never blocks on a run: what it cannot read is None. The step, SPS and
  return come from the run's ``progress.csv`` through ``shared.progress.read_rows`` (its last 16 KiB: cheap on a
  long run's file, and a row the script is writing is never read); the return is the latest non-empty
  ``return_mean``. The total is ``config.json``'s ``total_timesteps``, else the run's ``--total-timesteps``.
- ``write_status`` writes ``status.json`` at the experiment root (atomically): every run's state, exit code,
  error, step, total and return, and the count of each state. A failure to write it is ignored: it is a view,
  the runs' own ``launch.json`` files are the record.
- ``overview`` gives the experiment's ETA: the steps left over the runs not done or failed, at the summed SPS of
  the running ones; a queued run's total comes from its flags, else from a sibling of the same variant; ``-``
  when some run's total is unknown, or steps are left and no running run reports its SPS yet.
- ``python experiments/status.py ROOT`` (``main``) reads only: the grid of the root's ``experiment.json`` and
  each run's ``launch.json`` and progress; a root that is not an experiment's, or a damaged record, is one
  ``error:`` line naming it and exit 2, and nothing is written.
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C and SIGTERM wait until it has imported: experiments.flags.command (one line)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    if sys.path[0] and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # modules import once, as experiments.*

import contextlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.flags import Parser, command, one_line
from experiments.grid import LaunchError, Trial, build_grid, saved_grid
from experiments.records import STATES, experiment_problem, load_record, now, read_records, write_json
from shared.files import WriteError
from shared.progress import read_rows

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
        status["runs"][r.rel] = {
            "state": rec["state"],
            "exit_code": rec.get("exit_code"),
            "error": rec.get("error"),
            "step": p.get("step"),
            "total": p.get("total") or r.total_from_flags(),
            "return": p.get("return"),
        }
    status["counts"] = {s: sum(v["state"] == s for v in status["runs"].values()) for s in STATES}
    with contextlib.suppress(OSError, WriteError):
        write_json(root / "status.json", status)


def overview(runs: Sequence[Trial], records: dict[str, dict]) -> tuple[dict[str, dict], str, dict[str, int]]:
    """(progress of each run that started, the experiment's ETA, the count of each state): see the docstring."""
    prog = {
        r.rel: progress_of(r)
        for r in runs
        if records[r.rel]["state"] in ("running", "done", "interrupted", "failed", "submitted")
    }
    totals = {}
    for r in runs:  # a queued run's total: its flags, else a sibling's config (same flags but the seed)
        p = prog.get(r.rel) or {}
        totals[r.rel] = p.get("total") or r.total_from_flags()
    by_variant: dict[tuple, int] = {}
    for r in runs:
        if totals[r.rel]:
            by_variant.setdefault((r.script, r.env_id, r.variant_name), totals[r.rel])
    remaining, sps, unknown = 0.0, 0.0, False
    for r in runs:
        state = records[r.rel]["state"]
        if state in ("done", "failed"):
            continue
        total = totals[r.rel] or by_variant.get((r.script, r.env_id, r.variant_name))
        step = (prog.get(r.rel) or {}).get("step") or 0
        if total is None:
            unknown = True
            continue
        remaining += max(total - step, 0)
        if state == "running":
            sps += (prog.get(r.rel) or {}).get("sps") or 0.0
    eta = "-" if unknown or (remaining and not sps) else fmt_duration(remaining / sps if sps else 0)
    counts = {s: sum(records[r.rel]["state"] == s for r in runs) for s in STATES}
    return prog, eta, counts


def summary_line(runs: Sequence[Trial], records: dict[str, dict]) -> str:
    _, eta, counts = overview(runs, records)
    return (
        f"{counts['done']}/{len(runs)} done, {counts['running']} running, {counts['queued']} queued, "
        f"{counts['failed']} failed, {counts['interrupted']} interrupted; ETA {eta}"
    )


def print_status(runs: Sequence[Trial], records: dict[str, dict]) -> None:
    """One line per run (state, step of total, return; a failed run's error) and the summary."""
    for r in runs:
        rec, p = records[r.rel], progress_of(r)
        ret = f"{p['return']:.1f}" if p.get("return") is not None else "-"
        print(
            f"{rec['state']:<11} {r.rel}  step {fmt_steps(p.get('step'))}/{fmt_steps(p.get('total'))}  return "
            f"{ret}" + (f"  {rec.get('error')}" if rec["state"] == "failed" else "")
        )
    print(summary_line(runs, records))


def experiment_runs(root: Path) -> tuple[list[Trial], dict[str, dict]]:
    """The runs of the grid ``root/experiment.json`` recorded, and their records; ``LaunchError`` when ``root``
    is not an experiment root or a record is damaged."""
    if not (root / "experiment.json").is_file():
        what = "has no experiment.json (not an experiment root of launch.py)" if root.is_dir() else "is not a folder"
        raise LaunchError(f"{root} {what if root.exists() else 'does not exist'}")
    path = root / "experiment.json"
    grid = saved_grid(load_record(path, experiment_problem), str(path))
    if not grid.get("scripts"):
        raise LaunchError(f"{path}: no grid recorded (no launch got as far as writing it)")
    env_ids, seeds, flags = (grid.get(k, []) for k in ("env_ids", "seeds", "flags"))
    runs = build_grid(root, grid["scripts"], env_ids, seeds, flags, grid["levels"], grid.get("nproc_per_node", 1))
    return runs, read_records(runs)


@one_line
def main(argv: Sequence[str] | None = None) -> int:
    p = Parser(prog="status.py", description="The states of an experiment's runs, from its files (read only).")
    p.add_argument("root", type=Path, help="an experiment root (experiments/launch.py)")
    print_status(*experiment_runs(p.parse_args(argv).root.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(command(main))
