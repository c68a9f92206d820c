"""Files of a run folder written so that a crash or a full disk never leaves a broken one.

Guarantees
- ``atomic_write(path, write)`` calls ``write(tmp)`` on a temporary path beside ``path`` and renames it over
  ``path``: an interruption or a full disk leaves the previous version intact and no temporary file behind.
  A failure raises ``WriteError`` naming the file and the reason (e.g. no space left on the device).
Imports nothing from the project.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

__all__ = ["WriteError", "atomic_write", "nearest_existing", "probe_creatable", "write_text"]


class WriteError(RuntimeError):
    """A file of the run folder could not be written (disk full, permissions); the message names it."""


def reason(error: Exception, folder: Path) -> str:
    """Why a write failed, in words: the OS error, or a nearly full disk when the library did not say."""
    if isinstance(error, OSError) and error.errno is not None:
        return os.strerror(error.errno)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if free is not None and free < 64 << 20:
        return f"no space left on the device ({free:,} bytes free)"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Write ``path`` through ``write(tmp)`` and a rename (see the module docstring)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch reports a full disk as a RuntimeError ("unexpected pos")
        tmp.unlink(missing_ok=True)
        raise WriteError(f"cannot write {path}: {reason(e, path.parent)}") from e


def write_text(path: Path, text_writer: Callable) -> None:
    """``atomic_write`` for a text file: ``text_writer(f)`` writes to the open file."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            text_writer(f)

    atomic_write(path, write)


def nearest_existing(path: Path) -> Path:
    """``path`` (absolute) or its nearest parent that exists; ``OSError`` where ``exists()`` itself cannot tell (a
    folder this user may not enter)."""
    return next(p for p in [path.absolute(), *path.absolute().parents] if p.exists())


def probe_creatable(there: Path) -> None:
    """``OSError`` unless a folder can be made in the existing folder ``there``, found out by making one and removing
    it, its times set back: permissions alone do not say it for root, /proc or a read-only mount; nothing changes."""
    import tempfile

    times = there.stat()
    os.rmdir(tempfile.mkdtemp(prefix=".write-test-", dir=there))
    os.utime(there, ns=(times.st_atime_ns, times.st_mtime_ns))
