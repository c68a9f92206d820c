"""algos/r2d1_atari.py: the memory task (LSTM against its feed-forward ablation), value rescaling and its inverse,
the priority mix, burn-in outside the loss, recurrent-state resets, Atari smoke runs with resume, bad arguments."""

from __future__ import annotations

import os
import signal
import sys
from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import (
    ROOT,
    assert_killed_sampler_ends_the_run,
    assert_no_leftovers,
    finish,
    progress,
    refusal,
    run,
    start,
    wait_for_progress_row,
)

sys.path.insert(0, str(ROOT / "algos"))
import r2d1_atari as r2d1

from shared.envs import make_envs
from shared.evaluation import play
from shared.replay import SequenceReplayBuffer

# CartPole with the velocities removed: position and angle only, so acting well needs memory.
MEMORY_TASK = ["--preset", "memory", "--eval-episodes", "0"]  # the LSTM/feed-forward test below is the preset's


# ---------------------------------------------------------------------------------------------- value rescaling


@settings(max_examples=300, deadline=None)
@given(st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([1e-3, 1e-2, 0.0]))
def test_value_rescaling_inverse_is_exact(x, eps):
    t = torch.tensor([x], dtype=torch.float64)
    assert r2d1.h_inv(r2d1.h(t, eps), eps).item() == pytest.approx(x, rel=1e-9, abs=1e-9)
    assert r2d1.h(r2d1.h_inv(t / 1e3, eps), eps).item() == pytest.approx(x / 1e3, rel=1e-9, abs=1e-9)


def test_value_rescaling_values():
    x = torch.tensor([-3.0, 0.0, 3.0, 8.0], dtype=torch.float64)
    assert r2d1.h(x, 1e-3).tolist() == pytest.approx([-1.003, 0.0, 1.003, 2.008])  # sqrt(|x|+1) - 1 + eps x
    assert r2d1.h(x, 0.0).tolist() == pytest.approx([-1.0, 0.0, 1.0, 2.0])


# ---------------------------------------------------------------------------------------------- priorities


def test_sequence_priority_mixes_max_and_mean_over_valid_rows():
    td = np.array([[1.0, -4.0], [-3.0, 2.0], [100.0, 0.0]])  # [T=3, B=2]
    valid = np.array([[True, True], [True, True], [False, True]])  # row 2 of sequence 0 only resets the env
    p = r2d1.sequence_priorities(td, valid, eta=0.9)
    assert p.tolist() == pytest.approx([0.9 * 3 + 0.1 * 2.0, 0.9 * 4 + 0.1 * 2.0])
    assert r2d1.sequence_priorities(td, np.zeros_like(valid), 0.9).tolist() == [0.0, 0.0]


# ---------------------------------------------------------------------------------------------- network


def sequence(T=12, B=3, obs_dim=2, n_actions=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(T, B, obs_dim, generator=g),
        torch.randint(0, n_actions, (T, B), generator=g),
        torch.randn(T, B, generator=g),
    )


def test_recurrent_state_resets_where_an_episode_starts():
    torch.manual_seed(0)
    net = r2d1.R2D1Net((2,), 2, 16)
    obs, prev_a, prev_r = sequence()
    state = r2d1.RnnState(torch.randn(3, 16), torch.randn(3, 16))
    reset = torch.zeros(12, 3, dtype=torch.bool)
    reset[5, 1] = True  # env 1 starts an episode at row 5
    q, _ = net(obs, prev_a, prev_r, state, reset)
    # From row 5 on, env 1 behaves as a fresh start: zero state, no previous action (a zero one-hot), no reward.
    fresh_start = torch.zeros(7, 1, dtype=torch.bool)
    fresh_start[0] = True
    q_fresh, _ = net(
        obs[5:, 1:2], torch.randint(0, 2, (7, 1)), prev_r[5:, 1:2] * 0 + torch.randn(7, 1), net.initial_state(1), fresh_start
    )
    q_fresh_same, _ = net(obs[5:, 1:2], prev_a[5:, 1:2], prev_r[5:, 1:2], net.initial_state(1), fresh_start)
    assert not torch.allclose(q_fresh, q_fresh_same)  # rows after the first do see their previous action/reward
    q_fresh = q_fresh_same
    assert torch.allclose(q[5:, 1:2], q_fresh, atol=1e-6)
    assert not torch.allclose(q[5:, 0:1], q_fresh, atol=1e-3)
    # Without resets, the row-by-row path and the one-call path agree.
    q_one, s_one = net(obs, prev_a, prev_r, state, torch.zeros(12, 3, dtype=torch.bool))
    rows, s = [], state
    for t in range(12):
        qt, s = net(obs[t : t + 1], prev_a[t : t + 1], prev_r[t : t + 1], s, torch.zeros(1, 3, dtype=torch.bool))
        rows.append(qt)
    assert torch.allclose(torch.cat(rows), q_one, atol=1e-5) and torch.allclose(s.h, s_one.h, atol=1e-5)


def row_by_row(net, obs, prev_a, prev_r, state, starts):
    """The forward R2D1 had before the fused stretches: one LSTM call per row, the state zeroed where a sequence
    starts an episode (the reference for any batch)."""
    T, B = starts.shape
    keep = (~starts).float().unsqueeze(-1)
    x = net.torso(obs.flatten(0, 1).float().flatten(1)).view(T, B, -1)
    a = torch.nn.functional.one_hot(prev_a.long(), net.n_actions).float() * keep
    x = torch.cat([x, a, prev_r.float().unsqueeze(-1) * keep], dim=-1)
    out, hs, cs = [], state.h[None], state.c[None]
    for t in range(T):
        o, (hs, cs) = net.core(x[t : t + 1], (hs * keep[t], cs * keep[t]))
        out.append(o)
    h = torch.cat(out)
    adv = net.a(h)
    return net.v(h) + adv - adv.mean(-1, keepdim=True), r2d1.RnnState(hs[0], cs[0])


@pytest.mark.parametrize("p_start", [0.0, 0.02, 0.2, 1.0])
def test_the_fused_stretches_equal_the_row_by_row_lstm(p_start):
    """Batches with no episode start, a few (Atari), many, and one at every row: Q-values and the final state
    equal the row-by-row LSTM's within float tolerance, with the start rows given by the host (the fused stretches)
    or not (shared.rnn.lstm_rows, what --compile runs)."""
    torch.manual_seed(0)
    net = r2d1.R2D1Net((2,), 3, 16)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        obs, prev_a, prev_r = sequence(T=30, B=8, n_actions=3, seed=int(torch.randint(0, 10**6, (1,), generator=g)))
        state = r2d1.RnnState(torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g))
        starts = torch.rand(30, 8, generator=g) < p_start
        q_ref, s_ref = row_by_row(net, obs, prev_a, prev_r, state, starts)
        q, s = net(obs, prev_a, prev_r, state, starts, starts.any(1).numpy())
        q_rows, s_rows = net(obs, prev_a, prev_r, state, starts)
        for got, want in ((q, q_ref), (s.h, s_ref.h), (s.c, s_ref.c), (q_rows, q_ref), (s_rows.h, s_ref.h)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the test can fail: start rows that miss one (a stretch run through an episode start) change the outputs
    starts = torch.zeros(30, 8, dtype=torch.bool)
    starts[10, 3] = True
    q_wrong, _ = net(obs, prev_a, prev_r, state, starts, np.zeros(30, bool))
    assert not torch.allclose(q_wrong, row_by_row(net, obs, prev_a, prev_r, state, starts)[0], atol=1e-3)


def loss_batch(burn=4, L=6, n=2, B=3, seed=0):
    obs, prev_a, _ = sequence(T=burn + L + n, B=B, seed=seed)
    W = burn + L + n
    g = torch.Generator().manual_seed(seed + 1)
    return {
        "observation": obs.requires_grad_(True),
        "prev_action": prev_a,
        "prev_reward": torch.zeros(W, B),
        "action": torch.randint(0, 2, (W, B), generator=g),
        "n_step_return": torch.randn(W, B, generator=g),
        "terminated_n": torch.zeros(W, B, dtype=torch.bool),
        "n_taken": torch.full((W, B), n),
        "bootstrap_discount": torch.full((W, B), 0.9),
        "final_row": torch.zeros(W, B, dtype=torch.bool),
        "episode_start": torch.zeros(W, B, dtype=torch.bool),
        "is_weights": torch.ones(B),
        "init_rnn_state": r2d1.RnnState(torch.zeros(B, 16), torch.zeros(B, 16)),
    }


def test_burn_in_rows_do_not_enter_the_loss_or_the_gradient():
    torch.manual_seed(0)
    net, target = r2d1.R2D1Net((2,), 2, 16), r2d1.R2D1Net((2,), 2, 16)
    args = r2d1.Args(burn_in_steps=4, sequence_length=6, n_step_return=2)
    b = loss_batch()
    loss, td, valid = r2d1.r2d1_loss(net, target, b, args)
    assert td.shape == (6, 3)
    loss.backward()
    g = b["observation"].grad
    assert g[:4].abs().sum() == 0 and g[4:10].abs().sum() > 0  # no gradient through the burn-in rows
    b2 = loss_batch()
    b2["n_step_return"][:4] += 100.0  # targets and actions of burn-in rows change: the loss must not
    b2["action"][:4] = 1 - b2["action"][:4]
    b2["final_row"][:4] = True
    assert r2d1.r2d1_loss(net, target, b2, args)[0].item() == pytest.approx(loss.item(), rel=1e-6)
    b3 = loss_batch()
    b3["n_step_return"][5] += 1.0  # a training row's target does change it
    assert r2d1.r2d1_loss(net, target, b3, args)[0].item() != pytest.approx(loss.item(), rel=1e-6)


def test_the_loss_without_the_hosts_start_rows_still_zeroes_the_state_where_an_episode_starts():
    """A batch without ``start_rows`` (what --compile's update gets, and any other caller) zeroes the state where an
    episode starts, as the fused stretches do with them: not straight through (the fallback the review of issue 61
    found lost)."""
    torch.manual_seed(0)
    net, target = r2d1.R2D1Net((2,), 2, 16), r2d1.R2D1Net((2,), 2, 16)
    args = r2d1.Args(burn_in_steps=4, sequence_length=6, n_step_return=2)
    b = loss_batch()
    b["episode_start"][6, 1] = True
    with_rows = r2d1.r2d1_loss(net, target, {**b, "start_rows": b["episode_start"].any(1).numpy()}, args)[0]
    without = r2d1.r2d1_loss(net, target, b, args)[0]
    ignoring = r2d1.r2d1_loss(net, target, {**b, "start_rows": np.zeros(12, bool)}, args)[0]
    assert without.item() == pytest.approx(with_rows.item(), rel=1e-6)
    assert ignoring.item() != pytest.approx(with_rows.item(), rel=1e-6)  # the check can fail


def test_target_uses_the_online_argmax_at_the_bootstrap_row_and_stops_at_done():
    # A network whose Q does not depend on the state: the online net prefers action 1, the target values action 0
    # at 10 and action 1 at 2. Double DQN bootstraps h^-1(2); termination bootstraps nothing.
    class Const(torch.nn.Module):
        def __init__(self, q):
            super().__init__()
            self.q = torch.tensor(q)

        def embed(self, obs, prev_a, prev_r, reset):
            return torch.zeros(*reset.shape, 1)

        def recur(self, x, state, reset, start_rows=None):
            return x, state

        def head(self, out):
            return self.q.expand(*out.shape[:2], 2).clone().requires_grad_(True)

    args = r2d1.Args(burn_in_steps=0, sequence_length=2, n_step_return=1, value_rescale_eps=1e-3)
    b = loss_batch(burn=0, L=2, n=1, B=1)
    b["n_step_return"][:] = 1.0
    b["terminated_n"][1] = True
    b["action"][:] = 0
    online, target = Const([0.0, 1.0]), Const([10.0, 2.0])
    _, td, _ = r2d1.r2d1_loss(online, target, b, args)
    h = lambda x: r2d1.h(torch.tensor(x, dtype=torch.float64), 1e-3).item()
    h_inv = lambda x: r2d1.h_inv(torch.tensor(x, dtype=torch.float64), 1e-3).item()
    assert td[:, 0].tolist() == pytest.approx([h(1.0 + 0.9 * h_inv(2.0)) - 0.0, h(1.0) - 0.0], rel=1e-5)


# ---------------------------------------------------------------------------------------------- sampler


def test_sampler_stores_zero_state_and_previous_action_at_episode_starts():
    args = r2d1.Args(
        env_id="CartPole-v1", num_envs=2, hidden=8, rnn_state_interval=10, burn_in_steps=0, sequence_length=10, n_step_return=1
    )
    envs = make_envs(args, r2d1.make_env, "serial")
    torch.manual_seed(0)
    net = r2d1.R2D1Net((4,), 2, 8)
    sampler = r2d1.EnvStepper(envs, args, net, seed=0)
    ex = r2d1.Row(
        np.zeros(4, np.float32),
        np.int64(0),
        np.float32(0),
        False,
        False,
        np.int64(0),
        np.float32(0),
        r2d1.RnnState(np.zeros(8, np.float32), np.zeros(8, np.float32)),
    )
    buf = SequenceReplayBuffer(ex, 2000, 2, sequence_length=10, rnn_state_interval=10, discount=0.99)
    chunks = []
    for _ in range(300):
        chunk, _, _ = sampler.step(net, torch.device("cpu"))
        if chunk is not None:
            chunks.append(chunk)
            buf.append(chunk)
    envs.close()
    starts = buf.storage.episode_start[:300]
    h = np.concatenate([c.rnn_state.h for c in chunks])  # [300, B, 8]
    prev_a = np.concatenate([c.prev_action for c in chunks])
    prev_r = np.concatenate([c.prev_reward for c in chunks])
    assert starts.sum() > 4 and (~starts).sum() > 100
    assert np.all(h[starts] == 0) and np.all(np.abs(h[~starts]).sum(-1) > 0)
    assert np.all(prev_a[starts] == 0) and np.all(prev_r[starts] == 0) and prev_r[~starts].mean() > 0.9


def test_evaluation_reads_only_the_written_network_contract():
    """Evaluation needs only forward(...) and initial_state(B, device): a network with nothing else (no n_actions)
    plays epsilon-greedy episodes, the action count taken from its Q-values."""

    class Contract(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = r2d1.R2D1Net((2,), 2, 8)

        def initial_state(self, batch, device=None):
            return self.inner.initial_state(batch, device)

        def forward(self, obs, prev_action, prev_reward, state, episode_start, start_rows=None):
            return self.inner(obs, prev_action, prev_reward, state, episode_start, start_rows)

    act = r2d1.EvalPolicy(Contract(), torch.device("cpu"), epsilon=0.5)
    make_env = partial(r2d1.make_env, r2d1.Args(env_id="CartPole-v1", observe_indices=(0, 2)))
    episodes = play(make_env, act, 4, seed=0, envs=2)
    assert len(episodes.returns) == 4 and act.state.h.shape == (2, 8)


# ---------------------------------------------------------------------------------------------- runs


@pytest.mark.slow  # 150-180 s: with the slow tests, for CI's 30 minutes
def test_lstm_beats_its_feed_forward_ablation_on_the_memory_task(tmp_path):
    returns = {}
    for name, extra in (("lstm", []), ("ff", ["--no-recurrent"])):
        out = run(
            "r2d1_atari.py",
            *MEMORY_TASK,
            *extra,
            "--total-timesteps",
            "30000",
            "--log-every",
            "2000",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            name,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        rows = [r for r in progress(tmp_path / name) if r["return_mean"]]
        returns[name] = np.mean([float(r["return_mean"]) for r in rows[-3:]])  # the last 6k steps
    print(
        f"memory task, mean return over the last 6k of 30k steps: LSTM {returns['lstm']:.1f}, feed-forward {returns['ff']:.1f}"
    )
    assert returns["lstm"] >= 150 and returns["lstm"] >= 2 * returns["ff"], returns  # measured: about 280 and 75


# Atari parallel sampling (ale-py's vector env) is tested frame for frame in test_atari.py and here with the slow
# tests, for CI's 30 minutes.
@pytest.mark.parametrize(
    "sampler", ["serial", pytest.param("parallel", marks=pytest.mark.slow), pytest.param("async", marks=pytest.mark.slow)]
)
def test_atari_smoke_checkpoint_and_resume(sampler, tmp_path):
    common = [
        "--num-envs",
        "2",
        "--buffer-size",
        "2000",
        "--min-steps-learn",
        "200",
        "--log-every",
        "200",
        "--eval-episodes",
        "0",
        "--sampler",
        sampler,
        "--batch-size",
        "4",
        "--sequence-length",
        "8",
        "--burn-in-steps",
        "4",
        "--rnn-state-interval",
        "4",
        "--n-step-return",
        "2",
        "--hidden",
        "64",
        "--replay-ratio",
        "8",
    ]
    out = run("r2d1_atari.py", *common, "--total-timesteps", "400", "--out-dir", str(tmp_path), "--run-name", "a", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = progress(tmp_path / "a")
    assert len(rows) == 2 and int(rows[-1]["global_step"]) >= 400 and int(rows[-1]["updates"]) > 0
    ckpt = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    r2d1.R2D1Net((4, 84, 84), 4, 64).load_state_dict(ckpt["model"])
    out = run("r2d1_atari.py", *common, "--total-timesteps", "800", "--resume", str(tmp_path / "a"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ckpt2 = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    assert ckpt2["global_step"] >= 800 and ckpt2["updates"] > ckpt["updates"]


BAD_ARGUMENTS = [
    (["--batch-size", "0"], "--batch-size"),
    (["--eta", "2"], "--eta"),
    (["--burn-in-steps", "-1"], "--burn-in-steps"),
    (["--buffer-size", "1000"], "--buffer-size"),
    (["--min-steps-learn", "2000"], "--min-steps-learn"),  # 16 envs x 125 rows: 16 sequences, batch 64
    (["--env-id", "Pendulum-v1", "--num-envs", "1", "--min-steps-learn", "500", "--batch-size", "4"], "discrete"),
    (
        [
            "--env-id",
            "CartPole-v1",
            "--observe-indices",
            "7",
            "--num-envs",
            "1",
            "--min-steps-learn",
            "500",
            "--batch-size",
            "4",
        ],
        "--observe-indices",
    ),
]


@pytest.mark.parametrize("bad, words", BAD_ARGUMENTS)
def test_bad_arguments_exit_2(bad, words, tmp_path):
    lines = refusal("r2d1_atari.py", *bad, "--out-dir", str(tmp_path))  # in this process, before run.setup()
    assert len(lines) == 1 and words in lines[0], lines


def test_a_bad_argument_exits_2_from_the_command_line(tmp_path):
    """One case end to end: the process's exit code and its whole stderr."""
    bad, words = BAD_ARGUMENTS[-1]
    out = run("r2d1_atari.py", *bad, "--out-dir", str(tmp_path), timeout=60)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], out.stderr


def test_memory_task_flag_keeps_the_chosen_components():
    args = r2d1.Args(env_id="CartPole-v1", observe_indices=(0, 2))
    env = r2d1.make_env(args)()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2,) and env.observation_space.shape == (2,)
    full = r2d1.make_env(r2d1.Args(env_id="CartPole-v1"))()
    full_obs, _ = full.reset(seed=0)
    assert obs.tolist() == full_obs[[0, 2]].tolist()


def test_killed_async_sampler_ends_the_run(tmp_path):
    assert_killed_sampler_ends_the_run(
        "r2d1_atari.py",
        [*MEMORY_TASK, "--sampler", "async", "--total-timesteps", "10000000", "--log-every", "500"],
        tmp_path / "k",
    )


@pytest.mark.slow
def test_ctrl_c_writes_a_checkpoint_and_exits_130(tmp_path):
    proc = start(
        "r2d1_atari.py",
        *MEMORY_TASK,
        "--sampler",
        "parallel",
        "--total-timesteps",
        "10000000",
        "--log-every",
        "500",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "c",
    )
    wait_for_progress_row(tmp_path / "c", proc)
    os.kill(proc.pid, signal.SIGINT)
    err = finish(proc)
    assert proc.returncode == 130, err
    assert torch.load(tmp_path / "c" / "checkpoint.pt", weights_only=True)["global_step"] >= 500
    assert_no_leftovers(proc.pid)


def test_async_finishes_when_one_update_covers_more_than_the_lag_bound(tmp_path):
    # Replay ratio 1: one update per batch_size * sequence_length = 640 env steps, more than --max-lag-steps 100
    # (the defaults have the same shape: 5,120 against 2,000). This deadlocked before the sampler was allowed
    # to produce the data for the learner's next update.
    out = run(
        "r2d1_atari.py",
        *MEMORY_TASK,
        "--sampler",
        "async",
        "--replay-ratio",
        "1",
        "--max-lag-steps",
        "100",
        "--total-timesteps",
        "5000",
        "--log-every",
        "1000",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "l",
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = progress(tmp_path / "l")
    assert int(rows[-1]["global_step"]) >= 5000 and int(rows[-1]["updates"]) >= 3
