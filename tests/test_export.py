"""--resume RUN --export FILE: each script's acting policy as an ONNX graph, run by onnxruntime, against the
script's own evaluation act (deterministic here: evaluation epsilon 0) on observations from real episodes."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
from functools import partial
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from shared.atari import make_atari_env
from shared.evaluation import play
from shared.export import ExportError, export
from tests.helpers import ROOT, refusal, run
from tests.test_evaluation import SCRIPTS

CPU = torch.device("cpu")


def module_of(name: str):
    if str(ROOT / "algos") not in sys.path:
        sys.path.insert(0, str(ROOT / "algos"))
    return importlib.import_module(name[:-3])


def learner(name: str, folder):
    """The script's module, its env factory and ``make_learner``'s parts restored from the run's checkpoint, in
    this process."""
    m = module_of(name)
    saved = torch.load(folder / "checkpoint.pt", weights_only=False)
    args = m.Args(**{f.name: saved["args"][f.name] for f in dataclasses.fields(m.Args) if f.name in saved["args"]})
    probe = m.make_env(args)()
    space = SimpleNamespace(obs_space=probe.observation_space, act_space=probe.action_space, device=CPU, world=1)
    probe.close()
    parts = m.make_learner(args, space)
    return m, args, space, parts, saved


def acting(name: str, folder):
    """(the script's evaluation act with epsilon 0, the env factory): the parts it reads loaded from the run."""
    m, args, space, parts, saved = learner(name, folder)
    if name in ("dqn_atari.py", "catdqn_atari.py"):
        parts[0].load_state_dict(saved["model"])
        act = partial(m.act, parts[0], CPU, 0.0)
    elif name == "r2d1_atari.py":
        parts[0].load_state_dict(saved["model"])
        act = m.EvalPolicy(parts[0], CPU, 0.0)
    elif name == "ppo_mujoco.py":
        parts[0].load_state_dict(saved["model"])
        act = partial(m.act, parts[0], CPU, space.act_space)
    else:  # sac, td3, ddpg: the actor and the observation statistics
        actor, obs_norm = parts[0], parts[-1]
        actor.load_state_dict(saved["actor"])
        obs_norm.load_state_dict(saved["obs_norm"])
        act = partial(m.act, actor, obs_norm, CPU, space.act_space)
    return act, partial(m.make_env, args)


def recorded(act):
    """``act``, recording each call's inputs and actions: [(obs [B, ...], starts [B], rewards [B], actions)]."""
    calls = []

    def recording(obs, draws, starts, rewards):
        given = {"draws": draws, "starts": starts, "rewards": rewards}
        actions = act(obs, **{k: v for k, v in given.items() if k in inspect.signature(act).parameters})
        calls.append((obs.copy(), starts.copy(), rewards.copy(), np.asarray(actions).copy()))
        return actions

    return recording, calls


ONE_STEP = ["dqn_atari.py", "catdqn_atari.py", "sac_mujoco.py", "td3_mujoco.py", "ddpg_mujoco.py", "ppo_mujoco.py"]
IN_CI = {"dqn_atari.py", "sac_mujoco.py", "r2d1_atari.py"}


@pytest.mark.parametrize("name", [n if n in IN_CI else pytest.param(n, marks=pytest.mark.slow)
                                  for n in [*ONE_STEP, "r2d1_atari.py"]])
def test_onnxruntime_acts_as_the_scripts_own_act_on_real_episodes(name, tmp_path):
    flags, _ = SCRIPTS[name]
    trained = run(name, *flags, "--eval-episodes", "0", "--out-dir", str(tmp_path), "--run-name", "r", timeout=300)
    assert trained.returncode == 0, trained.stderr[-2000:]
    out = run(name, *flags, "--resume", str(tmp_path / "r"), "--export", str(tmp_path / "policy.onnx"), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "exported the policy" in out.stdout and out.stderr.strip() == ""
    onnx.checker.check_model(str(tmp_path / "policy.onnx"), full_check=True)
    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    act, make_env = acting(name, tmp_path / "r")
    recording, calls = recorded(act)
    while sum(len(c[0]) for c in calls) < 300:  # a few hundred observations of real episodes, several envs
        play(make_env, recording, 4, len(calls), envs=2)
    if name in ONE_STEP:
        assert names == ["obs"]
        for obs, _, _, actions in calls:
            got = session.run(None, {"obs": obs})[0]
            np.testing.assert_allclose(got, actions.astype(got.dtype), atol=1e-4, rtol=0)
        return
    # r2d1: the state goes out and comes back in, step after step, as a deployment would carry it
    assert names == ["obs", "prev_action", "prev_reward", "h", "c", "episode_start"]
    h = c = np.zeros((len(calls[0][0]), act.net.hidden), np.float32)
    prev = np.zeros(len(calls[0][0]), np.int64)
    for obs, starts, rewards, actions in calls:
        got, _, h, c = session.run(None, {"obs": obs, "prev_action": prev, "prev_reward": rewards.astype(np.float32),
                                          "h": h, "c": c, "episode_start": starts})
        np.testing.assert_array_equal(got, actions)
        prev = actions


def test_a_cnn_policy_exports_with_uint8_frames_scaled_inside(tmp_path):
    """The Nature CNN of dqn_atari on real Atari frames: uint8 in, the same Q-values and actions out."""
    m = module_of("dqn_atari.py")
    torch.manual_seed(0)
    net = m.QNetwork((4, 84, 84), 4, dueling=True)
    env, frames = make_atari_env("BreakoutNoFrameskip-v4"), []
    obs, _ = env.reset(seed=1)
    rng = np.random.default_rng(0)
    for _ in range(64):
        frames.append(obs)
        obs, *_ = env.step(int(rng.integers(4)))
    env.close()
    batch = torch.as_tensor(np.stack(frames))
    worst = export(m.ExportedPolicy(net), {"obs": batch}, ["action", "q_values"], tmp_path / "cnn.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(uint8)"
    action, q = session.run(None, {"obs": batch.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(q, net(batch).numpy(), atol=1e-4, rtol=0)
        assert worst <= 1e-4 and np.array_equal(action, net(batch).argmax(1).numpy())


class Tiny(torch.nn.Module):
    """A policy's shape: ``forward`` takes the observations by the name the export gives them."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 4)

    def forward(self, obs):
        return torch.tanh(self.layer(obs))


def test_an_export_that_differs_from_torch_is_refused_and_removed(tmp_path, monkeypatch):
    """The check inside ``export`` can fail: onnxruntime's outputs nudged by 1e-3 raise, and no file is left."""
    real = onnxruntime.InferenceSession

    class Nudged:
        def __init__(self, *a, **kw):
            self.session = real(*a, **kw)

        def run(self, names, feeds):
            return [o + 1e-3 for o in self.session.run(names, feeds)]

    monkeypatch.setattr(onnxruntime, "InferenceSession", Nudged)
    net = Tiny()
    with pytest.raises(ExportError, match="differs from torch"):
        export(net, {"obs": torch.randn(5, 3)}, ["out"], tmp_path / "p.onnx")
    assert not (tmp_path / "p.onnx").exists()


@pytest.mark.parametrize("flags, words", [
    (["--export", "p.onnx"], "--export writes a checkpoint's policy: give the run with --resume"),
    (["--export", "/no/such/folder/p.onnx", "--resume", "x"], "not a file in an existing folder"),
])
def test_bad_export_arguments_exit_2_with_one_line(flags, words):
    lines = refusal("sac_mujoco.py", "--env-id", "Pendulum-v1", *flags)
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0]


def test_the_exported_graph_takes_any_batch_size(tmp_path):
    net = Tiny()
    export(net, {"obs": torch.randn(8, 3)}, ["out"], tmp_path / "p.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "p.onnx"), providers=["CPUExecutionProvider"])
    for n in (1, 5, 100):
        x = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        with torch.no_grad():
            np.testing.assert_allclose(session.run(None, {"obs": x})[0], net(torch.as_tensor(x)).numpy(), atol=1e-5)
