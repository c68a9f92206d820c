"""A run's process: started pinned to its slot in a session of its own, never outliving the launcher, and ended
with everything it started.

Guarantees
- ``start_process`` runs a command with stdin closed, stdout and stderr appended to the run folder's
  ``stdout.log`` and ``stderr.log``, as the leader of a new session. In the forked child, before the script
  starts (and without a lock, a thread or an import there): pinned to ``cpus`` when given
  (``sched_setaffinity``), and armed to get SIGTERM when the launcher dies, even SIGKILLed
  (``PR_SET_PDEATHSIG``), so a script never outlives it.
- ``kill_session(sid)`` SIGKILLs what is left of a child's process group and session (``shared.procs``): called
  while the leader is still unreaped, its id cannot have been reused.
- ``pid_runs(pid, folder)``: the recorded ``pid`` is alive, not a zombie, and its command line names the run
  folder: a later launcher never mistakes another process for the run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from shared.procs import process_stat, session_processes

__all__ = ["kill_session", "pid_runs", "start_process"]

try:
    _LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the forked child only calls into it
except OSError:  # pragma: no cover
    _LIBC = None


def _pdeathsig() -> None:
    """In the child: SIGTERM when the launcher dies (even SIGKILLed), so a script never outlives it."""
    with contextlib.suppress(Exception):
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _child_setup(cpus: tuple[int, ...] | None):
    def setup() -> None:  # runs in the forked child before exec: no locks, no threads, no imports
        _pdeathsig()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return setup


def start_process(
    cmd: Sequence[str], folder: Path, env: dict[str, str], cpus: tuple[int, ...] | None = None
) -> subprocess.Popen:
    """``cmd`` in a session of its own, its output appended to ``folder``'s logs (see the module docstring)."""
    with open(folder / "stdout.log", "ab") as out, open(folder / "stderr.log", "ab") as err:
        return subprocess.Popen(
            list(cmd),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_child_setup(cpus),
        )


def kill_session(sid: int) -> None:
    """SIGKILL what is left of a child's process group and session (call while the leader is still unreaped, so
    its id cannot have been reused)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    for pid in session_processes(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def pid_runs(pid: int | None, folder: Path) -> bool:
    """Whether ``pid`` is alive and is a process of the run in ``folder`` (its command line names the folder)."""
    stat = process_stat(pid) if pid else None
    if stat is None or not stat.alive:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    return str(folder.parent) in cmd and folder.name in cmd
