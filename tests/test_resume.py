"""``--resume RUN`` is the whole run: its flags come back from the run folder, a flag given overrides one that may
change, and one that may not is refused in one line before anything is written (shared/cli.py)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from shared.cli import RESUME_MAY_CHANGE, RunArgs, parse_args, recorded_flags, resume_changes
from tests.helpers import ROOT, progress, run

sys.path.insert(0, str(ROOT / "algos"))
import dqn_atari
import ppo_atari
import r2d1_atari

SCRIPTS = [
    "a2c_atari",
    "catdqn_atari",
    "ddpg_mujoco",
    "dqn_atari",
    "ppo_atari",
    "ppo_lstm",
    "ppo_mujoco",
    "r2d1_atari",
    "sac_mujoco",
    "td3_mujoco",
]


def recorded_run(folder: Path, module=ppo_atari, preset: str = "cartpole", **changes) -> dict:
    """A run folder as a training run leaves it, as far as parsing reads it: config.json with the run's flags."""
    args = dataclasses.replace(module.PRESETS[preset], **changes)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"args": dataclasses.asdict(args), "script": module.__name__}
    (folder / "config.json").write_text(json.dumps(config, default=str))
    (folder / "checkpoint.pt").write_bytes(b"")  # parsing does not read it
    return config["args"]


def parse(monkeypatch, module, *argv: str):
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *argv])
    return parse_args(module.Args, module.PRESETS)


def refused(monkeypatch, capsys, module, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        parse(monkeypatch, module, *argv)
    assert e.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_bare_resume_restores_every_flag_the_run_recorded(tmp_path, monkeypatch):
    recorded = recorded_run(
        tmp_path / "r", env_id="Acrobot-v1", learning_rate=0.0123, num_envs=3, seed=7, total_timesteps=5000, ent_coef=0.02
    )
    args = parse(monkeypatch, ppo_atari, "--resume", str(tmp_path / "r"))
    assert dataclasses.asdict(args) == {**recorded, "resume": str(tmp_path / "r")}
    assert args.preset == "cartpole" and args.update_epochs == 20  # the preset's, not the default 4
    assert resume_changes(args) == {}


def test_flags_that_may_change_override_the_recorded_ones_and_are_reported(tmp_path, monkeypatch):
    recorded_run(tmp_path / "r", total_timesteps=5000)
    args = parse(
        monkeypatch,
        ppo_atari,
        "--resume",
        str(tmp_path / "r"),
        "--total-timesteps",
        "9000",
        "--sampler",
        "async",
        "--eval-every",
        "1000",
        "--device",
        "cpu",
        "--checkpoint-minutes",
        "1",
    )
    assert (args.total_timesteps, args.sampler, args.eval_every, args.checkpoint_minutes) == (9000, "async", 1000, 1.0)
    assert resume_changes(args) == {
        "total_timesteps": (5000, 9000),
        "sampler": ("serial", "async"),
        "eval_every": (0, 1000),
        "checkpoint_minutes": (15.0, 1.0),
        "device": ("auto", "cpu"),
    }
    assert args.learning_rate == ppo_atari.PRESETS["cartpole"].learning_rate  # the rest as recorded


@pytest.mark.parametrize(
    "flag, value, was, given",
    [
        ("--learning-rate", "0.1", "0.00025", "0.1"),
        ("--env-id", "Acrobot-v1", "'CartPole-v1'", "'Acrobot-v1'"),
        ("--num-envs", "8", "4", "8"),
        ("--seed", "2", "1", "2"),
        ("--preset", "atari", "'cartpole'", "'atari'"),
        ("--no-norm-adv", None, "True", "False"),
    ],
)
def test_a_flag_that_is_the_runs_own_is_refused_in_one_line_and_nothing_is_written(
    tmp_path, monkeypatch, capsys, flag, value, was, given
):
    recorded_run(tmp_path / "r", learning_rate=0.00025, num_envs=4)
    before = snapshot(tmp_path / "r")
    line = refused(monkeypatch, capsys, ppo_atari, "--resume", str(tmp_path / "r"), flag, *([value] if value else []))
    name = flag.replace("--no-", "--")
    assert f"{name} is the run's own setting ({was} there, {given} given)" in line, line
    assert snapshot(tmp_path / "r") == before


def test_a_flag_given_with_its_recorded_value_is_no_change(tmp_path, monkeypatch):
    recorded_run(tmp_path / "r", learning_rate=0.00025)
    args = parse(
        monkeypatch,
        ppo_atari,
        "--resume",
        str(tmp_path / "r"),
        "--preset",
        "cartpole",
        "--learning-rate",
        "0.00025",
        "--env-id",
        "CartPole-v1",
    )  # the launcher and old habits type the whole command again
    assert resume_changes(args) == {}


def test_the_latest_resume_records_the_flags(tmp_path, monkeypatch):
    recorded_run(tmp_path / "r", total_timesteps=1000)
    for step, total in ((500, 2000), (1500, 3000)):  # each resume writes config.resume-{step}.json beside it
        config = json.loads((tmp_path / "r" / "config.json").read_text())
        config["args"]["total_timesteps"] = total
        (tmp_path / "r" / f"config.resume-{step}.json").write_text(json.dumps(config))
    assert recorded_flags(str(tmp_path / "r"))["total_timesteps"] == 3000
    assert recorded_flags(str(tmp_path / "r" / "checkpoint.pt"))["total_timesteps"] == 3000  # the file names it too
    assert parse(monkeypatch, ppo_atari, "--resume", str(tmp_path / "r")).total_timesteps == 3000


def test_a_tuple_flag_comes_back_as_a_tuple(tmp_path, monkeypatch):
    recorded_run(tmp_path / "r", module=r2d1_atari, preset="memory", observe_indices=(0, 2))
    args = parse(monkeypatch, r2d1_atari, "--resume", str(tmp_path / "r"))
    assert args.observe_indices == (0, 2) and resume_changes(args) == {}


def test_a_folder_that_records_no_flags_resumes_with_the_flags_given_and_says_so(tmp_path, monkeypatch, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "checkpoint.pt").write_bytes(b"")
    args = parse(monkeypatch, ppo_atari, "--resume", str(tmp_path / "old"), "--preset", "cartpole", "--num-envs", "3")
    assert args.num_envs == 3 and args.env_id == "CartPole-v1"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("note: --resume") and "give the ones it was started with" in err[0]


def test_eval_only_of_a_run_trained_without_evaluation_plays_the_default_episodes(tmp_path, monkeypatch):
    recorded_run(tmp_path / "r", eval_episodes=0)
    assert parse(monkeypatch, ppo_atari, "--resume", str(tmp_path / "r"), "--eval-only").eval_episodes == RunArgs.eval_episodes
    args = parse(monkeypatch, ppo_atari, "--resume", str(tmp_path / "r"), "--eval-only", "--eval-episodes", "3")
    assert args.eval_episodes == 3


def test_another_scripts_run_is_named(tmp_path, monkeypatch, capsys):
    recorded_run(tmp_path / "r")
    line = refused(monkeypatch, capsys, dqn_atari, "--resume", str(tmp_path / "r"))
    assert "the checkpoint was written by ppo_atari, not dqn_atari" in line, line


def test_every_flag_that_may_change_is_a_flag_of_the_scripts():
    """A typo in RESUME_MAY_CHANGE would refuse that flag: every name is a field of some script's Args."""
    import importlib

    fields = {f.name for name in SCRIPTS for f in dataclasses.fields(importlib.import_module(name).Args)}
    assert RESUME_MAY_CHANGE <= fields, RESUME_MAY_CHANGE - fields


# ---------------------------------------------------------------------------------------- end to end, as a user
CARTPOLE_DQN = [
    "--env-id",
    "CartPole-v1",
    "--num-envs",
    "2",
    "--total-timesteps",
    "600",
    "--buffer-size",
    "2000",
    "--min-steps-learn",
    "200",
    "--batch-size",
    "32",
    "--log-every",
    "200",
]


@pytest.mark.parametrize(
    "name, flags, sampler",
    [
        (
            "ppo_atari.py",
            ["--preset", "cartpole", "--total-timesteps", "512", "--num-envs", "2", "--num-steps", "64"],
            "serial",
        ),
        pytest.param("dqn_atari.py", CARTPOLE_DQN, "async", marks=pytest.mark.slow),
    ],
)  # CI time: the slow matrix too
def test_eval_only_export_and_training_resume_with_no_other_flag(name, flags, sampler, tmp_path):
    first = run(
        name,
        *flags,
        "--sampler",
        sampler,
        "--eval-episodes",
        "2",
        "--eval-envs",
        "2",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=300,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    folder, steps = tmp_path / "r", int(progress(tmp_path / "r")[-1]["global_step"])
    evaluated = run(name, "--resume", str(folder), "--eval-only", timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert f"evaluating the policy at step {steps}: 2 episodes, 2 envs" in evaluated.stdout
    assert len(json.loads((folder / "eval.json").read_text())["returns"]) == 2
    exported = run(name, "--resume", str(folder), "--export", str(tmp_path / "p.onnx"), timeout=300)
    assert exported.returncode == 0 and (tmp_path / "p.onnx").is_file(), exported.stderr[-2000:]
    more = run(name, "--resume", str(folder), "--total-timesteps", str(2 * steps), timeout=300)
    assert more.returncode == 0, more.stderr[-2000:]
    assert "changed here: --total-timesteps" in more.stdout and f"sampler {sampler}" in more.stdout
    assert int(progress(folder)[-1]["global_step"]) >= 2 * steps
    resumed = json.loads((folder / f"config.resume-{steps}.json").read_text())
    assert resumed["resumed"] == {
        "from": str(folder),
        "recorded_flags": True,
        "changed": {"total_timesteps": [int(flags[flags.index("--total-timesteps") + 1]), 2 * steps]},
    }
    assert resumed["args"]["sampler"] == sampler  # from the run, not the default


# Every script, slow: a run made with a preset and one made with explicit flags (tests/test_evaluation.py's, in a
# sampling mode of each kind across the scripts) each resume bare: --eval-only, --export and training.
PRESET_RUNS = {
    "ppo_atari.py": ("cartpole", 512),
    "a2c_atari.py": ("cartpole", 512),
    "ppo_lstm.py": ("cartpole", 1024),
    "ppo_mujoco.py": ("pendulum", 2048),
    "dqn_atari.py": ("cartpole", 1200),
    "catdqn_atari.py": ("cartpole", 1200),
    "r2d1_atari.py": ("memory", 2400),
    "sac_mujoco.py": ("pendulum", 1200),
    "td3_mujoco.py": ("pendulum", 1200),
    "ddpg_mujoco.py": ("pendulum", 1200),
}
SAMPLER = {
    "ppo_atari.py": "serial",
    "dqn_atari.py": "serial",
    "a2c_atari.py": "parallel",
    "catdqn_atari.py": "parallel",
    "sac_mujoco.py": "parallel",
    "ppo_lstm.py": "parallel",
    "r2d1_atari.py": "async",
    "td3_mujoco.py": "async",
    "ddpg_mujoco.py": "async",
    "ppo_mujoco.py": "async",
}


def resumes_bare(name: str, folder: Path, tmp_path: Path) -> None:
    steps = int(progress(folder)[-1]["global_step"])
    evaluated = run(name, "--resume", str(folder), "--eval-only", "--eval-episodes", "2", "--eval-envs", "2", timeout=300)
    assert evaluated.returncode == 0 and f"evaluating the policy at step {steps}" in evaluated.stdout, evaluated.stderr[-2000:]
    onnx = tmp_path / f"{folder.name}.onnx"
    exported = run(name, "--resume", str(folder), "--export", str(onnx), timeout=300)
    assert exported.returncode == 0 and onnx.is_file(), exported.stderr[-2000:]
    more = run(name, "--resume", str(folder), "--total-timesteps", str(2 * steps), timeout=300)  # whole rollouts
    assert more.returncode == 0 and "changed here: --total-timesteps" in more.stdout, more.stderr[-2000:]
    assert int(progress(folder)[-1]["global_step"]) >= 2 * steps


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESET_RUNS))
def test_every_script_resumes_bare_a_preset_run_and_an_explicit_one(name, tmp_path):
    from tests.test_evaluation import SCRIPTS as EXPLICIT

    preset, total = PRESET_RUNS[name]
    made = run(
        name,
        "--preset",
        preset,
        "--total-timesteps",
        str(total),
        "--eval-episodes",
        "0",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "preset",
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    resumes_bare(name, tmp_path / "preset", tmp_path)
    flags, _ = EXPLICIT[name]
    made = run(
        name,
        *flags,
        "--sampler",
        SAMPLER[name],
        "--eval-episodes",
        "0",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "explicit",
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    resumes_bare(name, tmp_path / "explicit", tmp_path)
    assert f"sampler {SAMPLER[name]}" in run(name, "--resume", str(tmp_path / "explicit"), "--eval-only", timeout=300).stdout


@pytest.mark.slow
def test_a_torchrun_job_resumes_bare_under_torchrun(tmp_path):
    from tests.helpers import script
    from tests.test_distributed import launch, torchrun, wait

    made = launch(
        torchrun(
            script("ppo_atari.py"),
            "--preset",
            "cartpole",
            "--total-timesteps",
            "1024",
            "--eval-episodes",
            "0",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            "r",
        )
    )
    rc, _, err = wait(made, 300, str(tmp_path))
    assert rc == 0, err[-3000:]
    rc, out, err = wait(
        launch(torchrun(script("ppo_atari.py"), "--resume", str(tmp_path / "r"), "--total-timesteps", "2048")),
        300,
        str(tmp_path),
    )
    assert rc == 0 and "changed here: --total-timesteps 1024 -> 2048" in out, err[-3000:]
    assert int(progress(tmp_path / "r")[-1]["global_step"]) == 2048
