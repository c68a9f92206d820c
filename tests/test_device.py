"""Device logic without a GPU: ``resolve_device`` and the torchrun device mapping against a mocked CUDA (device
count, capability), the bf16 warnings, the NCCL environment set before the process group starts, and the ranks'
parameter checksum, the packed replay uploads, and uploads that land in a rollout's step (``into``)."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest
import torch

from shared import cli, distributed, precision
from tests.helpers import ROOT, spaces


@pytest.fixture
def cuda(monkeypatch):
    """A machine with two CUDA devices of compute capability 7.0 (a V100), as far as torch.cuda says."""
    calls = {"set_device": [], "capability": 0}

    def capability(device=None):
        calls["capability"] += 1
        return (7, 0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)

    def set_device(d):
        if torch.device(d).index is None:  # as torch does: a device without an index is refused
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{d}")
        calls["set_device"].append(torch.device(d))

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for var in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    return calls


def exit_line(capsys, fn, *args, **kwargs) -> str:
    with pytest.raises(SystemExit) as e:
        fn(*args, **kwargs)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    return lines[0]


def test_a_single_process_on_cuda_n_makes_it_the_current_device(cuda, capsys):
    assert cli.resolve_device("cuda:1") == torch.device("cuda", 1)
    assert cuda["set_device"] == [torch.device("cuda", 1)]  # autocast, events, pinned memory mean this GPU
    assert cli.resolve_device("auto") == torch.device("cuda", 0)  # the current GPU, by its index
    assert cli.resolve_device("cuda") == torch.device("cuda", 0)
    assert cuda["set_device"][1:] == [torch.device("cuda", 0)] * 2
    assert cuda["capability"] == 0  # read only for --bf16
    assert capsys.readouterr().err == ""


def test_bf16_on_a_gpu_older_than_ampere_warns_in_one_line(cuda, capsys):
    cli.resolve_device("cuda:0", bf16=True)
    assert capsys.readouterr().err.startswith("warning: --bf16 on a GPU older than Ampere (sm_80)")


def test_torchrun_ranks_take_the_gpu_of_their_local_rank(cuda, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")  # two nodes of two ranks
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert cli.resolve_device("cuda") == torch.device("cuda", 1)
    assert cli.resolve_device("auto") == torch.device("cuda", 1)


def test_one_explicit_gpu_for_several_local_ranks_exits_2_before_anything_starts(cuda, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert exit_line(capsys, cli.resolve_device, "cuda:0") == (
        "error: --device cuda:0: 2 ranks on this machine would share one GPU; give --device cuda (each rank takes "
        "the GPU of its local rank)"
    )
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert exit_line(capsys, cli.resolve_device, "cuda") == "error: --nproc-per-node 3 is more than the 2 GPU(s) here"
    assert cuda["set_device"] == []


def test_a_gpu_index_past_the_last_exits_2(cuda, capsys):
    assert exit_line(capsys, cli.resolve_device, "cuda:2") == "error: --device cuda:2: only 2 CUDA device(s) here"


def test_a_sampler_process_acts_in_bf16_only_where_the_cpu_has_it(monkeypatch, capsys):
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    assert precision.sampler_bf16(True) is False
    assert capsys.readouterr().err.startswith("warning: --bf16: the sampler process acts in float32")
    assert precision.sampler_bf16(False) is False
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert precision.sampler_bf16(True) is True
    assert capsys.readouterr().err == ""


def test_an_nccl_group_raises_in_python_when_a_peer_is_lost(monkeypatch):
    """TORCH_NCCL_BLOCKING_WAIT is set before the NCCL group starts: a timed-out collective then raises where
    the run ends cleanly (exit 1, checkpoint, no orphan), instead of NCCL's watchdog aborting the process."""
    import torch.distributed as dist

    seen = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(
        dist,
        "init_process_group",
        lambda backend, timeout: seen.update(
            backend=backend, blocking=__import__("os").environ.get("TORCH_NCCL_BLOCKING_WAIT")
        ),
    )
    monkeypatch.setattr(dist, "new_group", lambda backend, timeout: backend)
    monkeypatch.setattr(distributed, "_state", {**distributed._state})
    monkeypatch.setattr(distributed.signals, "flag_on_signals", lambda: None)
    distributed.start(torch.device("cuda", 0))
    assert seen == {"backend": "nccl", "blocking": "1"}
    assert distributed._state["cpu_group"] == "gloo"  # agreements never go over NCCL


def test_the_rank_checksum_is_exact_and_independent_of_the_order_of_the_sum():
    p = torch.randn(1000)
    same = p.flip(0).flip(0).clone()
    assert int(distributed._bits(p).sum()) == int(distributed._bits(same).sum())
    assert int(distributed._bits(p).sum()) == int(distributed._bits(p[torch.randperm(1000)]).sum())
    nudged = p.clone()
    nudged[7] = torch.nextafter(nudged[7], torch.tensor(float("inf")))  # one ulp on one parameter
    assert int(distributed._bits(p).sum()) != int(distributed._bits(nudged).sum())
    assert distributed._bits(torch.ones(3, dtype=torch.float64)).dtype == torch.int64


@pytest.mark.parametrize("script", ["dqn_atari", "catdqn_atari"])
def test_q_heads_stay_float32_under_bf16_autocast(script):
    """bf16 would round Q-values to steps of 1/16 near 10: the output layers run in float32 (review F20)."""
    import importlib
    import sys

    from tests.helpers import ROOT

    sys.path.insert(0, str(ROOT / "algos"))
    module = importlib.import_module(script)
    extra = (torch.linspace(-10, 10, 51),) if script == "catdqn_atari" else ()
    net = module.QNetwork((4,), 2, True, *extra)
    with torch.autocast("cpu", torch.bfloat16):
        raw = net.q(net.torso(torch.randn(3, 4)))  # what the head gave before: bfloat16
        out = net.q_values(torch.randn(3, 4)) if script == "catdqn_atari" else net(torch.randn(3, 4))
    assert raw.dtype == torch.bfloat16 and out.dtype == torch.float32
    with torch.autocast("cpu", torch.bfloat16):
        h = net.q[:-1](net.torso(torch.ones(1, 4)))
        head = module.float32_out(net.q, net.torso(torch.ones(1, 4)))
    assert torch.equal(head, net.q[-1](h.float()))


def test_r2d1_refuses_bf16_in_one_line(monkeypatch, capsys):
    """R2D1 runs in float32: its value rescaling cancels catastrophically in bfloat16 (review F4)."""
    import sys

    from tests.helpers import ROOT

    sys.path.insert(0, str(ROOT / "algos"))
    import r2d1_atari

    monkeypatch.setattr(sys, "argv", ["r2d1_atari", "--preset", "memory", "--bf16"])
    assert exit_line(capsys, cli.parse_args, r2d1_atari.Args, r2d1_atari.PRESETS, r2d1_atari.check_args) == (
        "error: --bf16 is not supported by R2D1: its value rescaling needs float32"
    )


# ---------------------------------------------------------------------------------------------- replay uploads


def _frames(rng, T, B, shape=(4, 44, 44)):
    return rng.integers(0, 255, (T, B, *shape), dtype=np.uint8)


def _r2d1_setup(seed: int):
    """A frame-wise R2D1 replay of random frames and episode ends, its networks and optimizer."""
    sys.path.insert(0, str(ROOT / "algos"))
    import r2d1_atari as r2d1

    from shared.replay import SequenceReplayBuffer

    rng, B, I = np.random.default_rng(seed), 2, 4
    ex = r2d1.Row(
        np.zeros((4, 44, 44), np.uint8),
        np.int64(0),
        np.float32(0),
        False,
        False,
        np.int64(0),
        np.float32(0),
        r2d1.RnnState(np.zeros(32, np.float32), np.zeros(32, np.float32)),
    )
    buf = SequenceReplayBuffer(
        ex,
        200,
        B,
        sequence_length=8,
        rnn_state_interval=I,
        n_step_return=2,
        frame_stack=4,
        prioritized=True,
        seed=seed,
        unique_frames=True,
    )
    for _ in range(10):
        buf.append(
            r2d1.Row(
                _frames(rng, I, B),
                rng.integers(0, 4, (I, B)),
                rng.random((I, B), dtype=np.float32),
                rng.random((I, B)) < 0.1,
                np.zeros((I, B), bool),
                rng.integers(0, 4, (I, B)),
                rng.random((I, B), dtype=np.float32),
                r2d1.RnnState(rng.random((I, B, 32), dtype=np.float32), rng.random((I, B, 32), dtype=np.float32)),
            )
        )
    torch.manual_seed(seed)
    net, target = r2d1.R2D1Net((4, 44, 44), 4, 32), r2d1.R2D1Net((4, 44, 44), 4, 32)
    args = r2d1.Args(batch_size=4, burn_in_steps=2, sequence_length=6, n_step_return=2, rnn_state_interval=I, hidden=32)
    return r2d1, buf, net, target, torch.optim.Adam(net.parameters(), lr=1e-3), args


def test_a_replay_update_uploads_one_packed_block_with_each_frame_once(monkeypatch):
    """R2D1 and DQN updates: one copy to the learner's device per update when batches are packed (as on CUDA),
    and parameters after the updates identical to the per-field path; R2D1's frames travel once each."""
    from shared import device as device_mod

    cpu = torch.device("cpu")
    results = []
    for pack in (False, True):
        uploader = device_mod.Uploader(cpu, pack=pack)
        monkeypatch.setitem(device_mod._uploaders, cpu, uploader)
        r2d1, buf, net, target, opt, args = _r2d1_setup(0)
        for _ in range(3):
            r2d1.r2d1_update(net, target, opt, buf, args, 0.5, cpu)
        results.append([p.detach().clone() for p in net.parameters()])
        assert uploader.copies == (3 if pack else 0)
    assert all(torch.equal(a, b) for a, b in zip(*results))
    batch, _ = buf.sample(4)
    # sequences of 8 + 2 rows of 4 stacked frames: 13 frames each, not 40, padded to that bound (one shape)
    assert batch.frames.shape[0] == 1 + 4 * (8 + 2 + 4 - 1)

    sys.path.insert(0, str(ROOT / "algos"))
    import dqn_atari

    from shared.device_replay import ReplayBatches
    from shared.replay import ReplayBuffer

    for pack in (False, True):
        uploader = device_mod.Uploader(cpu, pack=pack)
        monkeypatch.setitem(device_mod._uploaders, cpu, uploader)
        rng = np.random.default_rng(1)
        ex = dqn_atari.Step(np.zeros(4, np.float32), np.int64(0), np.float32(0), False, False, False)
        buf = ReplayBuffer(ex, 200, 2, n_step_return=3, prioritized=True, seed=1)
        buf.append(
            dqn_atari.Step(
                rng.random((50, 2, 4), dtype=np.float32),
                rng.integers(0, 2, (50, 2)),
                rng.random((50, 2), dtype=np.float32),
                rng.random((50, 2)) < 0.1,
                np.zeros((50, 2), bool),
                np.zeros((50, 2), bool),
            )
        )
        torch.manual_seed(1)
        q, tq = dqn_atari.QNetwork((4,), 2, True), dqn_atari.QNetwork((4,), 2, True)
        opt = torch.optim.Adam(q.parameters(), lr=1e-3)
        batches = ReplayBatches(buf, dqn_atari.HOST_ONLY, cpu)
        for _ in range(3):
            dqn_atari.dqn_update(q, tq, opt, batches, dqn_atari.Args(batch_size=8, prioritized=True), 0.5)
        assert uploader.copies == (3 if pack else 0)
        results.append([p.detach().clone() for p in q.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(results[2], results[3]))


def test_a_packed_upload_brings_every_dtype_and_shape_and_never_refills_a_buffer_in_flight():
    from shared.device import Uploader

    up = Uploader(torch.device("cpu"), depth=2, pack=True)
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(4):
        arrays = {
            "frames": rng.integers(0, 255, (3, 5, 5), dtype=np.uint8),
            "x": rng.random(7, dtype=np.float32),
            "flag": rng.random((2, 3)) < 0.5,
            "i": rng.integers(-9, 9, (4,)),
            "s": np.float64(2.5),
            "strided": rng.random((4, 6))[:, ::2],
            "empty": np.zeros((0, 3)),
            "tail": rng.integers(0, 255, 3, dtype=np.uint8),  # the block ends at 515 bytes: padded to view as float64
        }
        out = up(arrays)
        for k, a in arrays.items():
            assert out[k].numpy().dtype == np.asarray(a).dtype and out[k].shape == np.shape(a), k
            np.testing.assert_array_equal(out[k].numpy(), a)
        assert len({x.untyped_storage().data_ptr() for x in out.values()}) == 1  # views of one block
        assert all(x.is_contiguous() for x in out.values())
        seen.append((arrays, out))
    for arrays, out in seen:  # earlier batches are untouched by later refills of the staging buffers
        for k, a in arrays.items():
            np.testing.assert_array_equal(out[k].numpy(), a)
    assert up.copies == 4


@pytest.mark.parametrize("pack", [True, False])
def test_upload_each_lands_every_field_in_its_own_destination_and_refuses_one_that_does_not_fit(monkeypatch, pack):
    """A replay mirror's sync: each array straight into its rows of the mirror's tensors (packed: from its own place
    in the staging buffer, which takes turns), nothing else written; a destination of another dtype, shape or device
    (which copy_ would convert, broadcast, or copy on another stream), or another number of them, is a ValueError
    before anything is staged or copied."""
    from shared import device as device_mod

    cpu = torch.device("cpu")
    uploader = device_mod.Uploader(cpu, depth=2, pack=pack)
    monkeypatch.setitem(device_mod._uploaders, cpu, uploader)
    group, frames, meta = torch.zeros(12, 3), torch.zeros(12, 4, 5, dtype=torch.uint8), torch.zeros(5, dtype=torch.float64)
    rng = np.random.default_rng(0)
    sent = []
    for i in range(5):
        rows = slice(2 * i, 2 * i + 2)
        arrays = {
            "group": rng.random((2, 3), dtype=np.float32),
            "frames": rng.integers(1, 255, (2, 4, 5), dtype=np.uint8),
            "meta": rng.random(5),
        }
        device_mod.upload_each(arrays, [group[rows], frames[rows], meta], cpu)
        sent.append((rows, arrays))
        np.testing.assert_array_equal(meta.numpy(), arrays["meta"])
    for rows, arrays in sent:  # every run in its rows, none overwritten by a later refill of the staging buffers
        np.testing.assert_array_equal(group[rows].numpy(), arrays["group"])
        np.testing.assert_array_equal(frames[rows].numpy(), arrays["frames"])
    assert not group[10:].any() and not frames[10:].any()
    assert uploader.copies == (5 if pack else 0)
    a = {"group": np.ones((2, 3), np.float32), "other": np.ones((2, 3), np.float32)}
    wrong = [
        torch.zeros(2, 3, dtype=torch.float64),  # copy_ would convert
        torch.zeros(4, 3),  # copy_ would broadcast
        torch.zeros(1, 3),
        torch.zeros(2, 3, device="meta"),  # another device: copied on its stream, which no event follows
        np.zeros((2, 3), np.float32),
    ]
    first = torch.zeros(2, 3)
    for bad in wrong:
        with pytest.raises(ValueError, match="upload: a destination"):
            device_mod.upload_each(a, [first, bad], cpu)  # the second one is wrong: nothing is copied, the first either
    for dests in ([first], [first, torch.zeros(2, 3), torch.zeros(2, 3)]):
        with pytest.raises(ValueError, match="upload: .* destinations for 2 arrays"):
            device_mod.upload_each(a, dests, cpu)
    assert not first.any() and uploader.copies == (5 if pack else 0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(6.0),
        lambda: torch.arange(6.0).view(2, 3).t(),
        lambda: torch.ones(1).expand(4),
        lambda: torch.arange(5000.0),  # more than the bytes kept: a new array each read
    ],
)
def test_the_host_copy_of_one_tensor_is_its_own_memory(make):
    """``one_copy`` of one tensor (what ``to_host`` takes on CUDA, and under ``RL_HOST_PATH=cuda`` on the CPU) is a copy
    of its values, transposed or expanded: writing either one afterwards leaves the other as it was."""
    from shared.device import one_copy

    t = make()
    before = t.clone()
    (a,) = one_copy((t,))
    np.testing.assert_array_equal(a, before.numpy())
    t.untyped_storage().fill_(0)  # every byte of the tensor's memory, whatever its strides
    np.testing.assert_array_equal(a, before.numpy())
    (b,) = one_copy((torch.full_like(t, 7),))  # the next copy of the same dtype and shape
    np.testing.assert_array_equal(a, before.numpy())
    a[...] = -1
    assert not torch.equal(t, torch.full_like(t, -1)) and (b == 7).all()


def test_a_dry_launch_made_in_inference_mode_runs_outside_it():
    """``RL_HOST_PATH=dry``'s stand-in for a launch, made first inside a loop in inference mode (ppo_mujoco's
    collect), runs again outside it (its update): ``loop_overhead.py ppo_mujoco`` on its own failed there."""
    from shared.device import Uploader

    uploader = Uploader(torch.device("cpu"), pack=True)
    with torch.inference_mode():
        uploader._launch()
    uploader._launch()


def test_the_host_copies_of_several_tensors_are_each_their_own_memory():
    """``one_copy`` of several tensors lands in host bytes it keeps for their signature, and hands back copies of
    them: the next copy of the same signature, or a write to one array, changes no array handed back before."""
    from shared.device import one_copy

    first = one_copy((torch.tensor([1, 2]), torch.tensor([0.5, 1.5]), torch.tensor([True, False])))
    second = one_copy((torch.tensor([7, 8]), torch.tensor([2.5, 3.5]), torch.tensor([False, True])))
    first[0][0] = -1
    assert [a.tolist() for a in first] == [[-1, 2], [0.5, 1.5], [True, False]]
    assert [a.tolist() for a in second] == [[7, 8], [2.5, 3.5], [False, True]]
    big = (torch.arange(3000.0), torch.arange(3000))  # more than the bytes kept: a new array each read
    first, second = one_copy(big), one_copy((big[0] + 1, big[1] + 1))
    assert first[0].tolist() == big[0].tolist() and first[1].tolist() == big[1].tolist()
    assert (second[0] == first[0] + 1).all() and (second[1] == first[1] + 1).all()


def test_an_off_policy_batch_and_its_normaliser_statistics_go_up_in_one_copy(monkeypatch):

    from shared import device as device_mod
    from shared.normalize import ObsNorm, upload_batch

    rng = np.random.default_rng(0)
    norm = ObsNorm(3)
    norm.update(rng.normal(2.0, 3.0, (50, 3)))
    batch = dict(  # a replay batch's uploaded fields (ReplayBatches leaves HOST_ONLY out)
        observation=rng.normal(size=(8, 3)),
        next_observation=rng.normal(size=(8, 3)),
        action=rng.uniform(-1, 1, (8, 2)),
        n_step_return=rng.normal(size=8),
        terminated_n=rng.random(8) < 0.2,
        bootstrap_discount=np.full(8, 0.99),
    )
    cpu = torch.device("cpu")
    outs = []
    for pack in (False, True):
        uploader = device_mod.Uploader(cpu, pack=pack)
        monkeypatch.setitem(device_mod._uploaders, cpu, uploader)
        outs.append(upload_batch(batch, norm, cpu))
        assert uploader.copies == int(pack)
    for k in outs[0]:
        assert torch.equal(outs[0][k], outs[1][k]), k
    expected = torch.as_tensor((batch["observation"] - norm.mean) / np.sqrt(norm.var + 1e-8), dtype=torch.float32)
    torch.testing.assert_close(outs[1]["observation"], expected)


def _dqn_setup(module, prefetch: bool):
    """A prioritized replay of random vector transitions for dqn_atari/catdqn_atari, its networks and optimizer."""
    from shared.replay import ReplayBuffer

    rng = np.random.default_rng(2)
    ex = module.Step(np.zeros(4, np.float32), np.int64(0), np.float32(0), False, False, False)
    buf = ReplayBuffer(ex, 200, 2, n_step_return=3, prioritized=True, seed=2, prefetch=prefetch)
    buf.append(
        module.Step(
            rng.random((50, 2, 4), dtype=np.float32),
            rng.integers(0, 2, (50, 2)),
            rng.random((50, 2), dtype=np.float32),
            rng.random((50, 2)) < 0.1,
            np.zeros((50, 2), bool),
            np.zeros((50, 2), bool),
        )
    )
    torch.manual_seed(2)
    args = module.Args(batch_size=8, prioritized=True)
    if module.__name__ == "dqn_atari":
        q, tq = module.QNetwork((4,), 2, True), module.QNetwork((4,), 2, True)
    else:
        q, tq = module.make_network(args, *spaces((4,), 2)), module.make_network(args, *spaces((4,), 2))
    return buf, q, tq, torch.optim.Adam(q.parameters(), lr=1e-3), args


class _Spy:
    """Records a prioritized replay's draws (the sum tree's samples) and priority writes, in order."""

    def __init__(self, buf):
        self.events, self.tree_sample, self.write = [], buf.tree.sample, buf.update_priorities
        buf.tree.sample, buf.update_priorities = self.draw, self.written

    def draw(self, *a):
        out = self.tree_sample(*a)
        self.events.append(("draw", out[0]))
        return out

    def written(self, index, priorities):
        self.events.append(("write", index.abs_row))
        return self.write(index, priorities)


def _three_updates(script: str, prefetch: bool) -> list:
    """The draws and writes of three updates of ``script`` on a prioritized replay built with ``prefetch``."""
    from shared.device_replay import ReplayBatches

    sys.path.insert(0, str(ROOT / "algos"))
    module, cpu = __import__(script), torch.device("cpu")
    if script == "r2d1_atari":
        _, buf, net, target, opt, args = _r2d1_setup(0)
        buf.prefetch = prefetch
        spy = _Spy(buf)
        for _ in range(3):
            module.r2d1_update(net, target, opt, buf, args, 0.5, cpu)
        return spy.events
    buf, net, target, opt, args = _dqn_setup(module, prefetch)
    spy = _Spy(buf)
    batches = ReplayBatches(buf, module.HOST_ONLY, cpu)
    update = module.dqn_update if script == "dqn_atari" else module.c51_update
    for _ in range(3):
        update(net, target, opt, batches, args, 0.5)
    return spy.events


@pytest.mark.parametrize("script", ["dqn_atari", "catdqn_atari", "r2d1_atari"])
def test_a_prefetching_learner_draws_the_next_batch_before_it_reads_the_priorities(script):
    """With prefetch (a GPU learner fed by an async sampler) each update draws the next batch between its last
    kernel and its priority read, and trains on the batch drawn during the update before; without, one draw
    then one write per update, as ever."""
    for prefetch in (False, True):
        events = _three_updates(script, prefetch)
        assert "".join(kind[0] for kind, _ in events) == ("ddwdwdw" if prefetch else "dwdwdw")
        draws = [rows for kind, rows in events if kind == "draw"]
        writes = [rows for kind, rows in events if kind == "write"]
        for drawn, written in zip(draws, writes):  # each update trains on (and writes back) the k-th draw
            np.testing.assert_array_equal(drawn, written)


def test_channels_last_is_one_rule_on_a_cpu_and_with_bf16_on_a_gpu():
    """shared.precision.channels_last: NHWC weights on a CPU (any precision) and on a GPU with bf16 only; the rule
    reads the device's type alone, so a CUDA device object tells it without a GPU."""
    from shared.precision import channels_last

    def nhwc(device: str, bf16: bool) -> bool:
        conv = torch.nn.Conv2d(4, 8, 3)
        return channels_last(conv, torch.device(device), bf16).weight.is_contiguous(memory_format=torch.channels_last)

    assert nhwc("cpu", False) and nhwc("cpu", True) and nhwc("cuda", True)
    assert not nhwc("cuda", False)
    linear = torch.nn.Linear(3, 2)
    assert channels_last(linear, torch.device("cpu"), False) is linear  # nothing 4-d: unchanged


def test_an_upload_keeps_its_structure_whether_it_walks_or_not():
    """shared.device.upload's three ways: one array and a flat dict of arrays without a walk, anything nested through
    shared.namedarraytuple's walk (namedarraytuples with None fields, Dict observations, tensors among the arrays); a
    plain list stays one array, as it always was."""
    from shared.device import upload
    from shared.namedarraytuple import namedarraytuple

    cpu = torch.device("cpu")
    State = namedarraytuple("State", ["h", "c"])
    Batch = namedarraytuple("Batch", ["obs", "state", "extra"])
    one = upload(np.arange(3.0), cpu)
    assert isinstance(one, torch.Tensor) and one.tolist() == [0.0, 1.0, 2.0]
    flat = upload({"a": np.zeros(2, np.uint8), "b": np.ones(1, bool)}, cpu)
    assert list(flat) == ["a", "b"] and flat["a"].dtype == torch.uint8 and flat["b"].dtype == torch.bool
    held = torch.full((2,), 7.0)
    batch = Batch({"image": np.ones((2, 3), np.uint8), "vec": held}, State(np.zeros((1, 2)), None), [1, 2])
    up = upload(batch, cpu)
    assert type(up) is Batch and type(up.state) is State and up.state.c is None and list(up.obs) == ["image", "vec"]
    assert up.obs["image"].dtype == torch.uint8 and up.obs["image"].shape == (2, 3) and up.obs["vec"] is held
    assert isinstance(up.extra, torch.Tensor) and up.extra.tolist() == [1, 2]  # the list as one array


def test_a_packed_upload_stays_exact_across_changing_shapes_a_grown_staging_buffer_and_an_emptied_layout_cache():
    """The layouts and staging views kept per signature: shapes that change (an evaluation's last envs), a signature
    seen again after its staging buffer grew, and more signatures than the cache keeps (``_CACHED``) all upload the
    values given, never a view of an older buffer."""
    from shared import device as device_mod

    up = device_mod.Uploader(torch.device("cpu"), depth=2, pack=True)
    rng = np.random.default_rng(0)
    sizes = [3, 1, 3, 200, 3, *range(1, device_mod._CACHED + 5), 3, 200]
    for n in sizes:
        arrays = {"obs": rng.integers(0, 255, (n, 4), dtype=np.uint8), "mask": rng.random((n, 2)) < 0.5}
        out = up(arrays)
        for k, a in arrays.items():
            np.testing.assert_array_equal(out[k].numpy(), a)
    assert len(up.layouts) <= device_mod._CACHED
    assert len(device_mod._splits) <= device_mod._CACHED


def _rollout(steps: int, envs: int, dict_obs: bool = False) -> Any:
    """A rollout [T, B] as the PPO family's samplers keep it: observations and masks on the device (on_device)."""
    from shared.buffer import buffer_from_example, on_device
    from shared.namedarraytuple import namedarraytuple

    Rollout = namedarraytuple("Rollout", ["obs", "mask", "reward"])
    obs = np.zeros((4, 6), np.uint8)
    if dict_obs:  # as shared.dict_obs.obs_example allocates a Dict space's
        obs = namedarraytuple("Obs", ["image", "vec"])(np.zeros((3, 5), np.uint8), np.zeros(2, np.float32))
    example = Rollout(obs, np.zeros(3, bool), np.float32(0))
    return on_device(buffer_from_example(example, (steps, envs)), ("obs", "mask"), torch.device("cpu"))


@pytest.mark.parametrize("pack", [True, False])
def test_an_upload_into_a_rollouts_step_lands_there_in_its_one_copy_and_nowhere_else(monkeypatch, pack):
    """upload(arrays, device, into=rollout step t): on the packing path (CUDA's) the one copy lands in the rollout's
    step (on_device lays every step out as the copy packs it) and the tensors returned are the rollout's own; without
    packing (the CPU), the rollout gets the values all the same. No other step is touched."""
    from shared import device as device_mod

    cpu = torch.device("cpu")
    uploader = device_mod.Uploader(cpu, pack=pack)
    monkeypatch.setitem(device_mod._uploaders, cpu, uploader)
    buf, rng = _rollout(5, 2), np.random.default_rng(0)
    assert buf.obs.untyped_storage().data_ptr() == buf.mask.untyped_storage().data_ptr()  # one block
    sent = []
    for t in (0, 3, 1):
        arrays = {"obs": rng.integers(0, 255, (2, 4, 6), dtype=np.uint8), "mask": rng.random((2, 3)) < 0.5}
        into = {"obs": buf.obs[t], "mask": buf.mask[t]}
        up = device_mod.upload(arrays, cpu, into=into)
        sent.append((t, arrays))
        if pack:
            assert up is into  # the rollout's own tensors: nothing more to copy, on the device or into a graph's input
        np.testing.assert_array_equal(up["obs"].numpy(), arrays["obs"])
        np.testing.assert_array_equal(up["mask"].numpy(), arrays["mask"])
    assert uploader.copies == (3 if pack else 0)
    for t, arrays in sent:
        np.testing.assert_array_equal(buf.obs[t].numpy(), arrays["obs"])
        np.testing.assert_array_equal(buf.mask[t].numpy(), arrays["mask"])
    for t in (2, 4):
        assert not buf.obs[t].any() and not buf.mask[t].any()


def test_an_upload_into_places_that_are_not_one_packed_step_still_lands_in_each():
    """Destinations that are not a step of on_device as the copy packs it (steps mixed, separate tensors, the host's
    shared memory of an async sampler acting on a GPU, a Dict observation's namedarraytuple) each get their values
    apart; the copy up is the usual one."""
    from shared import device as device_mod

    cpu = torch.device("cpu")
    uploader = device_mod.Uploader(cpu, pack=True)
    rng = np.random.default_rng(1)

    def arrays() -> dict:
        return {"obs": rng.integers(0, 255, (2, 4, 6), dtype=np.uint8), "mask": rng.random((2, 3)) < 0.5}

    buf = _rollout(4, 2)
    host = {"obs": np.zeros((2, 4, 6), np.uint8), "mask": np.zeros((2, 3), bool)}
    places = [
        {"obs": buf.obs[1], "mask": buf.mask[2]},  # two steps' halves: the packed copy would write the wrong mask
        {"obs": torch.zeros(2, 4, 6, dtype=torch.uint8), "mask": torch.zeros(2, 3, dtype=torch.bool)},
        host,
    ]
    original = device_mod._uploaders.get(cpu)
    device_mod._uploaders[cpu] = uploader
    try:
        for into in places:
            a = arrays()
            up = device_mod.upload(a, cpu, into=into)
            assert up is not into
            for k in a:
                np.testing.assert_array_equal(np.asarray(into[k]), a[k])
                np.testing.assert_array_equal(up[k].numpy(), a[k])
        assert not buf.mask[1].any() and not buf.obs[2].any()
        dict_buf = _rollout(3, 2, dict_obs=True)
        a = {"obs": {"image": rng.integers(0, 9, (2, 3, 5), dtype=np.uint8), "vec": rng.random((2, 2), dtype=np.float32)}}
        a["mask"] = rng.random((2, 3)) < 0.5
        device_mod.upload(a, cpu, into={"obs": dict_buf.obs[2], "mask": dict_buf.mask[2]})
        np.testing.assert_array_equal(dict_buf.obs.image[2].numpy(), a["obs"]["image"])
        np.testing.assert_array_equal(dict_buf.obs.vec[2].numpy(), a["obs"]["vec"])
        np.testing.assert_array_equal(dict_buf.mask[2].numpy(), a["mask"])
    finally:
        if original is None:
            device_mod._uploaders.pop(cpu)
        else:
            device_mod._uploaders[cpu] = original


def _shared_rollout(steps: int, envs: int) -> Any:
    """A rollout [T, B] as an async sampler writes it: every field numpy in shared memory (a DoubleBuffer's slot)."""
    from shared.buffer import buffer_from_example
    from shared.namedarraytuple import namedarraytuple

    Rollout = namedarraytuple("Rollout", ["obs", "mask", "reward"])
    return buffer_from_example(Rollout(np.zeros((4, 6), np.uint8), np.zeros(3, bool), np.float32(0)), (steps, envs), True)


@pytest.mark.parametrize("plain", [True, False], ids=["plain-views", "shared-arrays"])
def test_an_upload_into_page_locked_shared_memory_is_written_there_once_and_copied_up_from_there(monkeypatch, plain):
    """An async sampler's rollout in shared memory it page-locked (pin_host, marked on CUDA's host path here), written
    through plain views as DoubleBuffer hands them out, or through the SharedArrays: each step's arrays land in the
    rollout's row and go up from there, with no staging buffer; the tensors handed back are copies (a later write to
    the row leaves them as they were, as a GPU's would); a key the rollout does not keep goes through staging; shared
    memory not page-locked, or private memory, takes the usual path. No other row changes."""
    from shared import device as device_mod
    from shared.namedarraytuple import map_structure

    cpu = torch.device("cpu")
    monkeypatch.setattr(device_mod, "CUDA_PATH", False)
    shared, other = _shared_rollout(5, 2), _shared_rollout(5, 2)
    device_mod.pin_host(shared, cpu)  # the CPU itself: nothing to lock
    assert not shared.obs._segment.pinned
    monkeypatch.setattr(device_mod, "CUDA_PATH", True)
    device_mod.pin_host(shared, cpu)
    assert shared.obs._segment.pinned and shared.mask[3]._segment.pinned and not other.obs._segment.pinned
    buf = map_structure(lambda x: x.view(np.ndarray), shared) if plain else shared
    uploader = device_mod.Uploader(cpu, pack=True)
    monkeypatch.setitem(device_mod._uploaders, cpu, uploader)
    rng = np.random.default_rng(0)
    sent = {}
    for t in (0, 3, 1):
        arrays = {"obs": rng.integers(0, 255, (2, 4, 6), dtype=np.uint8), "mask": rng.random((2, 3)) < 0.5}
        up = device_mod.upload(arrays, cpu, into={"obs": buf.obs[t], "mask": buf.mask[t]})
        sent[t] = {k: a.copy() for k, a in arrays.items()}
        assert uploader.copies == 0  # nothing staged
        buf.obs[t] = 7  # the row written again: the copy up already went
        for k, a in sent[t].items():
            np.testing.assert_array_equal(up[k].numpy(), a)
        buf.obs[t] = sent[t]["obs"]
    for t, arrays in sent.items():
        np.testing.assert_array_equal(buf.obs[t], arrays["obs"])
        np.testing.assert_array_equal(buf.mask[t], arrays["mask"])
    assert not buf.obs[[2, 4]].any() and not buf.mask[[2, 4]].any()
    start = rng.random((1, 2)) < 0.5  # ppo_lstm's: uploaded with the step, not kept in the rollout
    up = device_mod.upload({"obs": sent[0]["obs"], "start": start}, cpu, into={"obs": buf.obs[2]})
    assert uploader.copies == 1
    np.testing.assert_array_equal(up["start"].numpy(), start)
    np.testing.assert_array_equal(buf.obs[2], sent[0]["obs"])
    for into in ({"obs": other.obs[0]}, {"obs": np.zeros((2, 4, 6), np.uint8)}, {"obs": buf.obs[0], "mask": start}):
        up = device_mod.upload({"obs": sent[1]["obs"], "mask": start}, cpu, into=into)
        np.testing.assert_array_equal(into["obs"], sent[1]["obs"])
        np.testing.assert_array_equal(up["obs"].numpy(), sent[1]["obs"])
    assert uploader.copies == 4
    # Arrays the row would convert or broadcast (an env whose observations are not its space's) go up as they are,
    # as on every other path: not as the row holds them.
    wide, one = np.full((2, 4, 6), 300.7), np.full((4, 6), 9, np.uint8)
    up = device_mod.upload({"obs": wide}, cpu, into={"obs": buf.obs[4]})
    assert up["obs"].dtype == torch.float64 and float(up["obs"][0, 0, 0]) == 300.7
    up = device_mod.upload({"obs": one}, cpu, into={"obs": buf.obs[4]})
    assert tuple(up["obs"].shape) == (4, 6) and uploader.copies == 6


def test_page_locked_memory_is_forgotten_as_it_is_freed(monkeypatch):
    """pin_host's ranges go with their memory: once the rollout is freed, nothing at those addresses counts as locked
    (a new mapping there is not), and its views while it lives do."""
    import gc

    from shared import device as device_mod

    monkeypatch.setattr(device_mod, "CUDA_PATH", True)
    before = list(device_mod._LOCKED_STARTS), list(device_mod._LOCKED_ENDS)
    buf = _shared_rollout(3, 2)
    device_mod.pin_host(buf, torch.device("cpu"))
    row = buf.obs[1].view(np.ndarray)
    arrays = {"obs": np.ones((2, 4, 6), np.uint8)}
    assert device_mod._pinned({"obs": row}, arrays) and len(device_mod._LOCKED_STARTS) == len(before[0]) + 3
    assert not device_mod._pinned({"obs": row.copy()}, arrays)
    del buf, row
    gc.collect()
    assert (device_mod._LOCKED_STARTS, device_mod._LOCKED_ENDS) == before


def test_shared_memory_is_unlocked_before_it_is_freed():
    """A page-locked segment's ``unpin`` (the driver's unregistration, on a GPU) runs once as its last array goes, while
    its memory is still mapped: the driver must not keep pages that a later mapping reuses."""
    import gc

    from shared.buffer import shared_zeros

    a = shared_zeros((3, 5), np.float32)
    segment, seen = a._segment, []
    fd, mapping = segment.fd, segment.map
    segment.unpin = lambda: seen.append((os.fstat(fd).st_size, mapping[0]))  # open and mapped yet
    a[0, 0] = 1.0
    del a, segment
    gc.collect()
    assert len(seen) == 1 and seen[0][0] == 60


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_sampler_step_goes_up_from_its_page_locked_rollout():
    """On a GPU: pin_host registers the rollout's shared memory with the driver, each step's upload goes up from the
    row (no staging) with the exact values, and the segments are unregistered as they are freed (registering the
    same memory again then succeeds)."""
    import gc

    from shared import device as device_mod

    gpu = torch.device("cuda")
    buf = _shared_rollout(4, 3)
    device_mod.pin_host(buf, gpu)
    assert buf.obs._segment.unpin is not None
    uploader = device_mod._uploader(gpu)
    copies = uploader.copies
    rng = np.random.default_rng(2)
    for t in range(4):
        arrays = {"obs": rng.integers(0, 255, (3, 4, 6), dtype=np.uint8), "mask": rng.random((3, 3)) < 0.5}
        up = device_mod.upload(arrays, gpu, into={"obs": buf.obs[t], "mask": buf.mask[t]})
        assert up["obs"].device.type == "cuda"
        for k, a in arrays.items():
            np.testing.assert_array_equal(up[k].cpu().numpy(), a)
    assert uploader.copies == copies
    address, nbytes = buf.obs._segment.address, buf.obs._segment.nbytes
    mapping = buf.obs._segment.map  # held: the memory stays mapped after its segment goes
    del buf
    gc.collect()
    assert not mapping.closed
    assert int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)) == 0
    assert int(torch.cuda.cudart().cudaHostUnregister(address)) == 0


@pytest.mark.parametrize("script", ["ppo_atari", "a2c_atari", "ppo_lstm"])
def test_a_rollout_collected_through_packed_uploads_is_the_one_collected_without(monkeypatch, script):
    """The PPO family's serial sampler with CUDA's packing uploads (each step's copy landing in the rollout's step,
    laid out by on_device) and with the CPU's: the same rollout, field by field, on a stub of Breakout's spaces whose
    observations change every step (a copy landing in another step, or not at all, would differ)."""
    import importlib

    from benchmarks.speed.loop_overhead import ATARI_OBS, StubVectorEnv, _RunStub
    from shared import device as device_mod

    sys.path.insert(0, str(ROOT / "algos"))
    S = importlib.import_module(script)
    cpu, act_space = torch.device("cpu"), __import__("gymnasium").spaces.Discrete(4)
    rollouts = []
    for pack in (False, True):
        uploader = device_mod.Uploader(cpu, pack=pack)
        monkeypatch.setitem(device_mod._uploaders, cpu, uploader)
        envs = StubVectorEnv(ATARI_OBS, act_space, 2, lives=True)
        rng = np.random.default_rng(0)
        real_step = envs.step

        def step(action, real_step=real_step, envs=envs, rng=rng):
            out = real_step(action)
            out[0][...] = rng.integers(0, 255, out[0].shape, dtype=np.uint8)  # new observations every step
            return out

        envs.step = step
        monkeypatch.setattr(S, "make_envs", lambda *a, envs=envs, **k: envs)
        args = S.Args(num_envs=2, num_steps=6, sampler="serial")
        run = _RunStub(ATARI_OBS, act_space)
        torch.manual_seed(0)
        agent = S.make_learner(args, run)[0]
        sampler = S.Sampler(args, run, agent, 0, 10)
        torch.manual_seed(1)
        buf, _ = sampler.rollout(0, agent, 0)
        assert uploader.copies == (args.num_steps if pack else 0)
        rollouts.append({k: (v.numpy() if torch.is_tensor(v) else v).copy() for k, v in buf.items()})
    for k in rollouts[0]:
        np.testing.assert_array_equal(rollouts[0][k], rollouts[1][k], err_msg=k)
    assert rollouts[0]["obs"][1:].any() and not np.array_equal(rollouts[0]["obs"][2], rollouts[0]["obs"][3])


def test_a_copy_landing_in_a_rollouts_step_is_seen_by_graphed_in_every_field(monkeypatch):
    """The rollout's fields are views of one block: the packed copy written through the observations' view changes the
    version of the masks too, so a @graphed update passed the same rollout tensors again copies the new masks in (a
    tensor of its own on the block's storage kept its version: the update read the first rollout's masks forever)."""
    from shared import compiling
    from shared import device as device_mod

    cpu = torch.device("cpu")
    monkeypatch.setitem(device_mod._uploaders, cpu, device_mod.Uploader(cpu, pack=True))
    buf, rng = _rollout(3, 2), np.random.default_rng(2)

    @compiling.graphed
    def sums(obs: torch.Tensor, mask: torch.Tensor) -> tuple:
        return obs.sum().float(), mask.sum().float()

    compiling.enable(cpu)
    try:
        for rollout in range(4):
            before = buf.mask._version
            for t in range(3):
                arrays = {"obs": np.full((2, 4, 6), rollout, np.uint8), "mask": rng.random((2, 3)) < 0.5}
                device_mod.upload(arrays, cpu, into={"obs": buf.obs[t], "mask": buf.mask[t]})
            assert buf.mask._version > before
            obs, mask = sums(buf.obs, buf.mask)  # the same tensor objects every rollout, as learn_from passes them
            assert (float(obs), float(mask)) == (float(buf.obs.sum()), float(buf.mask.sum()))
    finally:
        compiling.disable()
