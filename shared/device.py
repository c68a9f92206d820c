"""What crosses between the host and the learner's device inside a hot loop.

Guarantees
- ``to_host(*tensors)`` returns the tensors' values as numpy arrays (each of its own dtype and shape; bfloat16
  as float32) in one device-to-host copy: the one wait on a GPU that a sampling step or an update makes, for
  what the host needs at once (the actions the envs step with, a prioritized replay's new priorities). Several
  tensors are joined as bytes on the device and land in host bytes kept for their signature (pinned, from a GPU);
  each array handed back is a copy of its own. On the CPU it copies nothing. Everything else a loop reports
  (losses, statistics) stays on the device as detached tensors until a progress row reads it (``shared.progress``).
- ``upload(arrays, device)`` brings a batch to the learner's device: ``arrays`` is a numpy array, or a dict or
  namedarraytuple of them, nested to any depth (a Dict observation inside a rollout), and comes back in the same
  structure with tensors in place of the arrays (a namedarraytuple of the same class, ``None`` fields kept); a
  tensor among them is passed as it is (moved, where it is elsewhere: a rollout kept on the device); a plain tuple
  or list is one array. One array and a flat dict of arrays (what a loop uploads every step) take no walk; anything
  nested goes through ``shared.namedarraytuple.walk_structure`` and ``replace_leaves``, by path. On
  the CPU the tensors share the arrays' memory (no copy). On CUDA the arrays' bytes are packed into a pinned staging
  buffer and sent in one non-blocking copy, the tensors being views of the one device block; two staging buffers
  take turns, and one is refilled only after the event recorded behind its last copy has passed, so the host
  never overwrites bytes still in flight: it runs at most two uploads ahead of the device (loops that upload
  several times between reads, such as PPO's epochs, may wait there; nothing else does).
- ``upload(arrays, device, into=...)``: ``into`` has the structure of ``arrays`` and says where a rollout keeps this
  step; every leaf lands there too. Where ``into``'s tensors are one step of ``shared.buffer.on_device``'s rollout on
  ``device``, laid out as this copy packs the same flat dict, the one copy goes straight there and ``into`` itself
  is returned (on a GPU: no copy from a staging block into the rollout, and a ``@graphed`` call sees one block);
  where they are numpy arrays in shared memory this process page-locked (``pin_host``: an async sampler's rollout on
  a GPU), each array is written there and copied up from there, one copy a field and no staging buffer: the host
  copies each step's bytes once, not twice (the copy reads the destination after the call returns: a loop writes
  that row again only after reading something back that came after it, as a sampler's actions do at every step);
  elsewhere (the CPU, another numpy destination, a Dict observation) each destination gets its copy apart: a numpy
  one the host's array, a tensor the uploaded one.
- ``pin_host(structure, device)``: the shared memory under ``structure``'s arrays (``shared.buffer.SharedArray``)
  page-locked for ``device`` in this process (CUDA's ``cudaHostRegister``, undone when the memory is freed; a
  refusal raises); on the CUDA host path (below) only marked, so that the tests and the benchmarks run the path
  above; elsewhere nothing.
- ``upload_each(arrays, dests, device)``: each array of a flat dict copied into its tensor of ``dests`` (in order; on
  ``device``, of its dtype and shape, else a ``ValueError`` before anything is copied, as is another number of them),
  on CUDA each straight from the staging buffer (one copy a field, no block in between, the staging buffers' turns as
  above): a replay mirror's rows, scattered in its tensors, written without a copy on the device.
- ``RL_HOST_PATH=cuda`` (benchmarks and tests only): on the CPU, the host work of the CUDA path runs as it would on
  a GPU (uploads packed into staging and copied as one block, or field by field by ``upload_each``; ``to_host``
  through one joined copy), so that the tests run it and ``benchmarks/speed/loop_overhead.py`` can count and time it
  on a machine without one; ``dry`` also leaves out the bytes of the copy up, which a GPU's DMA engine moves (the
  values are then wrong).
Imports nothing from the project but ``shared.namedarraytuple``'s walk (which imports nothing from it either).
"""

from __future__ import annotations

import bisect
import operator
import os
import threading
import weakref
from typing import Any, NamedTuple

import numpy as np

from shared.namedarraytuple import replace_leaves, walk_structure

__all__ = ["Uploader", "pin_host", "to_host", "upload", "upload_each"]

# The CUDA host path on the CPU (module docstring); "dry": also without the bytes a GPU's DMA engine would copy.
CUDA_PATH = os.environ.get("RL_HOST_PATH") in ("cuda", "dry")
DRY = os.environ.get("RL_HOST_PATH") == "dry"
_KEEP_BYTES = 16384  # to_host reads at most this many bytes into host memory it keeps (then copies them out)
_CACHED = 64  # signatures (names, shapes, dtypes) whose layout a copy keeps; more, and it starts again
_ROWS = 4096  # destinations (a rollout's steps) whose bytes a copy keeps
_NUMPY = {}  # torch dtype -> numpy dtype, and back: found once (a lookup through an empty array costs microseconds)


def to_host(*tensors: Any) -> Any:
    """The values of ``tensors`` on the host, as one numpy array or a list of them (see the module docstring)."""
    if CUDA_PATH or tensors[0].device.type != "cpu":
        out = one_copy(tensors)
    else:
        import torch

        out = [(t.float() if t.dtype == torch.bfloat16 else t).detach().numpy() for t in tensors]
    return out[0] if len(out) == 1 else out


def numpy_dtype(dtype: Any) -> np.dtype:
    """The numpy dtype of a torch ``dtype`` (cached)."""
    if dtype not in _NUMPY:
        import torch

        _NUMPY[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
    return _NUMPY[dtype]


def torch_dtype(dtype: np.dtype) -> Any:
    """The torch dtype of a numpy ``dtype`` (cached)."""
    if dtype not in _NUMPY:
        import torch

        _NUMPY[dtype] = torch.from_numpy(np.empty(0, dtype)).dtype
    return _NUMPY[dtype]


def one_copy(tensors: tuple) -> list[np.ndarray]:
    """The tensors' values on the host in one copy, each an array of its own memory (bfloat16 as float32): one tensor
    copied into host memory kept for its dtype and shape (contiguous), several joined as bytes on their device, copied
    at once into host bytes kept for their signature and split back into arrays; either way copies of those are
    handed back."""
    import torch

    if len(tensors) == 1:  # nothing to join (DQN's, SAC's actions); a copy on the CPU too, never the tensor's memory
        x = tensors[0].detach()
        x = x.float() if x.dtype == torch.bfloat16 else x
        out = _kept_copy((x.dtype, x.shape), x)  # its strides made contiguous
        if out is None:  # a large read: into new memory, with no second copy
            host = x.cpu()  # the copy from a GPU; on the CPU (RL_HOST_PATH) x itself, so cloned
            out = [(host.clone() if host is x else host).numpy()]
        return out
    signature = tuple([(t.dtype, t.shape) for t in tensors])
    split = _splits.get(signature)
    if split is None:  # how each tensor is joined and split again, found once per signature (a loop reads the same)
        if len(_splits) >= _CACHED:
            _splits.clear()
        split = _splits[signature] = _split(tensors)
    bf16, vectors, pieces = split
    if bf16:
        tensors = [t.float() if t.dtype == torch.bfloat16 else t for t in tensors]
    # One view a tensor of one dimension with its elements side by side (a graph's copied-out actions, values); else
    # contiguous() (a strided or expanded view x[:, 0]; a contiguous tensor is itself) and a flat view.
    try:
        flat = [t.view(torch.uint8) for t in tensors] if vectors else None
    except RuntimeError:  # a vector with a stride other than 1: not viewable as bytes
        flat = None
    if flat is None:
        flat = [t.contiguous().view(-1).view(torch.uint8) for t in tensors]
    flat = torch.cat(flat)
    flat = flat.detach() if flat.requires_grad else flat  # detached once, not each
    out = _kept_copy(signature, flat, pieces)
    # a large read (R2D1's recurrent states): into new memory, with no second copy
    return out if out is not None else _arrays(flat.cpu().numpy(), pieces)


def _split(tensors: tuple) -> tuple:
    """How ``one_copy`` joins ``tensors`` and splits their bytes: whether any is bfloat16 (sent as float32), whether all
    are vectors (viewed as bytes at once), and per tensor its bytes' start and end, its numpy dtype (None: uint8) and
    its shape (None: a vector)."""
    import torch

    pieces, at = [], 0
    for t in tensors:
        np_dtype = numpy_dtype(torch.float32 if t.dtype == torch.bfloat16 else t.dtype)
        n = t.numel() * np_dtype.itemsize
        pieces.append((at, at + n, None if np_dtype == np.uint8 else np_dtype, None if t.dim() == 1 else tuple(t.shape)))
        at += n
    bf16 = any(t.dtype == torch.bfloat16 for t in tensors)
    return bf16, all(t.dim() == 1 for t in tensors), pieces


_splits: dict = {}  # one_copy's signature -> its split
_held: dict = {}  # (one_copy's signature, thread) -> the host tensor its copy lands in and its arrays (_kept_copy)


def _kept_copy(signature: tuple, x: Any, pieces: list | None = None) -> list[np.ndarray] | None:
    """``x`` copied into a host tensor kept for ``signature`` and this thread (pinned where ``x`` is on a GPU, which the
    copy down is quicker from; made at the first copy), read back as one array (``pieces`` None) or as the arrays of
    ``_split``'s ``pieces``, each handed back as a copy: the next copy writes the kept one again. None where ``x`` is
    more than ``_KEEP_BYTES``, which a second copy would make dear (nothing is kept for it)."""
    import torch

    key = (signature, threading.get_ident())  # a thread of its own never writes another's host bytes
    held = _held.get(key)
    if held is None:
        if x.numel() * x.element_size() > _KEEP_BYTES:
            return None
        if len(_held) >= _CACHED:
            _held.clear()
        host = torch.empty(x.shape, dtype=x.dtype, pin_memory=x.device.type == "cuda")
        held = _held[key] = host, [host.numpy()] if pieces is None else _arrays(host.numpy(), pieces)
    held[0].copy_(x)  # the one copy (from a GPU: into pinned memory)
    return [a.copy() for a in held[1]]


def _arrays(host: np.ndarray, pieces: list) -> list[np.ndarray]:
    """The bytes ``host`` as one array per tensor of ``_split``'s ``pieces``: views, no copy."""
    out = []
    for at, end, dtype, shape in pieces:
        a = host[at:end] if dtype is None else host[at:end].view(dtype)
        out.append(a if shape is None else a.reshape(shape))
    return out


class _Plan(NamedTuple):
    """How a copy of one signature of arrays goes (``Uploader._plan``)."""

    layout: dict  # key -> (byte offset, bytes, torch dtype, shape)
    end: int  # the bytes in all
    padded: int  # and padded: the block copied, viewable as any dtype at once
    views: list  # each field as a view of the block: (key, dtype, shape, strides, offset in elements of its dtype)
    staged: list  # per staging buffer its fields (_stage): (the buffer, the numpy arrays written, the tensors)


class Uploader:
    """One copy per batch to ``device`` (``each``: one a field) through ``depth`` staging buffers in turn (see the module
    docstring); ``pack`` (default: on CUDA) packs on any device, which is how the CPU tests count the copies."""

    ALIGN = 64  # every field starts at a multiple: a view of any dtype is aligned

    def __init__(self, device: Any, depth: int = 2, pack: bool | None = None):
        self.device, self.depth = device, depth
        self.pack = (device.type == "cuda" or CUDA_PATH) if pack is None else pack
        self.buffers: list = [None] * depth
        self.layouts: dict = {}  # signature (names, shapes, dtypes) -> how its copy goes (_plan)
        self.events: list = [None] * depth
        self.copies = 0  # staging buffers filled: packed copies, and each's copies
        self.dry: dict[int, Any] = {}  # RL_HOST_PATH=dry: a block by size
        self.dry_pair: list = []  # RL_HOST_PATH=dry: the two bytes _launch copies between
        self.rows: dict[tuple, tuple] = {}  # (plan, destinations' addresses) -> (their storage, weakly; packed?)

    @classmethod
    def layout(cls, arrays: list) -> tuple[list[int], int]:
        """Where a copy packs ``arrays`` (numpy, in order): each one's byte offset, and the bytes in all."""
        offsets, end = [], 0
        for a in arrays:
            offsets.append(-(-end // cls.ALIGN) * cls.ALIGN)
            end = offsets[-1] + a.nbytes
        return offsets, end

    def __call__(self, arrays: dict[Any, Any], into: Any = None) -> dict[Any, Any]:
        """``arrays`` (a flat dict) as tensors on the device, in one copy; ``into`` itself when it is a dict of the
        same keys whose tensors are one step of ``shared.buffer.on_device`` on this device at this copy's offsets:
        the copy lands there (``upload``)."""
        import torch

        if not self.pack:  # shares the arrays' memory; a read-only one (shared.envs.action_mask's) is copied: torch warns
            arrays = {k: np.asarray(a) for k, a in arrays.items()}
            return {k: torch.as_tensor(a if a.flags.writeable else a.copy(), device=self.device) for k, a in arrays.items()}
        return self.packed({k: a if type(a) is np.ndarray else np.asarray(a) for k, a in arrays.items()}, into)

    def _stage(self, arrays: dict[Any, np.ndarray], dests: list | None = None) -> tuple:
        """``arrays`` written into the next staging buffer, once its last copy is done: (their plan, its slot, and the
        buffer with its fields as numpy arrays and as tensors); ``each``'s ``dests`` checked against the plan first
        (``_check_dests``), before anything is staged."""
        import torch

        signature = tuple([(k, a.shape, a.dtype) for k, a in arrays.items()])
        plan = self.layouts.get(signature)
        if plan is None:
            plan = self._plan(arrays, signature)
        if dests is not None:
            _check_dests(plan.layout.values(), dests, self.device)
        layout, padded, staged = plan.layout, plan.padded, plan.staged
        slot = self.copies % self.depth
        if self.events[slot] is not None:
            self.events[slot].synchronize()  # its last copy is done (long since, as a rule)
        buffer = self.buffers[slot]
        if buffer is None or buffer.numel() < padded:
            buffer = self.buffers[slot] = torch.empty(padded, dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        held = staged[slot]
        if held is None or held[0] is not buffer:  # this staging buffer's fields, shaped as the arrays: made once
            fields = [buffer[o : o + n].view(d).view(s) for o, n, d, s in layout.values()]
            held = staged[slot] = buffer, [f.numpy() for f in fields], fields
        for dst, a in zip(held[1], arrays.values()):
            dst[...] = a  # any layout: numpy copies a strided array as it goes
        return plan, slot, held

    def _sent(self, slot: int) -> None:
        """A copy out of staging buffer ``slot`` launched: on a GPU, its refill waits for the event recorded behind it,
        on the stream it ran on."""
        if self.device.type == "cuda":
            import torch

            self.events[slot] = self.events[slot] or torch.cuda.Event()
            self.events[slot].record(torch.cuda.current_stream(self.device))
        self.copies += 1

    def each(self, arrays: dict[Any, np.ndarray], dests: list) -> None:
        """Each of ``arrays`` (a flat dict of numpy arrays) copied straight from the staging buffer into its tensor in
        ``dests`` (in order), all of which are checked first (``_check_dests``): one copy a field, no block between
        (``upload_each``, for a replay mirror's rows)."""
        _, slot, held = self._stage(arrays, dests)
        for dst, src in zip(dests, held[2]):
            if DRY:  # a copy up costs the host its launch only
                self._launch()
            else:
                dst.copy_(src, non_blocking=True)
        self._sent(slot)

    def packed(self, arrays: dict[Any, np.ndarray], into: Any = None) -> dict[Any, Any]:
        """``__call__``'s packed copy, of a flat dict of numpy arrays."""
        import torch

        plan, slot, (buffer, _, _) = self._stage(arrays)
        end, padded, views = plan.end, plan.padded, plan.views
        row = None if into is None else self._row(into, arrays, plan, end)
        if row is not None:  # straight into the rollout's step (a GPU's DMA: no bytes for the host in the dry run)
            if DRY:
                self._launch()
            else:
                row.copy_(buffer[:end], non_blocking=True)
        elif self.device.type == "cuda":
            block = buffer[:padded].to(self.device, non_blocking=True)
        elif DRY:  # a copy up costs the host its launch only: the first copy of this size, again (stale values)
            if padded not in self.dry:
                self.dry[padded] = buffer[:padded].clone()
            block = self.dry[padded]
            self._launch()
        else:
            block = buffer[:padded].clone()
        self._sent(slot)
        if row is not None:
            return into
        # the fields as views of the block (which starts its storage): one view of it per dtype, one tensor per field
        typed, out = {}, {}
        for k, dtype, shape, strides, at in views:
            whole = typed.get(dtype)
            if whole is None:
                whole = typed[dtype] = block if dtype == torch.uint8 else block.view(dtype)
            out[k] = torch.as_strided(whole, shape, strides, at)
        return out

    def through(self, arrays: dict[Any, np.ndarray], into: dict) -> dict[Any, Any]:
        """``upload``'s copy through page-locked destinations: each of ``arrays`` written into its numpy array in
        ``into`` (``pin_host``'s memory) and copied up from there, one copy a field; those ``into`` leaves out go
        through staging (``packed``)."""
        import torch

        out, rest = {}, {}
        for k, a in arrays.items():
            dst = into.get(k)
            if dst is None:
                rest[k] = a
                continue
            dst[...] = a  # the one copy on the host
            src = torch.from_numpy(dst)
            if DRY:  # a copy up costs the host its launch only
                self._launch()
                out[k] = src
            else:  # on the CPU path, a copy as the GPU's would be: the rollout's row is not the acting step's input
                out[k] = src.to(self.device, non_blocking=True) if self.device.type == "cuda" else src.clone()
        if rest:
            out.update(self.packed(rest))
        return out

    def _plan(self, arrays: dict[Any, np.ndarray], signature: tuple) -> _Plan:
        """How a copy of ``arrays``' signature goes, worked out once: each field's (offset, bytes, torch dtype, shape),
        the bytes in all and padded, each field as a view of the block (key, dtype, shape, strides, offset in elements
        of its dtype), and per staging buffer its fields (made by ``_stage``: the numpy arrays they are written into,
        and the tensors ``each`` copies them from)."""
        offsets, end = self.layout(list(arrays.values()))
        layout = {k: (o, a.nbytes, torch_dtype(a.dtype), a.shape) for (k, a), o in zip(arrays.items(), offsets)}
        views = [(k, d, s, _strides(s), o // a.itemsize) for (k, (o, _, d, s)), a in zip(layout.items(), arrays.values())]
        if len(self.layouts) >= _CACHED:  # shapes that keep changing (an evaluation's last envs) never pile up
            self.layouts.clear()
            self.rows.clear()  # keyed by their plans
        padded = -(-end // self.ALIGN) * self.ALIGN  # the block copied: viewable as any dtype at once
        plan = self.layouts[signature] = _Plan(layout, end, padded, views, [None] * self.depth)
        return plan

    def _launch(self) -> None:
        """``RL_HOST_PATH=dry``: a copy's launch alone, the host's part of it (one ``copy_`` of one byte)."""
        import torch

        if not self.dry_pair:  # normal tensors, also when made in inference mode: a copy in it and out of it
            with torch.inference_mode(False):
                self.dry_pair = [torch.zeros(1, dtype=torch.uint8) for _ in range(2)]
        self.dry_pair[0].copy_(self.dry_pair[1])

    def _row(self, into: Any, arrays: dict, plan: _Plan, end: int) -> Any:
        """``into``'s bytes as one uint8 tensor when its tensors lie in one storage as this copy packs them (``packed``;
        the views of ``shared.buffer.on_device``'s block, which share one version counter), else None; found once per
        plan and place (a rollout's steps), then known by the tensors' addresses and their storage, held weakly
        (another storage at the same addresses, after the first is freed, is checked again)."""
        import torch

        if type(into) is not dict or len(into) != len(arrays):
            return None
        try:
            dests = list(map(into.__getitem__, arrays))  # in the copy's order
            key = (id(plan), *map(_DATA_PTR, dests))  # a plan lives as long as its rows (_plan)
        except (KeyError, AttributeError, TypeError):  # another key, a numpy destination
            return None
        if dests[0].dtype != torch.uint8 and torch.is_inference_mode_enabled():
            return None  # a byte view made in inference mode shares no version counter: the write would go unseen
        storage = dests[0].untyped_storage()
        known = self.rows.get(key)
        if known is None or known[0]() is not storage:
            tensors = all(type(d) is torch.Tensor for d in dests)
            packed = tensors and _packed_row(dests, storage, list(plan.layout.values()), end, self.device)
            known = self.rows[key] = (weakref.ref(storage), packed)
            if len(self.rows) > _ROWS:  # a long run through many places never piles them up
                self.rows = {key: known}
        if not known[1]:
            return None
        first = dests[0] if dests[0].dtype == torch.uint8 else dests[0].view(torch.uint8)
        return torch.as_strided(first, (end,), (1,))  # its storage's bounds checked: never a write past them


def _strides(shape: tuple) -> tuple:
    """A contiguous tensor's strides (in elements) for ``shape``."""
    return tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape)))


def _packed_row(dests: list, storage: Any, layout: list, end: int, device: Any) -> bool:
    """Whether ``dests`` lie in ``storage`` on ``device`` exactly as ``layout`` packs them (offsets, dtypes, shapes;
    contiguous), with ``end`` bytes from the first within it."""
    first = dests[0]
    for d, (offset, _, dtype, shape) in zip(dests, layout):
        if d.device != device or d.dtype != dtype or tuple(d.shape) != tuple(shape) or not d.is_contiguous():
            return False
        if d.untyped_storage().data_ptr() != storage.data_ptr() or d.data_ptr() - first.data_ptr() != offset:
            return False
    return first.data_ptr() - storage.data_ptr() + end <= storage.nbytes()


def _land(into: Any, arrays: Any, up: Any) -> None:
    """Each destination in ``into`` gets its value: a numpy one the host's array, a tensor the copy on the device (dict
    keys and namedarraytuple fields matched by name; a None destination is left out)."""
    import torch

    if isinstance(into, np.ndarray):
        into[...] = arrays
    elif isinstance(into, torch.Tensor):
        into.copy_(up, non_blocking=True)
    elif into is not None:
        by_key = isinstance(arrays, dict)  # else a namedarraytuple, as the upload of one is
        for key, dst in into.items() if isinstance(into, dict) else zip(into._fields, into):
            _land(dst, arrays[key] if by_key else getattr(arrays, key), up[key] if by_key else getattr(up, key))


_uploaders: dict = {}
_ARRAYS = {np.ndarray}  # the types of a flat dict of arrays
_DATA_PTR = operator.methodcaller("data_ptr")


def _uploader(device: Any) -> Uploader:
    """The one ``Uploader`` of ``device`` in this process (its staging buffers take turns across every upload)."""
    uploader = _uploaders.get(device)
    if uploader is None:
        uploader = _uploaders[device] = Uploader(device)
    return uploader


# pin_host's memory in this process, sorted: where each part starts, and where it ends
_LOCKED_STARTS: list[int] = []
_LOCKED_ENDS: list[int] = []


def _pinned(into: dict, arrays: dict) -> bool:
    """Whether every destination in ``into`` is a C-contiguous numpy array in memory this process page-locked
    (``pin_host``; a view of a SharedArray, or a plain view of one: what a sampler writes through,
    ``shared.procs.DoubleBuffer``) of its array's dtype and shape: a write there converts and broadcasts nothing,
    so what goes up is what any other path would send."""
    for k, dst in into.items():
        a = arrays.get(k)
        if not isinstance(dst, np.ndarray) or a is None or dst.dtype != a.dtype or dst.shape != a.shape:
            return False
        if not dst.flags.c_contiguous:
            return False
        first = dst.__array_interface__["data"][0]
        i = bisect.bisect_right(_LOCKED_STARTS, first) - 1
        if i < 0 or first + dst.nbytes > _LOCKED_ENDS[i]:
            return False
    return True


def pin_host(structure: Any, device: Any) -> None:
    """The shared memory under ``structure``'s arrays page-locked for ``device``'s copies in this process (module
    docstring); an array in private memory is left as it is. Its range is forgotten as the memory is freed (were it
    not, a copy from other memory at that address would still be right: from pageable memory, a GPU's copy waits).
    A refusal raises at once, naming CUDA's error: it leaves that error set in CUDA, where the next kernel launch
    would raise it under another name."""
    cuda = device.type == "cuda"
    if not (cuda or CUDA_PATH):
        return
    for _, a in walk_structure(structure, sequences=False):
        segment = getattr(a, "_segment", None)
        if segment is None or segment.pinned:
            continue
        if cuda:
            import torch

            cudart = torch.cuda.cudart()
            error = cudart.cudaHostRegister(segment.address, segment.nbytes, 1)  # 1: portable, as torch's own does
            if int(error):
                raise RuntimeError(
                    f"page-locking {segment.nbytes} bytes of shared memory for {device} (cudaHostRegister): "
                    f"{cudart.cudaGetErrorString(error)}"
                )
        i = bisect.bisect(_LOCKED_STARTS, segment.address)
        _LOCKED_STARTS.insert(i, segment.address)
        _LOCKED_ENDS.insert(i, segment.address + segment.nbytes)
        segment.unpin = lambda address=segment.address: _unpin(address, cuda)


def _unpin(address: int, cuda: bool) -> None:
    """``pin_host``'s work undone as its memory is freed (``_Segment.__del__``, which may run at the interpreter's
    exit, when torch or these lists may be gone: the driver lets go of everything then anyway)."""
    try:
        i = _LOCKED_STARTS.index(address)
        del _LOCKED_STARTS[i], _LOCKED_ENDS[i]
        if cuda:
            import torch

            torch.cuda.cudart().cudaHostUnregister(address)
    except Exception:
        pass


def upload_each(arrays: dict[Any, np.ndarray], dests: list, device: Any) -> None:
    """Each array of the flat dict ``arrays`` copied into its tensor of ``dests`` (in order) on ``device``, of its
    dtype and shape (else a ValueError, before anything is copied): on a GPU, each straight from the pinned staging
    buffer (module docstring)."""
    uploader = _uploader(device)
    if uploader.pack:
        return uploader.each(arrays, dests)
    import torch

    _check_dests([(0, 0, torch_dtype(a.dtype), a.shape) for a in arrays.values()], dests, device)
    for dst, a in zip(dests, arrays.values()):
        dst.copy_(torch.from_numpy(np.ascontiguousarray(a)))


def _check_dests(fields: Any, dests: list, device: Any) -> None:
    """``upload_each``'s destinations, before anything is staged or copied: one a field (``fields``: a plan's
    ``(offset, bytes, dtype, shape)``), each a tensor on ``device`` (which may leave out its index) of its field's dtype
    and shape; else a ValueError. ``copy_`` would convert another dtype, broadcast another shape, and copy to another
    GPU on that GPU's stream, which the staging buffer's event does not follow."""
    import torch

    fields = list(fields)
    if len(dests) != len(fields):
        raise ValueError(f"upload: {len(dests)} destinations for {len(fields)} arrays")
    for dst, (_, _, dtype, shape) in zip(dests, fields):
        if type(dst) is not torch.Tensor or dst.dtype != dtype or dst.shape != shape:
            raise ValueError(f"upload: a destination {getattr(dst, 'shape', dst)} for an array {dtype}, {shape}")
        place = dst.device
        if place.type != device.type or (device.index is not None and place.index != device.index):
            raise ValueError(f"upload: a destination on {place} for an upload to {device}")


def upload(arrays: Any, device: Any, into: Any = None) -> Any:
    """``arrays`` (numpy; a dict or namedarraytuple of them, nested) as tensors on ``device`` in one copy, in the
    same structure; with ``into`` (the same structure: where a rollout keeps this step), written there too (see the
    module docstring)."""
    uploader = _uploader(device)
    # The two shapes a loop uploads every step take no walk: one array, and a flat dict of arrays.
    if type(arrays) is np.ndarray:
        return uploader({"": arrays})[""]
    if type(arrays) is dict and set(map(type, arrays.values())) == _ARRAYS:
        if _LOCKED_STARTS and uploader.pack and type(into) is dict and _pinned(into, arrays):  # none locked: no call
            return uploader.through(arrays, into)
        up = uploader.packed(arrays, into) if uploader.pack else uploader(arrays, into)
        if into is not None and up is not into:
            _land(into, arrays, up)
        return up
    # Anything nested (a Dict observation in a rollout, namedarraytuples, tensors among the arrays): by path. A plain
    # tuple or list is one array, as np.asarray makes it, not a node.
    import torch

    done, packing = {}, {}  # by path: tensors moved as they are, arrays packed in one copy
    for path, x in walk_structure(arrays, sequences=False):
        if isinstance(x, torch.Tensor):
            done[path] = x.to(device, non_blocking=True)
        elif x is not None:
            packing[path] = x
    if packing:
        done.update(uploader(packing))
    up = replace_leaves(arrays, done, sequences=False)  # None fields stay None
    if into is not None:
        _land(into, arrays, up)
    return up
