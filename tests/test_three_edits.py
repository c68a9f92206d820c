"""The three edits a researcher makes every week, together, in a copy of each script outside the repository, each in
the places the script's "Where to change what" names (issue 68):

- a new network (tests/test_copy.py's: another network, or the script's own at another size; SAC, TD3 and DDPG get
  an actor of another shape, without the script's ``.net``);
- a new stored per-step quantity: the on-policy scripts' field in ``rollout_example``, written in ``collect``, put in
  ``learn_from``'s rows; the replay scripts' entry in ``ROW``, written in ``EnvStepper.step``; read by the loss, which
  checks every value it sees and leaves a mark saying it saw them;
- a wrapper in ``make_env``, which leaves a mark in every process that makes an env.

Every sampler mode trains; the loss read the quantity in the learner; the wrapper ran in the sampling processes and in
evaluation's; the checkpoint holds the new network, and ``--export`` writes it. CI's default tier runs ppo_atari's;
the other nine scripts are in the slow tier."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT
from tests.test_copy import MARK, MARKED, NEW_NETWORK

ACTORS = {
    "sac_mujoco": """
class OtherActor(nn.Module):
    \"\"\"Another shape: a shared body and two heads, no .net.\"\"\"

    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.other_body = nn.Sequential(nn.Linear(obs_dim, 48), nn.Tanh())
        self.mu, self.log_sigma = nn.Linear(48, act_dim), nn.Linear(48, act_dim)

    def mean_and_log_std(self, obs):
        h = self.other_body(obs)
        return self.mu(h), self.log_sigma(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def forward(self, obs):
        mean, log_std = self.mean_and_log_std(obs)
        return squashed_gaussian(mean, log_std, torch.randn_like(mean))


def make_networks(args, obs_space, act_space):
    obs_dim, act_dim = int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))
    return OtherActor(obs_dim, act_dim), Critics(obs_dim, act_dim, 32)
""",
    "td3_mujoco": """
class OtherActor(nn.Module):
    \"\"\"Another shape: a layer-normed body and a head, no .net.\"\"\"

    def __init__(self, obs_dim, act_dim):
        super().__init__()
        self.other_body = nn.Sequential(nn.Linear(obs_dim, 48), nn.LayerNorm(48), nn.ELU())
        self.head = nn.Linear(48, act_dim)

    def forward(self, obs):
        return torch.tanh(self.head(self.other_body(obs)))


def make_networks(args, obs_space, act_space):
    obs_dim, act_dim = int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))
    return OtherActor(obs_dim, act_dim), Critics(obs_dim, act_dim, 32, **CRITICS)
""",
}
ACTORS["ddpg_mujoco"] = ACTORS["td3_mujoco"].replace("**CRITICS", "k=1")
ACTORS["td3_mujoco"] = ACTORS["td3_mujoco"].replace(", **CRITICS", "")

# Everything the copy adds beside the edits in place: the wrapper (make_env, redefined around the script's), and the
# loss's check of the new quantity.
ADDED = """
class Marked(gym.Wrapper):
    \"\"\"Leaves a mark per process that resets an env.\"\"\"

    def reset(self, **kwargs):
        open(os.path.join(os.environ["MARKS"], f"env-{os.getpid()}"), "w").close()
        return super().reset(**kwargs)


_script_make_env = make_env


def make_env(args, render=False):
    thunk = _script_make_env(args, render)
    return lambda: Marked(thunk())


def _check_extra(x):
    \"\"\"The loss's reading of the new quantity: every value as written, and a mark saying it was read.\"\"\"
    assert bool((x == 7.0).all()), "the loss saw a value of the new quantity that was never written"
    open(os.path.join(os.environ["MARKS"], f"extra-{os.getpid()}"), "w").close()
"""

ON_POLICY = {"ppo_atari": "ppo_loss", "a2c_atari": "a2c_loss", "ppo_mujoco": "ppo_loss", "ppo_lstm": "ppo_loss"}
REPLAY = {
    "dqn_atari": "dqn_loss",
    "catdqn_atari": "c51_loss",
    "r2d1_atari": "r2d1_loss",
    "sac_mujoco": "sac_critic_loss",
    "td3_mujoco": "td3_critic_loss",
    "ddpg_mujoco": "ddpg_critic_loss",
}
FLAGS = {
    "ppo_atari": ["--preset", "cartpole", "--total-timesteps", "512", "--num-envs", "4"],
    "dqn_atari": ["--preset", "cartpole", "--total-timesteps", "1500", "--min-steps-learn", "200"],
    "sac_mujoco": ["--preset", "pendulum", "--total-timesteps", "600", "--min-steps-learn", "300", "--batch-size", "64"],
    **{name: flags for name, (flags, _, _) in MARKED.items()},
}
FLAGS["r2d1_atari"] = [*FLAGS["r2d1_atari"], "--min-steps-learn", "1000"]  # the preset learns from 2,000: never here


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env}  # nothing but the installed library
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} found {text.count(old)} times"
    return text.replace(old, new)


def _check_in_loss(text: str, function: str) -> str:
    """The loss ``function`` checking its batch's new quantity first, after its docstring."""
    node = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == function)
    batch = next(a.arg for a in node.args.args if a.arg in ("mb", "data", "batch", "b"))
    lines = text.splitlines(keepends=True)
    after, indent = node.body[0].end_lineno, " " * node.body[1].col_offset
    return "".join([*lines[:after], f'{indent}_check_extra({batch}["extra"])\n', *lines[after:]])


def edited(name: str) -> tuple[str, tuple[str, str, tuple]]:
    """``algos/{name}.py`` with the three edits, and where the checkpoint must show the new network."""
    text = (ROOT / "algos" / f"{name}.py").read_text()
    if name in ON_POLICY:  # the field, where collect writes it, learn_from's rows, the loss
        text = _replace_once(text, "    env = dict(reward=zero,", "    env = dict(extra=np.float32(0), reward=zero,")
        final = next(line for line in text.splitlines() if "buf.final_row[t]" in line and "=" in line)
        indent = final[: len(final) - len(final.lstrip())]
        text = _replace_once(text, final + "\n", final + "\n" + indent + "buf.extra[t] = 7.0\n")
        text = _replace_once(text, '"weight": f32(~', '"extra": buf.extra, "weight": f32(~')
        text = _check_in_loss(text, ON_POLICY[name])
    else:  # the entry in ROW, where EnvStepper.step writes it, the loss
        text = _replace_once(text, "ROW = dict(", "ROW = dict(extra=np.float32(0), ")
        row = "dict(observation=self.obs," if name == "r2d1_atari" else "observation=self.obs, action=action,"
        text = _replace_once(
            text, row, row.replace("observation=", "extra=np.full(len(action), 7.0, np.float32), observation=")
        )
        text = _check_in_loss(text, REPLAY[name])
    text = _replace_once(text, "import sys\n", "import os\nimport sys\n")
    if name in ACTORS:
        network, where = ACTORS[name], ("actor", "other_body.0.weight", (48, 3))
    elif name in NEW_NETWORK:
        _, network, where = NEW_NETWORK[name]
    else:
        _, factory, part = MARKED[name]
        network, where = MARK.format(factory=factory), (part, "copy_marker", (3,))
    main_block = 'if __name__ == "__main__":'
    return _replace_once(text, main_block, network + ADDED + "\n\n" + main_block), where


@pytest.mark.parametrize("sampler", ["serial", "parallel", "async"])
@pytest.mark.parametrize(
    "name", ["ppo_atari", *(pytest.param(n, marks=pytest.mark.slow) for n in sorted({*ON_POLICY, *REPLAY} - {"ppo_atari"}))]
)
def test_a_new_network_quantity_and_wrapper_reach_every_part(name: str, sampler: str, tmp_path: Path):
    assert ROOT not in tmp_path.resolve().parents
    text, (part, key, shape) = edited(name)
    copy = tmp_path / f"my_{name}.py"
    copy.write_text(text)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {"MARKS": str(marks)}
    train = [sys.executable, str(copy), *FLAGS[name], "--sampler", sampler, "--eval-episodes", "2", "--out-dir", "runs"]
    done = _run([*train, "--run-name", "r"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    learner = {p.name.split("-")[1] for p in marks.glob("extra-*")}
    wrapped = {p.name.split("-")[1] for p in marks.glob("env-*")}
    assert len(learner) == 1  # the learner's loss read the quantity, every value as written (else the run failed)
    assert wrapped - learner or sampler == "serial"  # the wrapper ran where the envs step: other processes
    assert learner <= wrapped or sampler != "serial"
    run = tmp_path / "runs" / "r"
    assert json.loads((run / "config.json").read_text())["script"] == f"my_{name}"  # runs labelled with the copy's name
    assert len(json.loads((run / "eval.json").read_text())["returns"]) == 2
    saved = torch.load(run / "checkpoint.pt", weights_only=False)[part]
    assert tuple(saved[key].shape) == shape, sorted(saved)
    exported = _run([sys.executable, str(copy), "--resume", str(run), "--export", str(tmp_path / "p.onnx")], tmp_path, env)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert (tmp_path / "p.onnx").stat().st_size > 0


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted({*ON_POLICY, *REPLAY}))
def test_each_edit_is_in_its_documented_places(name: str):
    """The edits above touch only the places the script's docstring names (so the recipe fails when they move)."""
    doc = ast.get_docstring(ast.parse((ROOT / "algos" / f"{name}.py").read_text()))
    places = ["rollout_example", "collect", "learn_from's rows"] if name in ON_POLICY else ["ROW", "EnvStepper.step"]
    for place in ["make_env", *places, "the loss"]:
        assert place in " ".join(doc.split()), place
    edited(name)  # every anchor found once
