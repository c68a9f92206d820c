"""What crosses between the host and the learner's device inside a hot loop.

Guarantees
- ``to_host(*tensors)`` returns the tensors' values as numpy arrays (each of its own dtype and shape; bfloat16
  as float32) in one device-to-host copy: the one wait on a GPU that a sampling step or an update makes, for
  what the host needs at once (the actions the envs step with, a prioritized replay's new priorities). On the
  CPU it copies nothing. Everything else a loop reports (losses, statistics) stays on the device as detached
  tensors until a progress row reads it (``shared.progress``).
Imports nothing from the project.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["to_host"]


def to_host(*tensors: Any) -> Any:
    """The values of ``tensors`` on the host, as one numpy array or a list of them (see the module docstring)."""
    import torch

    tensors = tuple(t.detach().float() if t.dtype == torch.bfloat16 else t.detach() for t in tensors)
    out = [t.numpy() for t in tensors] if tensors[0].device.type == "cpu" else one_copy(tensors)
    return out[0] if len(out) == 1 else out


def one_copy(tensors: tuple) -> list[np.ndarray]:
    """The tensors' bytes joined on their device, copied to the host at once, and split back into arrays."""
    import torch

    flat = torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in tensors]).cpu().numpy()
    out, at = [], 0
    for t in tensors:
        dtype = torch.empty(0, dtype=t.dtype).numpy().dtype
        n = t.numel() * dtype.itemsize
        out.append(flat[at : at + n].view(dtype).reshape(tuple(t.shape)))
        at += n
    return out
