"""docs/contract.md for the experiments/ command lines (issue 63): a bad argument, config file, root or record is one
``error:`` line and exit 2 before anything is created or changed; the flags a launch passes are checked by each
script's own parser before the first run folder exists; the report lists every run it leaves out, with the reason,
and never counts one as a seed; every experiments/ module imports, and the command lines run as scripts.

The in-process tests call ``main(argv)`` of launch.py, report.py and status.py and compare a snapshot of the
tree (every path, its bytes and its modification time) before and after."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments import launch, report, status
from tests.helpers import ROOT

GRID = {
    "scripts": [str(ROOT / "algos" / "ppo_atari.py")],
    "env_ids": ["CartPole-v1"],
    "seeds": [1],
    "flags": ["--preset", "cartpole"],
    "levels": [],
    "nproc_per_node": 1,
}
RUN = "ppo_atari/CartPole-v1/base/seed1"


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every path under ``root`` (and ``root``): its bytes (None for a folder) and modification time."""
    paths = [root, *root.rglob("*")] if root.exists() else []
    return {str(p): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns) for p in paths}


def experiment(root: Path, state: str = "done") -> Path:
    """An experiment root as a launch of GRID leaves it (one run, its launch.json), made by hand."""
    folder = root / RUN
    folder.mkdir(parents=True)
    (root / "experiment.json").write_text(json.dumps({"root": str(root), "grid": GRID, "runs": [RUN], "launches": []}))
    (root / "status.json").write_text(json.dumps({"runs": {RUN: {"state": state}}, "counts": {state: 1}}))
    record = {
        "run": RUN,
        "script": "ppo_atari",
        "env_id": "CartPole-v1",
        "seed": 1,
        "variant": {"name": "base"},
        "state": state,
        "exit_code": 0 if state == "done" else 1,
        "error": None,
        "command": None,
        "attempts": [],
    }
    (folder / "launch.json").write_text(json.dumps(record))
    return root


def refused(capsys, main, argv) -> str:
    """``main(argv)`` exits 2 (returned or by SystemExit, as argparse does) with one ``error:`` line on stderr."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, (argv, code, err)
    assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)  # one line: no usage block, no traceback
    return err.strip()


@pytest.fixture
def no_flag_checks(monkeypatch):
    """A refusal must come before the scripts' checks: reaching them (or a run) fails the test at once."""

    def reached(*args, **kwargs):
        raise AssertionError("the launch got past its own checks")

    if hasattr(launch, "check_flags"):
        monkeypatch.setattr(launch, "check_flags", reached)
    monkeypatch.setattr(launch, "Launcher", reached)
    monkeypatch.setattr(launch, "submit", reached)


# ---------------------------------------------------------------------------------------------- launch.py


@pytest.mark.parametrize("where", ["file", "under_a_file", "unwritable"])
def test_a_root_that_cannot_hold_an_experiment_is_one_line(where, tmp_path, capsys, no_flag_checks):
    (tmp_path / "f").write_text("x")
    root = {"file": tmp_path / "f", "under_a_file": tmp_path / "f" / "exp", "unwritable": Path("/proc/no/exp")}[where]
    before = snapshot(tmp_path)
    err = refused(capsys, launch.main, [str(root), "--scripts", "ppo_atari", "--seeds", "1"])
    assert "root" in err and str(root if where != "unwritable" else "/proc") in err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "config, said",
    [
        ({"seeds": 5}, "seeds must be a list of integers, got 5"),
        ({"seeds": ["1"]}, "seeds must be a list of integers"),
        ({"scripts": "ppo_atari"}, "scripts must be a list"),
        ({"env_ids": [""]}, "env_ids must be a list of env ids"),
        ({"flags": 3}, "flags must be a string or a list"),
        ({"root": 7}, "root must be a folder name"),
    ],
)
def test_a_config_value_of_the_wrong_type_is_one_line(config, said, tmp_path, capsys, no_flag_checks):
    cfg = tmp_path / "exp.json"
    cfg.write_text(json.dumps({"root": str(tmp_path / "exp"), "scripts": ["ppo_atari"], "seeds": [1], **config}))
    before = snapshot(tmp_path)
    assert said in refused(capsys, launch.main, ["--config", str(cfg)])
    assert snapshot(tmp_path) == before


def test_a_config_file_that_is_not_text_is_one_line(tmp_path, capsys, no_flag_checks):
    cfg = tmp_path / "exp.toml"
    cfg.write_bytes(b"root = '\xff\xfe'\n")
    assert "not UTF-8" in refused(capsys, launch.main, ["--config", str(cfg)])


DAMAGED = [
    ("experiment.json", "{", "not JSON"),
    ("experiment.json", "[]", "a JSON list, not an object"),
    ("experiment.json", json.dumps({"grid": {**GRID, "seeds": "abc"}}), "grid: seeds must be a list of integers"),
    ("experiment.json", json.dumps({"grid": {**GRID, "levels": [["a"]]}}), "levels must be lists of [name, [flags]]"),
    ("experiment.json", json.dumps({"grid": GRID, "launches": {}}), "launches is {}, not a list"),
    ("status.json", "[1]", "a JSON list, not an object"),
    ("status.json", json.dumps({"runs": []}), "runs is [], not an object of objects"),
    (f"{RUN}/launch.json", "{", "not JSON"),
    (f"{RUN}/launch.json", json.dumps({"state": "failed", "attempts": "x"}), 'attempts is "x", not a list'),
    (f"{RUN}/launch.json", json.dumps({"state": "odd", "attempts": []}), 'state is "odd", not one of'),
    (f"{RUN}/launch.json", json.dumps({"state": "failed", "attempts": [], "exit_code": "1"}), "exit_code is"),
]


@pytest.mark.parametrize("name, text, said", DAMAGED)
@pytest.mark.parametrize(
    "how", [["--status"], ["--retry-failed"], ["--scripts", "ppo_atari", "--env-ids", "CartPole-v1", "--seeds", "1"]]
)
def test_a_damaged_record_is_named_in_one_line_and_nothing_is_rewritten(
    name, text, said, how, tmp_path, capsys, no_flag_checks
):
    """--retry-failed over a damaged launch.json used to rewrite experiment.json and status.json, then crash."""
    root = experiment(tmp_path / "exp", state="failed")
    (root / name).write_text(text)
    before = snapshot(tmp_path)
    extra = ["--", "--preset", "cartpole"] if "--scripts" in how else []
    err = refused(capsys, launch.main, [str(root), *how, *extra])
    assert str(root / name) in err and said in err, err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["R", "--seeds", "1.5"],
        ["R", "--cores-per-run", "x"],
        ["R", "--cluster", "moon"],
        ["R", "--no-such-flag"],
        ["R", "--stop-timeout"],
    ],
)
def test_argparse_refusals_are_one_line(argv, tmp_path, capsys, no_flag_checks):
    refused(capsys, launch.main, [str(tmp_path / "exp") if a == "R" else a for a in argv])
    assert not (tmp_path / "exp").exists()


# Bad values for every flag of launch.py that the launcher itself refuses (the scripts' values are the next tests').
NOT_INT = st.sampled_from(["1.5", "x", "", "1e3", "0x10", "--", "nan"])
BELOW = lambda lo: st.integers(max_value=lo - 1).map(str)
BAD_FLOAT = st.one_of(st.floats(max_value=-1e-9, allow_nan=False).map(repr), st.sampled_from(["nan", "inf", "x", ""]))
LAUNCH_BAD = {
    "--cores-per-run": st.one_of(BELOW(1), NOT_INT),
    "--nproc-per-node": st.one_of(BELOW(1), NOT_INT),
    "--gpus-per-run": st.one_of(BELOW(0), NOT_INT),
    "--runs-per-gpu": st.one_of(BELOW(1), NOT_INT),
    "--time": st.one_of(BELOW(1), NOT_INT),
    "--array-parallelism": st.one_of(BELOW(1), NOT_INT),
    "--stop-timeout": BAD_FLOAT,
    "--status-every": BAD_FLOAT,
    "--mem-gb": st.one_of(BAD_FLOAT, st.just("0")),
    "--seeds": st.one_of(NOT_INT, st.just("1 1")),
    "--cluster": st.text(min_size=1, max_size=8).filter(lambda s: s not in ("auto", "slurm", "local")),
    "--slurm-param": st.text(max_size=10).filter(lambda s: "=" not in s or s.startswith("=")),
    "--partition": st.sampled_from(["", " "]),
    "--level": st.text(max_size=10).filter(lambda s: ":" not in s),
    "--scripts": st.sampled_from(["no_such_script", "README.md", ""]),
    "--env-ids": st.sampled_from(["", "..", "../x", ".hidden", "a b"]),
    "--config": st.sampled_from(["missing.toml", "folder", "bad.toml", "list.json", "seeds.json"]),
    "root": st.sampled_from(["file", "file/exp"]),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(sorted(LAUNCH_BAD)), data=st.data())
def test_property_every_bad_launch_flag_is_one_line_and_changes_nothing(flag, data, tmp_path, capsys, no_flag_checks):
    """Over an existing experiment root: any bad value of any launcher flag, one line, exit 2, the tree as it was."""
    base = tmp_path / "case"
    if not base.exists():
        experiment(base / "exp")
        (base / "file").write_text("x")
        (base / "folder").mkdir()
        (base / "bad.toml").write_text("root = [")
        (base / "list.json").write_text("[1]")
        (base / "seeds.json").write_text(json.dumps({"scripts": ["ppo_atari"], "seeds": 5}))
    value = data.draw(LAUNCH_BAD[flag], label=flag)
    root = str(base / "exp")
    argv = [root, "--scripts", "ppo_atari", "--seeds", "1"]
    if flag == "root":
        argv[0] = str(base / value)
    elif flag == "--config":
        argv = ["--config", str(base / value)]
    elif flag == "--seeds":
        argv = [root, "--scripts", "ppo_atari", "--seeds", *value.split(" ")]
    elif flag == "--partition" or flag == "--mem-gb" or flag == "--slurm-param":
        argv += [f"{flag}={value}"]
    else:
        argv += [f"{flag}={value}"] if value.startswith("-") or not value else [flag, value]
    before = snapshot(base)
    refused(capsys, launch.main, [*argv, "--", "--preset", "cartpole"])
    assert snapshot(base) == before


# ---------------------------------------------------------------------------------------------- report.py


def runs_for_report(root: Path) -> Path:
    """Two scored seeds and a run of each kind the report must leave out, with the reason it gives."""

    def folder(name, launch=None, config=None, ev=None, progress=None):
        f = root / name
        f.mkdir(parents=True)
        for file, content in (("launch.json", launch), ("config.json", config), ("eval.json", ev)):
            if content is not None:
                (f / file).write_text(content if isinstance(content, str) else json.dumps(content))
        if progress is not None:
            (f / "progress.csv").write_text("global_step,wall_time_s,sps,episodes,return_mean\n" + progress)

    def rec(seed, state="done"):
        return {"script": "ppo", "env_id": "CartPole-v1", "seed": seed, "state": state, "variant": {"name": "base"}}

    folder("a", rec(1), ev={"returns": [10.0, 12.0]})
    folder("b", rec(2), ev={"returns": [20.0]})
    folder("nan_train", rec(3), progress="10,1,1,2,nan\n")
    folder("nan_eval", rec(4), ev={"returns": [float("nan")]})
    folder("not_a_number", rec(5), progress="10,1,1,2,abc\n")
    folder("config_args_list", config={"script": "ppo", "args": ["x"]}, ev={"returns": [1.0]})
    folder("launch_seed_text", {**rec(6), "seed": "x"}, ev={"returns": [1.0]})
    folder("launch_list", "[1, 2]", ev={"returns": [1.0]})
    folder("launch_broken", "{", ev={"returns": [1.0]})
    folder("eval_returns_text", rec(7), ev={"returns": "many"})
    folder("running", rec(8, "running"), ev={"returns": [1.0]})
    folder("no_episode", rec(9), progress="10,1,1,0,\n")
    return root


LEFT_OUT = {
    "nan_train": "its train score is nan",
    "nan_eval": "its eval score is nan",
    "not_a_number": "progress.csv: return_mean 'abc' at step 10 is not a number",
    "config_args_list": 'config.json: args is ["x"], not an object',
    "launch_seed_text": 'launch.json: seed is "x", not an integer',
    "launch_list": "launch.json: a JSON list, not an object",
    "launch_broken": "launch.json: not JSON",
    "eval_returns_text": "eval.json: returns is not a list of numbers",
    "running": "not finished (state running",
    "no_episode": "progress.csv: no training episode finished",
}


def test_the_report_lists_every_run_it_leaves_out_and_never_counts_one_as_a_seed(tmp_path, capsys):
    root = runs_for_report(tmp_path / "exp")
    assert report.main([str(root), "--no-curves", "--reps", "100"]) == 0
    text = (root / "report" / "report.md").read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| ppo | CartPole-v1 | base |"))
    cells = [c.strip() for c in row.split("|")]
    assert cells[4] == "2" and cells[6] == "15.5", row  # seeds 1 and 2 only: NaN runs are not seeds
    for name, reason in LEFT_OUT.items():
        line = next((ln for ln in text.splitlines() if ln.startswith(f"- `{name}`")), None)
        assert line is not None and reason in line, (name, line)


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--seed", "-1"], "--seed must be in [0, 2**31)"),
        (["--seed", str(2**40)], "--seed must be in [0, 2**31)"),
        (["--reps", "1000000000000"], "--reps must be in [10, 100000]"),
        (["--reps", "5"], "--reps must be in [10, 100000]"),
        (["--last-episodes", "0"], "--last-episodes must be at least 1"),
        (["--source", "median"], "invalid choice"),
        (["--reps", "1.5"], "invalid int value"),
        (["--out", "FILE/report"], "is a file"),
        (["--reference", "MISSING"], "--reference"),
        (["--reference", "BADREF"], "needs finite"),
    ],
)
def test_report_refuses_bad_arguments_in_one_line_and_writes_nothing(extra, said, tmp_path, capsys):
    """--seed -1 used to leave an empty report/ behind; --reps 10**12 tried to allocate 14.6 TiB."""
    root = runs_for_report(tmp_path / "exp")
    (tmp_path / "file").write_text("x")
    (tmp_path / "badref.json").write_text(json.dumps({"CartPole-v1": {"random": 0, "human": math.inf}}))
    names = {"FILE": str(tmp_path / "file"), "MISSING": str(tmp_path / "none.json"), "BADREF": str(tmp_path / "badref.json")}
    extra = [names.get(a.split("/")[0], a.split("/")[0]) + ("/" + a.split("/", 1)[1] if "/" in a else "") for a in extra]
    before = snapshot(tmp_path)
    assert said in refused(capsys, report.main, [str(root), *extra])
    assert snapshot(tmp_path) == before


def test_report_without_its_argument_is_one_line(capsys):
    refused(capsys, report.main, [])


REPORT_BAD = {
    "--reps": st.one_of(st.integers(max_value=9), st.integers(min_value=100_001)).map(str),
    "--seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**31)).map(str),
    "--last-episodes": st.one_of(st.integers(max_value=0).map(str), NOT_INT),
    "--source": st.text(min_size=1, max_size=6).filter(lambda s: s not in ("auto", "eval", "train")),
    "--out": st.sampled_from(["file", "file/x"]),
    "--reference": st.sampled_from(["missing.json", "file", "folder", "list.json"]),
    "experiment": st.sampled_from(["missing", "file"]),
}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(sorted(REPORT_BAD)), data=st.data())
def test_property_every_bad_report_flag_is_one_line_and_changes_nothing(flag, data, tmp_path, capsys):
    base = tmp_path / "case"
    if not base.exists():
        runs_for_report(base / "exp")
        (base / "file").write_text("x")
        (base / "folder").mkdir()
        (base / "list.json").write_text("[1]")
    value = data.draw(REPORT_BAD[flag], label=flag)
    argv = [str(base / "exp"), "--no-curves"]
    if flag == "experiment":
        argv[0] = str(base / value)
    elif flag in ("--out", "--reference"):
        argv += [flag, str(base / value)]
    else:
        argv += [f"{flag}={value}"]
    before = snapshot(base)
    refused(capsys, report.main, argv)
    assert snapshot(base) == before


# ---------------------------------------------------------------------------------------------- status.py


def test_status_reads_an_experiment_and_refuses_a_damaged_one_in_one_line(tmp_path, capsys):
    root = experiment(tmp_path / "exp")
    before = snapshot(tmp_path)
    assert status.main([str(root)]) == 0
    out = capsys.readouterr().out
    assert RUN in out and "1/1 done" in out
    (root / "experiment.json").write_text(json.dumps({"grid": {**GRID, "seeds": 5}}))
    assert "experiment.json: damaged" in refused(capsys, status.main, [str(root)])
    assert "has no experiment.json" in refused(capsys, status.main, [str(tmp_path)])
    refused(capsys, status.main, [])
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.endswith("experiment.json")} == {
        k: v for k, v in before.items() if not k.endswith("experiment.json")
    }


# ---------------------------------------------------------------------------------------------- the scripts' flags


@pytest.mark.parametrize(
    "grid, said",
    [
        (["--seeds", "-1"], "--seed must be in [0, 2**31), got -1"),
        (["--seeds", "1", "--env-ids", "ALE/NoSuchGame-v5"], "NoSuchGame"),
        (["--seeds", "1", "--flags", "--learning-rate -1"], "--learning-rate"),
        (["--seeds", "1", "2", "--level", "ok:--num-envs 2", "bad:--num-envs 0"], "--num-envs"),
    ],
)
def test_flags_the_script_refuses_are_refused_before_any_folder_exists(grid, said, tmp_path, capsys):
    """Each script's own parser and pre-start checks run (as a subprocess, RL_CHECK_ONLY) before the launcher
    writes anything: once, one line, exit 2, no root; they used to create run folders whose runs failed."""
    root = tmp_path / "exp"
    err = refused(capsys, launch.main, [str(root), "--scripts", "ppo_atari", *grid, "--", "--preset", "cartpole"])
    assert said in err and "ppo_atari" in err, err
    assert list(tmp_path.iterdir()) == []


# Records each check it gets (its argv) and refuses --bad, as a script's parser would; no torch: milliseconds.
LOGS_ITS_CHECKS = """
import os, sys
with open(os.environ["CHECK_LOG"], "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if "--bad" in sys.argv:
    print("error: --bad is refused", file=sys.stderr)
    sys.exit(2)
sys.exit(0 if os.environ.get("RL_CHECK_ONLY") else 3)
"""


def test_the_checks_cover_every_variant_and_the_seed_range_without_a_check_per_seed(tmp_path, capsys, monkeypatch):
    """Two env ids x two variants x five seeds (20 runs): four checks (subprocesses of a stand-in script), one per
    script x env id x variant, whose seeds are the lowest and the highest; a bad variant is refused by name."""
    script, log = tmp_path / "logs.py", tmp_path / "log"
    script.write_text(LOGS_ITS_CHECKS)
    monkeypatch.setenv("CHECK_LOG", str(log))
    grid = [
        str(tmp_path / "exp"),
        "--scripts",
        str(script),
        "--env-ids",
        "A-v0",
        "B-v0",
        "--seeds",
        "3",
        "1",
        "9",
        "4",
        "5",
        "--level",
        "x:--lr 1",
        "y:--lr 2",
        "--dry-run",
    ]
    assert launch.main(grid) == 0
    checks = log.read_text().splitlines()
    assert len(checks) == 4, checks
    seeds = sorted(int(c.split("--seed ")[1].split()[0]) for c in checks)
    assert seeds[0] == 1 and seeds[-1] == 9
    assert {(c.split("--env-id ")[1].split()[0], c.split("--lr ")[1].split()[0]) for c in checks} == {
        ("A-v0", "1"),
        ("A-v0", "2"),
        ("B-v0", "1"),
        ("B-v0", "2"),
    }
    assert all(str(tmp_path) not in c for c in checks if "--out-dir" in c), "the checks never point at the root"
    err = refused(capsys, launch.main, [*grid[:-2], "y:--lr 2 --bad"])
    assert "refuses the flags of logs/" in err and "/y (seed" in err and "--bad is refused" in err
    assert not (tmp_path / "exp").exists()


# ---------------------------------------------------------------------------------------------- the package


def test_every_module_imports_and_every_command_runs_as_a_script(tmp_path):
    """``import experiments.<name>`` for each module of the folder, and ``python experiments/<name>.py --help`` for
    each command line, as subprocesses from another folder (status.py used to fail: No module named
    'experiments')."""
    import importlib

    import experiments

    names = sorted(p.stem for p in (ROOT / "experiments").glob("*.py") if p.stem != "__init__")
    assert set(experiments.MODULES) <= set(names), "experiments.MODULES names a module that is not there"
    for name in names:
        importlib.import_module(f"experiments.{name}")
    root = experiment(tmp_path / "exp")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for name in experiments.COMMANDS:
        done = subprocess.run(
            [sys.executable, str(ROOT / "experiments" / f"{name}.py"), "--help"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 0 and "usage" in done.stdout, (name, done.stderr[-2000:])
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "status.py"), str(root)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0 and RUN in done.stdout, done.stderr
