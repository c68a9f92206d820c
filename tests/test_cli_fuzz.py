"""Every flag of every script, hostile values: the command line is either accepted or refused with one line and
exit 2, never a traceback. The flag list is read from each script's Args, so new flags are covered unedited.

In-process, many draws per script: the scripts' own parse_args + check_args (the code path that runs before
anything starts). Then a few draws per script as real tiny jobs in a subprocess, which must exit 0 or 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import sys
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.cli import parse_args
from tests.helpers import ROOT, refusal, run

sys.path.insert(0, str(ROOT / "algos"))
SCRIPTS = [
    "ppo_atari",
    "a2c_atari",
    "dqn_atari",
    "catdqn_atari",
    "r2d1_atari",
    "ddpg_mujoco",
    "td3_mujoco",
    "sac_mujoco",
    "ppo_mujoco",
    "ppo_lstm",
]
HOSTILE_FLOATS = [0.0, -1.0, 1.0, 0.5, 1e-300, 1e308, math.nan, math.inf, -math.inf, 2.0]
HOSTILE_INTS = [0, -1, 1, 2, 3, 7, -(2**31), 2**40]
HOSTILE_STRS = ["", " ", "no/such/path", "/proc/forbidden", "CartPole-v1", "NoSuchEnv-v0", "ALE/Breakout-v5"]
NEVER = {"resume", "out_dir", "run_name", "device", "capture_video"}  # paths and devices have their own tests


def value_strategy(annotation: typing.Any):
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return st.sampled_from([*typing.get_args(annotation), "bogus"])
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.sampled_from(HOSTILE_INTS) | st.integers(-5, 100_000)
    if annotation is float or float in typing.get_args(annotation):
        return st.sampled_from(HOSTILE_FLOATS) | st.floats(-10, 10)
    if annotation is str:
        return st.sampled_from(HOSTILE_STRS)
    if origin is tuple:
        return st.lists(st.integers(-3, 6), max_size=3).map(tuple)
    raise AssertionError(f"no strategy for {annotation}")


def argv_for(name: str, value: typing.Any) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    if isinstance(value, tuple):
        return [flag, *map(str, value)] if value else []
    return [flag, str(value)]


def flags(module) -> dict[str, st.SearchStrategy]:
    hints = typing.get_type_hints(module.Args)
    return {f.name: value_strategy(hints[f.name]) for f in dataclasses.fields(module.Args) if f.name not in NEVER}


@st.composite
def command_lines(draw, module):
    strategies = flags(module)
    names = draw(st.lists(st.sampled_from(sorted(strategies)), min_size=1, max_size=6, unique=True))
    argv = []
    for n in names:
        argv += argv_for(n, draw(strategies[n]))
    return argv


def script_check(module):
    """The check the script's main() hands to parse_args: its own check_args, shared.cli's check_replay_sizes,
    or none."""
    used = module.main.__code__.co_names
    return next((getattr(module, n) for n in ("check_args", "check_replay_sizes") if n in used), None)


def check_in_process(module, argv: list[str], monkeypatch) -> int:
    """Parse and check as the script does before anything starts; 0 accepted, 2 refused with one line."""
    monkeypatch.setattr(sys, "argv", [module.__name__, *argv, "--out-dir", "/tmp/fuzz-runs"])
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse_args(module.Args, None, script_check(module))
    except SystemExit as e:
        assert e.code == 2, (argv, e.code, err.getvalue())
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err.getvalue())
        return 2
    return 0


@pytest.mark.parametrize("name", SCRIPTS)
def test_hostile_flags_are_accepted_or_refused_in_one_line(name, monkeypatch):
    module = __import__(name)

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(argv=command_lines(module))
    def check(argv):
        check_in_process(module, argv, monkeypatch)

    check()


# Flags a subprocess job keeps fixed so that it stays tiny: the budget, the env, and sizes that would only make it
# long (huge buffers and batches are refused or accepted by the in-process test above).
TINY = {
    "ppo_atari": ["--env-id", "CartPole-v1", "--total-timesteps", "64", "--num-envs", "2", "--num-steps", "16"],
    "a2c_atari": ["--env-id", "CartPole-v1", "--total-timesteps", "64", "--num-envs", "2", "--num-steps", "8"],
    "dqn_atari": [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "300",
        "--num-envs",
        "2",
        "--buffer-size",
        "1000",
        "--min-steps-learn",
        "100",
        "--batch-size",
        "8",
    ],
    "catdqn_atari": [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "300",
        "--num-envs",
        "2",
        "--buffer-size",
        "1000",
        "--min-steps-learn",
        "100",
        "--batch-size",
        "8",
    ],
    "r2d1_atari": [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "300",
        "--num-envs",
        "2",
        "--buffer-size",
        "1000",
        "--min-steps-learn",
        "200",
        "--batch-size",
        "4",
        "--hidden",
        "8",
        "--sequence-length",
        "4",
        "--burn-in-steps",
        "2",
        "--rnn-state-interval",
        "4",
    ],
    "ppo_mujoco": [
        "--env-id",
        "Pendulum-v1",
        "--total-timesteps",
        "64",
        "--num-envs",
        "2",
        "--num-steps",
        "16",
        "--hidden",
        "8",
    ],
    "ppo_lstm": [
        "--env-id",
        "CartPole-v1",
        "--total-timesteps",
        "64",
        "--num-envs",
        "2",
        "--num-steps",
        "16",
        "--hidden",
        "8",
        "--num-minibatches",
        "1",
    ],  # minibatches split the envs
    "ddpg_mujoco": [
        "--env-id",
        "Pendulum-v1",
        "--total-timesteps",
        "300",
        "--replay-ratio",
        "8",
        "--buffer-size",
        "1000",
        "--min-steps-learn",
        "100",
        "--batch-size",
        "8",
        "--hidden",
        "8",
    ],
    "td3_mujoco": [
        "--env-id",
        "Pendulum-v1",
        "--total-timesteps",
        "300",
        "--replay-ratio",
        "8",
        "--buffer-size",
        "1000",
        "--min-steps-learn",
        "100",
        "--batch-size",
        "8",
        "--hidden",
        "8",
    ],
    "sac_mujoco": [
        "--env-id",
        "Pendulum-v1",
        "--total-timesteps",
        "300",
        "--replay-ratio",
        "8",
        "--buffer-size",
        "1000",
        "--min-steps-learn",
        "100",
        "--batch-size",
        "8",
        "--hidden",
        "8",
    ],
}
SIZES = {
    "env_id",
    "total_timesteps",
    "num_envs",
    "num_steps",
    "buffer_size",
    "batch_size",
    "min_steps_learn",
    "hidden",
    "sequence_length",
    "burn_in_steps",
    "rnn_state_interval",
    "sampler",
    "eval_episodes",
    "replay_ratio",
    "update_epochs",
    "log_every",
    "checkpoint_every",
    "observe_indices",
    "num_minibatches",
}


# A2C, C51, TD3 and DDPG, whose flags are their siblings' with a few of their own (the in-process fuzz above draws
# them all), run their real jobs with the slow tests, for CI's 40 minutes.
SIBLINGS = {"a2c_atari", "catdqn_atari", "td3_mujoco", "ddpg_mujoco"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SIBLINGS else n for n in SCRIPTS])
def test_hostile_flags_in_a_real_tiny_job_exit_0_or_2(name, tmp_path, monkeypatch):
    """A command line the checks refuse never starts a job (the test above and each script's bad-argument tests,
    one of them end to end): it is refused here by the script's main() in this process, which must agree. One
    they accept runs as a real job."""
    module = __import__(name)
    strategies = {k: v for k, v in flags(module).items() if k not in SIZES}
    monkeypatch.setenv("RL_COMPILE_BACKEND", "aot_eager")  # a drawn --compile: traced, no minutes of inductor

    @settings(max_examples=2, deadline=None, derandomize=True)
    @given(st.lists(st.sampled_from(sorted(strategies)), min_size=2, max_size=4, unique=True), st.data())
    def job(names, data):
        argv = []
        for n in names:
            argv += argv_for(n, data.draw(strategies[n]))
        command = [*TINY[name], "--eval-episodes", "1", *argv]
        if check_in_process(module, command, monkeypatch) == 2:
            lines = refusal(f"{name}.py", *command, "--out-dir", str(tmp_path))
            assert len(lines) == 1 and lines[0].startswith("error: "), (argv, lines)
            return
        out = run(f"{name}.py", *command, "--out-dir", str(tmp_path), timeout=120)
        # 1 only for a loss that hostile coefficients sent to infinity, summed up on the last line.
        last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
        assert out.returncode in (0, 2) or last.startswith("error: FloatingPointError"), (argv, out.stderr[-3000:])
        if out.returncode == 2:
            assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), (argv, out.stderr)

    job()


# A flag that sizes memory, at a size no machine holds: refused in one line with exit 2 before the run folder, W&B
# or a sampler exist (the replay checked before it is allocated, a network's tensor refused by torch, an on-policy
# rollout's observations checked in Run); --track shows that W&B never started.
HUGE = {
    "ppo_atari": ["--num-steps", str(10**12)],
    "a2c_atari": ["--num-steps", str(10**12)],
    "dqn_atari": ["--buffer-size", str(10**13), "--track"],
    "catdqn_atari": ["--n-atoms", str(10**11)],
    "r2d1_atari": ["--buffer-size", str(10**13)],
    "ppo_mujoco": ["--num-steps", str(10**12), "--sampler", "async"],
    "ppo_lstm": ["--hidden", str(10**9)],
    "ddpg_mujoco": ["--buffer-size", str(10**13), "--sampler", "async"],
    "td3_mujoco": ["--hidden", str(10**7)],
    "sac_mujoco": ["--buffer-size", str(10**13)],
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_size_the_machine_cannot_hold_exits_2_in_one_line_before_anything_starts(name, tmp_path, monkeypatch):
    """In this process (the refusal comes from Run(...) or from run.allocating, after run.setup()); that W&B never
    starts is checked end to end below (W&B is not started in the tests' process)."""
    huge = [a for a in HUGE[name] if a != "--track"]
    lines = refusal(f"{name}.py", *TINY[name], *huge, "--out-dir", str(tmp_path), setup=True)
    assert len(lines) == 1 and lines[0].startswith("error: --") and "GiB" in lines[0], lines
    assert not any(tmp_path.iterdir())  # no run folder


# End to end for a replay (with W&B asked for) and for a network's tensor torch refuses: the process's exit code and
# its whole stderr.
@pytest.mark.parametrize("name", ["dqn_atari", "ppo_lstm"])
def test_a_size_the_machine_cannot_hold_exits_2_from_the_command_line(name, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out = run(f"{name}.py", *TINY[name], *HUGE[name], "--out-dir", str(tmp_path), timeout=120)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [ln for ln in out.stderr.splitlines() if not ln.startswith(("A.L.E:", "[Powered by Stella]"))]
    assert len(lines) == 1 and lines[0].startswith("error: --") and "GiB" in lines[0], out.stderr
    assert not any(tmp_path.iterdir())  # no run folder, no W&B files
