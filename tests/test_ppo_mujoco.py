"""algos/ppo_mujoco.py: the Gaussian log-density and entropy against their definitions, GAE against its definition,
the rollout's episode boundaries and statistics, learning in every sampling mode, resume with the normalisers'
statistics, determinism, bad arguments, interruption and a killed sampler."""

from __future__ import annotations

import json
import os
import re
import signal
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from shared.buffer import buffer_from_example
from shared.envs import vector_env
from tests.helpers import (
    ROOT,
    assert_killed_sampler_ends_the_run,
    assert_no_leftovers,
    finish,
    gae_by_definition,
    our_shm,
    progress,
    refusal,
    run,
    start,
    wait_for_progress_row,
)

sys.path.insert(0, str(ROOT / "algos"))
import ppo_mujoco

# The script's pendulum preset (InvertedPendulum-v5): the learning tests below are that preset's tests.
PENDULUM = ["--preset", "pendulum", "--eval-episodes", "0"]
TINY = [
    "--preset",
    "pendulum",
    "--num-envs",
    "2",
    "--num-steps",
    "64",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "2",
    "--eval-episodes",
    "0",
]


# ---------------------------------------------------------------------------------------------- the policy


def test_gaussian_log_prob_and_entropy_match_their_definitions():
    rng = np.random.default_rng(0)
    mean, log_std = rng.normal(size=(6, 3)), rng.normal(0.0, 0.7, size=(6, 3))
    action = mean + np.exp(log_std) * rng.normal(size=(6, 3)) * 2.0
    t = lambda x: torch.as_tensor(x, dtype=torch.float64)
    log_prob, entropy = ppo_mujoco.gaussian(t(mean), t(log_std), t(action))
    std = np.exp(log_std)
    density = np.prod(np.exp(-((action - mean) ** 2) / (2 * std**2)) / (std * np.sqrt(2 * np.pi)), axis=-1)
    np.testing.assert_allclose(log_prob.numpy(), np.log(density), rtol=1e-10)
    # Entropy -E[log p] by numerical integration of each dimension's density; independent dimensions add.
    for n in range(2):
        h = 0.0
        for i in range(3):
            x = np.linspace(mean[n, i] - 12 * std[n, i], mean[n, i] + 12 * std[n, i], 200_001)
            p = np.exp(-((x - mean[n, i]) ** 2) / (2 * std[n, i] ** 2)) / (std[n, i] * np.sqrt(2 * np.pi))
            h -= np.trapezoid(p * np.log(p), x)
        assert entropy[n].item() == pytest.approx(h, rel=1e-6)


def test_rollout_boundaries_returns_and_log_probs():
    """Two Pendulum envs cut at 5 steps: the row after each truncation only resets its env (reward 0), episodes
    are 5 steps long, the discounted return restarts with each episode, and the stored log-probabilities and
    values are the learner's for the same observations and actions (PPO's first ratio is exactly 1)."""
    args = ppo_mujoco.Args(env_id="Pendulum-v1", num_envs=2, num_steps=12, gamma=0.9)
    envs = vector_env([lambda: gym.make("Pendulum-v1", max_episode_steps=5)] * 2, "serial")
    state = ppo_mujoco.EnvState(envs, 3)
    agent = ppo_mujoco.Agent(3, 1, 16, -0.5)
    agent.obs_norm.update(torch.randn(50, 3) * 3 + 1)  # statistics away from the prior
    example, boot_example = ppo_mujoco.rollout_example(3, 1, 2)
    buf, boot = buffer_from_example(example, (12, 2)), buffer_from_example(boot_example, ())
    torch.manual_seed(0)
    ppo_mujoco.collect(envs, agent, state, buf, boot, args, torch.device("cpu"))
    ended = np.zeros((12, 2), bool)
    ended[[4, 10]] = True  # steps 5 and 11: the episodes' fifth steps
    np.testing.assert_array_equal(buf.episode_end, ended)
    np.testing.assert_array_equal(buf.final_row[1:], ended[:-1])
    assert not buf.terminated.any()
    assert (buf.reward[buf.final_row] == 0).all() and (buf.reward[~buf.final_row] != 0).all()
    assert (buf.ep_length[ended] == 5).all()
    for b in range(2):
        g = 0.0
        for t in range(12):
            g = 0.0 if buf.final_row[t, b] else 0.9 * g + buf.reward[t, b]
            assert buf.discounted[t, b] == pytest.approx(g, rel=1e-5)
    assert np.abs(buf.obs).max() > 1.0  # raw observations (Pendulum's angular velocity reaches past 1)
    with torch.no_grad():
        mean, log_std, value = agent(torch.as_tensor(buf.obs).flatten(0, 1))
        log_prob, _ = ppo_mujoco.gaussian(mean, log_std, torch.as_tensor(buf.action).flatten(0, 1))
    np.testing.assert_allclose(log_prob.numpy(), buf.logprob.reshape(-1), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(value.numpy(), buf.value.reshape(-1), rtol=1e-6, atol=1e-6)
    envs.close()


@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_definition_with_truncation_and_reset_rows(seed):
    rng = np.random.default_rng(seed)
    T, B = 12, 5
    term, trunc = rng.random((T, B)) < 0.1, rng.random((T, B)) < 0.1
    ended = term | trunc
    reset = np.zeros((T, B), bool)
    reset[1:] = ended[:-1]
    r, v, nv = rng.normal(size=(T, B)), rng.normal(size=(T, B)), rng.normal(size=B)
    f = lambda x: np.asarray(x, np.float32)
    adv, ret = ppo_mujoco.compute_gae(f(r), f(v), f(nv), f(term), f(ended), f(reset), 0.99, 0.95)
    expected = gae_by_definition(r, v, nv, term, ended, reset, 0.99, 0.95)
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, expected + v, rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_from_the_final_observation_and_termination_does_not():
    f = lambda x: np.array(x, np.float32)
    r, v = f([[1.0], [0.0]]), f([[2.0], [10.0]])  # row 1 (a reset row) holds the final observation's value 10
    ended, reset = f([[1.0], [0.0]]), f([[0.0], [1.0]])
    adv, _ = ppo_mujoco.compute_gae(r, v, f([5.0]), f([[0.0], [0.0]]), ended, reset, 0.5, 0.9)
    assert adv[0, 0] == pytest.approx(1.0 + 0.5 * 10.0 - 2.0) and adv[1, 0] == 0.0
    adv, _ = ppo_mujoco.compute_gae(r, v, f([5.0]), f([[1.0], [0.0]]), ended, reset, 0.5, 0.9)
    assert adv[0, 0] == pytest.approx(1.0 - 2.0)


# ---------------------------------------------------------------------------------------------- learning


# Parallel (45-60 s here: 8 env processes on 2 cores) with the slow tests, for CI's 30 minutes; the test after this
# one shows in CI that parallel sampling trains exactly as serial sampling does.
@pytest.mark.parametrize(
    "sampler", ["serial", pytest.param("parallel", marks=pytest.mark.slow), pytest.param("async", marks=pytest.mark.slow)]
)
def test_learns_inverted_pendulum_in_every_mode(sampler, tmp_path):
    out = run(
        "ppo_mujoco.py",
        "--preset",
        "pendulum",
        "--sampler",
        sampler,
        "--stop-at-return",
        "500",
        "--eval-episodes",
        "5",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=500,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"mean return of the last 20 episodes ([\d.]+) >= 500.0 at step (\d+)", out.stdout)
    assert m and int(m.group(2)) <= 150_000, f"did not reach 500 within 150k steps:\n{out.stdout[-2000:]}"
    # The deterministic policy with the checkpoint's frozen observation statistics holds the pole as well.
    ev = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert ev["mean"] >= 500, ev


@pytest.mark.slow  # 16 s, for CI's 30 minutes
def test_parallel_sampling_trains_exactly_as_serial_sampling(tmp_path):
    for sampler in ("serial", "parallel"):
        out = run(
            "ppo_mujoco.py",
            *TINY,
            "--sampler",
            sampler,
            "--total-timesteps",
            "512",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            sampler,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-2000:]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("wall_time_s", "sps")} for r in rows]
    assert strip(progress(tmp_path / "serial")) == strip(progress(tmp_path / "parallel"))


# ---------------------------------------------------------------------------------------------- runs


@pytest.mark.parametrize("sampler", ["serial", pytest.param("async", marks=pytest.mark.slow)])
def test_checkpoint_and_resume_carry_the_normalisers(sampler, tmp_path):
    flags = [*TINY, "--normalize-reward", "--sampler", sampler, "--out-dir", str(tmp_path), "--run-name", "r"]
    out = run("ppo_mujoco.py", *flags, "--total-timesteps", "256", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert first["model"]["obs_norm.count"].item() == pytest.approx(1e-4 + 256)  # every row of 2 rollouts
    returns_seen = first["return_norm"]["count"].item()  # one return per row, reset rows left out
    assert 128 < returns_seen <= 1e-4 + 256
    out = run("ppo_mujoco.py", *flags, "--total-timesteps", "512", "--resume", str(tmp_path / "r"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [int(r["global_step"]) for r in progress(tmp_path / "r")] == [128, 256, 384, 512]
    second = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert second["model"]["obs_norm.count"].item() == pytest.approx(1e-4 + 512)  # went on from the saved ones
    assert second["return_norm"]["count"].item() > returns_seen + 128
    out = run("ppo_mujoco.py", *flags, "--resume", str(tmp_path / "r"), "--eval-only", "--eval-episodes", "2", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ev = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert ev["global_step"] == 512 and len(ev["returns"]) == 2


def test_serial_runs_are_reproducible(tmp_path):
    for name in ("x", "y"):
        out = run("ppo_mujoco.py", *TINY, "--total-timesteps", "512", "--out-dir", str(tmp_path), "--run-name", name)
        assert out.returncode == 0, out.stderr[-2000:]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("wall_time_s", "sps")} for r in rows]
    a, b = strip(progress(tmp_path / "x")), strip(progress(tmp_path / "y"))
    assert len(a) == 4 and a == b
    ca = torch.load(tmp_path / "x" / "checkpoint.pt", weights_only=True)
    cb = torch.load(tmp_path / "y" / "checkpoint.pt", weights_only=True)
    assert all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])
    assert torch.equal(ca["return_norm"]["var"], cb["return_norm"]["var"])


# ---------------------------------------------------------------------------------------------- errors


BAD_ARGUMENTS = [
    (["--num-envs", "0"], "--num-envs"),
    (["--num-minibatches", "3"], "--num-minibatches"),
    (["--init-log-std", "30"], "--init-log-std"),
    (["--env-id", "CartPole-v1"], "--env-id CartPole-v1: ppo_mujoco needs a continuous (Box) action space, got Discrete(2)"),
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--resume", "/nonexistent/run"], "--resume"),
]


@pytest.mark.parametrize("bad, words", BAD_ARGUMENTS)
def test_bad_arguments_exit_2_with_one_line(bad, words, tmp_path):
    lines = refusal("ppo_mujoco.py", *PENDULUM, *bad, "--out-dir", str(tmp_path))  # before run.setup()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], lines
    assert not any(tmp_path.iterdir())  # nothing started, no run folder


def test_a_bad_argument_exits_2_from_the_command_line(tmp_path):
    """One case end to end: the process's exit code and its whole stderr, and no run folder."""
    bad, words = BAD_ARGUMENTS[3]
    out = run("ppo_mujoco.py", *PENDULUM, *bad, "--out-dir", str(tmp_path), timeout=60)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], out.stderr
    assert not any(tmp_path.iterdir())  # nothing started, no run folder


@pytest.mark.parametrize("sampler, sig", [("async", signal.SIGINT), ("serial", signal.SIGTERM)])
def test_interrupt_writes_checkpoint_and_ends_every_process(sampler, sig, tmp_path):
    shm_before = our_shm()
    proc = start(
        "ppo_mujoco.py",
        *TINY,
        "--sampler",
        sampler,
        "--total-timesteps",
        "10000000",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "i",
    )
    wait_for_progress_row(tmp_path / "i", proc)
    os.killpg(proc.pid, sig)  # as Ctrl-C does: the whole foreground group gets the signal
    err = finish(proc)
    assert proc.returncode == 130, err
    assert_no_leftovers(proc.pid)
    ckpt = torch.load(tmp_path / "i" / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] >= 128 and ckpt["model"]["obs_norm.count"] >= 128
    assert our_shm() <= shm_before


def test_killed_sampler_ends_the_run_with_exit_1(tmp_path):
    assert_killed_sampler_ends_the_run(
        "ppo_mujoco.py", [*TINY, "--sampler", "async", "--total-timesteps", "10000000"], tmp_path / "i"
    )
