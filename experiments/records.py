"""Each run's record, ``launch.json`` in its folder: every attempt, its state and why it ended, so that running
the same command again carries on where the last one stopped.

Guarantees
- ``launch.json`` holds the run's grid cell (script, env id, seed, variant, common flags, torchrun processes), the
  git commit and package versions of the launch, the state (``STATES``: queued, submitted, running, done,
  failed, interrupted; pruned: a run of a trial that ``experiments/tune.py`` stopped), the exit code, the last
  ``error:`` line of its stderr and every attempt (its exact command, resumed or not, host, cores, GPUs, slots
  and affinity codes, start and end, exit code). Every write of it (and of the root's ``experiment.json`` and
  ``status.json``) is atomic (``shared/files.py``): a crash leaves the previous version, never a broken file.
- A record a launch carries on from is read with ``load_record``: one that is there but damaged (not JSON, not
  an object, a field the launcher relies on of the wrong type: ``launch_problem``, ``experiment_problem``,
  ``status_problem``, ``jobs_problem``) is refused in one line naming the file and what is wrong, before
  anything is written, never replaced by a fresh one. ``read_json`` (``{}`` for anything unusable) is for views
  that may skip a file.
- A run is finished when its record says done with exit 0 and its ``checkpoint.pt`` exists; the launcher skips
  it. Any other run is started again: resumed with ``--resume <run folder>`` where a checkpoint exists, else
  afresh, the files an earlier attempt left (its progress.csv, which the script would append to) moved to
  ``.stale/N`` first (``launch.json`` and the logs stay).
- An attempt's end (``end_attempt``): exit 0 is done; exit 130, a signal the launcher sent, or a torchrun job that
  a signal reached without the launcher (SLURM's preemption signals every process of the job: its ranks
  checkpoint and exit 130, torchrun exits 1 with its own ``SignalException``, docs/contract.md) is interrupted;
  anything else is failed, with the last ``error:`` line of the attempt's stderr (or what killed it).
"""

from __future__ import annotations

import datetime
import json
import re
import shlex
import signal
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from experiments import ROOT
from experiments.grid import LaunchError, Trial
from experiments.slots import Slot
from shared.files import write_text

EXIT_INTERRUPTED = 130
STATES = ("queued", "submitted", "running", "done", "failed", "interrupted", "pruned")  # pruned: tune.py
KEEP_ON_FRESH = {"launch.json", "stdout.log", "stderr.log", ".stale"}  # what a fresh start leaves in place


def write_json(path: Path, obj: Any) -> None:
    """Atomically (``shared.files``: a temporary file renamed over it); a failure raises ``WriteError``."""
    write_text(path, lambda f: f.write(json.dumps(obj, indent=2, default=str) + "\n"))


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; ``{}`` when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class Unusable(ValueError):
    """Why a JSON file cannot be used: ``cannot be read (...)``, ``not JSON (...)``, ``a JSON list, not an object``
    or what a ``problem`` check found."""


def json_object(path: Path, problem: Callable[[dict], str | None] | None = None) -> dict:
    """The JSON object in ``path`` (``{}`` when there is none); ``Unusable`` with the reason when the file is there
    but cannot be read, is not a JSON object, or ``problem`` finds a field of the wrong type in it."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise Unusable(f"cannot be read ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError too
        raise Unusable(f"not JSON ({' '.join(str(e).split())[:120]})") from None
    what = f"a JSON {type(data).__name__}, not an object" if not isinstance(data, dict) else problem and problem(data)
    if what:
        raise Unusable(what)
    return data


def load_record(path: Path, problem: Callable[[dict], str | None] | None = None) -> dict:
    """``json_object`` for a launch to carry on from: ``Unusable`` becomes a ``LaunchError`` naming the file and
    what is wrong, raised before anything is written (the launcher never rewrites a record it could not read: that
    would lose what it held)."""
    try:
        return json_object(path, problem)
    except Unusable as e:
        what = str(e) if str(e).startswith("cannot be read") else f"damaged, {e}"
        raise LaunchError(f"{path}: {what}; move it away to start afresh") from None


def _wrong(data: dict, checks: dict[str, tuple[Callable[[Any], bool], str]]) -> str | None:
    for key, (ok, what) in checks.items():
        if key in data and not ok(data[key]):
            return f"{key} is {json.dumps(data[key], default=str)[:60]}, not {what}"
    return None


def _int_or_none(x: Any) -> bool:
    return x is None or (isinstance(x, int) and not isinstance(x, bool))


def _strings(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(v, str) for v in x)


def launch_problem(rec: dict) -> str | None:
    """What is wrong with a run's ``launch.json`` (None: nothing the launcher relies on)."""
    if rec.get("state") not in STATES:
        return f"state is {json.dumps(rec.get('state'), default=str)[:60]}, not one of {', '.join(STATES)}"
    return _wrong(
        rec,
        {
            "attempts": (lambda x: isinstance(x, list) and all(isinstance(t, dict) for t in x), "a list of objects"),
            "exit_code": (_int_or_none, "an integer or null"),
            "pid": (_int_or_none, "an integer or null"),
            "error": (lambda x: x is None or isinstance(x, str), "a string or null"),
            "command": (lambda x: x is None or _strings(x), "a list of strings or null"),
            "nproc_per_node": (lambda x: isinstance(x, int) and not isinstance(x, bool), "an integer"),
        },
    )


def experiment_problem(exp: dict) -> str | None:
    """What is wrong with an experiment root's ``experiment.json`` (its ``grid`` checked by the caller)."""
    return _wrong(
        exp,
        {
            "grid": (lambda x: isinstance(x, dict), "an object"),
            "launches": (lambda x: isinstance(x, list), "a list"),
            "runs": (_strings, "a list of strings"),
        },
    )


def status_problem(status: dict) -> str | None:
    """What is wrong with an experiment root's ``status.json`` (a view, but never overwritten unread)."""
    return _wrong(
        status,
        {
            "runs": (lambda x: isinstance(x, dict) and all(isinstance(v, dict) for v in x.values()), "an object of objects"),
            "counts": (lambda x: isinstance(x, dict), "an object"),
        },
    )


def jobs_problem(jobs: dict) -> str | None:
    """What is wrong with an experiment root's ``slurm_jobs.json``: run -> {job_id, cluster, submitted}."""
    bad = next((k for k, v in jobs.items() if not isinstance(v, dict)), None)
    return None if bad is None else f"{bad} is {json.dumps(jobs[bad], default=str)[:60]}, not an object"


def read_records(runs: Sequence[Trial]) -> dict[str, dict]:
    """Each run's ``launch.json`` as the last launch left it (a fresh, queued record where there is none); a
    damaged one raises ``LaunchError`` naming it (``load_record``)."""
    records = {}
    for r in runs:
        rec = load_record(r.folder / "launch.json", launch_problem)
        records[r.rel] = rec or {"state": "queued", "attempts": []}
        records[r.rel].setdefault("attempts", [])
    return records


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def git_info() -> dict:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {
        "commit": git("rev-parse", "HEAD").strip() or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no").strip()),
    }


def package_versions() -> dict[str, str]:
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for d in md.distributions():
        name = d.metadata["Name"]
        if name:
            out[name.lower()] = d.version
    return dict(sorted(out.items()))


def run_meta() -> dict:
    """What a launch records of the code it runs: the git commit (and whether the tree was dirty), the packages."""
    return {"git": git_info(), "versions": package_versions()}


def last_error(path: Path, offset: int = 0) -> str | None:
    """The last line starting with ``error:`` in ``path`` from ``offset`` on."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("error:")]
    return lines[-1] if lines else None


def torchrun_signalled(run: Trial, attempt: dict) -> bool:
    """torchrun's last line says a signal ended it (``...SignalException: Process N got signal: 15``)."""
    try:
        with open(run.folder / "stderr.log", "rb") as f:
            f.seek(max(attempt.get("stderr_offset", 0), f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return False
    return bool(lines) and re.search(r"SignalException: Process \d+ got signal: \d+$", lines[-1]) is not None


def finished(folder: Path, record: dict) -> bool:
    return record.get("state") == "done" and record.get("exit_code") == 0 and (folder / "checkpoint.pt").is_file()


def set_aside(folder: Path) -> list[str]:
    """A run starting afresh in a folder an earlier attempt wrote without a checkpoint: that attempt's files move
    to ``.stale/N`` (the script would otherwise append to its progress.csv)."""
    leftovers = [p for p in folder.iterdir() if p.name not in KEEP_ON_FRESH] if folder.is_dir() else []
    if not leftovers:
        return []
    stale = folder / ".stale"
    n = 1 + max((int(p.name) for p in stale.iterdir() if p.name.isdigit()), default=0) if stale.is_dir() else 1
    dest = stale / str(n)
    dest.mkdir(parents=True)
    for p in leftovers:
        p.replace(dest / p.name)
    return [p.name for p in leftovers]


def new_record(run: Trial, meta: dict) -> dict:
    return {
        "run": run.rel,
        "script": run.script,
        "script_path": run.script_path,
        "env_id": run.env_id,
        "seed": run.seed,
        "variant": {"name": run.variant_name, "levels": [{"name": n, "flags": list(f)} for n, f in run.variant]},
        "common_flags": list(run.common),
        "nproc_per_node": run.nproc,
        "state": "queued",
        "exit_code": None,
        "error": None,
        "command": None,
        "attempts": [],
        **meta,
    }


def renewed(record: dict, base: dict) -> dict:
    """A run's record for this launch: ``base`` (``new_record``'s) where ``record`` holds no attempt yet, else
    ``record`` with this launch's identity (commit, versions, grid cell) and its own history kept."""
    if record.get("state") not in STATES or not (record.get("attempts") or record.get("command")):
        return base
    return {**record, **{k: v for k, v in base.items() if k not in ("state", "exit_code", "error", "command", "attempts")}}


def begin_attempt(
    run: Trial, record: dict, slots: Sequence[Slot] | None, host_info: dict | None = None
) -> tuple[list[str], dict]:
    """Decide resume or fresh start, set aside stale files, open the log files; returns (command, attempt)."""
    folder = run.folder
    folder.mkdir(parents=True, exist_ok=True)
    resume = (folder / "checkpoint.pt").is_file()
    moved = [] if resume else set_aside(folder)
    cmd = run.command(resume)
    attempt = {
        "command": cmd,
        "command_line": shlex.join(cmd),
        "resumed": resume,
        "started": now(),
        "host": socket.gethostname(),
        "git": record.get("git"),
        **(
            {
                "cpus": [c for s in slots for c in s.cpus],
                "gpus": [g for s in slots for g in s.gpus],
                "threads": slots[0].cores,
                "slots": [s.index for s in slots],
                "affinity": [s.code for s in slots],
            }
            if slots
            else {}
        ),
        **(host_info or {}),
    }
    if moved:
        attempt["set_aside"] = moved
    for name in ("stdout.log", "stderr.log"):
        with open(folder / name, "a") as f:
            f.write(f"=== launch {attempt['started']}: {shlex.join(cmd)}\n")
    attempt["stderr_offset"] = (folder / "stderr.log").stat().st_size
    record.update(state="running", command=cmd, exit_code=None, error=None)
    record["attempts"].append(attempt)
    return cmd, attempt


def end_attempt(run: Trial, record: dict, rc: int, signalled: bool) -> str:
    """Record the exit of the attempt; returns the new state. A torchrun job that a signal reached without the
    launcher (SLURM's preemption signals every process of the job) is interrupted too: its ranks checkpointed and
    exited 130, and torchrun exits 1 with its own SignalException (docs/contract.md)."""
    attempt = record["attempts"][-1]
    error = last_error(run.folder / "stderr.log", attempt.get("stderr_offset", 0))
    if rc == 0:
        state, error = "done", None
    elif rc == EXIT_INTERRUPTED or signalled or (run.nproc > 1 and rc == 1 and torchrun_signalled(run, attempt)):
        state = "interrupted"
    else:
        state = "failed"
        if rc < 0 and not error:
            error = f"error: killed by {signal.Signals(-rc).name}"
        elif not error:
            error = f"error: exit {rc} without an error: line (see {run.rel}/stderr.log)"
    attempt.update(ended=now(), exit_code=rc)
    record.update(state=state, exit_code=rc, error=error, pid=None)
    return state
