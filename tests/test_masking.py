"""Invalid-action masking in ppo_atari.py and a2c_atari.py (masks from ``info["action_mask"]``,
``shared.envs.action_mask``), on the envs of tests/masked_env.py."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch.distributions import Categorical

from tests import masked_env
from tests.helpers import ROOT, progress, run

sys.path.insert(0, str(ROOT / "algos"))
import ppo_atari

from shared.envs import action_mask, vector_env

ENV = "tests.masked_env:MaskedChoice-v0"
FLAGS = {
    "ppo_atari.py": [
        "--num-envs",
        "4",
        "--num-steps",
        "64",
        "--learning-rate",
        "2.5e-3",
        "--num-minibatches",
        "4",
        "--update-epochs",
        "4",
    ],
    # a bandit in disguise: a short horizon keeps A2C's one-step advantages from drowning in later rewards
    "a2c_atari.py": ["--num-envs", "8", "--num-steps", "5", "--gamma", "0.5", "--no-anneal-lr", "--learning-rate", "3e-3"],
}


@pytest.mark.parametrize(
    "name, sampler",
    [("ppo_atari.py", "serial"), pytest.param("ppo_atari.py", "async", marks=pytest.mark.slow), ("a2c_atari.py", "serial")],
)
def test_the_masked_policy_never_takes_a_masked_action_and_learns_the_best_valid_one(name, sampler, tmp_path):
    """A masked action would pay most (10, against 1): the env raises if one is ever taken (in training or in
    evaluation), so the run ends well only if none is; the best valid action is learned (16 is the best return;
    a uniform policy over the valid actions gets 16/3)."""
    out = run(
        name,
        "--env-id",
        ENV,
        *FLAGS[name],
        "--sampler",
        sampler,
        "--total-timesteps",
        "30000",
        "--log-every",
        "10",
        "--eval-episodes",
        "5",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [r for r in progress(tmp_path / "r") if r["return_mean"]]
    assert float(rows[-1]["return_mean"]) >= 14.0, rows[-1]
    assert "mean return 1" in out.stdout.splitlines()[-1]  # evaluation: 10 or more of 16, masked too


def test_masked_log_probabilities_and_entropy_are_those_of_the_valid_actions_alone():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 6, generator=g) * 3
    mask = torch.rand(64, 6, generator=g) < 0.5
    mask[torch.arange(64), torch.randint(0, 6, (64,), generator=g)] = True  # at least one valid action a row
    dist = Categorical(logits=ppo_atari.masked(logits, mask), validate_args=False)
    logp = torch.stack([dist.log_prob(torch.full((64,), a)) for a in range(6)], 1)  # [64, 6]
    for i in range(64):
        valid = mask[i].nonzero().squeeze(1)
        direct = torch.log_softmax(logits[i, valid].double(), 0)  # over the valid actions only
        torch.testing.assert_close(logp[i, valid].double(), direct, atol=1e-5, rtol=1e-5)
        assert float(dist.probs[i][~mask[i]].sum()) == 0.0
        torch.testing.assert_close(dist.entropy()[i].double(), -(direct.exp() * direct).sum(), atol=1e-5, rtol=1e-5)
    assert torch.isfinite(dist.entropy()).all()
    unmasked = Categorical(logits=logits, validate_args=False)  # the test can fail: without the mask they differ
    assert not torch.allclose(unmasked.entropy(), dist.entropy(), atol=1e-3)


def test_the_masks_of_a_rollout_line_up_with_its_observations_after_resets():
    envs = vector_env([lambda: masked_env.MaskedChoice() for _ in range(3)], "serial")
    args = ppo_atari.Args(env_id=ENV, num_envs=3, num_steps=40)
    example, boot_example = ppo_atari.rollout_example(envs.single_observation_space, 5, 3)
    from shared.buffer import buffer_from_example

    buf, boot = buffer_from_example(example, (40, 3)), buffer_from_example(boot_example, ())
    state = ppo_atari.EnvState(envs, seed=0)
    agent = ppo_atari.Agent((4,), 5)
    ppo_atari.collect(envs, agent, state, buf, boot, args, torch.device("cpu"))  # 40 steps: two resets each
    envs.close()
    assert buf.final_row.sum() == 2 * 3
    for t in range(40):
        for b in range(3):
            state = int(buf.obs[t, b].argmax())
            expected = np.ones(5, bool) if buf.final_row[t, b] else masked_env.valid_actions(state)
            np.testing.assert_array_equal(buf.mask[t, b], expected, err_msg=f"row {t}, env {b}")
            assert buf.mask[t, b, buf.action[t, b]] or buf.final_row[t, b]  # the action taken was valid


def test_a_mask_that_allows_no_action_is_an_error_naming_the_env(tmp_path):
    out = run(
        "ppo_atari.py",
        "--env-id",
        "tests.masked_env:MaskedChoiceEmpty-v0",
        *FLAGS["ppo_atari.py"],
        "--total-timesteps",
        "2048",
        "--eval-episodes",
        "0",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    )
    assert out.returncode == 1
    assert "env 0: its action mask allows no action" in out.stderr.splitlines()[-1]
    info = {"action_mask": np.array([[True, False], [False, False]]), "_action_mask": np.array([True, True])}
    with pytest.raises(ValueError, match="env 1: its action mask allows no action"):
        action_mask(info, np.array([False, False]), 2)
    assert action_mask(info, np.array([False, True]), 2).tolist() == [[True, False], [True, True]]  # a final row
