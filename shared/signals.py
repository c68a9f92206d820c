"""How Ctrl-C (SIGINT) and SIGTERM reach a run.

Guarantees
- ``raise_on_signals()``: SIGINT and SIGTERM raise ``KeyboardInterrupt`` in the main thread, so one ``except``
  path writes the checkpoint, ends the children and exits 130. SIGINT is set explicitly: a process started in
  the background by a non-interactive shell inherits SIGINT ignored, and Python would leave it ignored.
  (Under torchrun, ``shared.distributed`` replaces this with a flag the ranks agree on, and restores it at the end.)
Imports nothing from the project.
"""

from __future__ import annotations

import signal

__all__ = ["raise_on_signals"]


def _raise(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def raise_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread."""
    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGINT, signal.default_int_handler)
