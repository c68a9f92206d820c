"""Waiting on something shared with another process without hanging when that process dies.

Guarantees
- ``wait_for(acquire, check)`` blocks on ``acquire(timeout)`` in short slices and calls ``check()`` between
  them; ``check`` raises when the other side has failed or gone, so the wait ends with that error.
- ``locked(lock, check)`` holds a lock shared with another process; with ``check``, a peer killed while holding
  the lock (it is then never released) makes ``check`` raise instead of a hang.
- A Ctrl-C or SIGTERM (``shared.signals.raise_on_signals``) never leaves ``locked``'s lock held: its
  ``KeyboardInterrupt`` comes before the lock is taken or after it is released. Without this, one handled in
  the bytecodes between the acquire and the block, or between the block and the release, kept the lock for
  ever (a few Ctrl-Cs in a hundred of an async replay run), and the checkpoint written on the way out waited
  on it (tests/test_sync.py).
Imports only ``shared.signals``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shared import signals

__all__ = ["POLL_S", "locked", "wait_for"]

POLL_S = 0.2  # longest slice of a wait between two checks


def wait_for(acquire: Callable[[float], bool], check: Callable[[], None]) -> None:
    """Block on ``acquire(timeout)`` in short slices, calling ``check()`` (which may raise) between them."""
    while not acquire(POLL_S):
        check()


class locked:
    """``with locked(lock, check):`` holds ``lock``; with ``check``, it waits in slices calling ``check()``.

    Signals are deferred (``shared.signals.defer``) from just before each acquire to just after the release:
    one that comes while the lock is held raises once it is released (an exception of the block then becomes
    that KeyboardInterrupt, the block's exception chained to it); one that comes while the lock is busy raises
    between two slices of the wait (within ``POLL_S`` seconds), nothing held. Inside another ``locked`` block
    the outer one defers it too: it raises when the outermost lock is released. So a block is never cut by a
    signal; only SIGKILL ends one that hangs."""

    def __init__(self, lock: Any, check: Callable[[], None] | None = None):
        self.lock, self.check = lock, check

    def __enter__(self) -> None:
        wait_for(self._acquire, self.check or (lambda: None))  # deferred until __exit__ has released the lock

    def _acquire(self, timeout: float) -> bool:
        """One slice of the wait, signals deferred; left deferred only when the lock is taken."""
        signals.defer()
        try:
            acquired = self.lock.acquire(timeout=timeout)
        except BaseException:  # a broken lock: signals raise again
            signals.undefer()
            raise
        if not acquired:
            signals.undefer()  # a kept signal raises here, nothing held
        return acquired

    def __exit__(self, *exc: object) -> None:
        try:
            self.lock.release()
        finally:
            signals.undefer()  # a signal kept while the lock was held raises now
