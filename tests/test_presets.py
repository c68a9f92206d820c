"""--preset NAME in every script: the preset's values become the defaults, any other flag overrides them, in
either order; an unknown name is one error line. The presets' learning is tested where the scripts' learning is
(test_ppo, test_a2c, test_dqn, test_catdqn, test_r2d1 and test_continuous run them)."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import typing

import pytest

from shared.cli import parse_args
from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "algos"))
SCRIPTS = [
    "ppo_atari",
    "a2c_atari",
    "dqn_atari",
    "catdqn_atari",
    "r2d1_atari",
    "sac_mujoco",
    "td3_mujoco",
    "ddpg_mujoco",
    "ppo_mujoco",
    "ppo_lstm",
]


@pytest.mark.parametrize("name", SCRIPTS)
def test_presets_are_defaults_that_flags_override(name, monkeypatch):
    m = importlib.import_module(name)
    choices = typing.get_args(typing.get_type_hints(m.Args)["preset"])
    assert tuple(m.PRESETS) == choices and m.PRESETS[choices[0]] == m.Args()
    for preset, values in m.PRESETS.items():
        assert values.preset == preset
        for argv in (["--preset", preset], [f"--preset={preset}"]):
            monkeypatch.setattr(sys, "argv", [name, *argv])
            assert parse_args(m.Args, m.PRESETS) == values
        for argv in (["--preset", preset, "--seed", "7"], ["--seed", "7", "--preset", preset]):
            monkeypatch.setattr(sys, "argv", [name, *argv])
            assert parse_args(m.Args, m.PRESETS) == dataclasses.replace(values, seed=7)
    monkeypatch.setattr(sys, "argv", [name])
    assert parse_args(m.Args, m.PRESETS) == m.Args()


def test_an_unknown_preset_is_one_error_line(monkeypatch, capsys):
    m = importlib.import_module("ppo_atari")
    monkeypatch.setattr(sys, "argv", ["ppo_atari", "--preset", "nope"])
    with pytest.raises(SystemExit) as e:
        parse_args(m.Args, m.PRESETS)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: invalid choice 'nope' for argument '--preset'. Expected one of ('atari', 'cartpole')."
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_takes_the_same_run_flags_from_run_args(name):
    """The lifecycle flags are declared once (shared.cli.RunArgs): same names, types, defaults and help in every
    script, listed first by --help, and no script redeclares one."""
    from shared.cli import RunArgs

    m = importlib.import_module(name)
    assert issubclass(m.Args, RunArgs)
    run_fields = [f.name for f in dataclasses.fields(RunArgs)]
    assert [f.name for f in dataclasses.fields(m.Args)][: len(run_fields)] == run_fields
    assert not set(run_fields) & set(vars(m.Args).get("__annotations__", {}))


@pytest.mark.parametrize(
    "name, argv, message",
    [
        (
            "dqn_atari",
            ["--buffer-size", "500", "--min-steps-learn", "600"],
            "error: --buffer-size 500 is smaller than --min-steps-learn or --batch-size",
        ),
        (
            "sac_mujoco",
            ["--buffer-size", "100", "--min-steps-learn", "50", "--batch-size", "256"],
            "error: --buffer-size 100 is smaller than --min-steps-learn or --batch-size",
        ),
        (
            "td3_mujoco",
            ["--min-steps-learn", "100", "--batch-size", "256"],
            "error: --min-steps-learn 100 leaves fewer valid transitions than --batch-size 256",
        ),
        (
            "catdqn_atari",
            ["--preset", "cartpole", "--min-steps-learn", "40", "--batch-size", "32"],
            "error: --min-steps-learn 40 leaves fewer valid transitions than --batch-size 32",
        ),
    ],
)
def test_replay_sizes_that_cannot_work_are_one_error_line(name, argv, message, monkeypatch, capsys):
    m = importlib.import_module(name)
    check = next(getattr(m, n) for n in ("check_args", "check_replay_sizes") if n in m.main.__code__.co_names)
    monkeypatch.setattr(sys, "argv", [name, *argv])
    with pytest.raises(SystemExit) as e:
        parse_args(m.Args, m.PRESETS, check)
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [message]
