"""Running observation statistics and reward scaling, shareable between a sampler process and a learner.

Guarantees
- ``update(x)`` folds a batch ``[N, D]`` into the running mean and variance with the parallel-variance formula
  (exact for any split of the data into batches, up to float64 rounding); ``count`` starts at 1e-4 with mean 0
  and variance 1, as in Stable-Baselines3's ``RunningMeanStd``.
- ``normalize(obs)`` returns ``clip((obs - mean) / sqrt(var + 1e-8), -clip, clip)`` as float32: a tensor on the
  tensor's device, or a numpy array for a numpy array; it is the identity when the normaliser is disabled.
- With ``shared=True`` the statistics live in one shared-memory float64 array, so the process that updates them
  (the async sampler) and the one that reads them (the learner) see the same numbers; a reader may see a mean
  and variance from consecutive updates (one step apart), never torn garbage beyond that.
- ``state()`` / ``load(state)`` round-trip the statistics as a tensor for a ``weights_only`` checkpoint.
- ``RewardScale`` divides each reward by the running standard deviation of the discounted return, then clips it
  (Stable-Baselines3's ``VecNormalize(norm_reward=True)``, gymnasium's ``NormalizeReward``): per env,
  ``G <- gamma G + r``, the statistics take ``G``, the reward becomes ``clip(r / sqrt(var(G) + 1e-8))``, and
  ``G`` restarts at 0 after a step that ends the episode. Rows that belong to no episode (next-step autoreset)
  change nothing and give 0. The statistics may be shared; ``G`` is local to the process that calls it.
"""

from __future__ import annotations

import numpy as np

from shared.buffer import shared_zeros

__all__ = ["ObsNorm", "RewardScale"]


class ObsNorm:
    """Running mean and variance of observations; disabled: ``update`` does nothing, ``normalize`` is identity."""

    def __init__(self, dim: int, enabled: bool = True, shared: bool = False, clip: float = 10.0):
        self.dim, self.enabled, self.clip = int(dim), bool(enabled), float(clip)
        self.stats = (shared_zeros if shared else np.zeros)(2 * self.dim + 1, np.float64)  # mean, var, count
        self.stats[self.dim:2 * self.dim], self.stats[-1] = 1.0, 1e-4

    @property
    def mean(self) -> np.ndarray:
        return self.stats[:self.dim]

    @property
    def var(self) -> np.ndarray:
        return self.stats[self.dim:2 * self.dim]

    @property
    def count(self) -> float:
        return float(self.stats[-1])

    def update(self, x: np.ndarray) -> None:
        if not self.enabled or len(x) == 0:
            return
        x = np.asarray(x, np.float64).reshape(len(x), self.dim)
        count, n = self.stats[-1], len(x)
        total = count + n
        # ufunc reductions rather than x.mean / x.var: this runs once per env step, mostly on a handful of rows.
        batch_mean = np.add.reduce(x, 0) / n
        batch_var = np.add.reduce((x - batch_mean) ** 2, 0) / n
        mean, var = self.stats[:self.dim], self.stats[self.dim:2 * self.dim]
        delta = batch_mean - mean
        var[:] = (var * count + batch_var * n + delta**2 * (count * n / total)) / total
        mean += delta * (n / total)
        self.stats[-1] = total

    def normalize(self, obs):
        """torch tensor ``[..., D]`` -> normalised float32 tensor on the same device; numpy array -> float32 array."""
        if not self.enabled:
            return obs
        mean, var = self.stats[:self.dim], self.stats[self.dim:2 * self.dim]
        if isinstance(obs, np.ndarray):
            return np.clip((obs - mean) / np.sqrt(var + 1e-8), -self.clip, self.clip).astype(np.float32)
        import torch

        s = torch.as_tensor(np.array(self.stats[:2 * self.dim]), dtype=torch.float32, device=obs.device)
        return ((obs - s[:self.dim]) / torch.sqrt(s[self.dim:] + 1e-8)).clamp(-self.clip, self.clip)

    def state(self):
        import torch

        return torch.from_numpy(np.array(self.stats))

    def load(self, state) -> None:
        state = np.asarray(state, np.float64)
        if state.shape != self.stats.shape:
            raise ValueError(f"observation statistics of shape {state.shape}, expected {self.stats.shape}")
        self.stats[:] = state


class RewardScale:
    """Rewards [B] scaled by the running std of each env's discounted return; disabled: rewards pass unchanged."""

    def __init__(self, num_envs: int, gamma: float, enabled: bool = True, shared: bool = False, clip: float = 10.0):
        self.gamma, self.enabled, self.clip = float(gamma), bool(enabled), float(clip)
        self.returns = ObsNorm(1, enabled, shared)  # statistics of G: the part a checkpoint keeps
        self.discounted = np.zeros(num_envs, np.float64)  # G per env

    def __call__(self, reward: np.ndarray, ended: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """reward, ended, valid: [B]; valid is False on rows that only reset their env."""
        if not self.enabled:
            return reward
        reward = np.where(valid, reward, 0.0)
        self.discounted = np.where(valid, self.discounted * self.gamma + reward, self.discounted)
        self.returns.update(self.discounted[valid, None])
        scaled = np.clip(reward / np.sqrt(self.returns.var[0] + 1e-8), -self.clip, self.clip)
        self.discounted[ended & valid] = 0.0
        return scaled

    def state(self):
        return self.returns.state()

    def load(self, state) -> None:
        self.returns.load(state)
