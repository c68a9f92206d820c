"""Dict observations (shared/dict_obs.py) in ppo_atari.py, a2c_atari.py and ppo_lstm.py, on tests/dict_env.py's
DictCue envs: the per-key network against a reference computed key by key, the rollout's nested arrays, every
sampling mode, masks, --compile, torchrun, learning, and the refusals (the replay scripts; entries the network
cannot take)."""

from __future__ import annotations

import json
import os
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from shared.buffer import buffer_from_example
from shared.device import upload
from shared.dict_obs import DictTorso, obs_example, obs_keys, without_text
from tests import dict_env  # noqa: F401  (registers the DictCue envs in this process)
from tests.helpers import ROOT, progress, refusal, run

sys.path.insert(0, str(ROOT / "algos"))
import a2c_atari
import ppo_atari
import ppo_lstm

SCRIPTS = ["ppo_atari.py", "a2c_atari.py", "ppo_lstm.py"]
ENV = "tests.dict_env:DictCue-v0"
SHORT = [
    "--total-timesteps",
    "256",
    "--num-envs",
    "4",
    "--num-steps",
    "32",
    "--eval-episodes",
    "0",
    "--checkpoint-minutes",
    "0",
]

SPACE = gym.spaces.Dict(
    {
        "pixels": gym.spaces.Box(0, 255, (3, 36, 40), np.uint8),  # channels first: the Nature CNN
        "grid": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),  # channels last: the small CNN
        "direction": gym.spaces.Discrete(4, start=1),
        "vec": gym.spaces.Box(-1, 1, (2, 3), np.float32),
        "mission": gym.spaces.Text(8),
    }
)


def sample(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "pixels": torch.as_tensor(rng.integers(0, 256, (n, 3, 36, 40), dtype=np.uint8)),
        "grid": torch.as_tensor(rng.integers(0, 11, (n, 7, 7, 3), dtype=np.uint8)),
        "direction": torch.as_tensor(rng.integers(1, 5, n)),
        "vec": torch.as_tensor(rng.uniform(-1, 1, (n, 2, 3)).astype(np.float32)),
    }


def reference_features(torso: DictTorso, obs: dict, drop: str | None = None) -> torch.Tensor:
    """The torso's features computed key by key from its own layers: each key's input prepared by hand (pixels
    scaled, the grid's codes by 1/10, the direction one-hot from its start, the vector flattened), through its encoder,
    concatenated in sorted key order; ``drop``: that key's features zeroed (a reference that must not match)."""
    enc = dict(zip(torso.keys, torso.encoders))
    inputs = {
        "direction": torch.eye(4)[obs["direction"] - 1],
        "grid": obs["grid"].permute(0, 3, 1, 2).float() / 10.0,
        "pixels": obs["pixels"].float() / 255.0,
        "vec": obs["vec"].reshape(len(obs["vec"]), 6),
    }
    feats = [enc[k](inputs[k]) * (0.0 if k == drop else 1.0) for k in sorted(inputs)]
    return torch.cat(feats, 1)


@pytest.mark.parametrize("drop", [None, "direction", "grid", "pixels", "vec"])
def test_the_network_is_each_key_through_its_encoder_concatenated_before_the_heads(drop):
    torch.manual_seed(0)
    agent = ppo_atari.Agent(SPACE, 5)
    assert agent.torso.keys == ["direction", "grid", "pixels", "vec"]  # sorted; the Text entry dropped
    assert agent.torso.kinds == ["discrete", "grid", "image", "vector"]
    assert agent.torso.width == 64 + 64 + 512 + 64
    obs = sample(6)
    with torch.no_grad():
        logits, value = agent(obs)
        h = reference_features(agent.torso, obs, drop)
        ref_logits, ref_value = agent.actor(h), agent.critic(h).squeeze(-1)
    same = torch.allclose(logits, ref_logits, atol=1e-6) and torch.allclose(value, ref_value, atol=1e-6)
    assert same == (drop is None)  # the reference with any one key dropped does not match


def test_a2c_and_the_recurrent_network_take_the_same_features():
    torch.manual_seed(0)
    a2c = a2c_atari.Agent(SPACE, 5)
    obs = sample(6)
    with torch.no_grad():
        logits, _ = a2c(obs)
        assert torch.allclose(logits, a2c.actor(reference_features(a2c.torso, obs)), atol=1e-6)
    torch.manual_seed(0)
    lstm = ppo_lstm.Agent(SPACE, gym.spaces.Discrete(5), 16, lstm=False)
    state = lstm.initial_state(3)
    with torch.no_grad():
        out, value, _ = lstm(obs, state, torch.zeros(2, 3, dtype=torch.bool))  # the 6 rows as [T=2, B=3], time-major
        h = lstm.core(reference_features(lstm.torso, obs))
    assert torch.allclose(out, lstm.actor(h), atol=1e-6)
    assert torch.allclose(value, lstm.critic(h).squeeze(-1), atol=1e-6)


def test_a_box_network_builds_the_modules_it_always_had():
    """The Box path is untouched: the same parameter names, in the same order (so the same initial draws; serial
    runs are compared bit for bit by /work/bitcheck, see the results README)."""
    names = [n for n, _ in ppo_atari.Agent((4,), 2).named_parameters()]
    assert names == [
        "torso.0.weight",
        "torso.0.bias",
        "torso.2.weight",
        "torso.2.bias",
        "actor.weight",
        "actor.bias",
        "critic.weight",
        "critic.bias",
    ]
    assert not ppo_atari.Agent((4, 84, 84), 4).dict
    box = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    example = obs_example(box, (5,))
    assert type(example) is np.ndarray and example.shape == (5, 4, 84, 84) and example.dtype == np.uint8
    frames = np.ones((5, 4, 84, 84), np.uint8)
    up = upload({"obs": frames}, torch.device("cpu"))
    assert list(up) == ["obs"] and torch.equal(up["obs"], torch.as_tensor(frames))


def test_the_rollout_holds_a_dict_in_private_and_shared_memory():
    example = obs_example(SPACE)
    assert example._fields == ("direction", "grid", "pixels", "vec")
    assert example.direction.dtype == np.int64 and example.direction.shape == ()
    env_obs = {k: v.numpy() for k, v in sample(4).items()} | {"mission": ("go",) * 4}
    for shared in (False, True):
        buf = buffer_from_example(example, (3, 4), shared=shared)  # [T, B]
        buf[1] = env_obs  # the env's dict, field by field by name; the strings not written
        for k in example._fields:
            assert np.array_equal(getattr(buf, k)[1], env_obs[k]) and not getattr(buf, k)[0].any()
    up = upload({"obs": buf[1:], "mask": np.ones(3, bool)}, torch.device("cpu"))  # one batch, the Dict nested in it
    assert type(up["obs"]) is type(example) and up["obs"]._fields == example._fields
    for k in example._fields:
        assert torch.equal(getattr(up["obs"], k), torch.as_tensor(getattr(buf, k)[1:]))
    rows = torch.tensor([0, 5])  # rows by number of [T, B] = [2, 4], as the PPO family's minibatches take them
    assert torch.equal(up["obs"][rows // 4, rows % 4].vec, torch.as_tensor(buf.vec[1:].reshape(8, 2, 3)[rows]))


def test_strings_are_dropped_and_other_entries_refused_by_name():
    env = without_text(gym.make(ENV))
    assert list(env.observation_space.spaces) == ["cue", "image", "vec"]
    assert "mission" not in env.reset(seed=0)[0]
    plain = gym.make("CartPole-v1")
    assert without_text(plain) is plain
    with pytest.raises(ValueError, match="'bits' is a MultiBinary"):
        obs_keys(gym.make("tests.dict_env:DictCueBad-v0").observation_space)
    with pytest.raises(ValueError, match="at least 7x7"):
        ppo_atari.Agent(gym.spaces.Dict({"img": gym.spaces.Box(0, 255, (5, 5, 3), np.uint8)}), 2)


@pytest.mark.parametrize("name", ["dqn_atari.py", "catdqn_atari.py", "r2d1_atari.py", "ppo_mujoco.py"])
def test_scripts_without_dict_observations_refuse_them_in_one_line(name):
    lines = refusal(name, "--env-id", ENV)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Dict" in lines[0], lines


@pytest.mark.parametrize("name", ["sac_mujoco.py", "td3_mujoco.py", "ddpg_mujoco.py"])
def test_continuous_replay_scripts_refuse_dict_observations_in_one_line(name):
    lines = refusal(name, "--env-id", "tests.dict_env:DictCueContinuous-v0")
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Dict" in lines[0], lines


@pytest.mark.parametrize("name", SCRIPTS)
def test_an_entry_the_network_cannot_take_is_one_line(name):
    lines = refusal(name, "--env-id", "tests.dict_env:DictCueBad-v0", setup=True)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "'bits' is a MultiBinary" in lines[0], lines


def test_ppo_lstm_refuses_normalize_obs_with_dict_observations():
    lines = refusal("ppo_lstm.py", "--env-id", ENV, "--normalize-obs", setup=True)
    assert len(lines) == 1 and "--normalize-obs" in lines[0] and "Dict" in lines[0], lines


# --------------------------------------------------------------------------------------- runs of the scripts


def short_run(name: str, tmp_path, *flags: str, env: str = ENV) -> None:
    out = run(name, "--env-id", env, *SHORT, *flags, "--out-dir", str(tmp_path), "--run-name", "r", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = progress(tmp_path / "r")
    assert int(rows[-1]["global_step"]) == 256 and int(rows[-1]["episodes"]) > 0


# In the default tier: the async double buffer (shared memory) with every script, parallel sampling (worker
# processes) with masks; the other combinations are slow.
@pytest.mark.parametrize("name", SCRIPTS)
def test_async_sampling_carries_the_dict_through_shared_memory(name, tmp_path):
    short_run(name, tmp_path, "--sampler", "async")


def test_parallel_sampling_with_a_dict_and_action_masks(tmp_path):
    """DictCueMasked raises if a masked action is ever taken."""
    short_run("ppo_atari.py", tmp_path, "--sampler", "parallel", env="tests.dict_env:DictCueMasked-v0")


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["serial", "parallel"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_in_every_mode(name, sampler, tmp_path):
    short_run(name, tmp_path, "--sampler", sampler, env="tests.dict_env:DictCueMasked-v0")


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["serial", "async"])
def test_recurrent_continuous_actions_with_a_dict(sampler, tmp_path):
    short_run("ppo_lstm.py", tmp_path, "--sampler", sampler, env="tests.dict_env:DictCueContinuous-v0")


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_the_nature_cnn_key(name, tmp_path):
    short_run(name, tmp_path, env="tests.dict_env:DictCueBig-v0")


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_compile_with_a_dict(name, tmp_path, monkeypatch):
    monkeypatch.setenv("RL_COMPILE_BACKEND", "aot_eager")
    monkeypatch.setenv("RL_COMPILE_STRICT", "1")  # a recompile is an error
    short_run(name, tmp_path, "--compile", env="tests.dict_env:DictCueMasked-v0")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo_atari.py", "ppo_lstm.py"])
def test_torchrun_with_a_dict(name, tmp_path):
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "algos" / name),
        "--env-id",
        ENV,
        *SHORT,
        "--num-envs",
        "2",
        "--num-minibatches",
        "2",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(progress(tmp_path / "r")[-1]["global_step"]) == 256


@pytest.mark.parametrize("name", [pytest.param("ppo_atari.py", marks=pytest.mark.slow), "ppo_lstm.py"])
def test_eval_only_and_video_after_resume(name, tmp_path):
    flags = [*SHORT[:-4], "--out-dir", str(tmp_path), "--run-name", "r"]
    out = run(name, "--env-id", ENV, *flags, "--eval-episodes", "2", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    out = run(
        name,
        "--env-id",
        ENV,
        *flags,
        "--resume",
        str(tmp_path / "r"),
        "--eval-only",
        "--eval-episodes",
        "2",
        "--capture-video",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(json.loads((tmp_path / "r" / "eval.json").read_text())["returns"]) == 2
    assert list((tmp_path / "r" / "videos").glob("*.mp4"))


@pytest.mark.parametrize(
    ("env", "threshold"), [("DictCue-v0", 14.0), pytest.param("DictCueImage-v0", 11.0, marks=pytest.mark.slow)]
)
def test_ppo_learns_from_the_key_that_holds_the_cue(env, threshold, tmp_path):
    """The cue is in the Discrete entry (the image noise), or only in the image (the small CNN, slower to read
    it): a policy that reads it scores 16 an episode, one blind to it 16/3. 8k steps, about 10 s on one core."""
    out = run(
        "ppo_atari.py",
        "--env-id",
        f"tests.dict_env:{env}",
        "--total-timesteps",
        "8192",
        "--num-envs",
        "8",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "4",
        "--learning-rate",
        "1e-3",
        "--ent-coef",
        "0",
        "--gamma",
        "0.5",
        "--eval-episodes",
        "0",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    last = [float(r["return_mean"]) for r in progress(tmp_path / "r")[-4:]]
    assert np.mean(last) >= threshold, last
