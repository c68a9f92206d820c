"""algos/a2c_atari.py: learning on CartPole, the lag correction, Atari smoke runs with resume, bad arguments."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import torch

from tests.helpers import ROOT, progress, refusal, run

sys.path.insert(0, str(ROOT / "algos"))
import a2c_atari

CARTPOLE = ["--preset", "cartpole", "--eval-episodes", "0"]  # the learning test below is the preset's test


def test_a2c_learns_cartpole_serial(tmp_path):
    out = run(
        "a2c_atari.py",
        *CARTPOLE,
        "--total-timesteps",
        "150000",
        "--stop-at-return",
        "450",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"mean return of the last 20 episodes ([\d.]+) >= 450", out.stdout), out.stdout[-2000:]
    assert int(progress(tmp_path / "r")[-1]["global_step"]) <= 150_000


def _data(agent, obs, shift):
    with torch.no_grad():
        logits, _ = agent(obs)
    dist = torch.distributions.Categorical(logits=logits)
    action = dist.sample()
    return {
        "obs": obs,
        "mask": torch.ones(len(obs), 2, dtype=torch.bool),
        "action": action,
        "logprob": dist.log_prob(action) + shift,
        "adv": torch.ones(len(obs)),
        "ret": torch.zeros(len(obs)),
        "weight": torch.ones(len(obs)),
    }


def test_importance_weight_is_one_on_policy_and_truncated_off_policy():
    torch.manual_seed(0)
    agent = a2c_atari.Agent((4,), 2)
    obs = torch.randn(32, 4)
    args = a2c_atari.Args(env_id="CartPole-v1", sampler="async")  # async: the sampler lags one update
    opt = torch.optim.SGD(agent.parameters(), lr=0.0)
    on = a2c_atari.a2c_update(agent, opt, _data(agent, obs, 0.0), args)
    assert float(on["rho_mean"]) == pytest.approx(1.0)
    # The behaviour policy gave these actions more probability than the learner does now: rho = pi/mu = e^-1.
    off = a2c_atari.a2c_update(agent, opt, _data(agent, obs, 1.0), args)
    assert float(off["rho_mean"]) == pytest.approx(np.exp(-1.0), rel=1e-5)
    # Less probability under the behaviour policy: pi/mu = e > 1 is truncated at 1.
    off = a2c_atari.a2c_update(agent, opt, _data(agent, obs, -1.0), args)
    assert float(off["rho_mean"]) == pytest.approx(1.0)
    # serial and parallel sample with the current parameters: rho is exactly 1, whatever the last bits of the
    # recomputed log-probabilities (another batch shape, TF32 or bf16 on a GPU)
    serial = a2c_atari.Args(env_id="CartPole-v1", sampler="serial")
    assert float(a2c_atari.a2c_update(agent, opt, _data(agent, obs, 1e-6), serial)["rho_mean"]) == 1.0


# Atari parallel sampling (ale-py's vector env) is tested frame for frame in test_atari.py and here with the slow
# tests, for CI's 30 minutes.
@pytest.mark.parametrize(
    "sampler", ["serial", pytest.param("parallel", marks=pytest.mark.slow), pytest.param("async", marks=pytest.mark.slow)]
)
def test_atari_smoke_checkpoint_and_resume(sampler, tmp_path):
    common = ["--num-envs", "4", "--num-steps", "5", "--log-every", "2", "--eval-episodes", "0", "--sampler", sampler]
    out = run("a2c_atari.py", *common, "--total-timesteps", "80", "--out-dir", str(tmp_path), "--run-name", "a", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "a"
    assert [int(r["global_step"]) for r in progress(run_dir)] == [40, 80]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    a2c_atari.Agent((4, 84, 84), 4).load_state_dict(ckpt["model"])
    assert ckpt["global_step"] == 80
    out = run("a2c_atari.py", *common, "--total-timesteps", "120", "--resume", str(run_dir / "checkpoint.pt"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [int(r["global_step"]) for r in progress(run_dir)] == [40, 80, 120]


BAD_ARGUMENTS = [
    (["--num-envs", "-1"], "--num-envs"),
    (["--sampler", "gpu"], "--sampler"),
    (["--env-id", "Pendulum-v1"], "discrete"),
]


@pytest.mark.parametrize("bad, words", BAD_ARGUMENTS)
def test_bad_arguments_exit_2(bad, words, tmp_path):
    lines = refusal("a2c_atari.py", *bad, "--out-dir", str(tmp_path))  # in this process, before run.setup()
    assert len(lines) == 1 and words in lines[0], lines


def test_a_bad_argument_exits_2_from_the_command_line(tmp_path):
    """One case end to end: the process's exit code and its whole stderr."""
    bad, words = BAD_ARGUMENTS[-1]
    out = run("a2c_atari.py", *bad, "--out-dir", str(tmp_path), timeout=60)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], out.stderr
