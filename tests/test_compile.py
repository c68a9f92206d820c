"""``--compile`` (shared/compiling.py): every script's acting step and update loss compile whole (fullgraph), never
recompile after the first iterations (rows, evaluations and checkpoints in between), and learn what eager learns.

The script runs use ``aot_eager``: the graphs inductor would compile, forward and backward, traced the same way
(a graph break or recompile shows there too) without generating code, which takes minutes on a CPU. Inductor's
own numerics are the slow tier's."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest
import torch

from shared import compiling
from tests.helpers import ROOT, refusal
from tests.test_syncs import COMMON, RUNS

# test_syncs' short runs, less what --compile refuses (the noisy layers' torch.Generator breaks a graph).
FLAGS = {script: [f for f in flags if f != "--noisy"] for script, flags in RUNS.items()}
# The @compiled functions each script calls in these runs: the acting step and the losses (SAC: critic, actor,
# temperature; TD3 and DDPG: critic, actor), one graph each.
GRAPHS = {"sac_mujoco": 4, "td3_mujoco": 3, "ddpg_mujoco": 3, "r2d1_atari": 4}  # R2D1: embed and loss, embed and q
# CI runs one on-policy and one replay script (30 minutes); the others are the slow tier's. ppo_lstm's compiled
# loss (the weighted minibatch) stays in CI in-process: test_rows_of_weight_zero_... and test_lstm_rows_compiles_whole.
CI = {"ppo_atari", "dqn_atari"}  # the other eight with the slow tests, for CI's 30 minutes
SCRIPTS = [s if s in CI else pytest.param(s, marks=pytest.mark.slow) for s in FLAGS]
STRICT = {"RL_COMPILE_BACKEND": "aot_eager", "RL_COMPILE_STRICT": "1"}


def run_script(script: str, out_dir, name: str, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "algos" / f"{script}.py"),
            *FLAGS[script],
            *COMMON,
            *flags,
            "--out-dir",
            str(out_dir),
            "--run-name",
            name,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def rows(path) -> list[dict]:
    with open(path / "progress.csv") as f:
        return list(csv.DictReader(f))


def parameters(path) -> dict[str, torch.Tensor]:
    """Every floating tensor of the checkpoint's modules, by name."""
    state = torch.load(path / "checkpoint.pt", map_location="cpu", weights_only=False)
    out = {}
    for obj, value in state.items():
        if isinstance(value, dict):
            out.update({f"{obj}.{k}": v for k, v in value.items() if isinstance(v, torch.Tensor) and v.is_floating_point()})
    return out


@pytest.mark.parametrize("script", SCRIPTS)
def test_compiled_run_has_no_graph_break_or_recompile_and_agrees_with_eager(script, tmp_path):
    compiled = run_script(script, tmp_path, "compiled", "--compile", env=STRICT)
    assert compiled.returncode == 0, compiled.stderr[-3000:]  # a graph break or recompile is an error here
    assert "compiled (aot_eager)" in compiled.stdout
    # Strict mode made any recompile an error; a count grows only by a first compile (a replay script's loss after
    # --min-steps-learn).
    counts = [int(r["compiled_graphs"]) for r in rows(tmp_path / "compiled")]
    assert counts == sorted(counts) and counts[-1] == GRAPHS.get(script, 2), counts
    config = json.loads((tmp_path / "compiled" / "config.json").read_text())
    assert config["args"]["compile"] is True and config["compile"]["compiled_graphs"] == counts[-1]
    assert config["compile"]["compile_s"] > 0
    eager = run_script(script, tmp_path, "eager")
    assert eager.returncode == 0, eager.stderr[-3000:]
    assert "compiled_graphs" not in rows(tmp_path / "eager")[0]
    # The same updates from the same state: parameters equal within float tolerance (the compiled kernels round
    # differently; eager and compiled take the one minibatch path).
    a, b = parameters(tmp_path / "eager"), parameters(tmp_path / "compiled")
    assert a.keys() == b.keys() and a
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{script} {k}: {m}")


@pytest.mark.parametrize("script", ["ppo_atari", pytest.param("a2c_atari", marks=pytest.mark.slow)])
def test_an_env_with_action_masks_compiles_once(script, tmp_path):
    """Masks that are all True at some steps and not at others: the compiled step always takes the mask (an all-True
    mask changes no logit), so one graph serves both."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "algos" / f"{script}.py"),
            "--env-id",
            "tests.masked_env:MaskedChoice-v0",
            "--num-envs",
            "4",
            "--num-steps",
            "16",
            "--total-timesteps",
            "256",
            "--eval-episodes",
            "1",
            "--compile",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            "r",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **STRICT},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(rows(tmp_path / "r")[-1]["compiled_graphs"]) == 2


@pytest.mark.parametrize(
    "script, flags",
    [
        ("ppo_atari", ["--sampler", "async"]),
        pytest.param("dqn_atari", ["--sampler", "async", "--max-lag-steps", "400"], marks=pytest.mark.slow),
    ],
)
def test_async_compiles_the_learner_and_samples_eagerly(script, flags, tmp_path):
    """A CPU learner's sampler process acts eagerly on the CPU (it never calls enable): the learner's loss is the one
    graph."""
    out = run_script(script, tmp_path, "r", "--compile", *flags, env=STRICT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(rows(tmp_path / "r")[-1]["compiled_graphs"]) == 1


@pytest.mark.slow
def test_two_ranks_compile_alike_and_average_eager_gradients(tmp_path):
    """torchrun: each rank compiles its own graphs; the all-reduce between backward and step stays eager. The
    ranks' parameters stay equal (shared.distributed checks it at every row) and the run ends 0."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "algos" / "ppo_atari.py"),
        *FLAGS["ppo_atari"],
        *COMMON,
        "--compile",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, **STRICT})
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(rows(tmp_path / "r")[-1]["compiled_graphs"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("script", list(FLAGS))
def test_inductor_learns_what_eager_learns(script, tmp_path):
    """Inductor's generated code (minutes of compiling on a CPU), drawing eager's random numbers, against eager.
    Its fused kernels round differently, and Adam turns a rounding difference in a near-zero gradient into up to a
    step of the learning rate, over a hundred updates or more: a few weights move apart (SAC: 2 of 65,536 by
    1e-2), so the check is each tensor's mean difference, which a wrong loss term would move far more."""
    env = {**STRICT, "RL_COMPILE_BACKEND": "inductor", "RL_COMPILE_EAGER_RANDOM": "1"}
    compiled = run_script(script, tmp_path, "compiled", "--compile", env=env)
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    eager = run_script(script, tmp_path, "eager")
    assert eager.returncode == 0, eager.stderr[-3000:]
    a, b = parameters(tmp_path / "eager"), parameters(tmp_path / "compiled")
    for k in a:
        assert (b[k] - a[k]).abs().mean() <= 1e-3 * (1 + a[k].abs().mean()), f"{script} {k}"


@pytest.mark.slow  # CI's 30 minutes: the compiled runs above agree with eager ones in CI, step by step
def test_compiled_ppo_learns_cartpole(tmp_path):
    """Inductor's generated code, learning: PPO's CartPole preset reaches 450 within 150k steps, as eager does in
    tests/test_ppo.py (its random draws are inductor's own, so the run differs from eager's)."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "algos" / "ppo_atari.py"),
            "--preset",
            "cartpole",
            "--compile",
            "--total-timesteps",
            "150000",
            "--stop-at-return",
            "450",
            "--eval-episodes",
            "0",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            "r",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "RL_COMPILE_STRICT": "1", "RL_COMPILE_BACKEND": "inductor"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "mean return of the last 20 episodes" in out.stdout, out.stdout[-2000:]
    assert int(rows(tmp_path / "r")[-1]["compiled_graphs"]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("script, preset", [("ppo_lstm", "cartpole"), ("r2d1_atari", "memory")])
def test_eval_only_with_compile_plays_the_checkpoint(script, preset, tmp_path):
    """--eval-only --compile: the evaluation policy acts eagerly (the recurrent ones through the row-by-row LSTM)."""
    first = run_script(script, tmp_path, "r", "--compile", env=STRICT)
    assert first.returncode == 0, first.stderr[-3000:]
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "algos" / f"{script}.py"),
            "--preset",
            preset,
            "--resume",
            str(tmp_path / "r"),
            "--eval-only",
            "--compile",
            "--eval-episodes",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **STRICT},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "evaluation over 2 episodes" in out.stdout


@pytest.mark.slow  # CI's 30 minutes: the compiled functions take the modules as arguments, so no state of
# torch.compile can reach a checkpoint (the compiled runs above, in CI, checkpoint and agree with eager)
def test_resume_across_eager_and_compiled(tmp_path):
    """A compiled run's checkpoint resumes in eager and an eager one compiled: the checkpoint is the same either way
    (the compiled functions take the modules as arguments; nothing of torch.compile is in the state)."""
    first = run_script("ppo_atari", tmp_path, "r", "--compile", env=STRICT)
    assert first.returncode == 0, first.stderr[-3000:]
    resume = [sys.executable, str(ROOT / "algos" / "ppo_atari.py"), "--preset", "cartpole", "--resume", str(tmp_path / "r")]
    eager = subprocess.run([*resume, "--total-timesteps", "2048"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert eager.returncode == 0, eager.stderr[-3000:]
    again = subprocess.run(
        [*resume, "--total-timesteps", "3072", "--compile"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **STRICT},
    )
    assert again.returncode == 0, again.stderr[-3000:]
    steps = [int(r["global_step"]) for r in rows(tmp_path / "r")]
    assert steps[-1] == 3072 and steps == sorted(steps)


@pytest.fixture
def strict_aot_eager(monkeypatch):
    monkeypatch.setenv("RL_COMPILE_BACKEND", "aot_eager")
    monkeypatch.setenv("RL_COMPILE_STRICT", "1")
    torch._dynamo.reset()
    compiling.enable(torch.device("cpu"))
    yield
    compiling.disable()
    torch._dynamo.config.error_on_recompile = False
    torch._dynamo.reset()


def test_a_graph_break_is_an_error(strict_aot_eager):
    @compiling.compiled
    def branches_on_a_value(x):
        return x if x.sum() > 0 else -x  # a Python branch on a tensor's value: the graph must break

    with pytest.raises(Exception, match="[Dd]ata-dependent|graph break|Unsupported"):
        branches_on_a_value(torch.ones(3))


def test_a_recompile_is_counted_and_strict_mode_refuses_it(strict_aot_eager):
    @compiling.compiled
    def loss(w, x):
        return (w * x).pow(2).mean()

    w = torch.ones(4, requires_grad=True)
    loss(w, torch.ones(8, 4)).backward()
    loss(w, torch.ones(8, 4)).backward()  # the same shapes: no new graph
    assert compiling.report()["compiled_graphs"] == 1 and w.grad is not None
    with pytest.raises(Exception, match="Recompil"):
        loss(w, torch.ones(6, 4))  # a new shape: a recompile


def test_the_report_counts_captured_cuda_graphs_on_cuda_only(strict_aot_eager):
    """Rows and config.json carry ``cuda_graphs`` on CUDA (shared.compiling.graphed's captures), not on the CPU."""
    assert "cuda_graphs" not in compiling.report()  # on the CPU nothing is captured
    # set, not monkeypatched: the fixture's disable() clears it
    compiling._state["device"] = torch.device("cuda")
    assert compiling.report()["cuda_graphs"] == 0  # counted from enable()


@pytest.mark.parametrize("script", ["dqn_atari.py", "catdqn_atari.py"])
def test_compile_refuses_noisy_layers(script):
    assert refusal(script, "--preset", "cartpole", "--compile", "--noisy") == [
        "error: --compile: the --noisy layers draw from a torch.Generator, which it cannot trace"
    ]


def test_without_enable_a_compiled_function_is_the_function_itself():
    @compiling.compiled
    def f(x):
        return x.sum().item()  # would break a graph: eager runs it as written

    assert not compiling.enabled() and f(torch.ones(3)) == 3.0


@pytest.mark.parametrize("seed", range(3))
def test_lstm_rows_is_the_fused_lstm_with_the_state_zeroed_where_episodes_start(seed):
    from shared.rnn import lstm_rows

    g = torch.Generator().manual_seed(seed)
    lstm = torch.nn.LSTM(5, 7)
    T, B = 9, 4
    x = torch.randn(T, B, 5, generator=g)
    h, c = torch.randn(1, B, 7, generator=g), torch.randn(1, B, 7, generator=g)
    keep = (torch.rand(T, B, 1, generator=g) > 0.3).float()
    outs, hs, cs = [], h, c
    for t in range(T):  # the reference: the fused LSTM one row at a time
        o, (hs, cs) = lstm(x[t : t + 1], (hs * keep[t], cs * keep[t]))
        outs.append(o)
    out, (h2, c2) = lstm_rows(lstm, x, h, c, keep)
    torch.testing.assert_close(out, torch.cat(outs))
    torch.testing.assert_close((h2, c2), (hs, cs))


def test_lstm_rows_compiles_whole(strict_aot_eager):
    from shared.rnn import lstm_rows

    lstm = torch.nn.LSTM(3, 4)
    step = compiling.compiled(lambda x, h, c, keep: lstm_rows(lstm, x, h, c, keep)[0].sum())
    step(torch.randn(5, 2, 3), torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.ones(5, 2, 1)).backward()
    assert compiling.report()["compiled_graphs"] == 1 and lstm.weight_hh_l0.grad is not None


def test_lstm_stretches_traced_steps_row_by_row_whatever_start_rows_it_is_given(strict_aot_eager):
    """Where Dynamo traces, the stretches of a given ``start_rows`` are never baked into the graph: the rows are
    stepped one by one (a fused LSTM there breaks the full graph, which --compile refuses)."""
    import numpy as np

    from shared.rnn import lstm_stretches

    lstm = torch.nn.LSTM(3, 4)
    start_rows = np.array([False, False, True, False, False])
    step = compiling.compiled(lambda x, h, c, keep: lstm_stretches(lstm, x, h, c, keep, start_rows)[0].sum())
    step(torch.randn(5, 2, 3), torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.ones(5, 2, 1)).backward()
    assert compiling.report()["compiled_graphs"] == 1 and lstm.weight_hh_l0.grad is not None


def test_rows_of_weight_zero_change_neither_the_ppo_loss_nor_its_gradients():
    """ppo_atari's one minibatch path (eager and --compile alike): a minibatch's final rows, weighted 0, against the
    rows of weight 1 alone: the same loss, statistics and gradients; and the advantages' weighted mean and standard
    deviation are those of the rows of weight 1."""
    sys.path.insert(0, str(ROOT / "algos"))
    import ppo_atari

    from shared import distributed

    torch.manual_seed(0)
    agent = ppo_atari.Agent((4,), 3)
    args = ppo_atari.Args(clip_vloss=True)
    n = 16
    data = {
        "obs": torch.randn(n, 4),
        "mask": torch.rand(n, 3) > 0.2,
        "action": torch.randint(0, 3, (n,)),
        "logprob": torch.randn(n) - 1.0,
        "ret": torch.randn(n),
        "value": torch.randn(n),
        "adv": torch.randn(n),
        "weight": (torch.rand(n) > 0.3).float(),
    }
    data["mask"][torch.arange(n), data["action"]] = True  # the action taken was allowed
    valid = data["weight"].bool()

    def loss_and_grads(mb):
        agent.zero_grad()
        loss, stats = ppo_atari.ppo_loss(agent, mb, args)
        loss.backward()
        return loss, stats, [p.grad.clone() for p in agent.parameters()]

    plain = loss_and_grads({k: v[valid] for k, v in data.items()})
    weighted = loss_and_grads(data)
    assert 0 < int(valid.sum()) < n
    for a, b in zip(plain, weighted):
        torch.testing.assert_close(b, a)
    torch.testing.assert_close(distributed.mean_std(data["adv"], data["weight"]), distributed.mean_std(data["adv"][valid]))


@pytest.mark.parametrize("sampler", ["serial", "async"])
def test_a2c_rows_of_weight_zero_change_neither_its_loss_nor_its_gradients(sampler):
    """a2c's one path (eager and --compile alike): every row of the rollout, the final ones weighted 0, against the rows
    of weight 1 alone: the same loss, statistics and gradients; with masks and the async importance weight."""
    sys.path.insert(0, str(ROOT / "algos"))
    import a2c_atari

    torch.manual_seed(0)
    agent = a2c_atari.Agent((4,), 3)
    args = a2c_atari.Args(sampler=sampler)
    n = 24
    data = {
        "obs": torch.randn(n, 4),
        "mask": torch.rand(n, 3) > 0.2,
        "action": torch.randint(0, 3, (n,)),
        "logprob": torch.randn(n) - 1.0,
        "adv": torch.randn(n),
        "ret": torch.randn(n),
        "weight": (torch.rand(n) > 0.3).float(),
    }
    data["mask"][torch.arange(n), data["action"]] = True  # the action taken was allowed
    valid = data["weight"].bool()

    def loss_and_grads(data):
        agent.zero_grad()
        loss, stats = a2c_atari.a2c_loss(agent, data, args)
        loss.backward()
        return loss, stats, [p.grad.clone() for p in agent.parameters()]

    plain = loss_and_grads({k: v[valid] for k, v in data.items()})
    weighted = loss_and_grads(data)
    assert 0 < int(valid.sum()) < n
    for a, b in zip(plain, weighted):
        torch.testing.assert_close(b, a)
