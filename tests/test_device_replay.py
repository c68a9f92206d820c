"""shared.device_replay: the replay's mirror on the learner's device gives the host path's batch at the rows it draws,
draws only what the host replay would sample, uniformly, and follows the buffer through wrap-around, n-step windows,
appends between syncs of more rows than it holds, a saved and loaded buffer and a shared one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import device_replay
from shared.device_replay import DeviceReplay
from shared.namedarraytuple import namedarraytuple
from shared.normalize import ObsNorm, upload_batch
from shared.replay import ReplayBuffer

pytestmark = pytest.mark.unit

Step = namedarraytuple("Step", ["observation", "action", "reward", "terminated", "truncated", "bonus"])
HOST_ONLY = ("reward", "terminated", "truncated", "truncated_n", "n_taken", "final_row", "episode_start", "is_weights")
OBS, ACT = 3, 2
CPU = torch.device("cpu")


def make(size: int, B: int, n: int, shared: bool = False, **kw) -> ReplayBuffer:
    example = Step(np.zeros(OBS, np.float32), np.zeros(ACT, np.float32), np.float32(0), False, False, np.float32(0))
    return ReplayBuffer(example, size, B, discount=0.9, n_step_return=n, shared=shared, seed=0, **kw)


def ends_after(rng: np.random.Generator, T: int, B: int, end: float, after: np.ndarray | None) -> np.ndarray:
    """Episode ends [T, B] as an env's rows have them: never in the row after an end (``after``: the ends of the row
    before the first), which only resets the env (gymnasium's next-step autoreset)."""
    ends = rng.random((T, B)) < end
    prev = np.zeros(B, bool) if after is None else np.asarray(after, bool)
    for t in range(T):
        ends[t] &= ~prev
        prev = ends[t]
    return ends


def rows(rng: np.random.Generator, T: int, B: int, end: float, start: int, after: np.ndarray | None = None) -> Step:
    """``T`` rows of ``B`` envs: values that say where they come from, episodes ending (terminated or truncated)."""
    t = start + np.arange(T)[:, None, None] + np.zeros((1, B, 1))
    ends = ends_after(rng, T, B, end, after)
    term = ends & (rng.random((T, B)) < 0.5)
    return Step(
        observation=(t + np.arange(B)[None, :, None] / 10 + np.arange(OBS) / 100).astype(np.float32),
        action=rng.uniform(-1, 1, (T, B, ACT)).astype(np.float32),
        reward=rng.normal(size=(T, B)).astype(np.float32),
        terminated=term,
        truncated=ends & ~term,
        bonus=rng.normal(size=(T, B)).astype(np.float32),
    )


def host_batch(buffer: ReplayBuffer, flat: np.ndarray, obs_norm: ObsNorm) -> dict:
    """What the host path uploads for the transitions at storage ``flat = row * B + env``: the buffer's own gather,
    ``upload_batch`` of every field but HOST_ONLY."""
    s, B = buffer.storage, buffer.B
    r, b = flat // B, flat % B
    batch = s.gather(r, b)
    batch["next_observation"] = s.observation((r + batch["n_taken"]) % buffer.T, b)
    batch["bootstrap_discount"] = s.discounts[batch["n_taken"]]
    return upload_batch({k: v for k, v in batch.items() if k not in HOST_ONLY}, obs_norm, CPU)


def check_sample(buffer: ReplayBuffer, mirror: DeviceReplay, obs_norm: ObsNorm, n: int = 64) -> np.ndarray:
    """A sample of the mirror: its rows are ones the host would sample, its values the host path's at those rows."""
    out = mirror.sample(n)
    flat = mirror.last_index.numpy()
    lo, hi = buffer.valid_window(buffer.cursor)
    r, b = flat // buffer.B, flat % buffer.B
    abs_row = lo + (r - lo) % buffer.T  # each storage row's absolute row inside the window
    assert ((abs_row >= lo) & (abs_row < hi)).all()
    assert not buffer.storage.final_row[r, b].any()
    want = host_batch(buffer, flat, obs_norm)
    assert set(out) == set(want)
    for k in want:
        assert out[k].dtype == torch.float32 and torch.equal(out[k], want[k]), k
    return flat


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    B=st.integers(1, 3),
    T=st.integers(6, 12),
    n=st.integers(1, 3),
    chunks=st.lists(st.tuples(st.integers(1, 30), st.booleans()), min_size=2, max_size=8),
    end=st.sampled_from([0.05, 0.3]),
    norm=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_mirror_samples_the_host_paths_batch_at_rows_the_host_would_draw(B, T, n, chunks, end, norm, seed):
    """Any chunking of appends between syncs (more rows than the buffer holds among them), wrap-around, n-step windows
    across episode ends and truncations, observation statistics: the mirror's batch equals the host path's at the
    rows it drew, and those are in the valid window and never a final-observation row."""
    rng = np.random.default_rng(seed)
    buffer = make(T * B, B, n)
    obs_norm = ObsNorm(OBS, enabled=norm)
    mirror = DeviceReplay(buffer, HOST_ONLY, CPU, obs_norm)
    torch.manual_seed(seed)
    at = 0
    for size, sync in chunks + [(1, True)]:
        chunk = rows(rng, min(size, T), B, end, at, after=buffer.storage.last_flags[0])
        buffer.append(chunk)
        obs_norm.update(chunk.observation.reshape(-1, OBS))
        at += len(chunk.observation)
        lo, hi = buffer.valid_window(buffer.cursor)
        if sync:
            mirror.sync(0)
            if hi > lo and not buffer.storage.final_row[np.arange(lo, hi) % T].all():  # something to sample
                check_sample(buffer, mirror, obs_norm)
    assert int(mirror.misses) == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("norm", [False, True])
def test_on_a_gpu_the_mirror_written_from_pinned_staging_gives_the_host_paths_batch(norm, monkeypatch):
    """On CUDA a sync's fields go from pinned staging buffers straight into the mirror, in copies that do not block,
    the two buffers taking turns behind events (``shared.device.upload_each``): after syncs of one row, and of more
    rows than the buffer holds, the batch at the drawn rows is the host path's, bit for bit. The stream is held
    busy before each sync, whose runs of 3 rows take more than two staging buffers: a buffer refilled before its copy
    has run would put another run's rows in the mirror."""
    monkeypatch.setattr(device_replay, "CHUNK", 3)
    cuda = torch.device("cuda")
    rng = np.random.default_rng(9)
    B, T = 2, 40
    buffer = make(T * B, B, 3)
    obs_norm = ObsNorm(OBS, enabled=norm)
    mirror = DeviceReplay(buffer, HOST_ONLY, cuda, obs_norm)
    at = 0
    for size in [1] * 30 + [55] + [1] * 20 + [7] * 10:  # a sync after each append: the staging buffers turn each time
        chunk = rows(rng, min(size, T), B, 0.1, at, after=buffer.storage.last_flags[0])
        buffer.append(chunk)
        obs_norm.update(chunk.observation.reshape(-1, OBS))
        at += len(chunk.observation)
        torch.cuda._sleep(10**7)  # the copies queue behind it: the host runs ahead of them
        mirror.sync(0)
    out = mirror.sample(512)
    flat = mirror.last_index.cpu().numpy()
    want = host_batch(buffer, flat, obs_norm)
    assert set(out) == set(want)
    for k in want:
        assert torch.equal(out[k].cpu(), want[k]), k
    assert int(mirror.misses) == 0


def test_each_valid_transition_is_drawn_equally_often_and_a_final_row_never():
    """Uniform over the valid transitions: a window with final rows, 100k draws, every count within 5 standard
    deviations of its expectation; the final rows never."""
    rng = np.random.default_rng(1)
    buffer = make(80, 2, 2)
    buffer.append(rows(rng, 30, 2, 0.2, 0))
    mirror = DeviceReplay(buffer, HOST_ONLY, CPU, ObsNorm(OBS, enabled=False))
    mirror.sync(0)
    torch.manual_seed(0)
    counts = np.zeros(buffer.T * buffer.B, np.int64)
    for _ in range(25):
        mirror.sample(4000)
        counts += np.bincount(mirror.last_index.numpy(), minlength=len(counts))
    lo, hi = buffer.valid_window(buffer.cursor)
    flat = (np.arange(lo, hi)[:, None] * buffer.B + np.arange(buffer.B)).reshape(-1)
    final = buffer.storage.final_row.reshape(-1)[flat]
    assert final.any() and counts[flat[final]].sum() == 0
    valid = flat[~final]
    expected = counts.sum() / len(valid)
    assert counts.sum() == counts[valid].sum() == 100_000
    assert np.abs(counts[valid] - expected).max() < 5 * np.sqrt(expected)


def test_a_draw_with_no_valid_candidate_is_counted(monkeypatch):
    """With one candidate a draw, the draws that land on a final row are exactly the ``misses`` counted (the check
    would otherwise never see one: 32 candidates make it a 1e-32 event)."""
    monkeypatch.setattr(device_replay, "CANDIDATES", 1)
    rng = np.random.default_rng(2)
    buffer = make(80, 2, 1)
    buffer.append(rows(rng, 30, 2, 0.3, 0))
    mirror = DeviceReplay(buffer, HOST_ONLY, CPU, ObsNorm(OBS, enabled=False))
    mirror.sync(0)
    landed = 0
    for _ in range(20):
        mirror.sample(256)
        flat = mirror.last_index.numpy()
        landed += int(buffer.storage.final_row.reshape(-1)[flat].sum())
    assert landed > 0 and int(mirror.misses) == landed


def test_a_loaded_and_a_shared_buffer_are_mirrored_as_they_are(tmp_path):
    """A buffer restored from ``save`` (the mirror made after: a resumed run) and one in shared memory (an async
    sampler's) give the host path's batches."""
    rng = np.random.default_rng(3)
    saved = make(60, 2, 3)
    saved.append(rows(rng, 25, 2, 0.1, 0))
    saved.append(rows(rng, 25, 2, 0.1, 25))  # around the end
    saved.save(tmp_path / "replay.npz")
    loaded = make(60, 2, 3, shared=True)
    loaded.load(tmp_path / "replay.npz")
    obs_norm = ObsNorm(OBS)
    mirror = DeviceReplay(loaded, HOST_ONLY, CPU, obs_norm)
    mirror.sync(0)
    check_sample(loaded, mirror, obs_norm)
    loaded.append(rows(rng, 7, 2, 0.1, 50))
    mirror.sync(0)
    check_sample(loaded, mirror, obs_norm)


def test_a_buffer_it_cannot_mirror_is_refused_at_once():
    """Prioritized and nested replays: a ValueError when the mirror is made, not a wrong batch later."""
    norm = ObsNorm(OBS, enabled=False)
    with pytest.raises(ValueError, match="uniform ReplayBuffer"):
        DeviceReplay(make(40, 2, 1, prioritized=True), HOST_ONLY, CPU, norm)
    Inner = namedarraytuple("Inner", ["a"])
    Nested = namedarraytuple("Nested", ["observation", "action", "reward", "terminated", "extra"])
    nested = ReplayBuffer(Nested(np.zeros(3, np.float32), np.float32(0), np.float32(0), False, Inner(np.float32(0))), 40, 2)
    with pytest.raises(ValueError, match="'extra' is nested"):
        DeviceReplay(nested, HOST_ONLY, CPU, norm)


Frame = namedarraytuple("Frame", ["observation", "action", "reward", "terminated", "truncated", "episode_end"])
FRAME_HOST_ONLY = ("reward", "terminated", "truncated", "episode_end", "truncated_n", "n_taken", "final_row", "episode_start")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    B=st.integers(1, 3),
    T=st.integers(8, 14),
    n=st.integers(1, 3),
    C=st.integers(2, 4),
    chunks=st.lists(st.tuples(st.integers(1, 30), st.booleans()), min_size=2, max_size=6),
    end=st.sampled_from([0.05, 0.3]),
    unique=st.booleans(),
    dtype=st.sampled_from([np.uint8, np.float32]),
    seed=st.integers(0, 2**16),
)
def test_a_framewise_mirror_stacks_the_host_replays_observations_in_their_dtypes(B, T, n, C, chunks, end, unique, dtype, seed):
    """DQN's replay (frames stored once, lost lives ending windows but not episodes, integer actions): without
    observation statistics each field keeps its stored dtype, as ``shared.device.upload`` sends it, and the stacks
    (zero frames before an episode's start) equal the host replay's, for a unique-frames batch or not."""
    rng = np.random.default_rng(seed)
    example = Frame(np.zeros((C, 2, 2), dtype), np.int64(0), np.float32(0), False, False, False)
    buffer = ReplayBuffer(example, T * B, B, 0.9, n, frame_stack=C, seed=0, unique_frames=unique)
    mirror = DeviceReplay(buffer, FRAME_HOST_ONLY, CPU)
    torch.manual_seed(seed)
    for size, sync in chunks + [(1, True)]:
        m = min(size, T)
        ends = ends_after(rng, m, B, end, buffer.storage.last_flags[0])
        term = rng.random((m, B)) < end / 2  # a lost life: terminal for learning, the episode goes on
        obs = (rng.integers(0, 255, (m, B, C, 2, 2)) / (1 if dtype == np.uint8 else 7)).astype(dtype)
        buffer.append(Frame(obs, rng.integers(0, 2**40, (m, B)), rng.normal(size=(m, B)), term | ends, ends & ~term, ends))
        lo, hi = buffer.valid_window(buffer.cursor)
        if not sync:
            continue
        mirror.sync(0)
        if hi <= lo or buffer.storage.final_row[np.arange(lo, hi) % T].all():
            continue
        out = mirror.sample(32)
        flat = mirror.last_index.numpy()
        r, b = flat // B, flat % B
        abs_row = lo + (r - lo) % T
        assert ((abs_row >= lo) & (abs_row < hi)).all()  # the window: a row whose frame history is overwritten, never
        assert not buffer.storage.final_row[r, b].any()
        s = buffer.storage
        want = {k: v for k, v in s.gather(r, b).items() if k not in FRAME_HOST_ONLY}
        want["observation"] = s.observation(r, b)
        want["next_observation"] = s.observation((r + s.n_taken[r, b]) % T, b)
        want["bootstrap_discount"] = s.discounts[s.n_taken[r, b]]
        want["is_weights"] = np.ones(32, np.float32)
        assert set(out) == set(want)
        for k, v in want.items():
            assert out[k].dtype == torch.from_numpy(np.asarray(v)).dtype and np.array_equal(out[k].numpy(), v), k
    assert int(mirror.misses) == 0


def test_a_sync_sends_each_storage_row_at_most_once(monkeypatch):
    """After more appends than the buffer holds, a sync sends each storage row once, in runs of at most ``CHUNK`` rows
    split at the wrap-around; a sync with nothing new sends nothing; one new row sends it and the n - 1 before it."""
    monkeypatch.setattr(device_replay, "CHUNK", 7)
    sent = []
    real = device_replay.upload_each
    monkeypatch.setattr(device_replay, "upload_each", lambda arrays, into, dev: sent.append(arrays) or real(arrays, into, dev))
    rng = np.random.default_rng(4)
    buffer = make(40, 2, 3)  # 20 rows
    mirror = DeviceReplay(buffer, HOST_ONLY, CPU, ObsNorm(OBS, enabled=False))
    for at in range(0, 55, 11):
        buffer.append(rows(rng, 11, 2, 0.1, at))
    mirror.sync(0)
    blocks = [a["float32"] for a in sent]  # with statistics, one float32 block of every field
    assert [len(b) for b in blocks] == [5 * 2, 7 * 2, 7 * 2, 1 * 2]  # rows 15-19, then 0-14 after the wrap-around
    check_sample(buffer, mirror, ObsNorm(OBS, enabled=False))
    sent.clear()
    mirror.sync(0)
    assert sent == []
    buffer.append(rows(rng, 1, 2, 0.1, 55))
    mirror.sync(0)
    assert len(sent) == 1 and len(sent[0]["float32"]) == 3 * 2  # the new row and the n - 1 = 2 before it


def test_rows_changed_in_place_are_sent_again_and_an_empty_window_is_refused(tmp_path):
    """``end_episodes`` (a resumed run) and ``load`` change rows without moving the cursor, or move it back: the next
    sync sends every row again, so the batches stay the host path's. A batch larger than the valid samples is the
    host replay's ValueError, not a draw from an empty window."""
    rng = np.random.default_rng(5)
    norm = ObsNorm(OBS, enabled=False)
    buffer = make(60, 2, 3)
    mirror = DeviceReplay(buffer, HOST_ONLY, CPU, norm)
    with pytest.raises(ValueError, match="batch_size=4 is larger than the 0 valid samples"):
        mirror.sync(4)
    buffer.append(rows(rng, 20, 2, 0.0, 0))  # no episode ends: end_episodes cuts every env
    buffer.save(tmp_path / "early.npz")
    buffer.append(rows(rng, 5, 2, 0.0, 20))
    mirror.sync(32)
    buffer.end_episodes()
    buffer.append(rows(rng, 1, 2, 0.0, 25))
    mirror.sync(32)
    torch.manual_seed(0)
    for _ in range(20):  # the rows end_episodes made final (flat 46, 47) are never drawn; the cut windows match
        check_sample(buffer, mirror, norm, 256)
    buffer.load(tmp_path / "early.npz")  # back to 20 rows
    mirror.sync(32)
    check_sample(buffer, mirror, norm, 256)


def test_frames_go_up_once_and_an_image_observation_keeps_its_bytes(monkeypatch):
    """A frame never changes once written: a sync sends the new rows' frames only, where it sends the n - 1 rows
    before them again for their n-step fields. An image stored whole (no frame stacking) is held in its own dtype,
    not widened: the mirror takes about the host replay's memory."""
    sent = []
    real = device_replay.upload_each
    monkeypatch.setattr(device_replay, "upload_each", lambda arrays, into, dev: sent.append(arrays) or real(arrays, into, dev))
    rng = np.random.default_rng(6)
    example = Frame(np.zeros((4, 2, 2), np.uint8), np.int64(0), np.float32(0), False, False, False)
    buffer = ReplayBuffer(example, 40, 2, 0.9, 3, frame_stack=4, unique_frames=True)
    mirror = DeviceReplay(buffer, FRAME_HOST_ONLY, CPU)
    chunk = lambda m: Frame(
        rng.integers(0, 255, (m, 2, 4, 2, 2), dtype=np.uint8),
        np.zeros((m, 2), np.int64),
        np.zeros((m, 2)),
        np.zeros((m, 2), bool),
        np.zeros((m, 2), bool),
        np.zeros((m, 2), bool),
    )
    buffer.append(chunk(10))
    mirror.sync(0)
    sent.clear()
    buffer.append(chunk(1))
    mirror.sync(0)
    assert len(sent) == 1 and len(sent[0]["frames"]) == 2 and len(sent[0]["int64"]) == 3 * 2
    image = example._replace(observation=np.zeros((4, 16, 16), np.uint8))  # 1 KB, stored whole (frame_stack 1)
    whole = ReplayBuffer(image, 400, 2, 0.9, 3)
    assert DeviceReplay(whole, FRAME_HOST_ONLY, CPU).nbytes < 1.1 * whole.nbytes  # float64 would be 8x


def test_the_mirror_is_announced_and_a_prioritized_replay_stays_on_the_host(capsys, monkeypatch):
    """``mirror_on`` (CUDA's host path) says where the batches are drawn and how much the mirror takes there; a
    prioritized replay gets none (its sum tree is on the host), and a CPU learner without the CUDA path none."""
    import shared.device

    monkeypatch.setattr(shared.device, "CUDA_PATH", False)
    assert device_replay.mirror_on(make(40, 2, 1), HOST_ONLY, CPU, ObsNorm(OBS)) is None
    monkeypatch.setattr(shared.device, "CUDA_PATH", True)
    assert device_replay.mirror_on(make(40, 2, 1, prioritized=True), HOST_ONLY, CPU, ObsNorm(OBS)) is None
    mirror = device_replay.mirror_on(make(40, 2, 1), HOST_ONLY, CPU, ObsNorm(OBS))
    assert isinstance(mirror, DeviceReplay)
    assert capsys.readouterr().out == f"replay: batches drawn on cpu, from a mirror of {mirror.nbytes / 2**30:.2f} GiB there\n"


def test_replay_batches_give_the_host_sample_uploaded_or_the_mirror_brought_up_to_date(monkeypatch):
    """``ReplayBatches.next``: on a CPU learner the buffer's own draw with the caller's beta (its index too), every
    field but HOST_ONLY uploaded (float32 and normalised with an ObsNorm, stored dtypes without); on CUDA's host path
    the mirror, synced with the rows appended since (no index), and no batch drawn or gathered on the host there."""
    import shared.device

    rng = np.random.default_rng(3)
    norm = ObsNorm(OBS)
    norm.update(rng.normal(2.0, 3.0, (50, OBS)))
    monkeypatch.setattr(shared.device, "CUDA_PATH", False)
    skips = {"uniform": HOST_ONLY, "prioritized": tuple(k for k in HOST_ONLY if k != "is_weights")}  # DQN's: uploaded
    for obs_norm, kind in ((norm, "uniform"), (None, "uniform"), (None, "prioritized")):
        prioritized = dict(prioritized=True, alpha=0.6, beta=0.4) if kind == "prioritized" else {}
        buffer, twin = make(80, 2, 3, **prioritized), make(80, 2, 3, **prioritized)  # the same seed: the same draws
        for b in (buffer, twin):
            b.append(rows(np.random.default_rng(4), 30, 2, 0.1, 0))
            if prioritized:  # priorities that differ, so that beta's weights do
                b.update_priorities(b.sample(32)[1], np.random.default_rng(5).uniform(0.1, 2.0, 32))
        batches = device_replay.ReplayBatches(buffer, skips[kind], CPU, obs_norm)
        assert batches.mirror is None
        batch, index = batches.next(16, beta=0.9 if prioritized else None)
        want, want_index = twin.sample(16, beta=0.9 if prioritized else None, skip=skips[kind])
        np.testing.assert_array_equal(index.abs_row, want_index.abs_row)
        np.testing.assert_array_equal(index.b, want_index.b)
        fields = {k: v for k, v in want.items() if k not in skips[kind]}
        assert set(batch) == set(fields) and ("is_weights" in batch) == bool(prioritized)
        up = upload_batch(fields, obs_norm, CPU) if obs_norm else {k: torch.as_tensor(v) for k, v in fields.items()}
        for k in fields:
            assert batch[k].dtype == up[k].dtype and torch.equal(batch[k], up[k]), k
    monkeypatch.setattr(shared.device, "CUDA_PATH", True)
    buffer = make(40, 2, 1)
    buffer.append(rows(rng, 10, 2, 0.1, 0))
    batches = device_replay.ReplayBatches(buffer, HOST_ONLY, CPU, norm)
    buffer.sample_ahead = lambda *a, **k: pytest.fail("a host batch gathered beside the mirror")
    buffer.sample = lambda *a, **k: pytest.fail("a host batch drawn beside the mirror")
    batches.ahead(8)
    buffer.append(rows(rng, 20, 2, 0.1, 10, after=buffer.storage.last_flags[0]))
    mirror, index = batches.next(8)
    assert mirror is batches.mirror and index is None
    check_sample(buffer, mirror, norm)  # the rows appended after it was made are drawn too, with the host's values
