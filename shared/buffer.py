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
- Nothing is allocated that the machine cannot hold: ``zeros`` (and through it ``buffer_from_example``, the
  replays and the sum tree) first checks the array's bytes against the memory this process may still take
  (``available_memory``: the smaller of ``MemAvailable`` and the cgroup's limit) and raises ``NotEnoughMemory``
  with both figures instead. The check comes first because neither refusal is reliable: numpy refuses only what
  the kernel's overcommit rule refuses, and shared memory is never refused at all (its pages are taken when
  written, hours later, by which time the kernel's out-of-memory killer ends the run). ``check_fits`` checks a
  sum of arrays made this way, whose pages are not touched yet.
- ``on_device(structure, fields, device)``: the same structure with those fields as zeroed tensors on ``device``,
  all views of one block laid out step by step: the leaves' ``[B, ...]`` slices of step ``t`` lie side by side,
  in the order of the fields and at ``shared.device.upload``'s offsets, so that a step's one copy up of the same
  fields lands in the rollout as it is (``upload(..., into=...)``); they are views of that block, so a write through
  any of them changes the version every one of them reports (what ``@graphed`` reads to skip an unchanged input).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from multiprocessing import reduction
from pathlib import Path
from typing import Any

import numpy as np

from shared.namedarraytuple import map_structure

__all__ = [
    "NotEnoughMemory",
    "SharedArray",
    "available_memory",
    "buffer_from_example",
    "check_fits",
    "on_device",
    "shared_zeros",
    "zeros",
]


class NotEnoughMemory(MemoryError):
    """``what`` needs ``needed`` bytes and this process may take only ``available``: refused before allocating."""

    def __init__(self, what: str, needed: int, available: int):
        self.what, self.needed, self.available = what, needed, available
        super().__init__(
            f"{what} needs {needed / 2**30:.1f} GiB, and {available / 2**30:.1f} GiB of memory are available here"
        )


def available_memory() -> int:
    """Bytes this process may still take: MemAvailable, or less where a cgroup limit is nearer."""
    free = None
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo") as f:
            free = int(next(ln for ln in f if ln.startswith("MemAvailable:")).split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            free = min(free if free is not None else 1 << 62, int(limit) - used)
    return free if free is not None else 1 << 62


_checking = [True]


def check_fits(nbytes: int, what: str) -> None:
    """Raise ``NotEnoughMemory`` when ``nbytes`` exceed the memory this process may still take (not inside
    ``unchecked``)."""
    if not _checking[-1]:
        return
    free = available_memory()
    if nbytes > free:
        raise NotEnoughMemory(what, int(nbytes), free)


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Arrays made inside are not checked: arrays that will never be written (the replay of an --eval-only run)
    take no memory, since their pages are taken only when written."""
    _checking.append(False)
    try:
        yield
    finally:
        _checking.pop()


def zeros(shape: Sequence[int] | int, dtype: Any, shared: bool = False) -> np.ndarray:
    """A zeroed array, in anonymous shared memory with ``shared``, after ``check_fits`` of its bytes."""
    shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    check_fits(nbytes, f"a {list(shape)} {dtype} array")
    return shared_zeros(shape, dtype) if shared else np.zeros(shape, dtype)


class _Segment:
    """One anonymous shared mapping and the descriptor that lets other processes map it; ``pinned`` where this
    process page-locked it for a GPU's copies (``shared.device.pin_host`` set ``unpin``, which undoes that before the
    mapping is freed)."""

    unpin: Any = None

    @property
    def pinned(self) -> bool:
        return self.unpin is not None

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
            if self.unpin is not None:  # before the mapping goes: the driver must not keep pages that are reused
                self.unpin()
        finally:
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
        base = self.base
        if type(base) is SharedArray:  # a view (its base holds the memory), known at once: a sampler's every row write
            self._segment = base._segment  # makes one, and the address check below costs 2 µs each
            return
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
        return zeros(leading + x.shape, x.dtype, shared)

    leaves: list[np.ndarray] = []
    map_structure(lambda x: leaves.append(_as_numpy(x)), example)
    rows = math.prod(leading)
    check_fits(rows * sum(x.nbytes for x in leaves), f"a structure of {len(leaves)} arrays of {list(leading)} rows")
    return map_structure(alloc, example)


def on_device(structure: Any, fields: Sequence[str], device: Any) -> Any:
    """``structure`` (a namedarraytuple of arrays ``[T, ...]``) with ``fields`` replaced by zeroed tensors on ``device``
    of each leaf's shape and dtype: where a sampler in the learner's process writes what the update reads on the
    device (a rollout's observations). They are views of one block whose step ``t`` holds every leaf's ``[t]`` at the
    offsets ``shared.device.upload`` packs them at (module docstring): a step's copy up lands there in one copy."""
    import torch

    from shared.device import Uploader, torch_dtype
    from shared.namedarraytuple import replace_leaves, walk_structure

    on = {f: getattr(structure, f) for f in fields}
    leaves = [(path, x) for path, x in walk_structure(on, sequences=False) if x is not None]
    layout, end = Uploader.layout([x[0] for _, x in leaves])  # a step's slice of each leaf, as a step uploads it
    row = -(-end // Uploader.ALIGN) * Uploader.ALIGN
    steps = leaves[0][1].shape[0]
    block = torch.zeros(steps * row, dtype=torch.uint8, device=device)
    tensors = {}
    for (path, x), offset in zip(leaves, layout):
        size = np.dtype(x.dtype).itemsize
        strides = (row // size, *(int(np.prod(x.shape[i + 1 :])) for i in range(1, x.ndim)))  # a step's slice contiguous
        # a view of the block, not a tensor set_ on its storage: every leaf shares the block's version counter, so a
        # step's copy through one of them is seen by @graphed as a change of all (the masks copied in with the obs)
        tensors[path] = block.view(torch_dtype(x.dtype)).as_strided(x.shape, strides, offset // size)
    return structure._replace(**replace_leaves(on, tensors, sequences=False))


def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if "torch" in sys.modules and isinstance(x, sys.modules["torch"].Tensor):
        torch = sys.modules["torch"]
        return (x.detach().float() if x.dtype == torch.bfloat16 else x.detach()).cpu().numpy()  # numpy has no bf16
    return np.asarray(x)
