"""Preallocated array structures, optionally in shared memory.

Guarantees
- ``buffer_from_example(example, leading_dims)`` allocates zeroed arrays shaped ``leading_dims + x.shape`` with
  ``x.dtype`` for every leaf ``x`` of ``example`` (``None`` stays ``None``), in the same structure.
- With ``shared=True`` the arrays live in anonymous shared memory (Linux ``memfd_create``; an unlinked temporary
  file elsewhere). A child made with ``fork`` inherits the mapping; a child made with ``spawn`` or
  ``forkserver`` receives a file descriptor when the array (or any view of it) is pickled as a process argument
  or through a multiprocessing queue, and maps the same pages: writes on either side are seen by the other.
- Nothing is ever named in ``/dev/shm``: the memory is returned to the system when the last process holding a
  mapping or descriptor exits or drops it, so a crash or SIGKILL cannot leak it.
"""

from __future__ import annotations

import mmap
import os
import sys
import tempfile
from collections.abc import Sequence
from multiprocessing import reduction
from typing import Any

import numpy as np

from shared.namedarraytuple import map_structure

__all__ = ["SharedArray", "shared_zeros", "buffer_from_example"]


class _Segment:
    """One anonymous shared mapping and the descriptor that lets other processes map it."""

    def __init__(self, nbytes: int, fd: int | None = None):
        self.nbytes = max(int(nbytes), 1)
        if fd is None:
            if hasattr(os, "memfd_create"):
                fd = os.memfd_create("rl-shared", os.MFD_CLOEXEC)
            else:  # pragma: no cover - non-Linux fallback: an already-unlinked file
                f = tempfile.TemporaryFile()
                fd = os.dup(f.fileno())
                f.close()
            os.ftruncate(fd, self.nbytes)
        self.fd = fd
        self.map = mmap.mmap(fd, self.nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.address = _address(np.frombuffer(self.map, dtype=np.uint8))

    def __reduce__(self):
        # DupFd hands the descriptor to a spawning child directly, or through multiprocessing's resource sharer.
        return (_attach_segment, (reduction.DupFd(self.fd), self.nbytes))

    def __del__(self):
        try:
            os.close(self.fd)
        except (OSError, AttributeError, TypeError):
            pass


def _attach_segment(dup_fd: Any, nbytes: int) -> _Segment:
    return _Segment(nbytes, fd=dup_fd.detach())


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class SharedArray(np.ndarray):
    """An ndarray in shared memory; it and its views pickle as a handle to the same memory, not a copy.

    Arrays computed from it (``a + 1``, fancy indexing) are ordinary private memory and pickle by value.
    """

    _segment: _Segment | None

    def __array_finalize__(self, obj: Any) -> None:
        seg = getattr(obj, "_segment", None)
        if seg is not None and not (seg.address <= _address(self) < seg.address + seg.nbytes or self.size == 0):
            seg = None  # a fresh allocation, not a view into the segment
        self._segment = seg

    def __reduce__(self):
        seg = self._segment
        if seg is None:
            return np.asarray(self).copy().__reduce__()
        offset = _address(self) - seg.address if self.size else 0
        return (_rebuild_shared, (seg, self.dtype.str, self.shape, self.strides, offset))

    def __deepcopy__(self, memo: Any) -> np.ndarray:
        return np.array(self, copy=True).view(np.ndarray)


def _rebuild_shared(seg: _Segment, dtype: str, shape: tuple, strides: tuple, offset: int) -> SharedArray:
    a = np.ndarray(shape, dtype=np.dtype(dtype), buffer=seg.map, offset=offset, strides=strides).view(SharedArray)
    a._segment = seg
    return a


def shared_zeros(shape: Sequence[int] | int, dtype: Any) -> SharedArray:
    """Zeroed array in anonymous shared memory (pages are zero on creation; nothing is touched until written)."""
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    seg = _Segment(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
    return _rebuild_shared(seg, dtype.str, shape, _c_strides(shape, dtype.itemsize), 0)


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    strides, acc = [], itemsize
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def buffer_from_example(example: Any, leading_dims: Sequence[int] | int, shared: bool = False) -> Any:
    """Zeroed arrays with ``leading_dims`` prepended to every leaf of ``example`` (see module docstring)."""
    leading = (leading_dims,) if isinstance(leading_dims, int) else tuple(leading_dims)
    if any(d < 0 for d in leading):
        raise ValueError(f"leading_dims must be non-negative, got {leading}")

    def alloc(x: Any) -> np.ndarray:
        x = _as_numpy(x)
        shape = leading + x.shape
        return shared_zeros(shape, x.dtype) if shared else np.zeros(shape, dtype=x.dtype)

    return map_structure(alloc, example)


def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor):
        torch = sys.modules["torch"]
        return (x.detach().float() if x.dtype == torch.bfloat16 else x.detach()).cpu().numpy()  # numpy has no bf16
    return np.asarray(x)
