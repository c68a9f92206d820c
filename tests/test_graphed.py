"""``shared.compiling.graphed``: a whole update (or acting step) as one CUDA graph under ``--compile``.

The CPU tests run the protocol without the capture (static inputs copied in, the same function called, outputs
copied out) and check what it promises: eager and graphed updates agree, data is copied and state is used in place,
a changing Python value is another graph (and too many an error), a function that writes its data argument is
refused, outputs survive the next call. The ``cuda`` tests add the capture itself: compiled and captured updates
agree with eager ones over 20 updates, random draws differ between replays, a learning rate anneals through
``set_lr`` and a replaced one is refused, and a collective cuts the capture into graphs run around it."""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn as nn

from shared import compiling


def on_cuda(test):
    """Marked ``cuda`` and skipped where torch sees no CUDA device."""
    return pytest.mark.cuda(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")(test))


@pytest.fixture
def enabled(request):
    """``compiling.enable`` on the device of the test's parameter (default cpu), ``disable`` after."""
    device = getattr(request, "param", "cpu")
    compiling.enable(device)
    yield torch.device(device)
    compiling.disable()


def make_learner(device, lr=1e-2, seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
    target = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
    target.load_state_dict(net.state_dict())
    target.requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=lr, fused=device.type in ("cpu", "cuda"))
    return net, target, opt


def td_loss(net, target, b: dict, gamma: float) -> tuple:
    q = net(b["obs"]).gather(1, b["action"][:, None])[:, 0]
    with torch.no_grad():
        y = b["reward"] + gamma * target(b["next_obs"]).max(1).values
    return ((q - y) ** 2).mean(), q


compiled_td_loss = compiling.compiled(td_loss)


def td_update(net, target, opt, b: dict, gamma: float, loss_fn=td_loss) -> dict:
    """A DQN-like update with no random draw: loss, backward, clipping, Adam, soft target update."""
    loss, q = loss_fn(net, target, b, gamma)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    with torch.no_grad():
        for tp, p in zip(target.parameters(), net.parameters()):
            tp.lerp_(p, 0.1)
    return {"loss": loss.detach(), "grad_norm": norm, "q": q.detach()}


graphed_td_update = compiling.graphed(td_update)


def batches(n: int, device, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append(
            {
                "obs": torch.randn(16, 4, generator=g),
                "action": torch.randint(0, 3, (16,), generator=g),
                "reward": torch.randn(16, generator=g),
                "next_obs": torch.randn(16, 4, generator=g),
            }
        )
    return [{k: v.to(device) for k, v in b.items()} for b in out]


def train(update, device, n: int = 20, loss_fn=td_loss) -> tuple[list, list]:
    net, target, opt = make_learner(device)
    stats = [update(net, target, opt, b, 0.9, loss_fn) for b in batches(n, device)]
    return [p.detach().cpu().clone() for p in (*net.parameters(), *target.parameters())], stats


@pytest.mark.unit
def test_without_enable_a_graphed_function_is_the_function():
    seen = []
    f = compiling.graphed(lambda x: seen.append(x) or x * 2)
    x = torch.ones(3)
    assert torch.equal(f(x), x * 2) and seen[0] is x  # the caller's tensor itself, no static copy


@pytest.mark.unit
def test_the_protocol_on_the_cpu_updates_as_eager_does(enabled):
    """20 updates through the protocol (static inputs, outputs copied out) give eager's parameters bit for bit and
    the same statistics, each call's own (an output is not overwritten by the next call)."""
    compiling.disable()
    eager, eager_stats = train(td_update, torch.device("cpu"))
    compiling.enable("cpu")
    graphed, graphed_stats = train(graphed_td_update, torch.device("cpu"))
    for a, b in zip(eager, graphed):
        assert torch.equal(a, b)
    for a, b in zip(eager_stats, graphed_stats):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert len({float(s["loss"]) for s in graphed_stats}) == 20  # each row its own update's


@pytest.mark.unit
def test_data_is_copied_into_static_inputs_once_per_change_and_state_is_used_in_place(enabled):
    seen = []

    @compiling.graphed
    def f(w, x):
        seen.append(x)
        with torch.no_grad():
            w.add_(x.sum())
        return x + 1

    w = torch.zeros((), requires_grad=True)  # state: requires grad
    x = torch.ones(3)
    f(w, x)
    f(w, x)
    assert seen[0] is seen[1] and seen[0] is not x  # one static input, not the caller's tensor
    assert float(w.detach()) == 6.0  # the caller's parameter, written in place
    copies = []
    real_copy = torch.Tensor.copy_
    try:
        torch.Tensor.copy_ = lambda self, src, non_blocking=False: copies.append(1) or real_copy(self, src)
        f(w, x)  # the same tensor, unchanged: no copy
        assert copies == []
        x.add_(1)  # changed in place: copied again
        out = f(w, x)
        assert copies == [1] and torch.equal(out, torch.full((3,), 3.0))
        f(w, torch.ones(3))  # another tensor: copied
        assert copies == [1, 1]
    finally:
        torch.Tensor.copy_ = real_copy


@pytest.mark.unit
def test_an_inference_tensor_is_copied_in_at_every_call(enabled):
    """An inference-mode tensor has no version counter, so nothing says it is unchanged: it is copied every call."""
    f = compiling.graphed(lambda x: x + 1)
    with torch.inference_mode():
        x = torch.ones(3)
        f(x)
    copies = []
    real_copy = torch.Tensor.copy_
    try:
        torch.Tensor.copy_ = lambda self, src, non_blocking=False: copies.append(1) or real_copy(self, src)
        with torch.inference_mode():
            x.add_(1)  # in place, unseen by any version counter
            out = f(x)
        assert copies == [1] and torch.equal(out, torch.full((3,), 3.0))
    finally:
        torch.Tensor.copy_ = real_copy


@pytest.mark.unit
def test_a_call_in_inference_mode_raises_nothing_inside(enabled):
    """Reading an inference tensor's version raises a C++ error (about 10 µs; ppo_mujoco's collect runs in inference
    mode, a call a step): a graph that has had one raises it once, then asks each tensor whether it is one. A normal
    tensor among them keeps its version; an inference one is copied at every call all the same."""
    import sys

    f = compiling.graphed(lambda x, y: x + y)
    raised = []

    def trace(frame, event, arg):
        if event == "exception" and frame.f_code.co_filename == compiling.__file__ and arg[0] is RuntimeError:
            raised.append(arg[0])
        return trace

    with torch.inference_mode():
        x, y = torch.ones(3), torch.ones(3)
        f(x, y)  # the first call learns it
    normal = torch.ones(3)
    sys.settrace(trace)
    try:
        for _ in range(3):
            with torch.inference_mode():
                assert torch.equal(f(x, y), torch.full((3,), 2.0))
    finally:
        sys.settrace(None)
    assert raised == []
    with torch.inference_mode():
        y.add_(1)  # unseen by any version counter: copied anyway
    assert torch.equal(f(normal, y), torch.full((3,), 3.0))
    normal.add_(1)  # seen by its version counter
    assert torch.equal(f(normal, y), torch.full((3,), 4.0))


@pytest.mark.unit
def test_a_graph_dropped_by_enable_is_never_replayed(enabled, monkeypatch):
    """enable() and disable() drop every graph, also the one the last call used (a call like it takes it again
    without looking it up): the next call makes a new graph, whose first calls run the body (dry: replays do not)."""
    monkeypatch.setenv("RL_COMPILE_GRAPHS", "dry")
    runs = []
    f = compiling.graphed(lambda x: runs.append(1) or x * 2)
    x = torch.ones(2)
    for _ in range(compiling.WARMUP_CALLS + 2):
        f(x)
    assert len(runs) == compiling.WARMUP_CALLS + 1  # the warm-up calls and the "capture"; then replays only
    compiling.enable("cpu")
    f(x)
    assert len(runs) == compiling.WARMUP_CALLS + 2


@pytest.mark.unit
@pytest.mark.parametrize("out", [lambda x: (x * 2).sum(), lambda x: {}, lambda x: {"s": x.sum(), "m": x.mean()}])
def test_a_lone_scalar_or_an_empty_dict_is_copied_out_as_it_is(enabled, monkeypatch, out):
    """A step that returns one 0-d float tensor (a loss), no statistics, or a dict of them: its outputs come back
    with their values, in the warm-up calls and the replays alike (dry)."""
    monkeypatch.setenv("RL_COMPILE_GRAPHS", "dry")
    f = compiling.graphed(out)
    x = torch.arange(4.0)
    for _ in range(compiling.WARMUP_CALLS + 3):
        got, want = f(x), out(x)
        assert type(got) is type(want) and str(got) == str(want)


@pytest.mark.unit
def test_two_graphs_called_in_turns_each_run_their_own(enabled, monkeypatch):
    """A flag that alternates between calls (TD3's delayed actor update) picks its graph each call, also where the
    call takes it from the record of the call before the last one without a lookup; after enable() (which drops the
    graphs) neither record is replayed."""
    monkeypatch.setenv("RL_COMPILE_GRAPHS", "dry")
    runs = []
    f = compiling.graphed(lambda x, flag: runs.append(flag) or (x * 2 if flag else x * 3))
    x = torch.ones(2)
    for i in range(2 * (compiling.WARMUP_CALLS + 3)):
        flag = i % 2 == 0
        assert f(x, flag).tolist() == ([2.0, 2.0] if flag else [3.0, 3.0])
    # the warm-up calls and the "capture" of each graph ran the body; then replays only
    assert runs.count(True) == runs.count(False) == compiling.WARMUP_CALLS + 1
    compiling.enable("cpu")
    f(x, True)
    f(x, False)
    assert runs.count(True) == runs.count(False) == compiling.WARMUP_CALLS + 2


@pytest.mark.unit
def test_a_batch_uploaded_as_one_block_is_copied_in_one_copy(enabled):
    """shared.device.upload's tensors are views of one block: the graph's static inputs mirror its layout, and a
    call copies the whole batch at once (a different layout falls back to a copy per tensor)."""
    import numpy as np

    from shared.device import Uploader

    up = Uploader(torch.device("cpu"), pack=True)
    f = compiling.graphed(lambda b: {k: v * 2 for k, v in b.items()})
    rng = np.random.default_rng(0)
    batch = lambda: up(
        {"obs": rng.normal(size=(5, 3)).astype(np.float32), "action": rng.integers(0, 4, 5), "done": rng.random(5) < 0.5}
    )
    f(batch())
    copies = []
    real_copy = torch.Tensor.copy_
    try:
        torch.Tensor.copy_ = lambda self, src, non_blocking=False: copies.append(1) or real_copy(self, src)
        b = batch()
        out = f(b)
        assert copies == [1]
        assert all(torch.equal(out[k], b[k] * 2) for k in b)
        f({k: v.clone() for k, v in b.items()})  # a storage each: one copy each
        assert copies == [1, 1, 1, 1]
    finally:
        torch.Tensor.copy_ = real_copy


@pytest.mark.unit
def test_a_block_whose_first_tensor_is_not_viewable_as_bytes_is_still_one_copy(enabled):
    """The block's bytes are read through the tensor at its start, as bytes; where that one cannot be viewed as bytes
    (its last stride not 1), through its storage: still one copy, and the values of this call, not the last."""
    f = compiling.graphed(lambda a, b: (a * 2, b + 1))
    blocks = [torch.arange(24.0).view(4, 6) + 100 * i for i in range(4)]
    calls = [(blk[:2].t(), blk[3]) for blk in blocks]  # [6, 2] of strides (1, 6) first, then [6]
    for a, b in calls[:3]:
        f(a, b)
    copies = []
    real_copy = torch.Tensor.copy_
    try:
        torch.Tensor.copy_ = lambda self, src, non_blocking=False: copies.append(1) or real_copy(self, src)
        a, b = calls[3]
        out = f(a, b)
    finally:
        torch.Tensor.copy_ = real_copy
    assert copies == [1] and torch.equal(out[0], a * 2) and torch.equal(out[1], b + 1)


@pytest.mark.unit
@pytest.mark.parametrize("bytes_view", [True, False], ids=["viewable", "through-storage"])
def test_a_block_deep_in_its_storage_is_copied_from_where_it_lies(enabled, bytes_view):
    """A rollout's step t is a block that starts t steps into the rollout's storage (PPO's ``buf.obs[t]``): the one
    copy reads this call's step, from its offset, whether the tensor at its start views as bytes or not."""
    f = compiling.graphed(lambda a, b: (a * 2, b + 1))
    rollout = torch.arange(5 * 24.0).view(5, 4, 6)  # [T, ...] in one storage
    step = lambda t: (rollout[t, :2] if bytes_view else rollout[t, :2].t(), rollout[t, 3])
    for t in range(3):
        f(*step(t))
    copies = []
    real_copy = torch.Tensor.copy_
    try:
        torch.Tensor.copy_ = lambda self, src, non_blocking=False: copies.append(1) or real_copy(self, src)
        for t in (4, 3):
            a, b = step(t)
            out = f(a, b)
            assert torch.equal(out[0], a * 2) and torch.equal(out[1], b + 1), t
    finally:
        torch.Tensor.copy_ = real_copy
    assert copies == [1, 1]


@pytest.mark.unit
def test_a_block_past_its_storages_end_is_never_read_by_growing_the_storage():
    """``_bytes`` refuses bytes past the storage's end (``set_`` would silently grow it to hold them)."""
    x = torch.zeros(8)
    assert compiling._bytes(x, 28, 4) is not None and compiling._bytes(x, 28, 8) is None
    assert x.untyped_storage().nbytes() == 32


@pytest.mark.unit
def test_overlapping_data_tensors_get_static_inputs_of_their_own(enabled):
    """Two views of one storage that overlap: mirrored static inputs would overlap too, and copying the next call's
    separate tensors into them would clash."""
    f = compiling.graphed(lambda a, b: a + b)
    x = torch.arange(5.0)
    assert torch.equal(f(x[:-1], x[1:]), x[:-1] + x[1:])
    assert torch.equal(f(torch.zeros(4), torch.ones(4)), torch.ones(4))


@pytest.mark.unit
def test_a_python_value_picks_the_graph_and_too_many_graphs_is_an_error(enabled):
    calls = []
    f = compiling.graphed(lambda x, flag: calls.append(flag) or (x * 2 if flag else x))
    x = torch.ones(2)
    assert torch.equal(f(x, True), x * 2) and torch.equal(f(x, False), x)  # TD3's delayed actor: two graphs
    for i in range(compiling.MAX_GRAPHS - 2):
        f(x, float(i))
    with pytest.raises(RuntimeError, match=r"9th graph, because the argument flag \(5.0, then 99.0\) changed.*as a tensor"):
        f(x, 99.0)
    f(x, True)  # an existing graph: the error compares with the call before, not with the last graph made
    with pytest.raises(RuntimeError, match=r"9th graph, because the argument flag \(True, then 98.0\) changed"):
        f(x, 98.0)


@dataclass
class Settings:
    coef: float = 2.0
    name: str = "a"
    sizes: list = field(default_factory=lambda: [1, 2])  # unhashable: still part of the key, by value


@pytest.mark.unit
@pytest.mark.parametrize("graphs", ["1", "dry"])
def test_a_changed_setting_is_a_new_graph_whose_replays_use_it(enabled, graphs, monkeypatch):
    """``args.coef = schedule(it)`` between calls: a replay (dry: the body not run, as on CUDA) uses the new value."""
    monkeypatch.setenv("RL_COMPILE_GRAPHS", graphs)
    f = compiling.graphed(lambda x, args: x * args.coef * sum(args.sizes))
    x, args = torch.ones(2), Settings()
    for _ in range(4):
        assert torch.equal(f(x, args), x * 6)
    args.coef = 3.0
    for _ in range(4):
        assert torch.equal(f(x, args), x * 9)
    args.sizes.append(1)  # a list field changed in place
    assert torch.equal(f(x, args), x * 12)
    ns = types.SimpleNamespace(coef=1.0, sizes=[1])  # plain attributes of a simple object
    f(x, ns), f(x, ns), f(x, ns)
    ns.coef = 5.0
    assert torch.equal(f(x, ns), x * 5)


@on_cuda
@pytest.mark.parametrize("enabled", ["cuda"], indirect=True)
def test_a_changed_setting_is_a_new_captured_graph(enabled):
    f = compiling.graphed(lambda x, args: x * args.coef)
    x, args = torch.ones(2, device=enabled), Settings()
    for _ in range(4):
        assert torch.equal(f(x, args), x * 2)
    args.coef = 3.0
    for _ in range(4):
        assert torch.equal(f(x, args), x * 3)
    assert compiling.report()["cuda_graphs"] == 2


@pytest.mark.unit
def test_a_setting_changed_at_every_call_is_an_error_naming_the_field(enabled):
    f = compiling.graphed(lambda x, args: x * args.coef)
    x, args = torch.ones(2), Settings()
    for i in range(compiling.MAX_GRAPHS):
        args.coef = float(i)
        f(x, args)
    args.coef = 0.5
    with pytest.raises(RuntimeError, match=r"because Settings.coef \(7.0, then 0.5\) changed between calls.*as a tensor"):
        f(x, args)
    with pytest.raises(RuntimeError, match=r"a 9th graph"):  # the same call again: refused again, no graphless record
        f(x, args)


@dataclass
class Outer:
    inner: Settings = field(default_factory=Settings)
    w: torch.Tensor = field(default_factory=lambda: torch.ones(3))  # state: used in place, keyed by identity
    bad: float = float("nan")  # the same object at every call: unchanged


@pytest.mark.unit
def test_a_nested_setting_a_tensor_attribute_and_a_nan_are_read_as_settings(enabled, monkeypatch):
    monkeypatch.setenv("RL_COMPILE_GRAPHS", "dry")
    f = compiling.graphed(lambda x, args: x * args.inner.coef * args.w)
    x, args = torch.ones(3), Outer()
    for _ in range(4):
        assert torch.equal(f(x, args), x * 2)
    args.inner.coef = 5.0  # one level down: still a new graph
    assert torch.equal(f(x, args), x * 5)


@pytest.mark.unit
def test_a_write_outside_the_outputs_is_refused(enabled):
    """A counter in a setting, or an append to a list argument: a replay would never make it."""

    def count(x, args):
        args.coef += 1
        return x

    with pytest.raises(RuntimeError, match=r"writes Settings.coef \(2.0, then 3.0\) outside its outputs"):
        compiling.graphed(count)(torch.ones(2), Settings())
    with pytest.raises(RuntimeError, match="writes a list, tuple or dict among its arguments"):
        compiling.graphed(lambda x, stats: stats.append(x.sum()) or x)(torch.ones(2), [])

    def counter(x, d):
        d["n"] += 1
        return x

    with pytest.raises(RuntimeError, match=r"writes a list, tuple or dict among its arguments \(an append, a counter\)"):
        compiling.graphed(counter)(torch.ones(2), {"n": 0})


@pytest.mark.unit
def test_a_function_that_writes_its_data_argument_is_refused(enabled):
    """A replay would write the static copy, never the caller's tensor: refused at the first call."""

    @compiling.graphed
    def f(x):
        x.mul_(2)
        return x

    with pytest.raises(RuntimeError, match="writes its data argument"):
        f(torch.ones(2))


@pytest.mark.unit
def test_set_lr_anneals_a_number_or_a_tensor_in_place():
    net, _, opt = make_learner(torch.device("cpu"))
    compiling.set_lr(opt, 0.5)
    assert opt.param_groups[0]["lr"] == 0.5
    opt.param_groups[0]["lr"] = torch.tensor(0.1)
    t = opt.param_groups[0]["lr"]
    compiling.set_lr(opt, 0.25)
    assert opt.param_groups[0]["lr"] is t and float(t) == 0.25


@pytest.mark.unit
def test_collective_runs_at_once_outside_a_capture():
    ran = []
    compiling.collective(lambda: ran.append(1))
    assert ran == [1]


@pytest.mark.unit
def test_a_checkpoint_holds_a_portable_learning_rate():
    """A capturable optimiser with a device-tensor learning rate is saved as an eager CPU run loads it."""
    from shared.checkpoint import state_of

    net, _, opt = make_learner(torch.device("cpu"))
    opt.param_groups[0]["lr"] = torch.tensor(0.01)
    opt.param_groups[0]["capturable"] = True
    saved = state_of({"optimizer": opt})["optimizer"]
    assert saved["param_groups"][0]["lr"] == pytest.approx(0.01) and not saved["param_groups"][0]["capturable"]
    fresh = make_learner(torch.device("cpu"))[2]
    fresh.load_state_dict(saved)
    net(torch.ones(1, 4)).sum().backward()
    fresh.step()  # a capturable CPU optimiser would refuse this


# ---------------------------------------------------------------------------------------------- CUDA


@on_cuda
@pytest.mark.parametrize("enabled", ["cuda"], indirect=True)
@pytest.mark.parametrize("compile_losses", [False, True])
def test_captured_updates_agree_with_eager_over_20_updates(enabled, compile_losses):
    """Forward, backward, clipping, Adam (capturable, device learning rate) and the target update in one graph:
    eager's parameters within float rounding after 20 updates, 18 of them replays."""
    compiling.disable()
    eager, eager_stats = train(td_update, enabled)
    compiling.enable(enabled)
    graphed, graphed_stats = train(graphed_td_update, enabled, loss_fn=compiled_td_loss if compile_losses else td_loss)
    assert compiling.report()["cuda_graphs"] == 1
    for a, b in zip(eager, graphed):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    for a, b in zip(eager_stats, graphed_stats):
        torch.testing.assert_close(b["loss"], a["loss"], rtol=1e-4, atol=1e-5)


@on_cuda
@pytest.mark.parametrize("enabled", ["cuda"], indirect=True)
def test_random_draws_differ_between_replays(enabled):
    @compiling.graphed
    @compiling.compiled
    def sample(logits):
        return torch.distributions.Categorical(logits=logits, validate_args=False).sample(), torch.randn(
            1000, device=logits.device
        )

    logits = torch.zeros(4096, 6, device=enabled)
    draws = [sample(logits) for _ in range(6)]  # 2 warm-up calls, then the capture and 3 replays
    assert compiling.report()["cuda_graphs"] == 1
    for i in range(len(draws)):
        for j in range(i):
            assert not torch.equal(draws[i][0], draws[j][0]) and not torch.equal(draws[i][1], draws[j][1])
    counts = torch.bincount(torch.cat([d[0] for d in draws[2:]]), minlength=6).float()
    assert (counts / counts.sum() - 1 / 6).abs().max() < 0.02  # still uniform
    normal = torch.cat([d[1] for d in draws[2:]])
    assert abs(float(normal.mean())) < 0.1 and abs(float(normal.std()) - 1) < 0.1


@on_cuda
@pytest.mark.parametrize("enabled", ["cuda"], indirect=True)
def test_a_learning_rate_anneals_through_set_lr_and_a_replaced_one_is_an_error(enabled):
    net, target, opt = make_learner(enabled, lr=0.0)
    b = batches(1, enabled)[0]
    for _ in range(3):  # warm-up twice, then captured with lr 0: nothing moves
        graphed_td_update(net, target, opt, b, 0.9)
    before = [p.detach().clone() for p in net.parameters()]
    graphed_td_update(net, target, opt, b, 0.9)
    assert all(torch.equal(a, p) for a, p in zip(before, net.parameters()))
    compiling.set_lr(opt, 1e-2)
    graphed_td_update(net, target, opt, b, 0.9)
    assert not any(torch.equal(a, p) for a, p in zip(before, net.parameters()))
    opt.param_groups[0]["lr"] = 1e-3
    with pytest.raises(RuntimeError, match="set_lr"):
        graphed_td_update(net, target, opt, b, 0.9)


@on_cuda
@pytest.mark.parametrize("enabled", ["cuda"], indirect=True)
def test_a_collective_cuts_the_capture_and_runs_between_the_graphs(enabled):
    """What torchrun's all-reduce does inside a captured update: here a stand-in on one GPU that doubles the
    gradient between the backward graph and the optimiser's."""
    ran = []

    @compiling.graphed
    def step(w, x):
        loss = (w * x).sum()
        w.grad = None
        loss.backward()
        g = w.grad
        compiling.collective(lambda: ran.append(1) or g.mul_(2))
        with torch.no_grad():
            w.sub_(g)
        return loss.detach()

    w = torch.zeros(3, device=enabled, requires_grad=True)
    x = torch.ones(3, device=enabled)
    for _ in range(5):  # 2 eager, the capture (nothing runs) and its replay, 2 replays
        step(w, x)
    assert compiling.report()["cuda_graphs"] == 2 and len(ran) == 2 + 3
    torch.testing.assert_close(w, torch.full((3,), -10.0, device=enabled))
