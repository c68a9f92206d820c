"""The command lines of ``experiments/``: their one-line refusals, and the flags they pass to a script checked by
that script's own parser before anything starts.

Guarantees
- ``Parser`` is ``argparse.ArgumentParser`` whose refusal is the scripts' (docs/contract.md): one line
  ``error: ...`` on stderr, no usage block, exit 2, also for a typed option given ``--`` as its value (where
  argparse would leave an empty list). ``launch.py``, ``report.py``, ``status.py``, ``plot.py`` and ``tune.py``
  parse their arguments with it.
- ``refusal(script, flags)`` says whether ``script`` would start with ``flags``, asking the script itself: it runs
  ``python script *flags`` with ``RL_CHECK_ONLY=1`` in its environment (``shared.run.CHECK_ONLY``), so the script
  parses its flags, makes every check it makes before a run starts (flag ranges, env id, spaces, device, memory)
  and exits 0 before anything is created (``--out-dir`` is checked without being made, ``shared/cli.py``). It
  returns None when the script accepts them, else the reason: the script's last ``error:`` line without its
  ``error: `` prefix, or, for a check that ended otherwise (a crash, a signal, past ``timeout``), a line saying
  how it ended and the last line it wrote. It never raises for what the script does; a script that cannot be
  started at all (``OSError``) is a refusal too.
- ``refusals(checks)`` makes many such checks: identical (script, flags) pairs once, at most ``jobs`` at a time
  (each one imports torch: seconds), and returns the refused ones by their index in ``checks``, in that order.
  With ``stop_at_first`` the checks not yet started are dropped once one is refused (the refusals found so far
  are returned). Ctrl-C ends the checks running: they are in this process's foreground group.
- ``run_options`` declares the options ``launch.py`` and ``tune.py`` share (the grid's root, ``--config``,
  ``--env-ids``, ``--seeds``, ``--flags``, this machine's slots, stopping, the display, the SLURM group), once;
  ``check_options`` refuses, in one ``LaunchError``, a value of those or of either command's own resource options
  outside its range (before anything is read or written).
- ``check_creatable(path, where)`` refuses, in one ``LaunchError`` naming ``where``, a folder that could not be made
  where ``path`` is (a file there or above it, a folder this user may not enter), found out without making it: the
  nearest folder that exists is walked to (``shared.files``) and, unless ``probe=False``, a folder made and removed
  in it, its times set back (permissions alone do not say it for root, /proc or a read-only mount).
- ``command(main)`` runs a command line's ``main``: a Ctrl-C or SIGTERM that nothing inside handles (the
  launcher's and the tuner's runs handle their own) ends it with one line on stderr, ``interrupted (SIGINT)``,
  and exit 130, never a traceback. Each command blocks both signals at its first statement (``python
  experiments/<name>.py``, before its imports); ``command`` unblocks them, so one that came while it imported
  ends it here. Before that first statement the interpreter's own start-up holds the signal (Python's default:
  a traceback, exit 1).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import NoReturn

from experiments.grid import LaunchError
from shared.files import nearest_existing, probe_creatable

# shared.run.CHECK_ONLY, spelled out: importing shared.run would import torch into every experiments/ command
# (tests/test_launch_contract.py checks that the two agree).
CHECK_ONLY = "RL_CHECK_ONLY"
TIMEOUT_S = 300.0  # a check probes one env: seconds, tens of seconds for a slow env on a loaded machine


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` refusing as the scripts do: one ``error:`` line on stderr, exit 2."""

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        for action in self._actions:
            # argparse drops a value "--" (``--time=--``) and leaves [] where one typed value belongs
            if action.nargs is None and action.type is not None and isinstance(getattr(ns, action.dest, None), list):
                self.error(f"argument {'/'.join(action.option_strings) or action.dest}: expected one value")
        return ns, rest

    def error(self, message: str) -> NoReturn:
        # argparse's own messages are one line; a type's ValueError text might not be, and the contract is one line
        line = " ".join(message.split())
        self.exit(2, f"error: {line}\n")


def _describe(proc: subprocess.CompletedProcess | None, timeout: float) -> str | None:
    if proc is None:
        return f"its checks did not finish in {timeout:g} s"
    if proc.returncode == 0:
        return None
    lines = [ln.strip() for ln in (proc.stderr or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    if proc.returncode == 2 and errors:
        return errors[-1][len("error:") :].strip()
    how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    last = (errors or lines or ["no output"])[-1]
    return f"its checks ended with {how}: {last}"


def refusal(
    script: str | Path, flags: Sequence[str], env: dict[str, str] | None = None, timeout: float = TIMEOUT_S
) -> str | None:
    """None when ``script`` accepts ``flags`` (it would start), else why not (see the module docstring).

    ``env``: the environment the run would get (default: this process's); ``RL_CHECK_ONLY`` is added to it."""
    child_env = dict(os.environ if env is None else env)
    child_env[CHECK_ONLY] = "1"
    child_env["PYTHONDONTWRITEBYTECODE"] = "1"  # a check writes nothing, not even a __pycache__ beside a copied script
    try:
        proc = subprocess.run(
            [sys.executable, str(script), *flags],
            env=child_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:  # subprocess.run has killed it
        proc = None
    except OSError as e:
        return f"cannot start {script}: {e.strerror or e}"
    return _describe(proc, timeout)


def refusals(
    checks: Sequence[tuple[str | Path, Sequence[str]]],
    jobs: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT_S,
    stop_at_first: bool = False,
) -> list[tuple[int, str]]:
    """``refusal`` of every (script, flags) in ``checks``, identical ones once, ``jobs`` at a time; returns
    ``(index, reason)`` of each refused one, by index."""
    keys = [(str(script), tuple(flags)) for script, flags in checks]
    unique = list(dict.fromkeys(keys))
    verdicts: dict[tuple[str, tuple[str, ...]], str | None] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(unique) or 1))) as pool:
        pending: dict[Future, tuple[str, tuple[str, ...]]] = {
            pool.submit(refusal, s, list(f), env, timeout): (s, f) for s, f in unique
        }
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    verdicts[pending.pop(fut)] = fut.result()
                if stop_at_first and any(verdicts.values()):
                    for fut in pending:
                        fut.cancel()  # not started yet: dropped; started ones finish (seconds)
                    break
        finally:
            for fut in pending:
                fut.cancel()
    return [(i, verdicts[k]) for i, k in enumerate(keys) if verdicts.get(k)]


STOP = {signal.SIGINT, signal.SIGTERM}  # what a command blocks at its first statement (the module docstring)


def _interrupt(signum, frame) -> NoReturn:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def command(main: Callable[[], int]) -> int:
    """``main()``'s exit status; 130 with one line after a Ctrl-C or SIGTERM it lets through (the module docstring)."""
    for s in STOP:
        signal.signal(s, _interrupt)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)  # a signal kept while the command imported raises here
        return main()
    except KeyboardInterrupt as e:
        print(f"interrupted ({e or 'SIGINT'})", file=sys.stderr, flush=True)
        return 130


def one_line(main: Callable[..., int]) -> Callable[..., int]:
    """``main`` with a ``LaunchError`` written as one ``error:`` line on stderr and returned as exit status 2."""

    @functools.wraps(main)
    def refusing(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except LaunchError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 2

    return refusing


def split_tail(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """A command's own arguments (``sys.argv``'s when ``argv`` is None) and those after ``--``: every run's flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    i = argv.index("--") if "--" in argv else len(argv)
    return argv[:i], argv[i + 1 :]


def run_options(p: argparse.ArgumentParser, root: str, slurm: str) -> argparse._ArgumentGroup:
    """The options launch.py and tune.py share, on ``p``; ``root`` and ``slurm`` say what the root is and what
    ``--slurm`` submits. Returns the SLURM group, for each command's own cluster options."""
    p.add_argument("root", nargs="?", help=f"{root} (or `root` in the --config file)")
    p.add_argument("--config", type=Path, help="the command in a TOML or JSON file (the module docstring's form)")
    p.add_argument("--env-ids", nargs="+", help="gymnasium ids (left out: the script's default)")
    p.add_argument("--seeds", nargs="+", type=int, help="each script x env id (x variant or trial) runs every seed")
    p.add_argument("--flags", default="", help="flags for every run, one string")
    p.add_argument("--dry-run", action="store_true", help="print what would run, and its resources; change nothing")
    p.add_argument("--cores-per-run", type=int, default=1, help="physical cores per slot (default 1)")
    p.add_argument("--gpus-per-run", type=int, default=None, help="GPUs of its own per run (0: hide the GPUs)")
    p.add_argument("--runs-per-gpu", type=int, default=None, help="at most this many runs share one GPU")
    p.add_argument("--stop-timeout", type=float, default=120.0, help="seconds a stopped run gets to write its checkpoint")
    p.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    p.add_argument("--status-every", type=float, default=30.0, help="seconds between summary lines (plain output)")
    s = p.add_argument_group("clusters (submitit)")
    s.add_argument("--slurm", action="store_true", help=slurm)
    s.add_argument("--cluster", choices=["auto", "slurm", "local"], default="auto", help="auto: SLURM where sbatch exists")
    s.add_argument("--partition", default=None)
    s.add_argument("--time", type=int, default=60, help="minutes per job (then it is requeued and resumes)")
    s.add_argument("--mem-gb", type=float, default=None)
    s.add_argument("--slurm-param", action="append", default=[], metavar="KEY=VALUE", help="any other sbatch option")
    s.add_argument("--wait", action="store_true", help="with --slurm: wait for the jobs")
    return s


POSITIVE = ("cores_per_run", "nproc_per_node", "runs_per_gpu", "time", "array_parallelism", "max_failures", "workers")
NON_NEGATIVE = ("gpus_per_run", "gpus_per_worker")
SECONDS = ("stop_timeout", "status_every", "stale_after")


def check_options(a: argparse.Namespace) -> None:
    """The options of this process (``run_options`` and each command's own resources), each on its own."""
    for dest in (*POSITIVE, "cpus_per_worker", *NON_NEGATIVE, *SECONDS, "mem_gb"):
        v, flag = getattr(a, dest, None), "--" + dest.replace("_", "-")
        if v is None:
            continue
        if dest in SECONDS and not (math.isfinite(v) and v >= 0):
            raise LaunchError(f"{flag} must be a finite, non-negative number of seconds, got {v}")
        if dest == "mem_gb" and not (math.isfinite(v) and v > 0):
            raise LaunchError(f"{flag} must be a positive number, got {v}")
        if dest in NON_NEGATIVE and v < 0:
            raise LaunchError(f"{flag} must be a non-negative integer, got {v}")
        if dest in (*POSITIVE, "cpus_per_worker") and v < 1:
            raise LaunchError(f"{flag} must be a positive integer, got {v}")
    if a.gpus_per_run is not None and a.runs_per_gpu is not None:
        raise LaunchError("give --gpus-per-run or --runs-per-gpu, not both")
    if a.partition is not None and not a.partition.strip():
        raise LaunchError("--partition must not be empty")
    for kv in a.slurm_param:
        if not re.match(r"^[A-Za-z][A-Za-z0-9_-]*=", kv):
            raise LaunchError(f"--slurm-param {kv!r}: not KEY=VALUE (e.g. account=abc)")
    if getattr(a, "sampler_seed", None) is not None and not 0 <= a.sampler_seed < 2**32:
        raise LaunchError(f"--sampler-seed must be in [0, 2**32), got {a.sampler_seed}")
    if a.slurm and importlib.util.find_spec("submitit") is None:
        raise LaunchError("--slurm needs submitit (pip install -r requirements.txt)")


def check_creatable(path: Path, where: str, probe: bool = True) -> None:
    """That folder ``path`` exists or could be made, without making it (the module docstring)."""
    try:  # exists() itself raises for a folder this user may not enter
        there = nearest_existing(path)
    except OSError as e:
        raise LaunchError(f"{where}: {e.strerror or e}") from None
    if not there.is_dir():
        raise LaunchError(f"{where}: {there} is a file, not a folder")
    try:
        if probe:
            probe_creatable(there)
    except OSError as e:
        raise LaunchError(f"{where}: cannot make a folder in {there} ({e.strerror or e})") from None
