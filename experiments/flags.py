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
- ``command(main)`` runs a command line's ``main``: a Ctrl-C or SIGTERM that nothing inside handles (the
  launcher's and the tuner's runs handle their own) ends it with one line on stderr, ``interrupted (SIGINT)``,
  and exit 130, never a traceback. Each command blocks both signals at its first statement (``python
  experiments/<name>.py``, before its imports); ``command`` unblocks them, so one that came while it imported
  ends it here. Before that first statement the interpreter's own start-up holds the signal (Python's default:
  a traceback, exit 1).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import NoReturn

__all__ = ["CHECK_ONLY", "Parser", "command", "refusal", "refusals"]

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
