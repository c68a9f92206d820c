"""algos/r2d1_atari.py under ``--compile``: torch.compile takes the torso and the heads only, the LSTM runs eagerly
between them (unrolled into one inductor graph, R2D1's 125 rows took minutes to compile), and the split computes
what the whole network's forward does, eager and compiled alike.

The compiled runs here use aot_eager (the graphs inductor would get, without generating code), through a backend
that records each graph Dynamo hands it."""

from __future__ import annotations

import copy
import sys

import pytest
import torch

from shared import compiling
from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "algos"))
import r2d1_atari as r2d1

GRAPHS: list[torch.fx.GraphModule] = []  # every graph compiled under the fixture, in order


@torch._dynamo.register_backend(name="r2d1_recording")
def recording(gm: torch.fx.GraphModule, example_inputs: list) -> object:
    GRAPHS.append(gm)
    return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


@pytest.fixture
def compiled_cpu(monkeypatch):
    """``--compile``'s protocol on the CPU in this process (strict: a recompile is an error), graphs recorded."""
    # every test here uses this backend: each @compiled function keeps the torch.compile it made first
    monkeypatch.setenv("RL_COMPILE_BACKEND", "r2d1_recording")
    monkeypatch.setenv("RL_COMPILE_STRICT", "1")
    torch._dynamo.reset()
    GRAPHS.clear()
    compiling.enable(torch.device("cpu"))
    yield GRAPHS
    compiling.disable()
    torch._dynamo.config.error_on_recompile = False
    torch._dynamo.reset()


ARGS = r2d1.Args(burn_in_steps=4, sequence_length=6, n_step_return=2, hidden=16)


def batch(B=3, seed=0) -> dict:
    """Sequences [W, B, ...] from a non-zero state, with episodes starting in the burn-in, the training rows and the
    bootstrap rows (where the state, the previous action and reward are zeroed)."""
    W = ARGS.burn_in_steps + ARGS.sequence_length + ARGS.n_step_return
    g = torch.Generator().manual_seed(seed)
    starts = torch.zeros(W, B, dtype=torch.bool)
    starts[2, 0] = starts[6, 1] = starts[10, 2] = True
    return {
        "observation": torch.randn(W, B, 2, generator=g),
        "prev_action": torch.randint(0, 2, (W, B), generator=g),
        "prev_reward": torch.randn(W, B, generator=g),
        "action": torch.randint(0, 2, (W, B), generator=g),
        "n_step_return": torch.randn(W, B, generator=g),
        "terminated_n": torch.rand(W, B, generator=g) < 0.2,
        "n_taken": torch.randint(1, ARGS.n_step_return + 1, (W, B), generator=g),
        "bootstrap_discount": torch.full((W, B), 0.9),
        "final_row": torch.rand(W, B, generator=g) < 0.1,
        "episode_start": starts,
        "is_weights": torch.rand(B, generator=g),
        "init_rnn_state": r2d1.RnnState(torch.randn(B, 16, generator=g), torch.randn(B, 16, generator=g)),
    }


def networks(seed=0) -> tuple:
    torch.manual_seed(seed)
    net = r2d1.R2D1Net((2,), 2, ARGS.hidden)
    target = r2d1.R2D1Net((2,), 2, ARGS.hidden).requires_grad_(False)  # other weights than the online net's
    return net, target


def whole_forward_loss(net, target_net, b: dict, args: r2d1.Args) -> tuple:
    """The loss as R2D1 computed it before the split: each network's forward (embed, recur and head in one call) over
    its rows, the LSTM row by row; (loss, |TD| [L, B])."""
    burn, L = args.burn_in_steps, args.sequence_length
    inputs = (b["observation"], b["prev_action"], b["prev_reward"])
    starts = b["episode_start"]
    with torch.no_grad():
        _, state = net(*(x[:burn] for x in inputs), b["init_rnn_state"], starts[:burn])
        q_target, _ = target_net(*inputs, b["init_rnn_state"], starts)
    q, _ = net(*(x[burn:] for x in inputs), state, starts[burn:])
    train = slice(burn, burn + L)
    q_taken = q[:L].gather(-1, b["action"][train].unsqueeze(-1)).squeeze(-1)
    boot_row = (torch.arange(L).unsqueeze(1) + b["n_taken"][train]).clamp(max=q.shape[0] - 1)
    a_star = q.detach().argmax(-1).gather(0, boot_row)
    q_next = q_target[burn:].gather(0, boot_row.unsqueeze(-1).expand(-1, -1, 2)).gather(-1, a_star.unsqueeze(-1))[..., 0]
    not_done = 1.0 - b["terminated_n"][train].float()
    y = r2d1.n_step_target(b["n_step_return"][train], not_done, b["bootstrap_discount"][train], q_next, args)
    valid = ~b["final_row"][train]
    td = y - q_taken
    per_seq = (0.5 * td**2 * valid).sum(0) / valid.sum(0).clamp(min=1)
    return (b["is_weights"] * per_seq).mean(), td.detach().abs()


def loss_and_grads(loss_fn, net, target, b) -> tuple:
    net.zero_grad(set_to_none=True)
    out = loss_fn(net, target, b, ARGS)
    out[0].backward()
    return out[0].detach(), out[1], {k: p.grad.clone() for k, p in net.named_parameters()}


def assert_same(got: tuple, want: tuple) -> None:
    loss, td, grads = got
    torch.testing.assert_close(loss, want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(td, want[1], rtol=1e-5, atol=1e-6)
    for k in want[2]:
        torch.testing.assert_close(grads[k], want[2][k], rtol=1e-4, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


def test_the_split_loss_is_the_whole_networks_loss():
    """Eager, with the host's start rows (the fused stretches) and without (row by row): the loss, |TD| and every
    gradient equal those of the forward in one call per network (the split takes the right rows and states)."""
    net, target = networks()
    b = batch()
    want = loss_and_grads(whole_forward_loss, net, target, b)
    assert_same(loss_and_grads(r2d1.r2d1_loss, net, target, b), want)
    rows = {**b, "start_rows": b["episode_start"].any(1).numpy()}
    assert_same(loss_and_grads(r2d1.r2d1_loss, net, target, rows), want)
    assert want[2]["core.weight_hh_l0"].abs().sum() > 0  # the recurrence is in the gradient


def test_compiled_loss_and_acting_step_hold_no_recurrence_and_compute_what_eager_does(compiled_cpu):
    """Under --compile: the update's two graphs (torso, heads and loss) and the acting step's two (torso, heads) read
    none of the LSTM's weights and hold none of its gates (R2D1's torso and heads use ReLU only); the loss, |TD| and
    gradients equal the whole forward's, and the acting step's outputs eager's; a second call compiles nothing."""
    net, target = networks()
    b = batch()
    assert_same(loss_and_grads(r2d1.r2d1_loss, net, target, b), loss_and_grads(whole_forward_loss, net, target, b))
    assert compiling.report()["compiled_graphs"] == 2
    g = torch.Generator().manual_seed(2)
    up = {
        "obs": torch.randn(3, 2, generator=g),
        "prev_action": torch.tensor([0, 1, 1]),
        "prev_reward": torch.randn(3, generator=g),
        "episode_start": torch.tensor([False, True, False]),
    }
    state = r2d1.RnnState(torch.randn(3, 16, generator=g), torch.randn(3, 16, generator=g))
    with torch.no_grad():
        acted = r2d1.q_step(net, up, state)
        compiling.disable()  # the same step as written: the reference
        eager = r2d1.q_step(net, up, state)
    flat = lambda q, state, new: (q, state.h, state.c, new.h, new.c)  # RnnState indexes its fields, not itself
    torch.testing.assert_close(flat(*acted), flat(*eager))
    assert len(compiled_cpu) == 4  # loss: 2, acting step: 2 (a recompile would have been an error)
    for gm in compiled_cpu:
        inputs = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        ops = [str(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
        assert not [name for name in inputs if "core" in name], inputs  # the LSTM's weights: read eagerly only
        assert not [op for op in ops if "sigmoid" in op or "tanh" in op], ops  # no LSTM cell unrolled in a graph


def test_the_compiled_update_steps_as_eager_does(compiled_cpu):
    """Two gradient steps through r2d1_step (the update's @graphed protocol on the CPU): the same losses and
    parameters as eager's steps from the same networks, and no recompile at the second."""
    net, target = networks()
    twin, twin_target = copy.deepcopy(net), copy.deepcopy(target)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-3)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-3, eps=1e-3)
    steps = [batch(seed=s) for s in (0, 1)]
    compiled_losses = [r2d1.r2d1_step(net, target, opt, b, ARGS)[0] for b in steps]
    assert compiling.report()["compiled_graphs"] == 2
    compiling.disable()
    eager_losses = [r2d1.r2d1_step(twin, twin_target, twin_opt, b, ARGS)[0] for b in steps]
    torch.testing.assert_close(torch.stack(compiled_losses), torch.stack(eager_losses), rtol=1e-5, atol=1e-6)
    for (k, p), q in zip(net.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
