"""algos/ppo_lstm.py: the learner replays the LSTM exactly as the sampler ran it (against a step-by-step reference,
across episode starts and rollouts, discrete and continuous), the rollout's boundaries, GAE against its definition,
learning the memory tasks (CartPole without velocities, Pendulum without angular velocity), action masks, Atari
smoke runs with resume, determinism, bad arguments, interruption and a killed sampler."""

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
from shared.evaluation import Draws
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
import ppo_lstm

CARTPOLE = ["--preset", "cartpole", "--eval-episodes", "0"]
PENDULUM = ["--preset", "pendulum", "--eval-episodes", "0"]
TINY = [
    "--preset",
    "cartpole",
    "--num-envs",
    "4",
    "--num-steps",
    "16",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "2",
    "--eval-episodes",
    "0",
]
ATARI_SMOKE = [
    "--num-envs",
    "4",
    "--num-steps",
    "16",
    "--num-minibatches",
    "2",
    "--total-timesteps",
    "256",
    "--eval-episodes",
    "0",
]


# ---------------------------------------------------------------------------------------------- the replay


def short_episodes(kind: str):
    """A vector env of 4 with many episode ends in 2 rollouts of 24 steps, its Args and an agent."""
    if kind == "discrete":  # positions only; a random policy drops the pole in about 20 steps
        args = ppo_lstm.Args(
            env_id="CartPole-v1", observe_indices=(0, 2), num_envs=4, num_steps=24, num_minibatches=2, hidden=16
        )
        thunk = lambda: gym.make("CartPole-v1", max_episode_steps=9)
    else:  # cut at 7 steps by the time limit, observations normalised by statistics away from the prior
        args = ppo_lstm.Args(
            env_id="Pendulum-v1",
            observe_indices=(0, 1),
            num_envs=4,
            num_steps=24,
            num_minibatches=2,
            hidden=16,
            normalize_obs=True,
        )
        thunk = lambda: gym.make("Pendulum-v1", max_episode_steps=7)
    keep = np.array(args.observe_indices)
    filtered = lambda: gym.wrappers.TransformObservation(
        thunk(), lambda o: o[keep], gym.spaces.Box(-np.inf, np.inf, (len(keep),), np.float32)
    )
    envs = vector_env([filtered] * 4, "serial")
    agent = ppo_lstm.make_agent(args, envs.single_observation_space, envs.single_action_space)
    if args.normalize_obs:
        agent.obs_norm.update(torch.randn(50, 2) * 0.3 + 0.5)
    return args, envs, agent


def step_by_step(agent, buf, boot, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference: env b's rows one at a time from its stored state, the state replaced by zeros (by this
    function, not by the agent's mask) at each episode start; log-probabilities of the stored actions and values."""
    state = ppo_lstm.RnnState(torch.as_tensor(boot.h0[b : b + 1]), torch.as_tensor(boot.c0[b : b + 1]))
    no_start = torch.zeros(1, 1, dtype=torch.bool)
    logprobs, values = [], []
    for t in range(len(buf.obs)):
        if buf.episode_start[t, b]:
            state = agent.initial_state(1)
        out, value, state = agent(torch.as_tensor(buf.obs[t, b : b + 1]), state, no_start)
        action = torch.as_tensor(buf.action[t, b : b + 1])
        logprobs.append(agent.policy(out, torch.as_tensor(buf.mask[t, b : b + 1]), action)[1].item())
        values.append(value.item())
    return np.array(logprobs, np.float32), np.array(values, np.float32)


@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_the_learner_replays_the_sampler_exactly_across_episode_starts(kind, monkeypatch):
    """Two rollouts (the second starts from states carried over), several episode starts in most sequences: the
    sampler's stored log-probabilities and values are those of a step-by-step reference, and the learner's first
    forward over each minibatch of whole sequences gives them again, bit for bit (PPO's first ratio is 1)."""
    args, envs, agent = short_episodes(kind)
    state = ppo_lstm.EnvState(envs, 3, agent, torch.device("cpu"))
    example, boot_example = ppo_lstm.rollout_example(envs.single_observation_space, envs.single_action_space, args.hidden, 4)
    buf, boot = buffer_from_example(example, (24, 4)), buffer_from_example(boot_example, ())
    torch.manual_seed(0)
    for _ in range(2):
        ppo_lstm.collect(envs, agent, state, buf, boot, args, torch.device("cpu"))
    envs.close()
    assert (buf.episode_start.sum(0) >= 2).sum() >= 3  # several episodes start inside most sequences
    assert np.abs(boot.h0).max() > 1e-4  # the second rollout starts from carried states, not zeros
    np.testing.assert_array_equal(buf.episode_start[1:], buf.final_row[:-1])  # the row after a final row
    np.testing.assert_array_equal(boot.episode_start, buf.final_row[-1])
    with torch.no_grad():
        for b in range(4):
            logprob, value = step_by_step(agent, buf, boot, b)
            np.testing.assert_allclose(buf.logprob[:, b], logprob, rtol=0, atol=1e-6)
            np.testing.assert_allclose(buf.value[:, b], value, rtol=0, atol=1e-6)

    replayed = []
    ppo_loss = ppo_lstm.ppo_loss

    def checked_loss(agent, mb, state, start_rows, args):  # ppo_loss, after replaying the minibatch as it does
        with torch.no_grad():
            out, value, _ = agent(mb["obs"], state, mb["episode_start"].view(args.num_steps, -1), start_rows)
            logprob = agent.policy(out, mb["mask"], mb["action"])[1]
        assert torch.equal(logprob, mb["logprob"]) and torch.equal(value, mb["value"])  # every row, final rows too
        loss, stats = ppo_loss(agent, mb, state, start_rows, args)
        assert stats["approx_kl"] == 0 and stats["clipfrac"] == 0  # the loss's ratios are 1
        replayed.append(mb["weight"])
        return loss, stats

    monkeypatch.setattr(ppo_lstm, "ppo_loss", checked_loss)
    frozen = torch.optim.SGD(agent.parameters(), lr=0.0)  # every minibatch of every epoch replays the sampler's policy
    ppo_lstm.learn_from(agent, ppo_lstm.RunningNorm(1, False), frozen, buf, boot, args, torch.device("cpu"), torch.Generator())
    assert len(replayed) == 2 * args.update_epochs and all(len(w) == 24 * 2 for w in replayed)  # whole sequences
    assert sum(int(w.sum()) for w in replayed[:2]) == (~buf.final_row).sum()  # an epoch: every row that is not final


def test_the_graphed_bootstrap_is_the_critic_one_step_on_from_each_envs_state():
    """learn_from's bootstrap, one graph under --compile (here the graphs' protocol on the CPU: data copied into the
    static inputs at every call): the values of the observations after the rollout, each env one step on from its
    state, a zero state where an episode starts; a second call's data (the next rollout's edge) are its own."""
    from shared import compiling

    args, envs, agent = short_episodes("discrete")
    dim = envs.single_observation_space.shape[0]
    envs.close()
    start = torch.tensor([[True, False, False, True]])  # [1, B]
    compiling.enable(torch.device("cpu"))
    try:
        for seed in range(2):
            g = torch.Generator().manual_seed(seed)
            obs, h, c = torch.randn(4, dim, generator=g), torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
            got = ppo_lstm.bootstrap_value(agent, obs, ppo_lstm.RnnState(h, c), start, False)  # [B]
            with torch.no_grad():
                for b in range(4):
                    state = agent.initial_state(1) if start[0, b] else ppo_lstm.RnnState(h[b : b + 1], c[b : b + 1])
                    _, want, _ = agent(obs[b : b + 1], state, torch.zeros(1, 1, dtype=torch.bool))
                    assert got[b].item() == pytest.approx(want.item(), abs=1e-6)
    finally:
        compiling.disable()


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
    adv, ret = ppo_lstm.compute_gae(f(r), f(v), f(nv), f(term), f(ended), f(reset), 0.99, 0.95)
    expected = gae_by_definition(r, v, nv, term, ended, reset, 0.99, 0.95)
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, expected + v, rtol=1e-5, atol=1e-5)


def test_evaluation_policy_carries_its_state_and_starts_afresh_with_each_episode():
    args, envs, agent = short_episodes("discrete")
    envs.close()
    policy = ppo_lstm.EvalPolicy(ppo_lstm.Policy(agent, gym.spaces.Discrete(2)), torch.device("cpu"))
    obs = [np.array([[0.1, 0.02], [0.5, 0.5]], np.float32), np.array([[0.12, 0.03], [0.4, 0.6]], np.float32)]
    draws, start, go_on, every = Draws(2), np.array([True, True]), np.array([False, False]), np.ones((2, 2), bool)
    with torch.no_grad():
        policy(obs[0], draws, start, every)
        carried = policy.state.h.clone()
        policy(obs[1], draws, go_on, every)
        assert not torch.equal(policy.state.h[0], carried[0])  # the state moves on within an episode
        moved = policy.state.h.clone()
        policy(obs[0], draws, np.array([True, False]), every)  # env 0 starts its next episode, env 1 goes on
        assert torch.equal(policy.state.h[0], carried[0])  # env 0 from zeros
        assert not torch.equal(policy.state.h[1], moved[1])  # env 1 carried its own state on


# ---------------------------------------------------------------------------------------------- learning


def reached(out, threshold: float) -> int | None:
    m = re.search(rf"mean return of the last \d+ episodes (-?[\d.]+) >= {threshold} at step (\d+)", out.stdout)
    return int(m.group(2)) if m else None


# slow, both modes: the preset is fragile (issue 40, benchmarks/results/README.md: 428.7 [376.3, 477.1] over 10
# seeds); whether seed 1 reaches 475 depends on the CPU and the thread count (it did not on 2 threads of an AMD EPYC
# on 2026-11-26). The pendulum test below keeps ppo_lstm's learning in the default tier until the preset is robust.
@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["serial", "async"])
def test_learns_cartpole_without_velocities(sampler, tmp_path):
    """The cartpole preset to a mean of 475 over 20 episodes within its 100k steps (positions only: the velocities
    must be inferred from what the LSTM remembers; with --no-lstm the preset stays at 45,
    benchmarks/learning/ppo_lstm_vs_recurrentppo.py)."""
    out = run(
        "ppo_lstm.py",
        *CARTPOLE,
        "--sampler",
        sampler,
        "--stop-at-return",
        "475",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert reached(out, 475.0), f"did not reach 475 within 100k steps:\n{out.stdout[-2000:]}"


@pytest.mark.slow  # CI's 30 minutes (issue 42's compile tests); the masked-policy test below learns in CI
def test_learns_pendulum_without_angular_velocity(tmp_path):
    """The pendulum preset to a mean of -400 over 10 episodes within its 200k steps (cos and sin of the angle
    only; random actions get about -1200, the preset with --no-lstm -1084 over the last tenth of its 200k steps,
    seeds 1 and 2, benchmarks/learning/ppo_lstm_vs_recurrentppo.py), and the deterministic policy with the frozen
    observation statistics far above that."""
    out = run(
        "ppo_lstm.py",
        *PENDULUM[:-2],
        "--eval-episodes",
        "5",
        "--stop-at-return",
        "-400",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert reached(out, -400.0), f"did not reach -400 within 200k steps:\n{out.stdout[-2000:]}"
    assert json.loads((tmp_path / "r" / "eval.json").read_text())["mean"] >= -800


def test_the_masked_policy_never_takes_a_masked_action_and_learns_the_best_valid_one(tmp_path):
    """tests/masked_env.py: a masked action would pay 10 and the env raises if one is ever taken (in training or
    evaluation); the best valid action is learned (16 is the best return, a uniform valid policy gets 16/3)."""
    out = run(
        "ppo_lstm.py",
        "--env-id",
        "tests.masked_env:MaskedChoice-v0",
        "--num-envs",
        "8",
        "--num-steps",
        "32",
        "--learning-rate",
        "2.5e-3",
        "--no-anneal-lr",
        "--clip-coef",
        "0.2",
        "--num-minibatches",
        "4",
        "--hidden",
        "32",
        "--total-timesteps",
        "16384",
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


# ---------------------------------------------------------------------------------------------- runs


@pytest.mark.parametrize(
    "sampler", ["serial", pytest.param("parallel", marks=pytest.mark.slow), pytest.param("async", marks=pytest.mark.slow)]
)
def test_atari_smoke_checkpoint_and_resume(sampler, tmp_path):
    out = run("ppo_lstm.py", *ATARI_SMOKE, "--sampler", sampler, "--out-dir", str(tmp_path), "--run-name", "a", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "a"
    assert [int(r["global_step"]) for r in progress(run_dir)] == [64, 128, 192, 256]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] == 256 and ckpt["args"]["sampler"] == sampler
    agent = ppo_lstm.Agent((4, 84, 84), gym.spaces.Discrete(4), 128)
    agent.load_state_dict(ckpt["model"])
    out = run(
        "ppo_lstm.py",
        *ATARI_SMOKE[:-4],
        "--total-timesteps",
        "384",
        "--eval-episodes",
        "0",
        "--sampler",
        sampler,
        "--resume",
        str(run_dir),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert [int(r["global_step"]) for r in progress(run_dir)] == [64, 128, 192, 256, 320, 384]


@pytest.mark.parametrize("sampler", ["serial", pytest.param("async", marks=pytest.mark.slow)])
def test_continuous_checkpoint_resume_and_eval_only_carry_the_normalisers(sampler, tmp_path):
    flags = [
        *PENDULUM,
        "--num-envs",
        "2",
        "--num-steps",
        "64",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "2",
        "--sampler",
        sampler,
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    ]
    out = run("ppo_lstm.py", *flags, "--total-timesteps", "256", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert first["model"]["obs_norm.count"].item() == pytest.approx(1e-4 + 256)
    out = run("ppo_lstm.py", *flags, "--total-timesteps", "512", "--resume", str(tmp_path / "r"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [int(r["global_step"]) for r in progress(tmp_path / "r")] == [128, 256, 384, 512]
    second = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert second["model"]["obs_norm.count"].item() == pytest.approx(1e-4 + 512)
    assert second["return_norm"]["count"].item() > first["return_norm"]["count"].item()
    out = run("ppo_lstm.py", *flags, "--resume", str(tmp_path / "r"), "--eval-only", "--eval-episodes", "2", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ev = json.loads((tmp_path / "r" / "eval.json").read_text())
    assert ev["global_step"] == 512 and len(ev["returns"]) == 2


@pytest.mark.slow
def test_parallel_sampling_trains_exactly_as_serial_sampling(tmp_path):
    for sampler in ("serial", "parallel"):
        out = run(
            "ppo_lstm.py",
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


@pytest.mark.parametrize("preset", ["cartpole", pytest.param("pendulum", marks=pytest.mark.slow)])
def test_serial_runs_are_reproducible(preset, tmp_path):
    flags = [*TINY, "--preset", preset, "--total-timesteps", "512"]
    for name in ("x", "y"):
        out = run("ppo_lstm.py", *flags, "--out-dir", str(tmp_path), "--run-name", name)
        assert out.returncode == 0, out.stderr[-2000:]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("wall_time_s", "sps")} for r in rows]
    a, b = strip(progress(tmp_path / "x")), strip(progress(tmp_path / "y"))
    assert len(a) == 8 and a == b
    ca = torch.load(tmp_path / "x" / "checkpoint.pt", weights_only=True)["model"]
    cb = torch.load(tmp_path / "y" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(ca[k], cb[k]) for k in ca)


# ---------------------------------------------------------------------------------------------- errors


BAD_ARGUMENTS = [
    (["--num-envs", "0"], "--num-envs"),
    (["--num-minibatches", "3"], "--num-minibatches 3 does not divide --num-envs 8"),
    (["--hidden", "0"], "--hidden"),
    (["--observe-indices", "7"], "--observe-indices 7 does not fit observations of shape (4,)"),
    (["--env-id", "BreakoutNoFrameskip-v4"], "--observe-indices applies to vector observations"),
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--sampler", "threads"], "--sampler"),
    (["--resume", "/nonexistent/run"], "--resume"),
]


@pytest.mark.parametrize("bad, words", BAD_ARGUMENTS)
def test_bad_arguments_exit_2_with_one_line(bad, words, tmp_path):
    lines = refusal("ppo_lstm.py", *CARTPOLE, *bad, "--out-dir", str(tmp_path))  # before run.setup()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], lines
    assert not any(tmp_path.iterdir())  # nothing started, no run folder


def test_a_bad_argument_exits_2_from_the_command_line(tmp_path):
    """One case end to end: the process's exit code and its whole stderr, and no run folder."""
    bad, words = BAD_ARGUMENTS[3]
    out = run("ppo_lstm.py", *CARTPOLE, *bad, "--out-dir", str(tmp_path), timeout=60)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], out.stderr
    assert not any(tmp_path.iterdir())  # nothing started, no run folder


@pytest.mark.parametrize("sampler, sig", [("async", signal.SIGINT), ("serial", signal.SIGTERM)])
def test_interrupt_writes_checkpoint_and_ends_every_process(sampler, sig, tmp_path):
    shm_before = our_shm()
    proc = start(
        "ppo_lstm.py",
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
    assert torch.load(tmp_path / "i" / "checkpoint.pt", weights_only=True)["global_step"] >= 64
    assert our_shm() <= shm_before


def test_killed_sampler_ends_the_run_with_exit_1(tmp_path):
    assert_killed_sampler_ends_the_run(
        "ppo_lstm.py", [*TINY, "--sampler", "async", "--total-timesteps", "10000000"], tmp_path / "i"
    )
