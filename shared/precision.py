"""Mixed precision in one call, so that an algorithm's forward passes say only where bfloat16 may apply.

Guarantees
- ``autocast(device, bf16)`` is ``torch.autocast(device.type, torch.bfloat16, enabled=bf16)``: inside it the ops
  autocast lists (matmuls, convolutions, LSTMs) run in bfloat16 on the CPU and on CUDA, everything else in
  float32; with ``bf16=False`` it changes nothing. Outputs that feed a loss or an action are cast back with
  ``.float()`` by the caller. ``shared.cli.resolve_device`` warns when the device has no native bfloat16.
- ``channels_last(module, device, bf16)``: the one rule for channels-last (NHWC) weights: on a CPU, and with
  ``bf16`` on a GPU; a module without 4-d weights is unchanged either way.
- ``gpu_defaults()``: TF32 and cuDNN's benchmark, set by every process of a run that computes on a GPU.
- ``sampler_bf16(bf16)``, for a sampler process that acts on the CPU (a CPU learner's; a GPU learner's sampler acts
  on that GPU, ``shared.run.sampler_device``): ``bf16`` where this CPU computes bfloat16 natively (AVX512-BF16,
  AMX), else False with one warning line, since emulated bfloat16 would make sampling about 10x slower.
Imports nothing from the project.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["autocast", "channels_last", "cpu_has_bf16", "sampler_bf16"]


def autocast(device: Any, bf16: bool) -> Any:
    """bfloat16 autocast on ``device`` (a ``torch.device``) when ``bf16``, else a context that does nothing."""
    import torch

    return torch.autocast(device.type, torch.bfloat16, enabled=bf16)


def channels_last(module: Any, device: Any, bf16: bool) -> Any:
    """``module`` with its 4-d weights in channels-last (NHWC) memory where convolutions run faster that way: on a
    CPU, and on a GPU with ``bf16`` (tensor cores); elsewhere, and for a module without convolutions, unchanged.
    Every script's image network goes through this one rule."""
    import torch

    return module.to(memory_format=torch.channels_last) if device.type == "cpu" or bf16 else module


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere torch emulates it, ~10x slower."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def gpu_defaults() -> None:
    """What every process of a run that computes on a GPU sets (the learner, an async sampler acting there). TF32 for
    float32 matmuls and convolutions, chosen, not inherited: torch's defaults let convolutions use it but not matmuls,
    so an "fp32" run would be half TF32 (tensor cores on Ampere and later; config.json records it). cuDNN's benchmark:
    every script's steps and updates keep their shapes, so the fastest convolutions are picked once."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True


def sampler_bf16(bf16: bool) -> bool:
    """Whether a sampler process runs its forward passes in bfloat16 (see the module docstring)."""
    if bf16 and not cpu_has_bf16():
        print(
            "warning: --bf16: the sampler process acts in float32 (this CPU has no native bfloat16)",
            file=sys.stderr,
            flush=True,
        )
        return False
    return bf16
