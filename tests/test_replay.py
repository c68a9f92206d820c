"""Replay buffers against a plain reference that keeps the whole history in Python lists."""

import multiprocessing as mp

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.namedarraytuple import namedarraytuple
from shared.replay import ReplayBuffer, SequenceReplayBuffer

Step = namedarraytuple("Step", ["observation", "action", "reward", "terminated", "truncated", "extra"])
RStep = namedarraytuple("RStep", ["observation", "action", "reward", "terminated", "truncated", "rnn_state"])
HW = (2, 2)


class Stream:
    """A fake vector env under next-step autoreset: after an episode ends, one final-observation row follows
    (reward 0, no flags), then the next episode starts. Frame f_t is unique to (t, b); stacks pad with zeros."""

    def __init__(self, B, C, rng, p_end=0.2, p_timeout=0.5):
        self.B, self.C, self.rng, self.p_end, self.p_timeout = B, C, rng, p_end, p_timeout
        self.rows = [[] for _ in range(B)]  # per env: dicts of everything appended

    def frame(self, t, b):
        f = np.zeros(HW, np.uint8)
        f[0, 0], f[0, 1], f[1, 0] = t % 251 + 1, b + 1, (t // 251) % 251 + 1
        return f

    def chunk(self, Tc):
        obs, act, rew, done, tout = [], [], [], [], []
        for b in range(self.B):
            rows = self.rows[b]
            o_b, a_b, r_b, d_b, to_b = [], [], [], [], []
            for _ in range(Tc):
                t = len(rows)
                final = t > 0 and (rows[-1]["terminated"] or rows[-1]["truncated"])
                start = t == 0 or (t > 0 and rows[-1]["final"])
                ends = not final and self.rng.random() < self.p_end
                is_to = ends and self.rng.random() < self.p_timeout
                d, to = ends and not is_to, is_to
                r = 0.0 if final else float(self.rng.integers(-3, 4))
                # Stack: frames of this episode only, zero before its start.
                ep_first = t if start else rows[-1]["ep_first"]
                stack = np.zeros((self.C,) + HW, np.uint8)
                for c in range(self.C):
                    tt = t - (self.C - 1 - c)
                    if tt >= ep_first:
                        stack[c] = self.frame(tt, b)
                row = dict(
                    obs=stack,
                    action=t * 10 + b,
                    reward=r,
                    terminated=d,
                    truncated=to,
                    final=final,
                    ep_first=ep_first,
                    extra=float(t) + 0.5,
                )
                rows.append(row)
                o_b.append(stack), a_b.append(row["action"]), r_b.append(r), d_b.append(d), to_b.append(to)
            obs.append(o_b), act.append(a_b), rew.append(r_b), done.append(d_b), tout.append(to_b)
        tr = lambda x, dt: np.asarray(x, dtype=dt).swapaxes(0, 1)
        o = np.asarray(obs, np.uint8).swapaxes(0, 1)
        if self.C == 1:
            o = o[:, :, 0]
        extra = tr([[r["extra"] for r in self.rows[b][-Tc:]] for b in range(self.B)], np.float64)
        return Step(o, tr(act, np.int64), tr(rew, np.float32), tr(done, bool), tr(tout, bool), extra)

    def expected(self, t, b, n, gamma):
        rows = self.rows[b]
        ret, k, terminated_n, truncated_n = 0.0, 0, False, False
        for j in range(n):
            r = rows[t + j]
            ret += gamma**j * r["reward"]
            k += 1
            if r["terminated"] or r["truncated"]:
                terminated_n, truncated_n = r["terminated"], r["truncated"] and not r["terminated"]
                break
        obs = lambda i: rows[i]["obs"] if self.C > 1 else rows[i]["obs"][0]
        return dict(
            ret=ret,
            k=k,
            terminated_n=terminated_n,
            truncated_n=truncated_n,
            obs=obs(t),
            next_obs=obs(t + k),
            final=rows[t]["final"],
            action=rows[t]["action"],
            extra=rows[t]["extra"],
        )


def _example(C):
    obs = np.zeros((C,) + HW, np.uint8) if C > 1 else np.zeros(HW, np.uint8)
    return Step(obs, np.int64(0), np.float32(0), np.bool_(False), np.bool_(False), np.float64(0))


def _check_all_valid_rows(buf, stream, n, gamma, C):
    cursor = buf.storage.cursor
    T, B = buf.T, buf.B
    lo_ref = max(cursor - T + (C - 1), 0)
    hi_ref = max(cursor - n, 0)
    lo, hi = buf.valid_window(cursor)
    assert (lo, hi) == (min(lo_ref, hi_ref), hi_ref)
    assert len(buf) == (hi - lo) * B
    st_ = buf.storage
    for t in range(lo, hi):
        for b in range(B):
            e = stream.expected(t, b, n, gamma)
            row = t % T
            assert st_.final_row[row, b] == e["final"]
            if e["final"]:
                continue
            assert st_.n_taken[row, b] == e["k"]
            assert st_.terminated_n[row, b] == e["terminated_n"]
            assert st_.truncated_n[row, b] == e["truncated_n"]
            assert st_.n_step_return[row, b] == pytest.approx(e["ret"], abs=1e-5)
            np.testing.assert_array_equal(st_.observation(np.array([row]), np.array([b]))[0], e["obs"])
            nxt = np.array([(row + e["k"]) % T])
            np.testing.assert_array_equal(st_.observation(nxt, np.array([b]))[0], e["next_obs"])


@settings(max_examples=60, deadline=None)
@given(
    T=st.integers(6, 16),
    B=st.integers(1, 3),
    n=st.integers(1, 4),
    C=st.sampled_from([1, 4]),
    prioritized=st.booleans(),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_nstep_buffer_matches_reference_across_wraparound(T, B, n, C, prioritized, seed, data):
    if T <= n + C:
        T = n + C + 1
    gamma = 0.9
    rng = np.random.default_rng(seed)
    stream = Stream(B, C, rng)
    buf = ReplayBuffer(
        _example(C), T * B, B, discount=gamma, n_step_return=n, frame_stack=C, prioritized=prioritized, seed=seed
    )
    for _ in range(data.draw(st.integers(1, 8))):
        Tc = data.draw(st.integers(1, T))
        buf.append(stream.chunk(Tc))
        _check_all_valid_rows(buf, stream, n, gamma, C)
        if len(buf) > 0 and not buf.storage.final_row.all():
            try:
                batch, idx = buf.sample(min(8, len(buf)))
            except ValueError as e:  # only when (almost) every valid row is a final-observation row
                assert "final observation" in str(e)
                continue
            lo, hi = buf.valid_window(buf.storage.cursor)
            assert np.all((idx.abs_row >= lo) & (idx.abs_row < hi))
            for i, (t, b) in enumerate(zip(idx.abs_row, idx.b)):
                e = stream.expected(int(t), int(b), n, gamma)
                assert not e["final"]
                assert batch.action[i] == e["action"] and batch.extra[i] == e["extra"]
                np.testing.assert_array_equal(batch.observation[i], e["obs"])
                np.testing.assert_array_equal(batch.next_observation[i], e["next_obs"])
                assert batch.n_step_return[i] == pytest.approx(e["ret"], abs=1e-5)
                assert batch.bootstrap_discount[i] == pytest.approx(gamma ** e["k"])
                assert batch.terminated_n[i] == e["terminated_n"] and batch.truncated_n[i] == e["truncated_n"]


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(9, 20),
    B=st.integers(1, 3),
    n=st.integers(1, 4),
    prioritized=st.booleans(),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_transition_unique_frames_stack_into_both_observations_and_carry_each_frame_once(T, B, n, prioritized, seed, data):
    """A transition buffer with unique_frames samples what the stacking one samples (same seed, same appends):
    ``stacked(batch)`` gives its observation and next_observation (zeroed frames before episode starts included), each
    frame travels once a sample, C + n of them where the two stacks hold 2 C, one shape for the batch size."""
    from shared.replay import stacked

    C = 4
    stream = Stream(B, C, np.random.default_rng(seed))
    kw = dict(discount=0.9, n_step_return=n, frame_stack=C, prioritized=prioritized, seed=seed)
    plain = ReplayBuffer(_example(C), T * B, B, **kw)
    unique = ReplayBuffer(_example(C), T * B, B, unique_frames=True, **kw)
    for _ in range(data.draw(st.integers(1, 6))):
        chunk = stream.chunk(data.draw(st.integers(1, T)))
        plain.append(chunk)
        unique.append(chunk)
        if len(plain) == 0 or plain.storage.final_row.all():
            continue
        N = min(8, len(plain))
        try:
            (a, ia), (b, ib) = plain.sample(N), unique.sample(N)
        except ValueError as e:  # only when (almost) every valid row is a final-observation row
            assert "final observation" in str(e)
            continue
        np.testing.assert_array_equal(ia.abs_row, ib.abs_row)
        assert "observation" not in b and "next_observation" not in b
        both = stacked(b)
        np.testing.assert_array_equal(both["observation"], a.observation)
        np.testing.assert_array_equal(both["next_observation"], a.next_observation)
        np.testing.assert_array_equal(b.action, a.action)
        assert len(b.frames) == 1 + N * (C + n)  # each frame once a sample: C + n, not 2 C
        assert not b.frames[0].any()


@pytest.mark.unit
def test_a_unique_frames_batch_keeps_a_new_field_named_like_observation_and_refuses_an_unknown_field():
    """A stored field whose name contains "observation" stays in a unique-frames batch (only the two stacks give way
    to the frames), and asking for a field the batch does not have (its ``observation``) is an error, not nothing."""
    from shared.namedarraytuple import namedarraytuple

    Row = namedarraytuple("Row", ["observation", "action", "reward", "terminated", "observation_count"])
    ex = Row(np.zeros((4, 3, 3), np.uint8), np.int64(0), np.float32(0), False, np.int64(0))
    buf = ReplayBuffer(ex, 40, 1, frame_stack=4, unique_frames=True, seed=0)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 9, (10, 1, 4, 3, 3), dtype=np.uint8)
    ones = np.ones((10, 1), np.int64)
    buf.append(Row(frames, ones, ones.astype(np.float32), np.zeros((10, 1), bool), np.arange(10)[:, None]))
    batch, _ = buf.sample(4)
    assert "observation_count" in batch._fields and "observation" not in batch._fields
    with pytest.raises(ValueError, match="no field 'observation'"):
        buf.sample(4, fields=("observation", "action"))


def test_timeout_flag_survives_the_wraparound():
    # T=5 rows, n=3: the window of abs row 8 (storage row 3) runs through rows 4, 0 (wrapped); the timeout
    # sits on the wrapped row. rlpyt's time-limit buffer dropped exactly this flag.
    buf = ReplayBuffer(
        Step(np.zeros(1, np.float32), np.int64(0), np.float32(0), False, False, np.float64(0)),
        size=5,
        B=1,
        discount=0.5,
        n_step_return=3,
    )
    timeouts = np.zeros(11, bool)
    timeouts[10] = True
    for t in range(11):
        buf.append(
            Step(
                np.full((1, 1, 1), t, np.float32),
                np.zeros((1, 1), np.int64),
                np.ones((1, 1), np.float32),
                np.zeros((1, 1), bool),
                timeouts[t : t + 1, None],
                np.zeros((1, 1)),
            )
        )
    row = 8 % 5
    assert buf.storage.truncated_n[row, 0] and not buf.storage.terminated_n[row, 0]
    assert buf.storage.n_taken[row, 0] == 3
    assert buf.storage.n_step_return[row, 0] == pytest.approx(1 + 0.5 + 0.25)


def test_prioritized_weights_updates_and_new_sample_priority():
    buf = ReplayBuffer(_example(1), 40, 2, n_step_return=1, prioritized=True, alpha=0.5, beta=0.4, seed=0)
    stream = Stream(2, 1, np.random.default_rng(0), p_end=0.0)
    buf.append(stream.chunk(10))
    batch, idx = buf.sample(6)
    np.testing.assert_allclose(batch.is_weights, 1.0)  # equal default priorities
    new = np.array([4.0, 1.0, 0.25, 1.0, 1.0, 1.0])
    buf.update_priorities(idx, new)
    leaves = buf.tree.leaves[idx.abs_row % buf.T, idx.b]
    # The last write to each sampled leaf wins.
    last = {}
    for (t, b), p in zip(zip(idx.abs_row, idx.b), new):
        last[(t, b)] = p
    np.testing.assert_allclose(leaves, [(last[(t, b)] + 1e-6) ** 0.5 for t, b in zip(idx.abs_row, idx.b)])
    batch, idx = buf.sample(len(buf), beta=1.0)
    p = buf.tree.leaves[idx.abs_row % buf.T, idx.b]
    np.testing.assert_allclose(batch.is_weights, (p / p.min()) ** -1.0, rtol=1e-6)
    assert batch.is_weights.max() == pytest.approx(1.0)
    # New samples get the largest priority seen so far (applied when their n-step window completes).
    buf.append(stream.chunk(1))
    t_new = buf.storage.cursor - 1
    buf.append(stream.chunk(1))
    assert buf.valid_window(buf.storage.cursor)[1] - 1 == t_new
    assert buf.tree.leaves[t_new % buf.T, 0] == pytest.approx((4.0 + 1e-6) ** 0.5)


def test_a_batch_drawn_ahead_is_the_next_one_sampled_and_without_prefetch_nothing_changes(tmp_path):
    """sample_ahead draws at once (before priorities written after it) and the next sample of that size returns
    that batch; without prefetch the draws are exactly those of a buffer never asked to draw ahead."""
    import pickle

    from shared.replay import prefetch_on

    def filled(prefetch):
        buf = ReplayBuffer(_example(1), 40, 2, prioritized=True, alpha=1.0, seed=3, prefetch=prefetch)
        buf.append(Stream(2, 1, np.random.default_rng(3), p_end=0.0).chunk(15))
        return buf

    plain, off = filled(False), filled(False)
    for i in range(3):
        off.sample_ahead(6)
        for buf in (plain, off):  # priorities written in between: seen by the next draw
            _, every = buf.sample(len(buf))
            buf.update_priorities(every, np.where(every.abs_row == every.abs_row[i], 1.0, 1e-9))
        (a, ia), (b, ib) = plain.sample(6), off.sample(6)
        np.testing.assert_array_equal(ia.abs_row, ib.abs_row)
        np.testing.assert_array_equal(a.observation, b.observation)
        assert (ib.abs_row == every.abs_row[i]).all()

    on = filled(True)
    _, everything = on.sample(len(on))
    on.sample_ahead(6, beta=1.0)
    on.update_priorities(everything, np.where(everything.abs_row == everything.abs_row[0], 1.0, 1e-9))
    batch, idx = on.sample(6)  # drawn before the priorities above: not all the one favoured row
    assert (idx.abs_row != everything.abs_row[0]).any()
    assert on.sample(6)[1].abs_row.tolist() == [everything.abs_row[0]] * 6  # fresh draws see the new priorities
    on.sample_ahead(6)
    on.sample(3)  # another size: a fresh draw, and the batch drawn ahead is dropped
    assert on._ahead is None
    on.sample_ahead(6)
    assert pickle.loads(pickle.dumps(on))._ahead is None  # a sampler process gets no learner's batch
    on.save(tmp_path / "r.npz")
    on.load(tmp_path / "r.npz")
    assert on._ahead is None  # drawn from the state that was replaced

    assert prefetch_on("cuda:1", "async") and not prefetch_on("cuda", "serial")
    assert not prefetch_on("cuda", "parallel") and not prefetch_on("cpu", "async")


def test_final_observation_rows_are_never_sampled():
    buf = ReplayBuffer(_example(1), 60, 3, prioritized=False, seed=1)
    stream = Stream(3, 1, np.random.default_rng(1), p_end=0.45)
    buf.append(stream.chunk(15))
    pbuf = ReplayBuffer(_example(1), 60, 3, prioritized=True, seed=1)
    pbuf.append(Stream(3, 1, np.random.default_rng(1), p_end=0.45).chunk(15))
    for b in (buf, pbuf):
        n_final = b.storage.final_row[:14].sum()
        assert n_final >= 5  # the test means something only if there are many to avoid
        for _ in range(50):
            _, idx = b.sample(len(b))
            assert not b.storage.final_row[idx.abs_row % b.T, idx.b].any()


def test_bad_input_names_the_argument():
    ex = _example(1)
    with pytest.raises(ValueError, match="alpha"):
        ReplayBuffer(ex, 100, 2, prioritized=True, alpha=1.5)
    with pytest.raises(ValueError, match="beta"):
        ReplayBuffer(ex, 100, 2, beta=-0.1)
    with pytest.raises(ValueError, match="size"):
        ReplayBuffer(ex, 1, 2)
    with pytest.raises(ValueError, match="n_step_return"):
        ReplayBuffer(ex, 100, 2, n_step_return=0)
    with pytest.raises(ValueError, match="frame_stack"):
        ReplayBuffer(ex, 100, 2, frame_stack=4)
    buf = ReplayBuffer(ex, 100, 2)
    good = Stream(2, 1, np.random.default_rng(0)).chunk(3)
    with pytest.raises(ValueError, match=r"samples\.observation.*shape"):
        buf.append(good._replace(observation=np.zeros((3, 2, 5), np.uint8)))
    with pytest.raises(ValueError, match=r"samples\.reward.*shape"):
        buf.append(good._replace(reward=np.zeros((3, 3), np.float32)))
    with pytest.raises(ValueError, match=r"samples\.observation.*dtype"):
        buf.append(good._replace(observation=good.observation.astype(np.float32)))
    with pytest.raises(ValueError, match="samples must be"):
        buf.append(tuple(good))
    buf.append(good)
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(len(buf) + 1)
    with pytest.raises(ValueError, match="beta"):
        buf.sample(1, beta=2.0)
    with pytest.raises(ValueError, match="prioritized"):
        buf.update_priorities(buf.sample(1)[1], [1.0])


# ---------------------------------------------------------------- sequences


def _rnn_example(C):
    obs = np.zeros((C,) + HW, np.uint8) if C > 1 else np.zeros(HW, np.uint8)
    return RStep(obs, np.int64(0), np.float32(0), np.bool_(False), np.bool_(False), np.zeros(3, np.float32))


def _with_rnn(chunk, stream):
    Tc = chunk.action.shape[0]
    # The state before row t encodes t: checks that the right one is kept and returned.
    t = np.array([[len(stream.rows[b]) - Tc + i for b in range(stream.B)] for i in range(Tc)], np.float32)
    return RStep(
        chunk.observation, chunk.action, chunk.reward, chunk.terminated, chunk.truncated, np.repeat(t[..., None], 3, axis=-1)
    )


@settings(max_examples=40, deadline=None)
@given(
    I=st.integers(1, 4),
    L=st.integers(1, 6),
    n=st.integers(1, 3),
    C=st.sampled_from([1, 3]),
    B=st.integers(1, 3),
    prioritized=st.booleans(),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_sequences_start_at_stored_states_never_cross_the_cursor_and_match_reference(I, L, n, C, B, prioritized, seed, data):
    gamma = 0.95
    T = ((L + n + C + I) // I + data.draw(st.integers(1, 3))) * I
    rng = np.random.default_rng(seed)
    stream = Stream(B, C, rng)
    buf = SequenceReplayBuffer(
        _rnn_example(C),
        T * B,
        B,
        sequence_length=L,
        rnn_state_interval=I,
        discount=gamma,
        n_step_return=n,
        frame_stack=C,
        prioritized=prioritized,
        seed=seed,
    )
    assert buf.T == T
    for _ in range(data.draw(st.integers(1, 8))):
        buf.append(_with_rnn(stream.chunk(data.draw(st.integers(1, T))), stream))
        cursor = buf.storage.cursor
        if len(buf) == 0:
            continue
        batch, idx = buf.sample(min(6, len(buf)))
        assert batch.observation.shape[:2] == (L + n, len(idx.b))
        for i, (slot, b) in enumerate(zip(idx.abs_row, idx.b)):
            start = int(slot) * I
            assert start - (C - 1) >= cursor - T  # history not overwritten
            assert start + L + n <= cursor  # the whole window, bootstrap rows included, is written
            np.testing.assert_array_equal(batch.init_rnn_state[i], np.full(3, start, np.float32))
            for j in range(L + n):
                r = stream.rows[int(b)][start + j]
                np.testing.assert_array_equal(batch.observation[j, i], r["obs"] if C > 1 else r["obs"][0])
                assert batch.action[j, i] == r["action"]
                assert batch.final_row[j, i] == r["final"]
                assert batch.episode_start[j, i] == (start + j == r["ep_first"])
            for j in range(L):
                if batch.final_row[j, i]:
                    continue
                e = stream.expected(start + j, int(b), n, gamma)
                assert batch.n_taken[j, i] == e["k"] and batch.terminated_n[j, i] == e["terminated_n"]
                assert batch.n_step_return[j, i] == pytest.approx(e["ret"], abs=1e-5)


@settings(max_examples=25, deadline=None)
@given(
    I=st.integers(1, 4),
    L=st.integers(1, 6),
    n=st.integers(1, 3),
    B=st.integers(1, 3),
    prioritized=st.booleans(),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_unique_frames_stack_into_the_observations_and_carry_each_frame_once(I, L, n, B, prioritized, seed, data):
    """A buffer with unique_frames samples what the stacking one samples (same seed, same appends), frames[index]
    is its observation (zeroed frames before episode starts included), and no frame travels twice for a sequence."""
    C = 3
    T = ((L + n + C + I) // I + data.draw(st.integers(1, 3))) * I
    stream = Stream(B, C, np.random.default_rng(seed))
    kw = dict(
        sequence_length=L,
        rnn_state_interval=I,
        discount=0.95,
        n_step_return=n,
        frame_stack=C,
        prioritized=prioritized,
        seed=seed,
    )
    stacked = SequenceReplayBuffer(_rnn_example(C), T * B, B, **kw)
    unique = SequenceReplayBuffer(_rnn_example(C), T * B, B, unique_frames=True, **kw)
    for _ in range(data.draw(st.integers(1, 6))):
        chunk = _with_rnn(stream.chunk(data.draw(st.integers(1, T))), stream)
        stacked.append(chunk)
        unique.append(chunk)
        if len(stacked) == 0:
            continue
        (a, ia), (b, ib) = stacked.sample(min(6, len(stacked))), unique.sample(min(6, len(unique)))
        np.testing.assert_array_equal(ia.abs_row, ib.abs_row)
        assert "observation" not in b and b.frame_index.shape == (L + n, len(ib.b), C)
        np.testing.assert_array_equal(b.frames[b.frame_index], a.observation)
        assert not b.frames[0].any()  # frame 0 stands for the frames before an episode's start
        used = np.unique(b.frame_index)
        assert len(b.frames) == 1 + len(ib.b) * (L + n + C - 1)  # each frame once a sequence, not L + n times C
        assert set(used) <= set(range(len(b.frames)))
        np.testing.assert_array_equal(b.action, a.action)


def test_sequence_input_priorities_land_shifted_back():
    stream = Stream(1, 1, np.random.default_rng(0), p_end=0.0)
    buf = SequenceReplayBuffer(
        _rnn_example(1),
        64,
        1,
        sequence_length=8,
        rnn_state_interval=4,
        n_step_return=1,
        prioritized=True,
        alpha=1.0,
        priority_eps=0.0,
        input_priority_shift=2,
        seed=0,
    )
    for k in range(6):  # chunks of 4 rows: one stored state each
        buf.append(_with_rnn(stream.chunk(4), stream), priorities=np.array([[10.0 + k]]))
    # Chunk k (slot k) brought the priority of slot k - 2, which by then has enough rows to be computed.
    lo, hi = buf.tree.window
    for slot in range(lo, hi):
        assert buf.tree.leaves[slot % buf.n_slots, 0] == pytest.approx(10.0 + slot + 2)


def test_sequence_buffer_bad_input():
    with pytest.raises(ValueError, match="rnn_state"):
        SequenceReplayBuffer(_example(1), 100, 1, sequence_length=4, rnn_state_interval=2)
    with pytest.raises(ValueError, match="rnn_state_interval"):
        SequenceReplayBuffer(_rnn_example(1), 100, 1, sequence_length=4, rnn_state_interval=0)
    with pytest.raises(ValueError, match="too few"):
        SequenceReplayBuffer(_rnn_example(1), 8, 1, sequence_length=8, rnn_state_interval=2)
    buf = SequenceReplayBuffer(_rnn_example(1), 100, 1, sequence_length=4, rnn_state_interval=2, prioritized=True)
    stream = Stream(1, 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="priorities"):
        buf.append(_with_rnn(stream.chunk(4), stream), priorities=np.ones((3, 1)))


# ---------------------------------------------------------------- shared memory across processes

Plain = namedarraytuple("Plain", ["observation", "action", "reward", "terminated", "truncated"])


def _appender(buf, n_chunks, Tc):
    B = buf.B
    for k in range(n_chunks):
        t = k * Tc + np.arange(Tc, dtype=np.float32)[:, None]  # observation encodes the abs row
        obs = np.repeat(np.repeat(t, B, axis=1)[..., None], 64, axis=-1)
        buf.append(
            Plain(
                obs,
                np.zeros((Tc, B), np.int64),
                np.ones((Tc, B), np.float32),
                np.zeros((Tc, B), bool),
                np.zeros((Tc, B), bool),
            )
        )


@pytest.mark.parametrize("prioritized", [False, True])
def test_sampler_process_appends_while_learner_samples_consistent_batches(prioritized):
    n = 3
    ex = Plain(np.zeros(64, np.float32), np.int64(0), np.float32(0), np.bool_(False), np.bool_(False))
    buf = ReplayBuffer(ex, 64 * 4, 4, discount=1.0, n_step_return=n, prioritized=prioritized, shared=True, seed=0)
    ctx = mp.get_context("spawn")
    n_chunks, Tc = 400, 8
    p = ctx.Process(target=_appender, args=(buf, n_chunks, Tc))
    p.start()
    checked = 0
    try:
        while p.is_alive() or checked == 0:
            if len(buf) < 16:
                continue
            batch, idx = buf.sample(16)
            # Every field of a sampled transition belongs to the same abs row: no torn reads.
            np.testing.assert_array_equal(batch.observation[:, 0], idx.abs_row.astype(np.float32))
            assert (batch.observation == batch.observation[:, :1]).all()
            np.testing.assert_array_equal(batch.next_observation[:, 0], idx.abs_row + n)
            np.testing.assert_array_equal(batch.n_step_return, n)
            if prioritized:
                buf.update_priorities(idx, np.random.default_rng(checked).random(16))
            checked += 1
    finally:
        p.join(timeout=60)
    assert p.exitcode == 0
    assert buf.storage.cursor == n_chunks * Tc  # the parent sees every append made by the child
    assert checked > 0


LStep = namedarraytuple("LStep", ["observation", "action", "reward", "terminated", "truncated", "episode_end"])


def test_life_loss_is_terminal_for_returns_but_no_row_is_skipped():
    # terminated=True at row 2 (a lost life) without an env reset: the window of row 1 stops there, row 3 is an ordinary
    # transition (not a final-observation row) and its frame history is not cut.
    ex = LStep(np.zeros((2, 1), np.float32), np.int64(0), np.float32(0), False, False, False)
    buf = ReplayBuffer(ex, 20, 1, discount=0.5, n_step_return=3, frame_stack=2)
    done = np.zeros(10, bool)
    done[2] = True
    for t in range(10):
        obs = np.array([[[[t - 1.0], [float(t)]]]], np.float32) if t else np.array([[[[0.0], [0.0]]]], np.float32)
        buf.append(
            LStep(
                obs,
                np.zeros((1, 1), np.int64),
                np.ones((1, 1), np.float32),
                done[t : t + 1, None],
                np.zeros((1, 1), bool),
                np.zeros((1, 1), bool),
            )
        )
    st_ = buf.storage
    assert st_.terminated_n[1, 0] and st_.n_taken[1, 0] == 2 and st_.n_step_return[1, 0] == pytest.approx(1.5)
    assert not st_.final_row[3, 0] and not st_.episode_start[3, 0]
    np.testing.assert_array_equal(st_.observation(np.array([3]), np.array([0]))[0, :, 0], [2.0, 3.0])


@pytest.mark.parametrize("structure", ["tuple", "dict", "nested"])
def test_sequence_buffer_takes_rnn_state_as_tuples_and_dicts(structure):
    I, B, Tc = 2, 2, 2

    def state(fill, lead):
        h = np.full(lead + (3,), fill, np.float32)
        c = np.full(lead + (2,), -fill, np.float32)
        return {"tuple": (h, c), "dict": {"h": h, "c": c}, "nested": {"lstm": (h, c)}}[structure]

    example = RStep(np.zeros(2, np.float32), np.int64(0), np.float32(0), False, False, state(0.0, ()))
    buf = SequenceReplayBuffer(example, 80, B, sequence_length=2, rnn_state_interval=I, seed=0)
    for k in range(10):
        chunk = RStep(
            np.zeros((Tc, B, 2), np.float32),
            np.zeros((Tc, B), np.int64),
            np.ones((Tc, B), np.float32),
            np.zeros((Tc, B), bool),
            np.zeros((Tc, B), bool),
            state(float(k), (Tc, B)),
        )
        buf.append(chunk)
    batch, idx = buf.sample(4)
    init = batch.init_rnn_state
    if structure == "tuple":
        h, c = init
    elif structure == "dict":
        h, c = init["h"], init["c"]
    else:
        h, c = init["lstm"]
    np.testing.assert_array_equal(h[:, 0], idx.abs_row.astype(np.float32))  # chunk k's state sits in slot k
    np.testing.assert_array_equal(c[:, 0], -idx.abs_row.astype(np.float32))
    wrong = RStep(
        chunk.observation, chunk.action, chunk.reward, chunk.terminated, chunk.truncated, np.zeros((Tc, B, 3), np.float32)
    )
    with pytest.raises(ValueError, match="rnn_state"):
        buf.append(wrong)


@pytest.mark.parametrize("cls", [ReplayBuffer, SequenceReplayBuffer])
def test_a_replay_the_machine_cannot_hold_is_refused_before_any_of_it_is_allocated(cls, monkeypatch):
    """Shared memory is never refused when it is made (its pages are taken as rows arrive, and the kernel's
    out-of-memory killer ends the run then): the replay checks every array before making it, then the sum."""
    from shared import buffer

    made = []
    real = buffer.shared_zeros
    monkeypatch.setattr(buffer, "shared_zeros", lambda shape, dtype: made.append(shape) or real(shape, dtype))
    monkeypatch.setattr(buffer, "available_memory", lambda: 2**30)
    frames = RStep(np.zeros((4, 84, 84), np.uint8), np.int64(0), np.float32(0), False, False, np.zeros(2, np.float32))
    kw = dict(sequence_length=4, rnn_state_interval=4) if cls is SequenceReplayBuffer else {}
    ex = frames if cls is SequenceReplayBuffer else Step(*tuple(frames)[:5], np.float32(0))
    with pytest.raises(buffer.NotEnoughMemory) as e:  # 1.05 GiB of frames alone: refused as the first array
        cls(ex, 160_000, 4, frame_stack=4, shared=True, **kw)
    assert e.value.needed == 160_000 * 84 * 84 and (40_000, 4, 84, 84) not in made  # the frames never made
    vec = ex._replace(observation=np.zeros(16, np.float32))  # 64 bytes a row: each array fits, all of them do not
    with pytest.raises(buffer.NotEnoughMemory, match=r"^the replay needs 1\.[1-9] GiB, and 1\.0 GiB"):
        cls(vec, 13_000_000, 4, shared=True, **kw)
    cls(vec, 1_000_000, 4, shared=True, **kw)  # one that fits is made


@pytest.mark.unit
@pytest.mark.parametrize("prefetch", [False, True])
def test_a_sample_skipping_fields_draws_the_same_batch_without_them(prefetch):
    """``skip`` (the replay scripts' host-only fields): the same draws as a full sample, those fields left out."""
    full, part = (ReplayBuffer(_example(1), 60, 3, seed=4, prefetch=prefetch) for _ in range(2))
    for buf in (full, part):
        buf.append(Stream(3, 1, np.random.default_rng(2), p_end=0.2).chunk(15))
    skip = ("reward", "truncated", "final_row", "n_taken")
    for _ in range(3):
        (a, ia), (b, ib) = full.sample(8), part.sample(8, skip=skip)
        part.sample_ahead(8, skip=skip)
        assert np.array_equal(ia.abs_row, ib.abs_row) and np.array_equal(ia.b, ib.b)
        for name, x in a.items():
            if name in skip and name != "n_taken":  # n_taken is always taken: the bootstrap needs it
                assert getattr(b, name) is None
            else:
                assert np.array_equal(x, getattr(b, name)), name


def test_a_sample_shaped_otherwise_than_the_example_is_refused_naming_the_field():
    """ReplayBuffer.append checks a chunk by walking the example and the sample together
    (shared.namedarraytuple.walk_structure): a nested field's path names what is wrong."""
    XStep = namedarraytuple("XStep", ["observation", "action", "reward", "terminated", "extra"])
    extra = {"goal": np.zeros(2, np.float32), "pair": (np.float32(0), np.int64(0))}
    buf = ReplayBuffer(XStep(np.zeros(3, np.float32), np.int64(0), np.float32(0), np.bool_(False), extra), 8, 2)
    rows = {"goal": np.zeros((1, 2, 2), np.float32), "pair": (np.zeros((1, 2), np.float32), np.zeros((1, 2), np.int64))}
    good = XStep(
        np.zeros((1, 2, 3), np.float32), np.zeros((1, 2), np.int64), np.zeros((1, 2), np.float32), np.zeros((1, 2), bool), rows
    )
    assert buf.storage.check(good) == 1
    with pytest.raises(ValueError, match=r"^extra: expected the structure of the example \(dict\), got dict"):
        buf.storage.check(good._replace(extra={"goal": rows["goal"]}))
    with pytest.raises(ValueError, match=r"^extra\.pair: expected the structure of the example \(tuple\), got tuple"):
        buf.storage.check(good._replace(extra={**rows, "pair": rows["pair"][:1]}))
    with pytest.raises(ValueError, match=r"^samples\.extra\.pair\.1 must have shape \[T, 2, \*\(\)\]"):
        buf.storage.check(good._replace(extra={**rows, "pair": (rows["pair"][0], np.zeros((1, 2, 5), np.int64))}))
