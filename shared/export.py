"""Policy export: a script's acting policy as an ONNX graph, run without Python's torch (onnxruntime, or any ONNX
runtime in another language).

Guarantees
- ``export(policy, inputs, outputs, path)`` writes ``policy`` (an ``nn.Module`` whose ``forward`` takes the
  tensors ``inputs`` by name, in order, and returns the tensors named ``outputs``, in order) to ``path`` with
  torch.onnx's exporter (``dynamo=True``), every input's batch axis dynamic: axis 0, or axis 1 for a recurrent
  state (``state_inputs``: ``[layers, B, H]``). The inputs keep the env's dtypes (uint8 frames are scaled inside
  the graph), so a deployment feeds what the env gives.
- The file is checked before this returns: onnx's checker passes, and onnxruntime run on ``inputs`` and on a
  batch of another size (the rows repeated) gives every output within ``TOLERANCE`` of torch's (integer
  outputs, the actions: exactly). Otherwise ``ExportError`` names the output and the difference, and the file is
  removed. Returns the largest difference seen.
- The policy runs under ``torch.no_grad()`` in eval mode; nothing of the training state changes.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

__all__ = ["TOLERANCE", "ExportError", "export"]

TOLERANCE = 1e-4


class ExportError(RuntimeError):
    """The exported graph does not compute what the policy computes."""


def export(policy: Any, inputs: dict[str, Any], outputs: list[str], path: str | Path,
           state_inputs: tuple[str, ...] = ()) -> float:
    """Write ``policy`` to ``path`` as ONNX and check it (see the module docstring)."""
    import numpy as np
    import onnx
    import onnxruntime
    import torch

    path = Path(path)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    shapes = {name: {1 if name in state_inputs else 0: batch} for name in inputs}
    was_training = policy.training
    policy.eval()
    quiet = logging.getLogger("torch.onnx")  # the exporter's notes (torchvision's ops skipped, ...) are not ours
    level, quiet.level = quiet.level, logging.ERROR
    try:
        with torch.no_grad(), warnings.catch_warnings():
            for kind in (FutureWarning, UserWarning):  # deprecations and notes inside torch's exporter
                warnings.simplefilter("ignore", kind)
            program = torch.onnx.export(policy, (), kwargs=inputs, dynamic_shapes=shapes, input_names=list(inputs),
                                        output_names=outputs, dynamo=True, verbose=False)
            program.save(str(path))
            onnx.checker.check_model(str(path), full_check=True)
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            worst = 0.0
            for repeat in (1, 3):  # the batch as given, and three times as many rows: the batch axis is dynamic
                given = {k: torch.cat([v] * repeat, dim=1 if k in state_inputs else 0) for k, v in inputs.items()}
                want = policy(**given)
                want = want if isinstance(want, tuple) else (want,)
                got = session.run(outputs, {k: v.cpu().numpy() for k, v in given.items()})
                for name, w, g in zip(outputs, want, got):
                    w = w.cpu().numpy()
                    if w.shape != g.shape:
                        raise ExportError(f"{name}: onnxruntime gives shape {g.shape}, torch {w.shape}")
                    exact = not np.issubdtype(w.dtype, np.floating)
                    diff = float(np.abs(w.astype(np.float64) - g.astype(np.float64)).max()) if w.size else 0.0
                    if (exact and diff > 0) or diff > TOLERANCE:
                        raise ExportError(f"{name}: onnxruntime differs from torch by {diff:.3g}")
                    worst = max(worst, 0.0 if exact else diff)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    finally:
        policy.train(was_training)
        quiet.setLevel(level)
    return worst
