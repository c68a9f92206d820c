"""Running the scripts in algos/ as a user does (a subprocess), reading what they write, and references the tests
compare against."""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from unittest import mock

import numpy as np

from shared.procs import process_table, session_processes

ROOT = Path(__file__).resolve().parents[1]


def spaces(obs_shape: tuple[int, ...], n_actions: int) -> tuple:
    """A Box of ``obs_shape`` and ``n_actions`` discrete actions: what a script's network factory takes."""
    import gymnasium as gym

    return gym.spaces.Box(-np.inf, np.inf, obs_shape, np.float32), gym.spaces.Discrete(n_actions)


def script(name: str) -> str:
    return str(ROOT / "algos" / name)


def run(
    name: str, *args: str, timeout: float = 600, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``algos/<name>`` to completion in its own session (``env`` added to this process's environment); fails
    the test if it leaves a process behind."""
    proc = subprocess.Popen(
        [sys.executable, script(name), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{name} {' '.join(args)} timed out\n{out[-3000:]}\n{err[-3000:]}") from None
    assert_no_leftovers(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def refusal(name: str, *args: str, setup: bool = False) -> list[str]:
    """Call ``main()`` of ``algos/<name>`` in this process with ``args`` as its command line, for arguments it
    must refuse: asserts exit code 2 and returns the non-blank lines it wrote to stderr (a warning it raised
    counts as lines too, as it would on a terminal). Fast enough for the unit tier: no interpreter, torch or
    env start per case; each script keeps one end-to-end case through ``run``.

    ``setup=False``: the refusal must come before ``run.setup()`` (which fails the test here), so before
    anything of the run starts. ``setup=True``: for a refusal from ``run.allocating`` or ``run.begin``, which
    need it; ``run.setup()`` then does what those read (the world, the cores it would use) without changing this
    process (no signal handlers, pinning, torch threads or seeds), and the test fails at ``with run:`` or
    ``run.evaluate_only()`` rather than train in this process."""
    if str(ROOT / "algos") not in sys.path:
        sys.path.insert(0, str(ROOT / "algos"))
    module = importlib.import_module(Path(name).stem)
    from shared.affinity import make_affinity
    from shared.run import Run

    def no_setup(self):
        raise AssertionError(f"{name} {' '.join(args)}: run.setup() reached, the arguments were not refused before")

    def started(self, *_):
        raise AssertionError(f"{name} {' '.join(args)}: the run started, the arguments were not refused")

    def setup_keeping_this_process(self):
        self.world, self.writes = 1, True
        self.affinity = make_affinity(self.args.sampler, gpu_learner=self.device.type == "cuda")
        return self

    err, code = io.StringIO(), None
    with (
        mock.patch.object(sys, "argv", [script(name), *args]),
        mock.patch.object(Run, "setup", setup_keeping_this_process if setup else no_setup),
        mock.patch.object(Run, "__enter__", started),
        mock.patch.object(Run, "evaluate_only", started),
        warnings.catch_warnings(record=True) as caught,
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        warnings.simplefilter("always")
        try:
            code = module.main()
        except SystemExit as e:
            code = e.code
    quiet = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)  # Python's defaults
    shown = [f"{w.category.__name__}: {w.message}" for w in caught if not issubclass(w.category, quiet)]
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()] + shown
    assert code == 2, (code, lines)
    return lines


def assert_no_leftovers(sid: int, wait: float = 5.0) -> None:
    deadline = time.time() + wait
    while session_processes(sid) and time.time() < deadline:
        time.sleep(0.1)
    left = session_processes(sid)
    if left:
        os.killpg(sid, signal.SIGKILL)
        raise AssertionError(f"processes left behind: {left}")


# The names Python's multiprocessing (semaphores, shared_memory), torch (file_system sharing) and numpy's mmap
# fallbacks give what they put in /dev/shm. Only these are ours to judge: another process on the machine may
# create or remove anything else there while a test runs.
OUR_SHM = ("sem.mp-", "psm_", "wnsm_", "torch_", "mp-", "rl-shared")


def our_shm() -> set[str]:
    """The entries of /dev/shm that a run of ours could have left behind (``OUR_SHM``)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith(OUR_SHM)}


def finish(proc: subprocess.Popen, timeout: float = 60) -> str:
    """Wait for a process started with ``start``; returns its stderr. If it does not end in time, kill its whole
    session (so it cannot slow down the tests after it) and fail."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)  # the run prints where each of its threads waits (shared.signals)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"pid {proc.pid} did not end within {timeout} s\n{err[-6000:]}") from None


def progress(run_dir: Path) -> list[dict]:
    with open(run_dir / "progress.csv") as f:
        return list(csv.DictReader(f))


def start(name: str, *args: str) -> subprocess.Popen:
    """Start ``algos/<name>`` in its own session without waiting for it."""
    return subprocess.Popen(
        [sys.executable, script(name), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_progress_row(run_dir: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Block until the run has written its first progress row (the loop is running)."""
    deadline = time.time() + timeout
    f = run_dir / "progress.csv"
    while not (f.exists() and len(f.read_text().splitlines()) >= 2):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no progress row in time"
        time.sleep(0.1)


def children(pid: int) -> dict[int, str]:
    """The child processes of ``pid``, zombies included, with their command lines (a zombie's is empty)."""
    found = {}
    for stat in process_table().values():
        if stat.ppid == pid:
            try:
                with open(f"/proc/{stat.pid}/cmdline") as f:
                    found[stat.pid] = f.read()
            except OSError:  # gone since the walk
                continue
    return found


def kill_sampler(pid: int) -> int:
    """SIGKILL the spawn children of ``pid`` (not multiprocessing's resource tracker); returns how many."""
    killed = 0
    for child, cmd in children(pid).items():
        if "spawn_main" in cmd and "resource_tracker" not in cmd:
            os.kill(child, signal.SIGKILL)
            killed += 1
    return killed


def assert_killed_sampler_ends_the_run(name: str, args: list[str], run_dir: Path) -> None:
    """Start ``algos/<name>`` (writing to ``run_dir``), SIGKILL its sampler process once the loop runs: the run
    must end with exit code 1, the failure named on its last stderr line, the learner's checkpoint written, and no
    process left behind."""
    proc = start(name, *args, "--out-dir", str(run_dir.parent), "--run-name", run_dir.name)
    wait_for_progress_row(run_dir, proc)
    assert kill_sampler(proc.pid) == 1
    err = finish(proc)
    assert proc.returncode == 1, err
    assert err.strip().splitlines()[-1].startswith("error: the sampler process failed")
    assert_no_leftovers(proc.pid)
    # Nothing lost: the learner's state at the failure is the checkpoint, with its step and counters.
    import torch

    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] > 0 and f"checkpoint at step {ckpt['global_step']} is written" in err


def gae_by_definition(r, v, nv, term, ended, reset, gamma, lam):
    """A_t = sum_k (gamma lam)^k delta_{t+k}, stopping after the row that ends the episode or a life."""
    T, B = r.shape
    adv = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            if reset[t, b]:
                continue
            coef = 1.0
            for j in range(t, T):
                next_v = nv[b] if j == T - 1 else v[j + 1, b]
                delta = r[j, b] + gamma * next_v * (1 - term[j, b]) - v[j, b]
                adv[t, b] += coef * delta
                if ended[j, b] or term[j, b]:
                    break
                coef *= gamma * lam
    return adv
