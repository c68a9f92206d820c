"""Waiting on something shared with another process without hanging when that process dies.

Guarantees
- ``wait_for(acquire, check)`` blocks on ``acquire(timeout)`` in short slices and calls ``check()`` between
  them; ``check`` raises when the other side has failed or gone, so the wait ends with that error.
- ``locked(lock, check)`` holds a lock shared with another process; with ``check``, a peer killed while holding
  the lock (it is then never released) makes ``check`` raise instead of a hang.
Imports nothing from the project.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

__all__ = ["POLL_S", "locked", "wait_for"]

POLL_S = 0.2  # longest slice of a wait between two checks


def wait_for(acquire: Callable[[float], bool], check: Callable[[], None]) -> None:
    """Block on ``acquire(timeout)`` in short slices, calling ``check()`` (which may raise) between them."""
    while not acquire(POLL_S):
        check()


@contextlib.contextmanager
def locked(lock: Any, check: Callable[[], None] | None = None):
    """Hold ``lock``. With ``check``, wait for it in short slices calling ``check()`` between them."""
    if check is None:
        lock.acquire()
    else:
        wait_for(lambda t: lock.acquire(timeout=t), check)
    try:
        yield
    finally:
        lock.release()
