"""A script copied out of the repository, as a researcher starts a project: it runs from anywhere once the library
is installed (requirements.txt's ``-e .``), says in one line what to do when it is not, and a new network is one edit
of its factory, reaching the learner, the async sampler, evaluation and --export alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT

# One family each: the on-policy scripts' make_agent, the DQN family's make_network, the continuous make_networks.
# Each replacement is what a researcher would write: a network of their own (or the script's at another size),
# defined after the original factory, which it overrides for every caller.
NEW_NETWORK = {
    "ppo_atari": (
        ["--preset", "cartpole", "--total-timesteps", "512", "--num-envs", "4"],
        """
class TinyAgent(nn.Module):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.tiny_body = nn.Sequential(nn.Linear(n_obs, 16), nn.Tanh())
        self.pi, self.v = nn.Linear(16, n_actions), nn.Linear(16, 1)

    def forward(self, obs):
        h = self.tiny_body(obs.float().flatten(1))
        return self.pi(h), self.v(h).squeeze(-1)


def make_agent(args, obs_space, act_space):
    return TinyAgent(int(np.prod(obs_space.shape)), int(act_space.n))
""",
        ("model", "tiny_body.0.weight", (16, 4)),
    ),
    "dqn_atari": (
        ["--preset", "cartpole", "--total-timesteps", "1500", "--min-steps-learn", "200"],
        """
class TinyQ(nn.Module):
    def __init__(self, n_obs: int, n_actions: int):
        super().__init__()
        self.tiny_q = nn.Sequential(nn.Linear(n_obs, 24), nn.ReLU(), nn.Linear(24, n_actions))

    def forward(self, obs, noise=None):
        return self.tiny_q(obs.float().flatten(1))


def make_network(args, obs_space, act_space):
    return TinyQ(int(np.prod(obs_space.shape)), int(act_space.n))
""",
        ("model", "tiny_q.0.weight", (24, 4)),
    ),
    "sac_mujoco": (
        ["--preset", "pendulum", "--total-timesteps", "600", "--min-steps-learn", "300", "--batch-size", "64"],
        # the script's own classes at another size (hidden 32, 3 critics): a sampler that built the actor itself,
        # at the default 256, would not take the learner's parameters
        """
def make_networks(args, obs_space, act_space):
    obs_dim, act_dim = int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))
    return Actor(obs_dim, act_dim, 32), Critics(obs_dim, act_dim, 32, k=3)
""",
        ("critics", "weights.0", (3, 4, 32)),
    ),
}


# The other scripts (slow: the three above stand for their families): the script's own factory wrapped so that every
# network it makes carries one more parameter, which the checkpoint must hold and the async sampler's copy must
# match (the sampler takes the learner's parameters by name and shape).
MARKED = {
    "a2c_atari": (["--preset", "cartpole", "--total-timesteps", "512"], "make_agent", "model"),
    "ppo_mujoco": (["--preset", "pendulum", "--total-timesteps", "1024", "--num-envs", "2"], "make_agent", "model"),
    "ppo_lstm": (["--preset", "cartpole", "--total-timesteps", "1024"], "make_agent", "model"),
    "catdqn_atari": (
        ["--preset", "cartpole", "--total-timesteps", "1500", "--min-steps-learn", "300"],
        "make_network",
        "model",
    ),
    "r2d1_atari": (["--preset", "memory", "--total-timesteps", "2000"], "make_network", "model"),
    "td3_mujoco": (
        ["--preset", "pendulum", "--total-timesteps", "600", "--min-steps-learn", "300", "--batch-size", "64"],
        "make_networks",
        "actor",
    ),
    "ddpg_mujoco": (
        ["--preset", "pendulum", "--total-timesteps", "600", "--min-steps-learn", "300", "--batch-size", "64"],
        "make_networks",
        "actor",
    ),
}
MARK = """
_script_factory = {factory}


def {factory}(*args):
    made = _script_factory(*args)
    for net in made if isinstance(made, tuple) else (made,):
        net.copy_marker = nn.Parameter(torch.zeros(3))
    return made
"""


def _copy(name: str, where: Path, extra: str = "") -> Path:
    """``algos/{name}.py`` copied to ``where``, ``extra`` (new definitions) inserted before its ``__main__`` block."""
    text = (ROOT / "algos" / f"{name}.py").read_text()
    main_block = 'if __name__ == "__main__":'
    assert text.count(main_block) == 1
    copy = where / f"my_{name}.py"
    copy.write_text(text.replace(main_block, extra + "\n\n" + main_block))
    return copy


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing but the installed library
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


# Slow, for CI's 40 minutes: tests/test_three_edits.py's ppo_atari cases run this copy (outside the repository, the new
# network, async, evaluation, --export and the copy's name) in the default tier, with two more edits.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo_atari", "dqn_atari", "sac_mujoco", *sorted(MARKED)])
def test_a_copy_outside_the_repository_trains_a_new_network_in_every_part(name: str, tmp_path: Path):
    """The copy lives outside the repository (tmp), runs with the async sampler (a sampler process building its own
    network from the factory: a different one would not take the learner's parameters), evaluates, then exports the
    new network from the checkpoint; its runs are labelled with the copy's name."""
    assert ROOT not in tmp_path.resolve().parents
    if name in NEW_NETWORK:
        flags, network, (part, key, shape) = NEW_NETWORK[name]
    else:
        flags, factory, part = MARKED[name]
        network, key, shape = MARK.format(factory=factory), "copy_marker", (3,)
    copy = _copy(name, tmp_path, network)
    train = [sys.executable, str(copy), *flags, "--sampler", "async", "--eval-episodes", "2", "--out-dir", "runs"]
    done = _run([*train, "--run-name", "r"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "r"
    assert json.loads((run / "config.json").read_text())["script"] == f"my_{name}"
    assert len(json.loads((run / "eval.json").read_text())["returns"]) == 2
    saved = torch.load(run / "checkpoint.pt", weights_only=False)[part]
    assert tuple(saved[key].shape) == shape, sorted(saved)
    exported = _run([sys.executable, str(copy), "--resume", str(run), "--export", str(tmp_path / "p.onnx")], tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (tmp_path / "p.onnx").stat().st_size > 0


def test_a_copy_without_the_library_says_what_to_do_in_one_line(tmp_path: Path):
    """Outside the repository and with nothing installed (python -S: no site-packages), one error: line naming the
    install command, before any import of the library."""
    copy = _copy("ppo_atari", tmp_path)
    done = _run([sys.executable, "-S", str(copy), "--preset", "cartpole"], tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: shared/ not found: pip install -e ")
    assert not (tmp_path / "runs").exists()


def test_a_copy_inside_the_repository_needs_no_install(tmp_path: Path):
    """A copy anywhere under the repository finds shared/ by its folder, even where nothing is installed."""
    where = ROOT / "runs" / f"copy-test-{os.getpid()}"
    where.mkdir(parents=True, exist_ok=True)
    try:
        copy = _copy("ppo_atari", where)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # -S: no site-packages, so the library cannot come from the install: the copy puts the repository first on
        # sys.path, then stops at its first third-party import (gymnasium), not at shared/
        probe = "import runpy, sys\ntry:\n    runpy.run_path(sys.argv[1])\nexcept ImportError as e:\n    print(sys.path[0], e.name)"  # noqa: E501
        done = subprocess.run([sys.executable, "-S", "-c", probe, str(copy)], env=env, capture_output=True, text=True)
        assert done.returncode == 0 and "shared/ not found" not in done.stderr, done.stderr[-2000:]
        assert done.stdout.split() == [str(ROOT), "gymnasium"]
    finally:
        for f in where.iterdir():
            f.unlink()
        where.rmdir()
