"""Mixed precision in one call, so that an algorithm's forward passes say only where bfloat16 may apply.

Guarantees
- ``autocast(device, bf16)`` is ``torch.autocast(device.type, torch.bfloat16, enabled=bf16)``: inside it the ops
  autocast lists (matmuls, convolutions, LSTMs) run in bfloat16 on the CPU and on CUDA, everything else in
  float32; with ``bf16=False`` it changes nothing. Outputs that feed a loss or an action are cast back with
  ``.float()`` by the caller. ``shared.cli.resolve_device`` warns when the device has no native bfloat16.
Imports nothing from the project.
"""

from __future__ import annotations

from typing import Any

__all__ = ["autocast"]


def autocast(device: Any, bf16: bool) -> Any:
    """bfloat16 autocast on ``device`` (a ``torch.device``) when ``bf16``, else a context that does nothing."""
    import torch

    return torch.autocast(device.type, torch.bfloat16, enabled=bf16)
