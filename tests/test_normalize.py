"""shared/normalize.py: running statistics against numpy over the concatenated data, for any split into batches;
reward scaling against a plain loop over the steps."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.normalize import ObsNorm, RewardScale


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_running_statistics_match_numpy_for_any_batching(sizes, seed):
    rng = np.random.default_rng(seed)
    batches = [rng.normal(3.0, 2.0, (n, 3)) for n in sizes]
    norm = ObsNorm(3)
    for b in batches:
        norm.update(b)
    # Reference: the prior (mean 0, variance 1, weight 1e-4) followed by all the data at once.
    data = np.concatenate(batches)
    n, prior = len(data), 1e-4
    mean = data.sum(0) / (n + prior)
    var = (prior * 1.0 + (data**2).sum(0)) / (n + prior) - mean**2  # E[x^2] - mean^2; the prior has E[x^2] = 1
    np.testing.assert_allclose(norm.mean, mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(norm.var, var, rtol=1e-7, atol=1e-9)
    assert abs(norm.count - (n + prior)) < 1e-9
    x = torch.as_tensor(data[:4], dtype=torch.float32)
    expected = np.clip((data[:4] - mean) / np.sqrt(var + 1e-8), -10, 10)
    np.testing.assert_allclose(norm.normalize(x).numpy(), expected, rtol=1e-5, atol=1e-5)
    as_numpy = norm.normalize(data[:4].astype(np.float32))
    assert as_numpy.dtype == np.float32
    np.testing.assert_allclose(as_numpy, expected, rtol=1e-5, atol=1e-5)


def test_disabled_is_the_identity_and_state_round_trips():
    off = ObsNorm(2, enabled=False)
    off.update(np.ones((5, 2)))
    x = torch.randn(3, 2)
    assert off.normalize(x) is x and off.count == 1e-4
    on = ObsNorm(2)
    on.update(np.arange(10.0).reshape(5, 2))
    again = ObsNorm(2)
    again.load(on.state().numpy())
    assert np.array_equal(again.stats, on.stats)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_reward_scale_matches_a_plain_loop(num_envs, steps, seed):
    """Per env G <- gamma G + r; the std of every G so far (the 1e-4 prior included) divides r; G restarts after
    an episode's end; a reset row (not valid) adds nothing and gives 0."""
    rng = np.random.default_rng(seed)
    gamma = 0.9
    scale = RewardScale(num_envs, gamma, clip=3.0)
    G, seen = np.zeros(num_envs), []
    for _ in range(steps):
        reward = rng.normal(0.0, 5.0, num_envs)
        valid = rng.random(num_envs) < 0.8
        ended = valid & (rng.random(num_envs) < 0.2)
        out = scale(reward, ended, valid)
        for b in range(num_envs):
            if valid[b]:
                G[b] = gamma * G[b] + reward[b]
                seen.append(G[b])
        n, prior = len(seen), 1e-4  # the prior: mean 0, variance 1, weight 1e-4
        mean = sum(seen) / (n + prior)
        var = (prior + sum(g * g for g in seen)) / (n + prior) - mean**2
        expected = np.where(valid, np.clip(reward / np.sqrt(var + 1e-8), -3.0, 3.0), 0.0)
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-9)
        G[ended] = 0.0
    off = RewardScale(num_envs, gamma, enabled=False)
    r = rng.normal(size=num_envs)
    assert off(r, np.zeros(num_envs, bool), np.ones(num_envs, bool)) is r
    restored = RewardScale(num_envs, gamma)
    restored.load(scale.state())
    np.testing.assert_array_equal(restored.returns.stats, scale.returns.stats)
