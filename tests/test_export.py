"""--resume RUN --export FILE: each script's acting policy as an ONNX graph, run by onnxruntime, against the
script's own evaluation act (deterministic here: evaluation epsilon 0) on observations from real episodes."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import subprocess
import sys
import textwrap
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch

# a GPU node installs from a wheel folder without these (docs/gpu.md): --export's tests skip there, one line says so
onnx = pytest.importorskip("onnx", reason="--export needs onnx and onnxruntime (requirements.txt)")
onnxruntime = pytest.importorskip("onnxruntime", reason="--export needs onnx and onnxruntime (requirements.txt)")

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
    """(the script's evaluation act, deterministic where the script has an epsilon; the network it reads; the env
    factory), the parts loaded from the run."""
    m, args, space, parts, saved = learner(name, folder)
    if name in ("dqn_atari.py", "catdqn_atari.py"):
        parts[0].load_state_dict(saved["model"])
        return partial(m.act, m.Policy(parts[0]), CPU, 0.0), parts[0], partial(m.make_env, args)
    if name == "r2d1_atari.py":
        parts[0].load_state_dict(saved["model"])
        return m.EvalPolicy(parts[0], CPU, 0.0), parts[0], partial(m.make_env, args)
    if name == "ppo_lstm.py":
        parts[0].load_state_dict(saved["model"])
        return m.EvalPolicy(m.Policy(parts[0], space.act_space), CPU), parts[0], partial(m.make_env, args)
    if name in ("ppo_atari.py", "a2c_atari.py"):
        parts[0].load_state_dict(saved["model"])
        return partial(m.act, m.Policy(parts[0]), CPU), parts[0], partial(m.make_env, args)
    if name == "ppo_mujoco.py":
        parts[0].load_state_dict(saved["model"])
        return partial(m.act, m.Policy(parts[0], space.act_space), CPU), parts[0], partial(m.make_env, args)
    actor, obs_norm = parts[0], parts[-1]  # sac, td3, ddpg: the actor and the observation statistics
    actor.load_state_dict(saved["actor"])
    obs_norm.load_state_dict(saved["obs_norm"])
    return partial(m.act, m.Policy(actor, obs_norm, space.act_space), CPU), actor, partial(m.make_env, args)


def recorded(act):
    """``act``, recording each call: (obs [B, ...] or a dict of them, starts [B], rewards [B], actions, the
    recurrent state ``h`` after the call or None)."""
    calls = []

    def recording(obs, draws, starts, rewards, mask=None):
        given = {"draws": draws, "starts": starts, "rewards": rewards, "mask": mask}
        actions = act(obs, **{k: v for k, v in given.items() if k in inspect.signature(act).parameters})
        state = getattr(act, "state", None)
        obs = {k: v.copy() for k, v in obs.items()} if isinstance(obs, dict) else obs.copy()
        calls.append(
            (obs, starts.copy(), rewards.copy(), np.asarray(actions).copy(), None if state is None else state.h.numpy().copy())
        )
        return actions

    return recording, calls


def feeds(obs) -> dict:
    return dict(obs) if isinstance(obs, dict) else {"obs": obs}


DICT_PPO = ["--env-id", "tests.dict_env:DictCue-v0", "--num-envs", "4", "--num-steps", "32", "--total-timesteps", "256"]
CASES = {name: SCRIPTS[name][0] for name in SCRIPTS}
for name in ("sac_mujoco.py", "td3_mujoco.py", "ddpg_mujoco.py"):  # statistics to fold into the graph
    CASES[name] = [*CASES[name], "--normalize-obs"]
CASES["ppo_atari.py:dict"] = DICT_PPO
IN_CI = {"sac_mujoco.py", "ppo_lstm.py", "ppo_atari.py:dict"}  # r2d1's recurrent graph: with the slow tests


@pytest.mark.parametrize("case", [c if c in IN_CI else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_onnxruntime_acts_as_the_scripts_own_act_on_real_episodes(case, tmp_path):
    """A few hundred observations of real episodes (several envs, several seeds), played by the script's own
    evaluation act: the graph's action is that act's where the act is deterministic; its logits, Q-values or
    mean are the network's; a recurrent graph carries the state as the act does, step after step."""
    name, flags = case.split(":")[0], CASES[case]
    trained = run(name, *flags, "--eval-episodes", "0", "--out-dir", str(tmp_path), "--run-name", "r", timeout=300)
    assert trained.returncode == 0, trained.stderr[-2000:]
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()}
    out = run(name, *flags, "--resume", str(tmp_path / "r"), "--export", str(tmp_path / "policy.onnx"), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "exported the policy" in out.stdout and out.stderr.strip() == ""
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()} == before  # the run folder untouched
    onnx.checker.check_model(str(tmp_path / "policy.onnx"), full_check=True)
    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert names[:3] == ["cue", "image", "vec"] if case.endswith(":dict") else names[0] == "obs"

    act, net, make_env = acting(name, tmp_path / "r")
    recording, calls = recorded(act)
    while sum(len(c[3]) for c in calls) < 300:
        play(make_env, recording, 4, len(calls), envs=2)
    with torch.no_grad():
        if name in ("r2d1_atari.py", "ppo_lstm.py"):  # the state goes out and comes back in, as a deployment's
            h = c = np.zeros((len(calls[0][3]), net.hidden), np.float32)
            prev = np.zeros(len(calls[0][3]), np.int64)
            for obs, starts, rewards, actions, h_act in calls:
                extra = {"prev_action": prev, "prev_reward": rewards.astype(np.float32)} if "prev_action" in names else {}
                got, _, h, c = session.run(None, {**feeds(obs), **extra, "h": h, "c": c, "episode_start": starts})
                np.testing.assert_allclose(h, h_act, atol=1e-4, rtol=0)  # the act's own state, step after step
                if name == "r2d1_atari.py":
                    np.testing.assert_array_equal(got, actions)
                prev = actions
            return
        for obs, _, _, actions, _ in calls:
            got = session.run(None, feeds(obs))
            if name in ("ppo_atari.py", "a2c_atari.py"):  # a sampling act: the graph's logits are the network's
                x = {k: torch.as_tensor(v) for k, v in obs.items()} if isinstance(obs, dict) else torch.as_tensor(obs)
                logits, _ = net(x)
                np.testing.assert_allclose(got[1], logits.numpy(), atol=1e-4, rtol=0)
                np.testing.assert_array_equal(got[0], logits.argmax(1).numpy())
                continue
            np.testing.assert_allclose(got[0], actions.astype(got[0].dtype), atol=1e-4, rtol=0)
            if name in ("dqn_atari.py", "catdqn_atari.py"):
                q = net(torch.as_tensor(obs)) if name == "dqn_atari.py" else net.q_values(torch.as_tensor(obs))
                np.testing.assert_allclose(got[1], q.numpy(), atol=1e-4, rtol=0)


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
    worst = export(m.Policy(net), {"obs": batch}, ["action", "q_values"], tmp_path / "cnn.onnx")
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


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--export", "p.onnx"], "--export writes a checkpoint's policy: give the run with --resume"),
        (["--export", "/no/such/folder/p.onnx", "--resume", "x"], "not a file in an existing folder"),
    ],
)
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


def test_the_readmes_five_lines_run_an_exported_policy_without_torch(tmp_path):
    """README.md's snippet, as written, on ppo_atari.py's CartPole policy: it runs, and never imports torch."""
    readme = (ROOT / "README.md").read_text()
    snippet = textwrap.dedent(readme.split("Running it needs no torch:")[1].split("```python")[1].split("```")[0])
    flags = ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "32", "--total-timesteps", "64"]
    trained = run("ppo_atari.py", *flags, "--eval-episodes", "0", "--out-dir", str(tmp_path), "--run-name", "r")
    assert trained.returncode == 0, trained.stderr[-2000:]
    out = run("ppo_atari.py", *flags, "--resume", str(tmp_path / "r"), "--export", str(tmp_path / "policy.onnx"))
    assert out.returncode == 0, out.stderr[-2000:]
    check = snippet + "\nimport sys\nassert 'torch' not in sys.modules, 'the snippet imported torch'\n"
    done = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() in ("[0]", "[1]")
