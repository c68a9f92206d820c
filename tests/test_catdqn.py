"""algos/catdqn_atari.py: the projection against a per-atom loop, noisy layers against their definition (dqn_atari's
copy too), the atari100k preset against the published configuration, learning on CartPole, Atari smoke runs with
resume (the noise generator's state included), bad arguments."""

from __future__ import annotations

import importlib.util
import math
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.evaluation import Draws
from tests import loop_order
from tests.helpers import ROOT, progress, refusal, run, spaces

sys.path.insert(0, str(ROOT / "algos"))
import catdqn_atari
import dqn_atari

CARTPOLE = ["--preset", "cartpole", "--eval-episodes", "0"]  # the learning test below is the preset's test


def project_by_loop(p, r, d, z):
    """Per sample, per atom: move mass p_j to r + d z_j, clipped, split between the neighbouring atoms."""
    N, K = p.shape
    v_min, v_max = z[0], z[-1]
    dz = (v_max - v_min) / (K - 1)
    m = np.zeros((N, K))
    for i in range(N):
        for j in range(K):
            tz = min(max(r[i] + d[i] * z[j], v_min), v_max)
            b = (tz - v_min) / dz
            lo, hi = int(np.floor(b)), int(np.ceil(b))
            if lo == hi:
                m[i, lo] += p[i, j]
            else:
                m[i, lo] += p[i, j] * (hi - b)
                m[i, hi] += p[i, j] * (b - lo)
    return m


@settings(max_examples=40, deadline=None)
@given(K=st.integers(2, 21), N=st.integers(1, 6), seed=st.integers(0, 2**31), on_grid=st.booleans(), terminal=st.booleans())
def test_projection_matches_a_per_atom_loop(K, N, seed, on_grid, terminal):
    rng = np.random.default_rng(seed)
    z = np.linspace(-5.0, 5.0, K)
    p = rng.dirichlet(np.ones(K), N)
    # Rewards past both ends, inside, and (on_grid) exactly on atoms with discount 1: every branch of the split.
    r = rng.choice(z, N) if on_grid else rng.uniform(-12, 12, N)
    d = np.zeros(N) if terminal else (np.ones(N) if on_grid else rng.uniform(0, 1, N))
    got = catdqn_atari.project(torch.tensor(p, dtype=torch.float64), torch.tensor(r), torch.tensor(d), torch.tensor(z))
    expected = project_by_loop(p, r, d, z)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-9)
    np.testing.assert_allclose(got.sum(1).numpy(), 1.0, atol=1e-9)  # no mass lost


def test_terminal_target_puts_all_mass_at_the_return():
    z = torch.linspace(0, 10, 11)
    m = catdqn_atari.project(torch.full((1, 11), 1 / 11), torch.tensor([3.0]), torch.tensor([0.0]), z)
    assert m[0, 3].item() == pytest.approx(1.0)


# With the slow tests, for CI's 30 minutes (C51 CartPole is re-measured by benchmarks/checks/recheck_learning.py: 500.0
# over 3 seeds); the distributional loss and projection are checked against a reference in CI.
# host_path "cuda": CUDA's host path on this CPU, the batches drawn from the replay's mirror on the "device".
@pytest.mark.slow
@pytest.mark.parametrize(
    "noisy, host_path", [([], ""), (["--noisy"], ""), ([], "cuda")], ids=["epsilon-greedy", "noisy", "device-mirror"]
)
def test_c51_learns_cartpole_serial(noisy, host_path, tmp_path):
    out = run(
        "catdqn_atari.py",
        *CARTPOLE,
        *noisy,
        "--total-timesteps",
        "100000",
        "--stop-at-return",
        "475",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=500,
        env={"RL_HOST_PATH": host_path},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"mean return of the last 20 episodes ([\d.]+) >= 475.0 at step (\d+)", out.stdout)
    assert m and int(m.group(2)) <= 100_000, out.stdout[-2000:]


# With the slow tests (dqn_atari.py's sampler code, tested there; the atari100k preset's smoke keeps C51 on Atari
# in CI, for its 30 minutes).
@pytest.mark.parametrize(
    "sampler",
    [
        pytest.param("serial", marks=pytest.mark.slow),
        pytest.param("parallel", marks=pytest.mark.slow),
        pytest.param("async", marks=pytest.mark.slow),
    ],
)
def test_atari_smoke_small_buffer_checkpoint_and_resume(sampler, tmp_path):
    common = [
        "--num-envs",
        "4",
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
        "--double-dqn",
        "--dueling",
        "--prioritized",
        "--n-step-return",
        "3",
    ]
    out = run(
        "catdqn_atari.py", *common, "--total-timesteps", "400", "--out-dir", str(tmp_path), "--run-name", "a", timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "a"
    assert [int(r["global_step"]) for r in progress(run_dir)] == [200, 400]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    net = catdqn_atari.QNetwork((4, 84, 84), 4, dueling=True, support=torch.linspace(-10, 10, 51))
    net.load_state_dict(ckpt["model"])
    out = run("catdqn_atari.py", *common, "--total-timesteps", "600", "--resume", str(run_dir), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [int(r["global_step"]) for r in progress(run_dir)] == [200, 400, 600]


BAD_ARGUMENTS = [
    (["--n-atoms", "1"], "--n-atoms"),
    (["--v-min", "5", "--v-max", "5"], "--v-min"),
    (["--sampler", "x"], "--sampler"),
]


@pytest.mark.parametrize("bad, words", BAD_ARGUMENTS)
def test_bad_arguments_exit_2(bad, words, tmp_path):
    lines = refusal("catdqn_atari.py", *bad, "--out-dir", str(tmp_path))  # in this process, before run.setup()
    assert len(lines) == 1 and words in lines[0], lines


def test_a_bad_argument_exits_2_from_the_command_line(tmp_path):
    """One case end to end: the process's exit code and its whole stderr."""
    bad, words = BAD_ARGUMENTS[1]
    out = run("catdqn_atari.py", *bad, "--out-dir", str(tmp_path), timeout=60)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], out.stderr


# ---------------------------------------------------------------------------------------------- noisy nets


# The layer is in both scripts (each file whole): both copies are checked against the definition.
BOTH = pytest.mark.parametrize("script", [catdqn_atari, dqn_atari], ids=["catdqn", "dqn"])


@BOTH
def test_noisy_layer_output_has_the_definitions_mean_and_variance(script):
    """y_i = sum_j (w_ij + s_ij f(a_i) f(b_j)) x_j + c_i + t_i f(a_i), f(e) = sign(e) sqrt|e|, a, b ~ N(0, 1):
    E[y] = w x + c, Var[y_i] = E|e| (E|e| sum_j s_ij^2 x_j^2 + t_i^2) with E|e| = sqrt(2 / pi)."""
    torch.manual_seed(0)
    layer = script.NoisyLinear(5, 3, sigma_0=0.5)
    with torch.no_grad():  # scales of different sizes, so that a wrong index shows
        layer.weight_sigma.copy_(torch.rand(3, 5) + 0.2)
        layer.bias_sigma.copy_(torch.rand(3) + 0.2)
    x = torch.tensor([[0.5, -1.0, 2.0, 0.0, 1.5]])
    gen = torch.Generator().manual_seed(1)
    n = 40_000
    with torch.no_grad():
        y = torch.cat([layer(x, gen) for _ in range(n)]).double()  # [n, 3]: one draw per call
        mean = layer(x, None)[0].double()
        e_abs = math.sqrt(2 / math.pi)
        var = e_abs * (e_abs * (layer.weight_sigma.double() ** 2 * x.double() ** 2).sum(1) + layer.bias_sigma.double() ** 2)
    assert torch.allclose(mean, (layer.weight @ x[0] + layer.bias).double())
    assert torch.all((y.mean(0) - mean).abs() < 5 * (var / n).sqrt()), (y.mean(0), mean)
    assert torch.allclose(y.var(0), var, rtol=0.05), (y.var(0), var)


@BOTH
def test_noisy_layer_noise_is_factorised_and_shared_by_the_batch(script):
    """Probing one call with the unit vectors reads its weight noise: sigma_w * outer(f_out, f_in), rank one, with
    the bias noise f_out as its column factor; every row of the batch sees the same draw."""
    torch.manual_seed(0)
    p, q = 6, 4
    layer = script.NoisyLinear(p, q, sigma_0=0.5)
    x = torch.cat([torch.zeros(1, p), torch.eye(p), torch.eye(p)])  # [1 + 2p, p]
    with torch.no_grad():
        y = layer(x, torch.Generator().manual_seed(3))
        bias_noise = (y[0] - layer.bias) / layer.bias_sigma  # f_out [q]
        w_noise = (y[1 : p + 1] - y[0]).T - layer.weight  # [q, p]: column j from unit vector j
        eps = w_noise / layer.weight_sigma
    assert torch.allclose(y[1 : p + 1], y[p + 1 :])  # the same noise for every row
    assert torch.linalg.matrix_rank(eps, atol=1e-5) == 1
    f_in = eps / bias_noise[:, None]  # each row is f_in when eps = outer(f_out, f_in)
    assert torch.allclose(f_in, f_in[0].expand_as(f_in), atol=1e-5)
    # f(e) = sign(e) sqrt|e| of standard normals: f_out and f_in are the draws' transforms, not the draws
    g = torch.Generator().manual_seed(3)
    e = torch.randn(p + q, generator=g)
    f = e.sign() * e.abs().sqrt()
    assert torch.allclose(f_in[0], f[:p], atol=1e-5) and torch.allclose(bias_noise, f[p:], atol=1e-5)


def test_noisy_network_draws_anew_each_call_and_evaluates_with_the_mean_weights():
    torch.manual_seed(0)
    net = catdqn_atari.QNetwork((4, 84, 84), 5, True, torch.linspace(-10, 10, 51), "data-efficient", 0.1)
    assert {n for n, _ in net.named_parameters() if "sigma" in n} == {
        "q.0.weight_sigma",
        "q.0.bias_sigma",
        "q.2.weight_sigma",
        "q.2.bias_sigma",
        "v.0.weight_sigma",
        "v.0.bias_sigma",
        "v.2.weight_sigma",
        "v.2.bias_sigma",
    }
    assert net.torso(torch.zeros(1, 4, 84, 84)).shape == (1, 64 * 3 * 3)
    assert net.q[0].weight_sigma.flatten()[0].item() == pytest.approx(0.1 / math.sqrt(576))
    obs = torch.randint(0, 255, (2, 4, 84, 84), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        a, b = net.q_values(obs, gen), net.q_values(obs, gen)
        assert not torch.allclose(a, b)
        assert torch.equal(net.q_values(obs), net.q_values(obs, None))
    args = catdqn_atari.Args(noisy=True, num_envs=3, eps_start=0.5, eps_end=0.5, min_steps_learn=100)
    assert np.all(catdqn_atari.epsilons(args, 99) == 1)  # uniform actions fill the replay
    assert np.all(catdqn_atari.epsilons(args, 100) == 0)  # then the noise explores
    args.noisy_epsilon = 0.01  # Dopamine's DER: epsilon-greedy beside the noise
    assert np.all(catdqn_atari.epsilons(args, 99) == 1) and np.all(catdqn_atari.epsilons(args, 100) == 0.01)
    loud = catdqn_atari.QNetwork((4, 84, 84), 5, True, torch.linspace(-10, 10, 51), "data-efficient", 50.0)
    policy = catdqn_atari.Policy(loud)
    acts = {tuple(catdqn_atari.act(policy, torch.device("cpu"), 0.0, obs.numpy(), Draws(2))) for _ in range(20)}
    assert len(acts) == 1  # evaluation: the mean weights, the same actions every time (however loud the noise)


# Data-efficient Rainbow as published: van Hasselt, Hessel and Aslanides (2019), appendix table, and Dopamine's
# labs/atari_100k/configs/DER.gin (where they agree; the preset's comment says where they differ); the protocol of
# the Atari 100k benchmark (Kaiser et al. 2019).
DER = dict(
    network="data-efficient",
    noisy=True,
    noisy_sigma=0.1,
    noisy_epsilon=0.0,
    dueling=True,
    double_dqn=True,
    prioritized=True,
    n_atoms=51,
    v_min=-10.0,
    v_max=10.0,
    gamma=0.99,
    n_step_return=20,
    batch_size=32,
    learning_rate=1e-4,
    adam_epsilon=1.5e-4,
    optimizer="adam",
    max_grad_norm=10.0,
    min_steps_learn=1600,
    target_update_interval=2000,
    alpha=0.5,
    beta=0.4,
    total_timesteps=100_000,
    num_envs=1,
    buffer_size=100_000,
    sticky_actions=0.0,
    life_loss_terminal=True,
    clip_rewards=True,
    noop_max=30,
    eval_episodes=100,
    eval_epsilon=0.001,
)


def test_atari100k_preset_is_the_published_configuration():
    preset = catdqn_atari.PRESETS["atari100k"]
    assert {k: getattr(preset, k) for k in DER} == DER
    assert preset.replay_ratio / preset.batch_size == 1  # one update per agent step
    assert preset.env_id.endswith("NoFrameskip-v4")  # action repeat 4, 108k-frame episodes: shared/atari.py
    assert catdqn_atari.PRESETS["atari"].network == "nature" and not catdqn_atari.PRESETS["atari"].noisy


PRESET_SMOKE = [
    "--preset",
    "atari100k",
    "--env-id",
    "PongNoFrameskip-v4",
    "--min-steps-learn",
    "100",
    "--buffer-size",
    "1000",
    "--log-every",
    "100",
    "--eval-episodes",
    "0",
    "--target-update-interval",
    "100",
]


@pytest.mark.parametrize(
    "sampler", ["serial", pytest.param("parallel", marks=pytest.mark.slow), pytest.param("async", marks=pytest.mark.slow)]
)
def test_atari100k_preset_smoke(sampler, tmp_path):
    out = run(
        "catdqn_atari.py",
        *PRESET_SMOKE,
        "--sampler",
        sampler,
        "--total-timesteps",
        "300",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "a",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = progress(tmp_path / "a")
    # async: a row when the learner sees a multiple of 100 pass; one poll can see two pass (a loaded machine: [100,
    # 300]), and then writes one row
    steps = [int(r["global_step"]) for r in rows]
    assert (
        steps == [100, 200, 300]
        if sampler != "async"
        else (2 <= len(steps) <= 3 and steps == sorted(set(steps)) and steps[-1] == 300)
    ), steps
    # One update per step from step 100 in this process, launched before the step's envs: the 200th would come with a
    # 301st step (the run ends first; a resume with its saved replay makes it first, one that refills the replay does
    # not). The async learner trails its sampler (up to --max-lag-steps 1000 behind, more than this run is long).
    updates = int(rows[-1]["updates"])
    assert float(rows[-1]["epsilon"]) == 0.0 and (updates == 199 if sampler != "async" else updates >= 1), updates
    assert "noise" in torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)


@pytest.mark.slow  # 23 s; dqn's noisy resume test keeps the noise state in CI
def test_resume_with_the_replay_restores_the_noise_generator(tmp_path):
    """Two resumes from one checkpoint are identical (serial runs are deterministic); one from a copy whose noise
    state was replaced differs: the resumed run draws from the checkpoint's generator, not a reseeded one."""
    flags = [
        "--preset",
        "cartpole",
        "--noisy",
        "--min-steps-learn",
        "200",
        "--log-every",
        "200",
        "--eval-episodes",
        "0",
        "--save-replay",
        "--buffer-size",
        "2000",
    ]
    out = run(
        "catdqn_atari.py", *flags, "--total-timesteps", "400", "--out-dir", str(tmp_path), "--run-name", "a", timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    ckpt = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=True)
    fresh = torch.Generator().manual_seed(1 + 7_919).get_state()  # the default --seed 1
    assert not torch.equal(ckpt["noise"], fresh)  # it advanced with the run
    for name in ("b", "c", "d"):
        shutil.copytree(tmp_path / "a", tmp_path / name)
    other = dict(ckpt, noise=torch.Generator().manual_seed(12345).get_state())
    torch.save(other, tmp_path / "d" / "checkpoint.pt")
    models = {}
    for name in ("b", "c", "d"):
        out = run("catdqn_atari.py", *flags, "--total-timesteps", "600", "--resume", str(tmp_path / name), timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "restored the replay:" in out.stdout, out.stdout[-2000:]
        models[name] = torch.load(tmp_path / name / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(models["b"][k], models["c"][k]) for k in models["b"])
    assert not all(torch.equal(models["b"][k], models["d"][k]) for k in models["b"])


@pytest.fixture
def replaced_network():
    """catdqn_atari.py with its network replaced by a plain categorical head (one nn.Linear, no noisy layers, no dueling
    head), as a module loaded from a copy inside the repository (a copy finds shared/ from there)."""
    src = (ROOT / "algos" / "catdqn_atari.py").read_text()
    built = "QNetwork(obs_space.shape, int(act_space.n), args.dueling, support, args.network, noisy_sigma)"
    assert src.count(built) == 1
    folder = Path(tempfile.mkdtemp(prefix="tmp_c51_", dir=ROOT))
    path = folder / "c51_linear.py"
    path.write_text(src.replace(built, "nn.Linear(int(np.prod(obs_space.shape)), int(act_space.n) * len(support))"))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look the module up while Args is made
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(path.stem, None)
        shutil.rmtree(folder)


def test_flags_the_network_cannot_honour_are_refused_in_one_place(replaced_network, capsys):
    replaced_network.make_network(replaced_network.Args(), *spaces((4,), 2))  # no flag: nothing to refuse
    args = catdqn_atari.Args(noisy=True, dueling=True)
    catdqn_atari.make_network(args, *spaces((4,), 2))  # the script's network honours both
    for flag, message in [
        ("noisy", "--noisy: the network has no NoisyLinear layer to draw noise for"),
        ("dueling", "--dueling: the dueling head is QNetwork's; Linear has none"),
    ]:
        with pytest.raises(SystemExit) as e:
            replaced_network.make_network(replaced_network.Args(**{flag: True}), *spaces((4,), 2))
        assert e.value.code == 2
        assert capsys.readouterr().err.splitlines() == [f"error: {message}"]


def test_the_envs_step_while_the_updates_run(tmp_path):
    """main's loop acts, then launches the step's updates, then steps the envs: on a GPU the acting step's copy waits
    for every update launched before it, so an update followed at once by the next acting step would leave the GPU
    idle while the envs step (tests/loop_order.py records the order: A acting, U an update, E the envs' step)."""
    flags = [*CARTPOLE, "--min-steps-learn", "64", "--batch-size", "16", "--total-timesteps", "200"]
    flags += ["--out-dir", str(tmp_path)]
    events = loop_order.record("catdqn_atari", "c51_update", flags)
    assert events.count("E") == events.count("A") == 50 and events.count("U") >= 100, events
    assert re.fullmatch(r"(AE)+(AU+E)+", events), events  # never "UA": the envs step between an update and the next act
