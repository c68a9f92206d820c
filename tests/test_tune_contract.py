"""experiments/tune.py keeps docs/contract.md: a bad argument, config file, tune folder, storage or flag of the runs is
one ``error:`` line and exit 2 before anything is created or changed; a damaged record is named and left as it is;
the runs of a tune folder belong to one study, and a moved or copied folder reports its own.

The studies here run tests/tune_script.py, a stand-in for a script of algos/ with the same command line, contract
and run folder in a fraction of a second, so ``tune.main`` runs a whole study in-process. Each check compares a
snapshot of the folder (every path, its bytes and its modification time) before and after."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments import tune
from tests.helpers import ROOT

optuna = pytest.importorskip("optuna")

SCRIPT = str(ROOT / "tests" / "tune_script.py")
SEARCH = "learning-rate=log:1e-4:1e-2"
FIELD = {"kind": "float", "choices": None, "ranges": [{"gt": 0, "ge": None, "lt": 1, "le": None}], "optional": False}


def command(root: Path, *extra: str, trials: int = 2, seeds=("1",), search=(SEARCH,), tail=()) -> list[str]:
    return [str(root), "--script", SCRIPT, "--env-ids", "CartPole-v1", "--seeds", *seeds, "--trials", str(trials),
            "--search", *search, "--pruner", "none", "--sampler-seed", "0", "--plain", *extra,
            "--", "--total-timesteps", "300", *tail]  # fmt: skip


def run_main(argv: list[str]) -> int:
    """tune.main in this process; argparse's SystemExit (the code before tune.py refused in one line) as its code."""
    try:
        return tune.main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2


def run_tune(argv: list[str]) -> int:
    """run_main, for a command that gets as far as the script: its checks and runs are subprocesses (the tier of
    tests/conftest.py reads this docstring: these tests are not ``unit``)."""
    return run_main(argv)


def snapshot(path: Path) -> dict[str, tuple]:
    """Every path under ``path`` (and ``path`` itself) with its bytes and modification time: what "unchanged" means."""
    if not path.exists():
        return {}
    out = {}
    for p in [path, *sorted(path.rglob("*"))]:
        s = p.stat()
        out[str(p.relative_to(path.parent))] = (p.read_bytes() if p.is_file() else None, s.st_mtime_ns, s.st_size)
    return out


def assert_refused(capsys, code: int, *needles: str) -> str:
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (code, err)
    for n in needles:
        assert n in err, err
    return err


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A tune folder holding a finished study of two trials (one seed each) over tests/tune_script.py."""
    root = tmp_path_factory.mktemp("study") / "tune"
    assert run_tune(command(root)) == 0
    return root


@pytest.fixture
def folder(finished, tmp_path) -> Path:
    """A copy of ``finished`` of this test's own (a copy is also what the copied-folder check needs)."""
    return Path(shutil.copytree(finished, tmp_path / "tune"))


def load(root: Path, name: str = "tune"):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root / 'study.db'}")


# ---------------------------------------------------------------------------------------------- refusals


@pytest.mark.unit
@pytest.mark.parametrize(
    "storage, message",
    [
        ("bogus://", "knows no database kind 'bogus'"),
        ("mysql://user@localhost/db", "its driver MySQLdb is not installed (pip install mysqlclient)"),
        ("postgresql://user@localhost/db", "is not installed (pip install psycopg"),
        ("journal:{tmp}", "is a folder, not a journal file"),
        ("sqlite:///{tmp}", "is a folder, not a sqlite file"),
        ("sqlite:///{tmp}/text.db", "is not a SQLite database"),
        ("sqlite:///:memory:", "an in-memory SQLite database keeps no study"),
        ("journal:{tmp}/text.db/study.log", "is a file, not a folder"),
        ("not a url", "not a storage URL"),
    ],
)
def test_a_storage_that_cannot_hold_the_study_is_refused_before_anything_is_created(tmp_path, capsys, storage, message):
    (tmp_path / "text.db").write_text("not a database")
    before = snapshot(tmp_path)
    code = run_main(command(tmp_path / "new", "--storage", storage.replace("{tmp}", str(tmp_path))))
    assert_refused(capsys, code, message)
    assert snapshot(tmp_path) == before  # no new/, no lock, no empty study.db


@pytest.mark.unit
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--cores-per-run", "100000"], "--cores-per-run 100000: only"),
        (["--cores-per-run", "0"], "--cores-per-run must be a positive integer"),
        (["--gpus-per-run", "-1"], "--gpus-per-run must be a non-negative integer"),
        (["--runs-per-gpu", "0"], "--runs-per-gpu must be a positive integer"),
        (["--slurm", "--slurm-param", "account"], "--slurm-param 'account': not KEY=VALUE"),
        (["--slurm", "--mem-gb", "nan"], "--mem-gb must be a positive number"),
    ],
)
def test_impossible_resources_are_refused_before_anything_is_created(tmp_path, capsys, monkeypatch, extra, message):
    # neither the script's Args nor its checks are what is tested here: no subprocess (raising=False: the code
    # before had no check_flags, and these commands failed after creating the folder)
    monkeypatch.setattr(tune, "script_fields", lambda path: {"learning_rate": FIELD}, raising=False)
    monkeypatch.setattr(tune, "check_flags", lambda st, **_: None, raising=False)
    code = run_main(command(tmp_path / "new", *extra))
    assert_refused(capsys, code, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.unit
@pytest.mark.parametrize("extra", [[], ["--script", SCRIPT, "--seeds", "1"]])
def test_report_of_a_folder_without_a_study_creates_nothing(tmp_path, capsys, extra):
    code = run_main([str(tmp_path / "new"), "--report", *extra])
    assert_refused(capsys, code, "nothing to report")
    assert list(tmp_path.iterdir()) == []  # not the study database it would then say does not exist


@pytest.mark.unit
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seeds", "1.5"], "argument --seeds: invalid int value: '1.5'"),
        (["--aggregate", "median"], "argument --aggregate: invalid choice: 'median'"),
        (["--trials"], "argument --trials: expected one argument"),
        (["--no-such-option"], "unrecognized arguments: --no-such-option"),
    ],
)
def test_argument_errors_are_one_line_without_the_usage_block(tmp_path, capsys, argv, message):
    code = run_main([str(tmp_path / "new"), "--script", SCRIPT, *argv])
    assert_refused(capsys, code, message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.unit
@pytest.mark.parametrize(
    "text, message",
    [
        ('seeds = 5\nsearch = ["learning-rate=log:1e-4:1e-2"]', "seeds"),
        ('seeds = [1]\nenv_ids = "CartPole-v1"', "env_ids"),
        ('seeds = [1, "2"]', "seeds"),
        ('seeds = [1]\ntrials = "3"', "trials is '3', not an integer"),
        ("seeds = [1]\nsearch = 5", "search is 5, not a list or a table"),
        ('seeds = [1]\ntarget_scores = {"CartPole-v1" = 5}', "--target-scores 'CartPole-v1='"),
        ("seeds = [1", "--config"),
    ],
)
def test_a_config_file_with_a_wrong_type_is_one_line(tmp_path, capsys, text, message):
    config = tmp_path / "tune.toml"
    config.write_text(f'script = "{SCRIPT}"\n{text}\n')
    before = snapshot(tmp_path)
    code = run_main([str(tmp_path / "new"), "--config", str(config), "--trials", "2"])
    assert_refused(capsys, code, message)
    assert snapshot(tmp_path) == before


@pytest.mark.unit
def test_a_tune_folder_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    before = snapshot(tmp_path)
    assert_refused(capsys, run_main(command(tmp_path / "file")), "is a file, not a folder")
    assert_refused(capsys, run_main(command(tmp_path / "file" / "new")), "is a file, not a folder")
    assert snapshot(tmp_path) == before


def test_a_damaged_record_is_named_and_nothing_is_rewritten(folder, capsys):
    run = folder / "tune_script" / "CartPole-v1" / "trial0000" / "seed1" / "launch.json"
    run.write_text(run.read_text()[:40])  # cut short, as a full disk leaves a file written in place
    before = snapshot(folder)
    code = run_tune(command(folder, trials=3))
    assert_refused(capsys, code, f"{run}: damaged, not JSON")
    assert snapshot(folder) == before
    rec = json.loads((folder / "tune_script" / "CartPole-v1" / "trial0001" / "seed1" / "launch.json").read_text())
    run.write_text(json.dumps({**rec, "trial": "1"}))  # JSON, but a field of the wrong type
    before = snapshot(folder)
    assert_refused(capsys, run_tune(command(folder, trials=3)), f'{run}: damaged, trial is "1", not an integer')
    assert snapshot(folder) == before
    (folder / "tune.json").write_text('{"study_name": 3}')
    before = snapshot(folder)
    assert_refused(capsys, run_tune([str(folder), "--report"]), "tune.json: damaged, study_name is 3, not str")
    assert snapshot(folder) == before


# ---------------------------------------------------------------------------------------------- the script's checks


@pytest.mark.parametrize(
    "seeds, search, tail, message",
    [
        (["-1"], SEARCH, [], "tune_script refuses the flags of a run (--total-timesteps 300 --env-id CartPole-v1 --seed -1)"
         ": --seed must be in [0, 2**31), got -1"),
        (["1", "-2"], SEARCH, [], "--seed -2): --seed must be in [0, 2**31), got -2"),
        (["1"], "num-steps=int:64:8192", [], "--search num-steps=int:64:8192: tune_script refuses --num-steps 8192"
         " (beside the flags of every run): --num-steps 8192: at most 4096 fit a rollout here"),
        (["1"], "num-steps=cat:128,5000", [], "refuses --num-steps 5000"),
        (["1"], "num-steps=int:64:256", ["--learning-rate", "2"], "--learning-rate must be in (0, 1), got 2.0"),
    ],
)  # fmt: skip
def test_flags_the_script_refuses_are_refused_once_before_any_run_folder(tmp_path, capsys, seeds, search, tail, message):
    """The script's own parser sees a run of each seed and each searched bound before the first trial: the code
    before ran up to --max-failures failing trials, each with its run folders, and exited 1."""
    code = run_tune(command(tmp_path / "new", seeds=seeds, search=[search], tail=tail))
    assert_refused(capsys, code, message)
    assert list(tmp_path.iterdir()) == []


def test_an_env_id_the_script_cannot_make_is_refused_before_any_run_folder(tmp_path, capsys):
    argv = command(tmp_path / "new")
    argv[argv.index("CartPole-v1")] = "NoSuchEnv-v0"
    assert_refused(capsys, run_tune(argv), "--env-id NoSuchEnv-v0: no such environment")
    assert list(tmp_path.iterdir()) == []


def test_a_seed_ppo_atari_refuses_is_refused_by_its_own_parser(tmp_path, capsys):
    """The real script: --seeds -1 ran five failing trials of ppo_atari before the tune stopped."""
    root = tmp_path / "new"
    argv = [str(root), "--script", "ppo_atari", "--env-ids", "CartPole-v1", "--seeds", "-1", "--trials", "2",
            "--search", SEARCH, "--plain", "--", "--preset", "cartpole", "--total-timesteps", "512"]  # fmt: skip
    assert_refused(capsys, run_tune(argv), "ppo_atari refuses the flags of a run", "--seed must be in [0, 2**31)")
    assert not root.exists()


# ---------------------------------------------------------------------------------------------- one study per folder


def test_a_second_study_in_the_folder_is_refused_not_scored_from_the_firsts_runs(folder, capsys):
    """Today a second --study-name in the folder "resumed" its trial 0 from the first study's finished run folder
    (trained with other flags) and scored it as its own without running anything."""
    before = snapshot(folder)
    code = run_tune(command(folder, "--study-name", "other", trials=1))
    assert_refused(capsys, code, "holds the runs of study 'tune': study 'other' needs a folder of its own")
    assert snapshot(folder) == before
    other = folder / "elsewhere.log"
    code = run_tune(command(folder, "--storage", f"journal:{other}", trials=1))
    assert_refused(capsys, code, "holds the runs of study 'tune' in sqlite:///", f"not journal:{other}")
    assert snapshot(folder) == before


def test_a_study_made_again_does_not_take_the_runs_of_the_deleted_one(folder, capsys):
    (folder / "study.db").unlink()
    before = snapshot(folder)
    code = run_tune(command(folder, trials=2))
    assert_refused(capsys, code, "is a run of a study whose storage", "study.db does not exist")
    assert snapshot(folder) == before  # no new study.db


def test_each_run_records_its_study_and_a_run_of_another_is_refused(folder, capsys):
    uid = load(folder).user_attrs["uid"]
    records = sorted(folder.glob("tune_script/CartPole-v1/trial*/seed1/launch.json"))
    assert len(records) == 2
    for path in records:
        assert json.loads(path.read_text())["study"] == {"name": "tune", "uid": uid}
    rec = json.loads(records[0].read_text())
    records[0].write_text(json.dumps({**rec, "study": {"name": "tune", "uid": "another"}}))
    before = snapshot(folder)
    code = run_tune(command(folder, trials=3))
    assert_refused(capsys, code, f"{records[0].parent} is a run of another study", "one study per tune folder")
    assert snapshot(folder) == before


def test_a_copied_tune_folder_reports_its_own_study(finished, tmp_path, capsys):
    """tune.json recorded the absolute storage URL: a copy reported (and, the original gone, created) the
    original's study. The storage is now recorded relative to the folder."""
    original = tmp_path / "original"
    shutil.copytree(finished, original)
    copy = Path(shutil.copytree(original, tmp_path / "copy"))
    assert json.loads((copy / "tune.json").read_text())["storage"] == "sqlite:///study.db"
    shutil.rmtree(original)
    code = run_tune([str(copy), "--report"])
    out = capsys.readouterr().out
    assert code == 0 and f"Storage `sqlite:///{copy / 'study.db'}`" in out and "Best: trial" in out, out
    assert not original.exists()


# ---------------------------------------------------------------------------------------------- every flag


BAD = {  # a bad value of each option of tune.py (--partition takes any name: it has none)
    "--config": ["{tmp}/missing.toml", "{tmp}"],
    "--script": ["no_such_script", "{tmp}"],
    "--env-ids": ["NoSuchEnv-v0", ""],
    "--seeds": ["x", "-1", "1.5", "2147483648"],
    "--flags": ["--seed 3", "--x 'unterminated", "--learning-rate 5"],
    "--search": ["learning-rate", "learning-rate=log:0:1", "x=float:0:1", "num-steps=int:1:9000", "seed=int:1:2"],
    "--target-scores": ["CartPole-v1=1:1", "Other-v0=0:1", "CartPole-v1"],
    "--trials": ["0", "-1", "x"],
    "--aggregate": ["median"],
    "--score": ["best"],
    "--last-episodes": ["0", "-3"],
    "--sampler": ["annealing", "tpe:no_such_argument=1", "random:seed=x=y"],
    "--sampler-seed": ["-1", "x", str(2**40)],
    "--pruner": ["xyz", "median:no_such_argument=2"],
    "--prune-every": ["0", "-5"],
    "--storage": ["bogus://", "mysql://u@h/db", "journal:{tmp}", "sqlite:///{tmp}"],
    "--study-name": ["other"],
    "--max-failures": ["0", "nan"],
    "--stale-after": ["nan", "-1"],
    "--cores-per-run": ["0", "100000"],
    "--gpus-per-run": ["-1"],
    "--runs-per-gpu": ["0"],
    "--stop-timeout": ["-1", "nan"],
    "--status-every": ["-1", "nan"],
    "--workers": ["0"],
    "--cluster": ["pbs"],
    "--time": ["0"],
    "--cpus-per-worker": ["0"],
    "--gpus-per-worker": ["-1"],
    "--mem-gb": ["0", "nan", "inf"],
    "--slurm-param": ["account"],
    "root": ["{tmp}/file", "{tmp}/file/tune"],
}
SLURM_ONLY = {"--workers", "--cluster", "--time", "--cpus-per-worker", "--gpus-per-worker", "--mem-gb", "--slurm-param"}


@pytest.fixture(scope="module")
def fields():
    return tune.script_fields(SCRIPT)


POSITIVE_INT = ["--trials", "--last-episodes", "--prune-every", "--max-failures", "--cores-per-run", "--runs-per-gpu",
                "--workers", "--time", "--cpus-per-worker"]  # fmt: skip
NON_NEGATIVE = ["--gpus-per-run", "--gpus-per-worker", "--stale-after", "--stop-timeout", "--status-every"]
NUMBERS = [*POSITIVE_INT, *NON_NEGATIVE, "--seeds", "--sampler-seed", "--mem-gb"]
CASES = st.one_of(
    st.sampled_from([(flag, v) for flag, values in BAD.items() for v in values]),
    st.tuples(st.sampled_from(POSITIVE_INT), st.integers(max_value=0).map(str)),
    st.tuples(st.sampled_from(NON_NEGATIVE), st.integers(max_value=-1).map(str)),
    st.tuples(st.just("--sampler-seed"), st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)).map(str)),
    st.tuples(st.sampled_from(NUMBERS), st.text("abx.,!_ ", min_size=1, max_size=4)),  # not a number at all
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=CASES)
def test_every_option_with_a_bad_value_is_one_line_and_leaves_the_folder_as_it_was(
    finished, fields, tmp_path, capsys, monkeypatch, case
):
    """A bad value of any option, over a folder holding a finished study (the same command otherwise): one error:
    line, exit 2, and the folder and its surroundings exactly as they were; the tune never starts."""
    monkeypatch.setattr(tune, "script_fields", lambda path: fields)

    def started(*_):
        raise AssertionError(f"{case}: the tune started")

    monkeypatch.setattr(tune, "Tune", started)
    monkeypatch.setattr(tune, "dry_run", started)
    (tmp_path / "file").write_text("")
    flag, value = case
    value = value.replace("{tmp}", str(tmp_path))
    argv = command(finished)
    if flag == "root":
        argv[0] = value
    elif flag in ("--seeds", "--search", "--env-ids", "--trials"):  # replace the command's own value
        i = argv.index(flag)
        argv[i + 1] = value
    else:
        i = argv.index("--plain")
        argv[i:i] = [flag, value, *(["--slurm"] if flag in SLURM_ONLY else [])]
    before, around = snapshot(finished), snapshot(tmp_path)
    code = run_tune(argv)
    assert_refused(capsys, code)
    assert snapshot(finished) == before and snapshot(tmp_path) == around


def test_a_refusal_only_the_study_can_make_removes_the_folder_it_made(tmp_path, capsys):
    """Two folders on one journal: the second with other seeds is refused by the study's record of the first's
    arguments, which is known only once the storage is open; the folder it had made for its lock is gone again."""
    journal = f"journal:{tmp_path / 'study.log'}"
    assert run_tune(command(tmp_path / "a", "--storage", journal, "--study-name", "shared", trials=1)) == 0
    capsys.readouterr()
    before = snapshot(tmp_path / "a")
    log = (tmp_path / "study.log").read_bytes()
    code = run_tune(command(tmp_path / "b", "--storage", journal, "--study-name", "shared", trials=1, seeds=("2",)))
    assert_refused(capsys, code, "study 'shared' in journal:", "was made with other seeds")
    assert not (tmp_path / "b").exists() and snapshot(tmp_path / "a") == before
    assert (tmp_path / "study.log").read_bytes() == log
