"""Saving and restoring a replay (--save-replay): a restored buffer samples as the saved one would, and
``end_episodes`` is exactly a time limit one row before the newest."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.namedarraytuple import namedarraytuple
from shared.replay import ReplayBuffer, SequenceReplayBuffer
from tests.helpers import progress, run

Step = namedarraytuple("Step", ["observation", "action", "reward", "terminated", "truncated", "episode_end"])
Seq = namedarraytuple("Seq", ["observation", "action", "reward", "terminated", "truncated", "rnn_state"])
B = 3


def rows(rng: np.random.Generator, n: int, start: int = 0, frames: bool = False) -> Step:
    obs = (
        rng.integers(0, 255, (n, B, 4, 6, 6)) if frames else start + np.arange(n)[:, None, None] + np.zeros((n, B, 2))
    ).astype(np.uint8 if frames else np.float32)
    done = rng.random((n, B)) < 0.1
    timeout = (rng.random((n, B)) < 0.05) & ~done
    return Step(obs, rng.integers(0, 4, (n, B)), rng.normal(size=(n, B)).astype(np.float32), done, timeout, done | timeout)


def fill(buf: ReplayBuffer, step: Step) -> None:
    """Append ``step`` [n, B] in chunks the ring can take (wrapping around it when n is large)."""
    for i in range(0, len(step.reward), 20):
        buf.append(Step(*(x[i : i + 20] for x in step)))


def make(prioritized: bool, frames: bool = False, size: int = 120) -> ReplayBuffer:
    ex = Step(
        np.zeros((4, 6, 6) if frames else 2, np.uint8 if frames else np.float32),
        np.int64(0),
        np.float32(0),
        False,
        False,
        False,
    )
    return ReplayBuffer(
        ex, size, B, discount=0.9, n_step_return=3, frame_stack=4 if frames else 1, prioritized=prioritized, seed=5
    )


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), prioritized=st.booleans(), frames=st.booleans(), n=st.integers(5, 300))
def test_a_restored_replay_samples_as_the_saved_one(seed, prioritized, frames, n, tmp_path_factory):
    rng = np.random.default_rng(seed)
    a = make(prioritized, frames)
    fill(a, rows(rng, n, frames=frames))
    if prioritized and len(a) >= 16:
        _, idx = a.sample(16)
        a.update_priorities(idx, rng.random(16) * 5)
    path = tmp_path_factory.mktemp("r") / "replay.npz"
    a.save(path)
    b = make(prioritized, frames)
    b.load(path)
    for name, x in a.arrays().items():
        assert np.array_equal(x, b.arrays()[name]), name
    more = rows(rng, 7, frames=frames)
    a.append(more)
    b.append(more)
    if len(a):
        k = min(32, len(a))
        (sa, ia), (sb, ib) = a.sample(k), b.sample(k)
        for name in sa._fields:
            assert np.array_equal(getattr(sa, name), getattr(sb, name)), name
        assert np.array_equal(ia.abs_row, ib.abs_row)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), prioritized=st.booleans(), n=st.integers(2, 60))
def test_end_episodes_is_a_time_limit_one_row_before_the_newest(seed, prioritized, n):
    """Reference: the same rows with ``truncated`` (and ``episode_end``) set on the second newest row of every env
    whose newest row was not already a final row, appended through the ordinary path."""
    rng = np.random.default_rng(seed)
    old, fresh = rows(rng, n), rows(rng, 9, start=100)
    cut = make(prioritized)
    fill(cut, old)
    not_final = ~cut.storage.last_flags[1].astype(bool)
    cut.end_episodes()
    cut.append(fresh)

    marked = Step(*(np.array(x) for x in old))
    marked.truncated[-2, not_final] = marked.episode_end[-2, not_final] = True
    marked.terminated[-1, not_final] = marked.truncated[-1, not_final] = marked.episode_end[-1, not_final] = False
    ref = make(prioritized)
    fill(ref, marked)
    ref.append(fresh)
    got, want = cut.arrays(), ref.arrays()
    for name in want:
        assert np.array_equal(got[name], want[name]), name


def test_a_replay_of_other_flags_is_refused_by_name(tmp_path):
    a = make(False)
    a.append(rows(np.random.default_rng(0), 10))
    a.save(tmp_path / "r.npz")
    with pytest.raises(ValueError, match="other flags built it"):
        make(False, size=240).load(tmp_path / "r.npz")
    with pytest.raises(ValueError, match="no 'tree"):
        make(True).load(tmp_path / "r.npz")


def test_a_sequence_replay_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    ex = Seq(np.zeros(2, np.float32), np.int64(0), np.float32(0), False, False, (np.zeros(4, np.float32),) * 2)
    kw = dict(sequence_length=8, rnn_state_interval=4, discount=0.9, n_step_return=2, prioritized=True, seed=3)
    a, b = SequenceReplayBuffer(ex, 400, B, **kw), SequenceReplayBuffer(ex, 400, B, **kw)
    for _ in range(10):
        n = 12
        a.append(
            Seq(
                rng.normal(size=(n, B, 2)).astype(np.float32),
                rng.integers(0, 3, (n, B)),
                rng.normal(size=(n, B)).astype(np.float32),
                rng.random((n, B)) < 0.05,
                np.zeros((n, B), bool),
                (rng.normal(size=(n, B, 4)).astype(np.float32),) * 2,
            )
        )
    a.save(tmp_path / "s.npz")
    b.load(tmp_path / "s.npz")
    (sa, ia), (sb, ib) = a.sample(16), b.sample(16)
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(sa.observation, sb.observation))
    assert np.array_equal(ia.abs_row, ib.abs_row)


# ---------------------------------------------------------------------------------------------- --save-replay


DQN = [
    "--env-id",
    "CartPole-v1",
    "--num-envs",
    "4",
    "--buffer-size",
    "20000",
    "--min-steps-learn",
    "1000",
    "--log-every",
    "1000",
    "--replay-ratio",
    "4",
    "--eval-episodes",
    "0",
]  # 1 update per 8 env steps


def _updates_at(folder, step: int) -> int:
    return int(next(r["updates"] for r in progress(folder) if int(r["global_step"]) == step))


@pytest.mark.parametrize("sampler", ["serial", pytest.param("async", marks=pytest.mark.slow)])
def test_a_resumed_run_goes_on_with_its_saved_replay(sampler, tmp_path):
    """With --save-replay the resumed learner keeps the uninterrupted schedule: (step - min_steps_learn) x
    updates per step; without it, it refills min_steps_learn first. (The episodes cannot match an uninterrupted
    run's: a resumed run's envs start afresh.)"""
    first = run(
        "dqn_atari.py",
        *DQN,
        "--total-timesteps",
        "3000",
        "--save-replay",
        "--sampler",
        sampler,
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=300,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    for name in ("kept", "refilled"):
        shutil.copytree(tmp_path / "r", tmp_path / name)
    with np.load(tmp_path / "r" / "replay.npz", allow_pickle=False) as f:
        assert int(f["state"][0]) == torch.load(tmp_path / "r" / "checkpoint.pt")["replay_cursor"] == 750
    kept = run(
        "dqn_atari.py",
        *DQN,
        "--total-timesteps",
        "5000",
        "--save-replay",
        "--sampler",
        "serial",
        "--resume",
        str(tmp_path / "kept"),
        timeout=300,
    )
    assert kept.returncode == 0 and "restored the replay: 2996 samples" in kept.stdout, kept.stderr[-2000:]
    # a row counts the updates due before its last vector step (4 envs): they run before that step's envs
    assert _updates_at(tmp_path / "kept", 5000) == (5000 - 4 - 1000) // 8
    refilled = run(
        "dqn_atari.py",
        *DQN,
        "--total-timesteps",
        "5000",
        "--sampler",
        "serial",
        "--no-save-replay",
        "--resume",
        str(tmp_path / "refilled"),
        timeout=300,
    )  # the run recorded --save-replay: off here
    assert refilled.returncode == 0, refilled.stderr[-2000:]
    assert _updates_at(tmp_path / "refilled", 5000) == _updates_at(tmp_path / "r", 3000) + (5000 - 4 - 3000 - 1000) // 8


def test_a_missing_replay_warns_and_starts_empty(tmp_path):
    first = run("dqn_atari.py", *DQN, "--total-timesteps", "2000", "--out-dir", str(tmp_path), "--run-name", "r", timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    out = run("dqn_atari.py", *DQN, "--total-timesteps", "3000", "--save-replay", "--resume", str(tmp_path / "r"), timeout=300)
    assert out.returncode == 0
    assert "warning: --save-replay: no replay saved with the checkpoint" in out.stderr
    assert (tmp_path / "r" / "replay.npz").exists()  # saved from now on
