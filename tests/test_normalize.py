"""shared/normalize.py: running statistics against numpy over the concatenated data, for any split into batches;
the module version against the array version."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.normalize import ObsNorm, RunningNorm


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


def test_disabled_is_the_identity_and_state_round_trips():
    off = ObsNorm(2, enabled=False)
    off.update(np.ones((5, 2)))
    x = torch.randn(3, 2)
    assert off.normalize(x) is x and off.count == 1e-4
    on = ObsNorm(2)
    on.update(np.arange(10.0).reshape(5, 2))
    again = ObsNorm(2)
    again.load_state_dict(on.state_dict().numpy())
    assert np.array_equal(again.stats, on.stats)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_running_norm_module_matches_obs_norm_and_travels_in_its_state_dict(sizes, seed):
    rng = np.random.default_rng(seed)
    batches = [rng.normal(50.0, 0.1, (n, 3)).astype(np.float32) for n in sizes]  # a large mean, a small spread
    reference, module = ObsNorm(3), RunningNorm(3)
    for b in batches:
        reference.update(b)
        module.update(torch.as_tensor(b))
    np.testing.assert_allclose(module.mean.numpy(), reference.mean, rtol=1e-12)
    np.testing.assert_allclose(module.var.numpy(), reference.var, rtol=1e-7, atol=1e-12)
    assert module.count.item() == pytest.approx(reference.count)
    x = torch.as_tensor(batches[0], dtype=torch.float32)
    np.testing.assert_allclose(module(x).numpy(), reference.normalize(x).numpy(), rtol=1e-4, atol=1e-4)
    copy = RunningNorm(3)
    copy.load_state_dict(module.state_dict())
    assert torch.equal(copy(x), module(x))
    off = RunningNorm(3, enabled=False)
    off.update(x)
    assert off(x) is x and off.count.item() == 1e-4
