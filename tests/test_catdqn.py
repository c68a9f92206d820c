"""algos/catdqn_atari.py: the projection against a per-atom loop, learning on CartPole, Atari smoke runs with
resume, bad arguments."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT, progress, run

sys.path.insert(0, str(ROOT / "algos"))
import catdqn_atari

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
@given(K=st.integers(2, 21), N=st.integers(1, 6), seed=st.integers(0, 2**31),
       on_grid=st.booleans(), terminal=st.booleans())
def test_projection_matches_a_per_atom_loop(K, N, seed, on_grid, terminal):
    rng = np.random.default_rng(seed)
    z = np.linspace(-5.0, 5.0, K)
    p = rng.dirichlet(np.ones(K), N)
    # Rewards past both ends, inside, and (on_grid) exactly on atoms with discount 1: every branch of the split.
    r = rng.choice(z, N) if on_grid else rng.uniform(-12, 12, N)
    d = np.zeros(N) if terminal else (np.ones(N) if on_grid else rng.uniform(0, 1, N))
    got = catdqn_atari.project(torch.tensor(p, dtype=torch.float64), torch.tensor(r), torch.tensor(d),
                               torch.tensor(z))
    expected = project_by_loop(p, r, d, z)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-9)
    np.testing.assert_allclose(got.sum(1).numpy(), 1.0, atol=1e-9)  # no mass lost


def test_terminal_target_puts_all_mass_at_the_return():
    z = torch.linspace(0, 10, 11)
    m = catdqn_atari.project(torch.full((1, 11), 1 / 11), torch.tensor([3.0]), torch.tensor([0.0]), z)
    assert m[0, 3].item() == pytest.approx(1.0)


def test_c51_learns_cartpole_serial(tmp_path):
    out = run("catdqn_atari.py", *CARTPOLE, "--total-timesteps", "100000", "--stop-at-return", "475",
              "--out-dir", str(tmp_path), "--run-name", "r", timeout=500)
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"mean return of the last 20 episodes ([\d.]+) >= 475.0 at step (\d+)", out.stdout)
    assert m and int(m.group(2)) <= 100_000, out.stdout[-2000:]


# Serial in CI; parallel and async (the same sampler code as dqn_atari.py's, tested there) with the slow tests.
@pytest.mark.parametrize("sampler", ["serial", pytest.param("parallel", marks=pytest.mark.slow),
                                     pytest.param("async", marks=pytest.mark.slow)])
def test_atari_smoke_small_buffer_checkpoint_and_resume(sampler, tmp_path):
    common = ["--num-envs", "4", "--buffer-size", "2000", "--min-steps-learn", "200", "--log-every", "200",
              "--eval-episodes", "0", "--sampler", sampler, "--double-dqn", "--dueling", "--prioritized",
              "--n-step-return", "3"]
    out = run("catdqn_atari.py", *common, "--total-timesteps", "400", "--out-dir", str(tmp_path), "--run-name", "a",
              timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "a"
    assert [int(r["global_step"]) for r in progress(run_dir)] == [200, 400]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    net = catdqn_atari.QNetwork((4, 84, 84), 4, dueling=True, support=torch.linspace(-10, 10, 51))
    net.load_state_dict(ckpt["model"])
    out = run("catdqn_atari.py", *common, "--total-timesteps", "600", "--resume", str(run_dir), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [int(r["global_step"]) for r in progress(run_dir)] == [200, 400, 600]


@pytest.mark.parametrize("bad, words", [
    (["--n-atoms", "1"], "--n-atoms"),
    (["--v-min", "5", "--v-max", "5"], "--v-min"),
    (["--sampler", "x"], "--sampler"),
])
def test_bad_arguments_exit_2(bad, words, tmp_path):
    out = run("catdqn_atari.py", *bad, "--out-dir", str(tmp_path), timeout=60)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], out.stderr
