"""Commands the GPU check starts, each within a time limit, and the end of everything they start: every process
started from here stays a descendant of this one (it is made a child subreaper, so orphans are re-parented to it,
not to init), and ``kill_tree`` ends them all (``shared.procs.descendants``, walked again until nothing is left)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path

from shared.procs import descendants

ROOT = Path(__file__).resolve().parents[2]


def become_subreaper() -> None:
    """Orphans of the processes this check starts are re-parented to it (not to init), so a cut finds them all."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _own_tracker() -> int | None:
    """The pid of this process's own multiprocessing resource tracker, where it has started one."""
    from multiprocessing import resource_tracker

    return getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)


def kill_tree(grace: float = 3.0, spare: frozenset[int] = frozenset()) -> list[int]:
    """SIGTERM every descendant but ``spare``, SIGKILL what is left after ``grace`` seconds, reap them; returns the
    pids found. This process's own resource tracker is spared too: no command started it, it ignores SIGTERM by
    design, and killed it would leave this process's shared memory and semaphores unremoved at its exit (and a test
    process that calls the check's parts warned that it "died unexpectedly")."""
    found: set[int] = set()
    termed: set[int] = set()
    end = time.monotonic() + grace
    spare = spare | {_own_tracker()}
    while True:
        _reap()
        live = [pid for pid in descendants(os.getpid()) if pid not in spare]
        if not live:
            return sorted(found)
        found.update(live)
        if time.monotonic() > end + 10:
            return sorted(found)
        for pid in live:
            if time.monotonic() < end and pid in termed:
                continue
            termed.add(pid)
            try:
                os.kill(pid, signal.SIGTERM if time.monotonic() < end else signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


class Interrupted(Exception):
    pass


def interrupt(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def run_cmd(
    cmd: list[str], log: Path, timeout: float, env: dict | None = None, cwd: Path | None = None, grace: float = 3.0
) -> tuple[int | None, bool, float]:
    """Run ``cmd`` from the repository root (or ``cwd``) into ``log``; (exit code, cut by the timeout, seconds). A
    cut (or an interrupt of this check) kills the command's whole tree, SIGKILL ``grace`` seconds after SIGTERM; so
    does a normal end, for whatever it left behind. The processes this one had before the command are not its."""
    before = frozenset(descendants(os.getpid()))
    t0 = time.monotonic()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd or ROOT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(timeout, 0.1))
            cut = False
        except subprocess.TimeoutExpired:
            rc, cut = None, True
        except BaseException:
            kill_tree(spare=before)
            proc.wait()
            raise
        left = kill_tree(grace, before)
        if cut:
            proc.wait()
            f.write(f"\n[gpu_check] cut after {timeout:.0f} s: killed {len(left)} process(es)\n")
        elif left:
            f.write(f"\n[gpu_check] {len(left)} process(es) left behind, killed: {left}\n")
    return rc, cut, time.monotonic() - t0
