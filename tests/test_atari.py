"""shared/atari.py and shared/envs.py: the two Atari pipelines agree frame for frame; every script's network takes
any image shape it can (channel-first or -last) and refuses the rest with a readable reason; a custom env
registered at import time works in every sampling mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from shared.atari import ale_game, make_atari_env, make_atari_vector_env
from shared.envs import image_shape
from tests.helpers import ROOT, progress, run

sys.path.insert(0, str(ROOT / "algos"))
import catdqn_atari
import dqn_atari
import ppo_atari
import r2d1_atari


def test_ale_game_names():
    assert ale_game("BreakoutNoFrameskip-v4") == "breakout"
    assert ale_game("MsPacmanNoFrameskip-v4") == "ms_pacman"


def test_serial_and_parallel_atari_preprocess_and_account_identically():
    serial = gym.vector.SyncVectorEnv(
        [lambda: make_atari_env("BreakoutNoFrameskip-v4", noop_max=0)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
    )
    parallel = make_atari_vector_env("BreakoutNoFrameskip-v4", 1, num_threads=1, noop_max=0)
    try:
        o1, i1 = serial.reset(seed=3)
        o2, i2 = parallel.reset(seed=3)
        np.testing.assert_array_equal(o1, o2)
        rng = np.random.default_rng(0)
        ends = 0
        for _ in range(600):
            a = rng.integers(0, serial.single_action_space.n, 1)
            o1, r1, te1, tr1, i1 = serial.step(a)
            o2, r2, te2, tr2, i2 = parallel.step(a)
            np.testing.assert_array_equal(o1, o2)
            assert r1[0] == r2[0] and te1[0] == te2[0] and tr1[0] == tr2[0]
            assert i1["lives"][0] == i2["lives"][0]
            ends += int(te1[0])
        assert ends >= 1  # the comparison crossed a game over and its reset
    finally:
        serial.close()
        parallel.close()


def test_image_shape_reads_both_layouts_and_refuses_small_images():
    assert image_shape((4, 84, 84)) == (4, 84, 84)
    assert image_shape((64, 64, 3)) == (3, 64, 64)
    with pytest.raises(ValueError, match="at least 36x36"):
        image_shape((3, 32, 32))
    with pytest.raises(ValueError, match="3 axes"):
        image_shape((84, 84))


NETWORKS = {
    "ppo": lambda shape: ppo_atari.Agent(shape, 5),
    "dqn": lambda shape: dqn_atari.QNetwork(shape, 5, dueling=True),
    "c51": lambda shape: catdqn_atari.QNetwork(shape, 5, True, torch.linspace(-1, 1, 11)),
    "r2d1": lambda shape: r2d1_atari.R2D1Net(shape, 5, 16),
}


def forward(name: str, net: torch.nn.Module, obs: torch.Tensor) -> torch.Tensor:
    if name == "r2d1":
        n = obs.shape[0]
        q, _ = net(
            obs[None],
            torch.zeros(1, n, dtype=torch.long),
            torch.zeros(1, n),
            net.initial_state(n),
            torch.zeros(1, n, dtype=torch.bool),
        )
        return q[0]
    out = net(obs)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", list(NETWORKS))
def test_networks_take_channel_last_and_other_sizes(name):
    hwc = torch.randint(0, 255, (2, 64, 64, 3), dtype=torch.uint8)
    torch.manual_seed(0)
    net_hwc = NETWORKS[name]((64, 64, 3))
    torch.manual_seed(0)
    net_chw = NETWORKS[name]((3, 64, 64))
    # The same weights see the same pixels whichever layout the env produces.
    torch.testing.assert_close(forward(name, net_hwc, hwc), forward(name, net_chw, hwc.permute(0, 3, 1, 2)))
    assert forward(name, NETWORKS[name]((4, 100, 120)), torch.zeros(3, 4, 100, 120, dtype=torch.uint8)).shape[0] == 3


@pytest.mark.parametrize("name", list(NETWORKS))
def test_networks_refuse_images_too_small_with_the_reason(name):
    with pytest.raises(ValueError, match="at least 36x36"):
        NETWORKS[name]((3, 24, 24))


CUSTOM_ENV = """
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class TinyImage(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (3, 24, 24), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


# Custom envs registered when this script is imported: spawned processes import the script again.
gym.register("ShortCartPole-v0", entry_point=CartPoleEnv, max_episode_steps=50)
gym.register("TinyImage-v0", entry_point=TinyImage)
"""


@pytest.fixture(scope="module")
def copied_scripts():
    """Copies of ppo_atari.py and dqn_atari.py two folders deep inside the repository, each registering a custom
    env at import time."""
    folder = tempfile.mkdtemp(prefix="tmp_copies_", dir=ROOT)
    sub = ROOT / folder / "deeper"
    sub.mkdir()
    paths = {}
    for name in ("ppo_atari.py", "dqn_atari.py"):
        src = (ROOT / "algos" / name).read_text()
        marker = "from shared.run import Run\n"  # the last import: the envs are registered after it
        assert src.count(marker) == 1
        dst = sub / f"my_{name}"
        dst.write_text(src.replace(marker, marker + CUSTOM_ENV, 1))
        paths[name] = dst
    yield paths
    shutil.rmtree(ROOT / folder)


@pytest.mark.parametrize("sampler", ["serial", "parallel", "async"])
@pytest.mark.parametrize(
    "name, flags",
    [
        ("ppo_atari.py", ["--num-envs", "2", "--num-steps", "16", "--total-timesteps", "128"]),
        pytest.param(
            "dqn_atari.py",
            [
                "--num-envs",
                "2",
                "--total-timesteps",
                "400",
                "--buffer-size",
                "500",
                "--min-steps-learn",
                "100",
                "--batch-size",
                "16",
                "--log-every",
                "100",
            ],
            marks=pytest.mark.slow,
        ),  # ppo_atari's copy in CI, for its 30 minutes
    ],
)
def test_a_copy_anywhere_in_the_repo_with_a_custom_env_runs_in_every_mode(copied_scripts, name, flags, sampler, tmp_path):
    out = run(
        str(copied_scripts[name]),
        "--env-id",
        "ShortCartPole-v0",
        "--sampler",
        sampler,
        *flags,
        "--eval-episodes",
        "1",
        "--out-dir",
        str(tmp_path),
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.startswith(f"ShortCartPole-v0__my_{name[:-3]}__1__")  # the copy names its runs
    rows = progress(run_dir)
    assert int(rows[-1]["global_step"]) >= 128 and int(rows[-1]["episodes"]) > 0


def test_an_image_env_the_cnn_cannot_take_exits_2_with_one_line(copied_scripts, tmp_path):
    out = run(str(copied_scripts["ppo_atari.py"]), "--env-id", "TinyImage-v0", "--out-dir", str(tmp_path), timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("\n") == 1 and "at least 36x36" in out.stderr, out.stderr
    assert not any(tmp_path.iterdir())  # nothing started


# ---------------------------------------------------------------------------------------------- make_env in every mode

CLIP = 100  # Breakout's frames reach 142 or so: the clip below changes them


def _clipped(make_env):
    """``make_env`` with an observation-clipping wrapper added, as a researcher would."""

    def with_clip(args, render=False):
        def thunk():
            env = make_env(args, render)()
            return gym.wrappers.TransformObservation(env, lambda o: np.minimum(o, CLIP), env.observation_space)

        return thunk

    return with_clip


@pytest.mark.parametrize("module", [ppo_atari, dqn_atari, catdqn_atari, r2d1_atari])
def test_the_unchanged_atari_make_env_keeps_ale_threads_and_a_changed_one_does_not(module):
    from shared.envs import standard_atari

    args = module.Args(env_id="BreakoutNoFrameskip-v4")
    assert standard_atari(args, module.make_env)
    assert not standard_atari(args, _clipped(module.make_env))
    assert not standard_atari(replace(args, noop_max=3), lambda a, render=False: module.make_env(args))


def test_a_wrapper_added_to_make_env_reaches_parallel_sampling():
    from shared.envs import close_envs, make_envs

    args = ppo_atari.Args(env_id="BreakoutNoFrameskip-v4", num_envs=2)
    envs = make_envs(args, ppo_atari.make_env, "parallel")
    try:
        assert type(envs).__name__ == "AtariVectorEnv"  # the shortcut: the same games in ale-py's threads
    finally:
        close_envs(envs)
    envs = make_envs(args, _clipped(ppo_atari.make_env), "parallel")
    try:
        obs, _ = envs.reset(seed=1)
        for _ in range(20):
            obs, *_ = envs.step(np.ones(2, np.int64))  # FIRE, then the ball
            assert obs.max() <= CLIP
    finally:
        close_envs(envs)


MARKING_WRAPPER = '''
class Marked(gym.ObservationWrapper):
    """Clips observations to 100 and leaves a file per process saying it ran and what it clipped."""

    def observation(self, obs):
        with open(os.path.join(os.environ["MARKS"], str(os.getpid())), "a") as f:
            f.write(f"{int(obs.max())}\\n")
        return np.minimum(obs, 100)
'''


# serial steps make_env's own envs (the edit reaching them is tests/test_three_edits.py's serial case): slow here;
# parallel too, for CI's 40 minutes: async's sampler process steps the same worker processes' envs, and
# test_a_wrapper_added_to_make_env_reaches_parallel_sampling above checks parallel's
@pytest.mark.parametrize("sampler", [pytest.param(s, marks=pytest.mark.slow) for s in ("serial", "parallel")] + ["async"])
def test_a_wrapper_added_to_ppo_atari_make_env_reaches_every_sampling_mode(sampler, tmp_path):
    """The researcher's edit (c) of issue 52 (first issue 41's): a wrapper in ppo_atari.py's make_env, one line changed
    there, reaches training in every sampling mode and the evaluation's envs. Under parallel and async Atari sampling it
    used to be skipped without a word (ale-py's vector env never called make_env)."""
    folder = Path(tempfile.mkdtemp(prefix="tmp_wrapped_", dir=ROOT))
    try:
        src = (ROOT / "algos" / "ppo_atari.py").read_text()
        atari = "return make_atari_env(args.env_id, args.noop_max, args.sticky_actions, render)"
        assert src.count(atari) == 1
        edited = src.replace(atari, atari.replace("return ", "return Marked(") + ")", 1)
        changed = [a for a, b in zip(src.splitlines(), edited.splitlines()) if a != b]
        assert len(changed) == 1  # the edit: one line of make_env (the wrapper's class aside)
        assert edited.count("from shared.run import Run\n") == 1
        edited = edited.replace("from shared.run import Run\n", "from shared.run import Run\n" + MARKING_WRAPPER + "\n", 1)
        edited = edited.replace("import sys\n", "import os\nimport sys\n", 1)
        (folder / "wrapped_ppo.py").write_text(edited)
        marks = tmp_path / "marks"
        marks.mkdir()
        out = subprocess.run(
            [
                sys.executable,
                str(folder / "wrapped_ppo.py"),
                "--env-id",
                "BreakoutNoFrameskip-v4",
                "--sampler",
                sampler,
                "--num-envs",
                "2",
                "--num-steps",
                "16",
                "--total-timesteps",
                "64",
                "--eval-episodes",
                "1",
                "--out-dir",
                str(tmp_path / "runs"),
                "--run-name",
                "w",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
            env={**os.environ, "MARKS": str(marks)},
        )
        assert out.returncode == 0, out.stderr[-3000:]
        seen = [int(v) for f in marks.iterdir() for v in f.read_text().split()]
        evaluated = json.loads((tmp_path / "runs" / "w" / "eval.json").read_text())["lengths"][0]
        assert len(seen) >= 64 + evaluated and max(seen) > 100  # every step went through the wrapper, which clipped
        if sampler != "serial":  # and the run said why it is slower
            assert "worker processes, not in ale-py's threads" in out.stdout
    finally:
        shutil.rmtree(folder)


def test_an_atari_script_evaluates_its_own_games_in_worker_processes(tmp_path):
    """ppo_atari.py on Pong, evaluated on 2 envs: its ``make_env`` (a closure in the script's ``__main__``) reaches
    the spawned evaluation workers (one per CPU, on 2 or more CPUs), and eval.json holds 2 whole games with their
    lengths (an untrained policy loses 0-21: hundreds of steps)."""
    out = run(
        str(ROOT / "algos" / "ppo_atari.py"),
        "--env-id",
        "PongNoFrameskip-v4",
        "--num-envs",
        "2",
        "--num-steps",
        "16",
        "--total-timesteps",
        "32",
        "--eval-episodes",
        "2",
        "--eval-envs",
        "2",
        "--out-dir",
        str(tmp_path),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    saved = json.loads((run_dir / "eval.json").read_text())
    assert len(saved["returns"]) == 2 and all(-21 <= r <= 21 for r in saved["returns"])
    assert len(saved["lengths"]) == 2 and min(saved["lengths"]) > 200
