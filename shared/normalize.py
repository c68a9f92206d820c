"""Running observation statistics: shareable between a sampler process and a learner (``ObsNorm``), or carried by a
module with its parameters (``RunningNorm``).

Guarantees
- ``update(x, rows=None)`` folds a batch ``[N, D]`` (its ``rows`` where given) into the running mean and variance,
  doing nothing when disabled, with the parallel-variance formula
  (exact for any split of the data into batches, up to float64 rounding); ``count`` starts at 1e-4 with mean 0
  and variance 1, as in Stable-Baselines3's ``RunningMeanStd``.
- ``normalize(obs)`` returns ``clip((obs - mean) / sqrt(var + 1e-8), -clip, clip)`` as float32 on the tensor's
  device, and is the identity when the normaliser is disabled.
- With ``shared=True`` the statistics live in one shared-memory float64 array, so the process that updates them
  (the async sampler) and the one that reads them (the learner) see the same numbers; a reader may see a mean
  and variance from consecutive updates (one step apart), never torn garbage beyond that.
- ``state_dict()`` / ``load_state_dict(state)`` round-trip the statistics as a tensor for a ``weights_only`` checkpoint.
- ``RunningNorm`` keeps the same statistics as torch buffers of a module, so that they travel with the parameters
  of the module that owns it: into its ``state_dict`` (the checkpoint), to an async sampler's copy, and to every
  rank with torchrun's broadcast. Its ``update(x)`` merges the batches of every rank (``distributed.moments``),
  so all ranks hold the same statistics after each update.
- ``upload_batch(arrays, obs_norm, device)``: a replay batch, or a step's observations (numpy), as float32
  tensors on ``device`` in one copy (``shared.device.upload``; converted to float32 on the host, so that each is a
  view of that copy), ``observation`` and ``next_observation`` (those present) normalised with the statistics,
  which travel in that same copy.
"""

from __future__ import annotations

import numpy as np
import torch

from shared.buffer import shared_zeros
from shared.device import upload

__all__ = ["ObsNorm", "RunningNorm", "merge_moments", "upload_batch"]


def merge_moments(mean, var, count, batch_mean, batch_var, n):
    """Mean, (population) variance and count of two sets from each set's own, by the parallel-variance formula
    (Chan et al.); numpy arrays or torch tensors."""
    total = count + n
    delta = batch_mean - mean
    return mean + delta * (n / total), (var * count + batch_var * n + delta**2 * (count * n / total)) / total, total


class ObsNorm:
    """Running mean and variance of observations; disabled: ``update`` does nothing, ``normalize`` is identity."""

    def __init__(self, dim: int, enabled: bool = True, shared: bool = False, clip: float = 10.0):
        self.dim, self.enabled, self.clip = int(dim), bool(enabled), float(clip)
        self.stats = (shared_zeros if shared else np.zeros)(2 * self.dim + 1, np.float64)  # mean, var, count
        self.stats[self.dim : 2 * self.dim], self.stats[-1] = 1.0, 1e-4

    @property
    def mean(self) -> np.ndarray:
        return self.stats[: self.dim]

    @property
    def var(self) -> np.ndarray:
        return self.stats[self.dim : 2 * self.dim]

    @property
    def count(self) -> float:
        return float(self.stats[-1])

    def update(self, x: np.ndarray, rows: np.ndarray | None = None) -> None:
        """Fold ``x`` [N, ...] (only its ``rows`` [N] where True, when given) into the statistics; disabled, nothing
        at all, the rows' selection included (the off-policy samplers call this every step)."""
        if not self.enabled:
            return
        x = x if rows is None else x[rows]
        if len(x) == 0:
            return
        x = np.asarray(x, np.float64).reshape(len(x), self.dim)
        count, n = self.stats[-1], len(x)
        # ufunc reductions rather than x.mean / x.var: this runs once per env step, mostly on a handful of rows.
        batch_mean = np.add.reduce(x, 0) / n
        batch_var = np.add.reduce((x - batch_mean) ** 2, 0) / n
        mean, var, total = merge_moments(self.mean, self.var, count, batch_mean, batch_var, n)
        self.stats[: self.dim], self.stats[self.dim : 2 * self.dim], self.stats[-1] = mean, var, total

    def moments(self) -> np.ndarray:
        """Mean and variance as one float32 array ``[2 * D]``, to send with a batch (``normalize``'s ``stats``)."""
        return np.asarray(self.stats[: 2 * self.dim], np.float32)

    def normalize(self, obs, stats=None):
        """torch tensor ``[..., D]`` -> normalised float32 tensor on the same device; ``stats``: ``moments()``
        already on that device (uploaded with the batch), else they are uploaded here."""
        if not self.enabled:
            return obs
        s = torch.as_tensor(self.moments(), device=obs.device) if stats is None else stats
        return ((obs - s[: self.dim]) / torch.sqrt(s[self.dim :] + 1e-8)).clamp(-self.clip, self.clip)

    def state_dict(self):
        """The statistics as one float64 tensor ``[mean, var, count]`` (what the checkpoint holds)."""
        return torch.from_numpy(np.array(self.stats))

    def load_state_dict(self, state) -> None:
        state = np.asarray(state, np.float64)
        if state.shape != self.stats.shape:
            raise ValueError(f"observation statistics of shape {state.shape}, expected {self.stats.shape}")
        self.stats[:] = state


def upload_batch(arrays: dict, obs_norm: ObsNorm, device: torch.device) -> dict:
    """See the module docstring: the off-policy scripts' batch, observations normalised, in one upload."""
    # float32 on the host (nothing to do for the replay's float32 fields): every tensor stays a view of the one copy
    # (a graphed update then copies its batch in as one block), and no conversion runs per field on the device
    arrays = {k: np.asarray(v, np.float32) for k, v in arrays.items()}
    if obs_norm.enabled:
        arrays["obs_stats"] = obs_norm.moments()
    out = upload(arrays, device)
    stats = out.pop("obs_stats", None)
    for k in ("observation", "next_observation"):
        if k in out:
            out[k] = obs_norm.normalize(out[k], stats)  # [N, S]
    return out


class RunningNorm(torch.nn.Module):
    """``forward(x)``: ``clip((x - mean) / sqrt(var + 1e-8))`` in x's dtype (the identity when disabled);
    ``update(x)``: folds a batch ``[N, D]`` (every rank's, under torchrun) into the float64 running statistics,
    with the prior and the formula of ``ObsNorm``."""

    def __init__(self, dim: int, enabled: bool = True, clip: float = 10.0):
        super().__init__()
        self.enabled, self.clip = bool(enabled), float(clip)
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        return ((x - self.mean.to(x.dtype)) / torch.sqrt(self.var + 1e-8).to(x.dtype)).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        if not self.enabled:
            return
        from shared import distributed

        n, batch_mean, batch_var = distributed.moments(x.reshape(len(x), -1))
        mean, var, total = merge_moments(self.mean, self.var, self.count, batch_mean, batch_var, n)
        # Tensors throughout, so a GPU never waits here; an empty batch (n = 0) leaves them as they are.
        self.mean.copy_(torch.where(n > 0, mean, self.mean))
        self.var.copy_(torch.where(n > 0, var, self.var))
        self.count.copy_(torch.where(n > 0, total, self.count))
