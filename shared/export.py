"""Policy export: a script's acting policy as an ONNX graph, run without Python's torch (onnxruntime, or any ONNX
runtime in another language).

Guarantees
- ``export(policy, inputs, outputs, path)`` writes ``policy`` (an ``nn.Module`` whose ``forward`` takes the
  tensors ``inputs`` by name and returns the tensors named ``outputs``, in order) to ``path`` with torch.onnx's
  exporter (``dynamo=True``), every input's batch axis dynamic: axis 0, or axis 1 for a recurrent state
  (``state_inputs``: ``[layers, B, H]``). An input may be a dict of tensors (a Dict observation): the graph
  takes its entries as inputs of their own, by key. The graph's inputs come in the order of ``forward``'s
  parameters (a ``**kwargs`` forward is refused: torch's exporter fails on it). The inputs keep the env's dtypes
  (uint8 frames are scaled inside the graph), so a deployment feeds what the env gives.
- The file is checked before this returns: onnx's checker passes, and onnxruntime run on ``inputs`` and on a
  batch of another size (the rows repeated) gives every output within ``TOLERANCE`` of torch's (integer
  outputs, the actions: exactly). Otherwise ``ExportError`` names the output and the difference. The graph is
  written beside ``path`` and replaces it only once checked: on any failure ``path`` is left as it was. Returns
  the largest difference seen.
- The policy runs under ``torch.no_grad()`` in eval mode; nothing of the training state changes.
- ``export_run(policy, obs_space, seed, outputs, path, rows, inputs)`` is a run's ``--export FILE``
  (``shared.run.Run.export``): ``policy`` moved to the CPU and exported as above with ``rows`` observations
  sampled from the env's space (seeded with ``seed``; a Dict space's Box and Discrete entries, each an input of
  its own by key) and the tensors ``inputs`` by name. Returns what was written in words (inputs, outputs, the
  difference from torch). Every failure (a graph that differs, the exporter, onnx's checker, the disk) is an
  ``ExportError`` whose message is one line; a ``KeyboardInterrupt`` passes through, the file not written.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from pathlib import Path
from typing import Any

__all__ = ["TOLERANCE", "ExportError", "export", "export_run"]

TOLERANCE = 1e-4


class ExportError(RuntimeError):
    """The exported graph does not compute what the policy computes."""


def export(
    policy: Any, inputs: dict[str, Any], outputs: list[str], path: str | Path, state_inputs: tuple[str, ...] = ()
) -> float:
    """Write ``policy`` to ``path`` as ONNX and check it (see the module docstring)."""
    import numpy as np
    import onnx
    import onnxruntime
    import torch

    path = Path(path)
    batch = torch.export.Dim("batch", min=1, max=1 << 16)
    # torch.export reads the inputs in the order of forward's signature; a dict input is its entries in order
    order = [p for p in inspect.signature(policy.forward).parameters if p in inputs]
    if sorted(order) != sorted(inputs):
        raise ExportError(f"forward takes no input named {', '.join(sorted(set(inputs) - set(order)))}")
    inputs = {k: inputs[k] for k in order}
    axis = {k: {1 if k in state_inputs else 0: batch} for k in inputs}
    shapes = {k: {sub: {0: batch} for sub in v} if isinstance(v, dict) else axis[k] for k, v in inputs.items()}
    leaves = {sub: t for k, v in inputs.items() for sub, t in (v.items() if isinstance(v, dict) else [(k, v)])}
    if len(leaves) != sum(len(v) if isinstance(v, dict) else 1 for v in inputs.values()):
        raise ExportError(f"two inputs of one name among {', '.join(leaves)}")
    was_training = policy.training
    policy.eval()
    quiet = logging.getLogger("torch.onnx")  # the exporter's notes (torchvision's ops skipped, ...) are not ours
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    written = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # checked before it replaces ``path``
    try:
        with torch.no_grad(), warnings.catch_warnings():
            for kind in (FutureWarning, UserWarning):  # deprecations and notes inside torch's exporter
                warnings.simplefilter("ignore", kind)
            program = torch.onnx.export(
                policy,
                (),
                kwargs=inputs,
                dynamic_shapes=shapes,
                input_names=list(leaves),
                output_names=outputs,
                dynamo=True,
                verbose=False,
            )
            program.save(str(written))
            onnx.checker.check_model(str(written), full_check=True)
            session = onnxruntime.InferenceSession(str(written), providers=["CPUExecutionProvider"])
            worst = 0.0
            for repeat in (1, 3):  # the batch as given, and three times as many rows: the batch axis is dynamic
                given = {k: _repeat(v, repeat, 1 if k in state_inputs else 0) for k, v in inputs.items()}
                want = policy(**given)
                want = want if isinstance(want, tuple) else (want,)
                flat = {sub: t for k, v in given.items() for sub, t in (v.items() if isinstance(v, dict) else [(k, v)])}
                got = session.run(outputs, {k: v.cpu().numpy() for k, v in flat.items()})
                for name, w, g in zip(outputs, want, got):
                    w = w.cpu().numpy()
                    if w.shape != g.shape:
                        raise ExportError(f"{name}: onnxruntime gives shape {g.shape}, torch {w.shape}")
                    exact = not np.issubdtype(w.dtype, np.floating)
                    diff = float(np.abs(w.astype(np.float64) - g.astype(np.float64)).max()) if w.size else 0.0
                    if (exact and diff > 0) or diff > TOLERANCE:
                        raise ExportError(f"{name}: onnxruntime differs from torch by {diff:.3g}")
                    worst = max(worst, 0.0 if exact else diff)
        os.replace(written, path)
    finally:
        written.unlink(missing_ok=True)
        policy.train(was_training)
        quiet.setLevel(level)
    return worst


def _repeat(x: Any, times: int, dim: int) -> Any:
    """``x`` (a tensor, or a dict of them) with its rows ``times`` over along ``dim``."""
    import torch

    if isinstance(x, dict):
        return {k: torch.cat([v] * times, dim=0) for k, v in x.items()}
    return torch.cat([x] * times, dim=dim)


def export_run(
    policy: Any, obs_space: Any, seed: int, outputs: list[str], path: str | Path, rows: int = 8, inputs: dict | None = None
) -> str:
    """A run's ``--export``, on observations sampled from its env's space (see the module docstring)."""
    try:
        import gymnasium as gym
        import numpy as np
        import torch

        inputs = inputs or {}
        policy = policy.cpu()  # the graph holds no device; the observations below are made on the CPU
        obs_space.seed(seed)
        samples = [obs_space.sample() for _ in range(rows)]
        if isinstance(obs_space, gym.spaces.Dict):  # one input per key a network takes
            obs = {
                k: torch.as_tensor(np.stack([s[k] for s in samples]))
                for k, sub in obs_space.items()
                if isinstance(sub, (gym.spaces.Box, gym.spaces.Discrete))
            }
            names = [*obs, *inputs]
        else:
            obs = torch.as_tensor(np.stack(samples))
            names = ["obs", *inputs]
        worst = export(policy, {"obs": obs, **inputs}, outputs, path)
    except ExportError:
        raise
    except Exception as e:  # the exporter, onnx's checker or the disk: one line, no traceback
        raise ExportError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    return f"{', '.join(names)} in; {', '.join(outputs)} out; onnxruntime within {worst:.1g} of torch"
