"""What crosses between the host and the learner's device inside a hot loop.

Guarantees
- ``to_host(*tensors)`` returns the tensors' values as numpy arrays (each of its own dtype and shape; bfloat16
  as float32) in one device-to-host copy: the one wait on a GPU that a sampling step or an update makes, for
  what the host needs at once (the actions the envs step with, a prioritized replay's new priorities). On the
  CPU it copies nothing. Everything else a loop reports (losses, statistics) stays on the device as detached
  tensors until a progress row reads it (``shared.progress``).
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
- ``RL_HOST_PATH=cuda`` (benchmarks and tests only): on the CPU, the host work of the CUDA path runs as it would on
  a GPU (uploads packed into staging and copied as one block, ``to_host`` through one joined copy), so that the
  tests run it and ``benchmarks/speed/loop_overhead.py`` can count and time it on a machine without one; ``dry`` also
  leaves out the bytes of the copy up, which a GPU's DMA engine moves (the values are then wrong).
Imports nothing from the project but ``shared.namedarraytuple``'s walk (which imports nothing from it either).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from shared.namedarraytuple import replace_leaves, walk_structure

__all__ = ["Uploader", "to_host", "upload"]

# The CUDA host path on the CPU (module docstring); "dry": also without the bytes a GPU's DMA engine would copy.
CUDA_PATH = os.environ.get("RL_HOST_PATH") in ("cuda", "dry")
DRY = os.environ.get("RL_HOST_PATH") == "dry"
_CACHED = 64  # signatures (names, shapes, dtypes) whose layout a copy keeps; more, and it starts again
_NUMPY = {}  # torch dtype -> numpy dtype, and back: found once (a lookup through an empty array costs microseconds)


def to_host(*tensors: Any) -> Any:
    """The values of ``tensors`` on the host, as one numpy array or a list of them (see the module docstring)."""
    import torch

    tensors = tuple(t.detach().float() if t.dtype == torch.bfloat16 else t.detach() for t in tensors)
    out = [t.numpy() for t in tensors] if tensors[0].device.type == "cpu" and not CUDA_PATH else one_copy(tensors)
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
    """The tensors' bytes joined on their device, copied to the host at once, and split back into arrays."""
    import torch

    signature = tuple([(t.dtype, t.shape) for t in tensors])
    split = _splits.get(signature)
    if split is None:  # (numpy dtype, bytes, shape) per tensor, found once per signature (a loop reads the same every step)
        if len(_splits) >= _CACHED:
            _splits.clear()
        split = _splits[signature] = [(numpy_dtype(t.dtype), t.numel() * t.element_size(), tuple(t.shape)) for t in tensors]
    # contiguous(): a strided or expanded view (x[:, 0]) as bytes; a contiguous tensor is itself, at no cost
    flat = [t.contiguous().view(-1).view(torch.uint8) for t in tensors]
    flat = (torch.cat(flat) if len(flat) > 1 else flat[0]).cpu().numpy()
    out, at = [], 0
    for dtype, n, shape in split:
        out.append(flat[at : at + n].view(dtype).reshape(shape))
        at += n
    return out


_splits: dict = {}  # one_copy's signature -> its split


class Uploader:
    """One copy per batch to ``device`` through ``depth`` staging buffers in turn (see the module docstring);
    ``pack`` (default: on CUDA) packs on any device, which is how the CPU tests count the copies."""

    ALIGN = 64  # every field starts at a multiple: a view of any dtype is aligned

    def __init__(self, device: Any, depth: int = 2, pack: bool | None = None):
        self.device, self.depth = device, depth
        self.pack = (device.type == "cuda" or CUDA_PATH) if pack is None else pack
        self.buffers: list = [None] * depth
        self.hosts: list = [{} for _ in range(depth)]  # per buffer: numpy views of its bytes by signature
        self.layouts: dict = {}  # signature (names, shapes, dtypes) -> (the fields' layout, bytes)
        self.events: list = [None] * depth
        self.copies = 0  # packed copies made
        self.dry: dict[int, Any] = {}  # RL_HOST_PATH=dry: a block by size

    def __call__(self, arrays: dict[Any, Any]) -> dict[Any, Any]:
        import torch

        if not self.pack:  # shares the arrays' memory; a read-only one (shared.envs.action_mask's) is copied: torch warns
            arrays = {k: np.asarray(a) for k, a in arrays.items()}
            return {k: torch.as_tensor(a if a.flags.writeable else a.copy(), device=self.device) for k, a in arrays.items()}
        arrays = {k: a if type(a) is np.ndarray else np.asarray(a) for k, a in arrays.items()}
        signature = tuple([(k, a.shape, a.dtype) for k, a in arrays.items()])
        layout = self.layouts.get(signature)
        if layout is None:  # each field's (offset, bytes, torch dtype, shape): worked out once per signature
            layout, end = {}, 0
            for k, a in arrays.items():
                offset = -(-end // self.ALIGN) * self.ALIGN
                layout[k] = (offset, a.nbytes, torch_dtype(a.dtype), a.shape)
                end = offset + a.nbytes
            if len(self.layouts) >= _CACHED:  # shapes that keep changing (an evaluation's last envs) never pile up
                self.layouts.clear()
                self.hosts = [{} for _ in range(self.depth)]
            self.layouts[signature] = layout, end
        else:
            layout, end = layout
        slot = self.copies % self.depth
        if self.events[slot] is not None:
            self.events[slot].synchronize()  # its last copy is done (long since, as a rule)
        if self.buffers[slot] is None or self.buffers[slot].numel() < end:
            self.buffers[slot] = torch.empty(end, dtype=torch.uint8, pin_memory=self.device.type == "cuda")
            self.hosts[slot] = {}
        hosts = self.hosts[slot].get(signature)
        if hosts is None:  # numpy views of the staging buffer shaped as the fields, made once per buffer and signature
            host = self.buffers[slot].numpy()
            fields = zip(arrays.items(), layout.values())
            hosts = {k: host[o : o + n].view(a.dtype).reshape(a.shape) for (k, a), (o, n, _, _) in fields}
            self.hosts[slot][signature] = hosts
        for k, a in arrays.items():
            hosts[k][...] = a  # any layout: numpy copies a strided array as it goes
        block = self.buffers[slot][:end]
        if self.device.type == "cuda":
            block = block.to(self.device, non_blocking=True)
            self.events[slot] = self.events[slot] or torch.cuda.Event()
            self.events[slot].record()
        elif DRY:  # a copy up costs the host its launch only: the first copy of this size, again (stale values)
            if end not in self.dry:
                self.dry[end] = block.clone()
            block = self.dry[end]
        else:
            block = block.clone()
        self.copies += 1
        return {k: block[o : o + n].view(dtype).view(shape) for k, (o, n, dtype, shape) in layout.items()}


_uploaders: dict = {}


def upload(arrays: Any, device: Any) -> Any:
    """``arrays`` (numpy; a dict or namedarraytuple of them, nested) as tensors on ``device`` in one copy, in the
    same structure (see the module docstring)."""
    if device not in _uploaders:
        _uploaders[device] = Uploader(device)
    # The two shapes a loop uploads every step take no walk: one array, and a flat dict of arrays.
    if type(arrays) is np.ndarray:
        return _uploaders[device]({"": arrays})[""]
    if type(arrays) is dict and all(type(a) is np.ndarray for a in arrays.values()):
        return _uploaders[device](arrays)
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
        done.update(_uploaders[device](packing))
    return replace_leaves(arrays, done, sequences=False)  # None fields stay None
