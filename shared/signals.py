"""How Ctrl-C (SIGINT) and SIGTERM reach a run: one place for both ways of handling them.

Guarantees
- ``raise_on_signals()``: SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the main thread, so one ``except``
  path writes the checkpoint, ends the children and exits 130. SIGINT is set explicitly: a process started in
  the background by a non-interactive shell inherits SIGINT ignored, and Python would leave it ignored.
- ``flag_on_signals()``: SIGINT and SIGTERM only set a flag (``signalled()``), for a torchrun job whose ranks must
  leave their loop at the same iteration: they agree on the flag first (``shared.distributed.any_rank``).
  ``clear()`` resets it. Going back with ``raise_on_signals()`` keeps the flag, so the caller can still act on
  a signal that came in between.
- ``defer()`` ... ``undefer()`` (main thread; calls in other threads do nothing; they nest): a SIGINT or SIGTERM
  that would raise in between is kept and raised by the outermost ``undefer()``, so a few lines that must not
  be cut (a lock taken and the ``try`` that releases it: ``shared.sync.locked``) run whole. Only under
  ``raise_on_signals()``.
- Under ``raise_on_signals()``, an interrupt that no ``with run:`` catches (one during the setup before the
  training loop: building the networks, allocating the replay, loading a checkpoint) prints one line, not a
  traceback (unless it cut the handling of another error: then that error's traceback); the ``finally`` blocks
  and context managers it passes through run as usual, and Python then ends the process by SIGINT (the status a
  shell shows as 130).
- Under ``raise_on_signals()`` too, every SIGINT or SIGTERM sets ``signalled()``. Python runs a signal handler
  in the main thread at its next check, which may fall inside a finalizer (a ``weakref.finalize`` callback, a
  ``__del__``, run by the garbage collector): there the ``KeyboardInterrupt`` is printed as "Exception ignored"
  and dropped, and the process goes on. ``shared.run.Run.periodic`` reads the flag, so the training loop still
  stops at its next iteration as for Ctrl-C (exit 130, the checkpoint written). ``clear()`` resets it
  (``Run.setup`` does).
- ``sigint_blocked()``: SIGINT blocked in the calling thread for the block. A process started within it inherits the
  mask (it survives fork and exec) and keeps it until it changes it: a spawned worker that imports the script
  for seconds cannot be cut mid-import by a Ctrl-C to the process group. A Ctrl-C for this process meanwhile goes
  to another thread or waits, and raises at the end of the block at the latest. (It starts multiprocessing's
  resource tracker first: that one unblocks SIGINT when it starts.)
- Either way, SIGUSR1 prints the Python stack of every thread to stderr and the run goes on
  (``kill -USR1 <pid>``): what a hung run is waiting on, without a debugger.
Imports nothing from the project.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = ["clear", "defer", "flag_on_signals", "raise_on_signals", "sigint_blocked", "signalled", "undefer"]

_flag = {"signalled": False}
_deferring = {"depth": 0, "kept": None}  # the main thread's defer() depth; the signal kept meanwhile


def _raise(signum, frame):
    _flag["signalled"] = True  # also when the raise below is swallowed (see the module docstring)
    if _deferring["depth"] > 0:
        _deferring["kept"] = signum
        return
    _deferring["kept"] = None  # raised now: nothing left for an undefer() to raise again
    raise KeyboardInterrupt(f"signal {signum}")


def defer() -> None:
    """Until the matching ``undefer()``, a signal that would raise is kept instead (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        _deferring["depth"] += 1


def undefer() -> None:
    """End a ``defer()``; a signal kept meanwhile raises ``KeyboardInterrupt`` here."""
    if threading.current_thread() is not threading.main_thread():
        return
    _deferring["depth"] = max(_deferring["depth"] - 1, 0)  # an unmatched undefer() cannot defer for good
    if _deferring["depth"] == 0 and _deferring["kept"] is not None:
        signum, _deferring["kept"] = _deferring["kept"], None
        raise KeyboardInterrupt(f"signal {signum}")


def _set_flag(signum, frame) -> None:
    _flag["signalled"] = True


def raise_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread; SIGUSR1 prints every thread's stack."""
    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, _raise)
    if _hook["previous"] is None:  # once: a hook installed after ours may chain to it
        _hook["previous"], sys.excepthook = sys.excepthook, _one_line
    # fd 2 itself, also when sys.stderr is replaced (pytest capture, a notebook)
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


def _one_line(kind, value, tb) -> None:
    """``sys.excepthook``: the module docstring. An interrupt during the handling of another error (a Ctrl-C in a
    ``finally`` after a failure) shows that error whole."""
    cause = value.__cause__ or value.__context__
    if issubclass(kind, KeyboardInterrupt) and (cause is None or isinstance(cause, KeyboardInterrupt)):
        print(f"interrupted ({str(value) or 'Ctrl-C'}) outside the training loop", file=sys.stderr, flush=True)
    else:
        _hook["previous"](kind, value, tb)


_hook: dict = {"previous": None}


def flag_on_signals() -> None:
    """SIGTERM and SIGINT only set the flag ``signalled()`` reads."""
    _flag["signalled"] = False
    signal.signal(signal.SIGINT, _set_flag)
    signal.signal(signal.SIGTERM, _set_flag)


def signalled() -> bool:
    return _flag["signalled"]


def clear() -> None:
    _flag["signalled"] = False


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread within the block (the module docstring); where the platform has no
    ``pthread_sigmask``, nothing."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    # multiprocessing's resource tracker, started by the first semaphore or queue, unblocks SIGINT once it is
    # running (whatever the mask was): it is started before the block, not within it.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a Ctrl-C kept meanwhile raises here
