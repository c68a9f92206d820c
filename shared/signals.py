"""How Ctrl-C (SIGINT) and SIGTERM reach a run: one place for both ways of handling them.

Guarantees
- ``raise_on_signals()``: SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the main thread, so one ``except``
  path writes the checkpoint, ends the children and exits 130. SIGINT is set explicitly: a process started in
  the background by a non-interactive shell inherits SIGINT ignored, and Python would leave it ignored.
- ``flag_on_signals()``: SIGINT and SIGTERM only set a flag (``signalled()``), for a torchrun job whose ranks must
  leave their loop at the same iteration: they agree on the flag first (``shared.distributed.any_rank``).
  ``clear()`` resets it. Going back with ``raise_on_signals()`` keeps the flag, so the caller can still act on
  a signal that came in between.
- Either way, SIGUSR1 prints the Python stack of every thread to stderr and the run goes on
  (``kill -USR1 <pid>``): what a hung run is waiting on, without a debugger.
Imports nothing from the project.
"""

from __future__ import annotations

import faulthandler
import signal
import sys

__all__ = ["clear", "flag_on_signals", "raise_on_signals", "signalled"]

_flag = {"signalled": False}


def _raise(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _set_flag(signum, frame) -> None:
    _flag["signalled"] = True


def raise_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread; SIGUSR1 prints every thread's stack."""
    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # fd 2 itself, also when sys.stderr is replaced (pytest capture, a notebook)
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


def flag_on_signals() -> None:
    """SIGTERM and SIGINT only set the flag ``signalled()`` reads."""
    _flag["signalled"] = False
    signal.signal(signal.SIGINT, _set_flag)
    signal.signal(signal.SIGTERM, _set_flag)


def signalled() -> bool:
    return _flag["signalled"]


def clear() -> None:
    _flag["signalled"] = False
