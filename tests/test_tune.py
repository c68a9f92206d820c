"""experiments/tune.py: the search space refused or accepted against the script's Args, a search that finds a
better learning rate, pruning, Ctrl-C and resuming to exactly --trials, two processes on one study.

The runs are tiny CartPole runs of algos/ppo_atari.py over slots of one physical core."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import search_space, tune, tune_display, tune_folder, tune_report
from experiments import study as study_module
from experiments.grid import LaunchError
from experiments.search_space import searched_values
from shared.affinity import physical_cores
from tests.helpers import ROOT, assert_no_leftovers, progress

optuna = pytest.importorskip("optuna")
from optuna.trial import TrialState

TUNE = str(ROOT / "experiments" / "tune.py")
TINY = ["--preset", "cartpole", "--eval-episodes", "2"]
two_cores = pytest.mark.skipif(len(physical_cores()) < 2, reason="needs two physical cores for two slots")


def command(
    root: Path,
    *extra: str,
    total: int = 2048,
    seeds=("1",),
    trials: int = 2,
    search=("learning-rate=log:1e-4:1e-2",),
    taskset: str | None = None,
) -> list[str]:
    head = ["taskset", "-c", taskset] if taskset else []
    return [
        *head,
        sys.executable,
        TUNE,
        str(root),
        "--script",
        "ppo_atari",
        "--env-ids",
        "CartPole-v1",
        "--seeds",
        *seeds,
        "--trials",
        str(trials),
        "--search",
        *search,
        "--plain",
        *extra,
        "--",
        *TINY,
        "--total-timesteps",
        str(total),
    ]


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"tune did not end in {timeout} s\n{out[-3000:]}\n{err[-3000:]}") from None
    assert_no_leftovers(proc.pid)
    return out, err


def study(root: Path, name: str | None = None, storage: str | None = None):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name or root.name, storage=storage or f"sqlite:///{root / 'study.db'}")


def record(folder: Path) -> dict:
    return json.loads((folder / "launch.json").read_text())


def trial_runs(root: Path, number: int) -> list[Path]:
    return sorted((root / "ppo_atari" / "CartPole-v1" / f"trial{number:04d}").glob("seed*"))


# ---------------------------------------------------------------------------------------------- the search space


@pytest.mark.parametrize(
    "item, message",
    [
        ("learning-rate", "not NAME=FORM"),
        ("learning-rate=log:0:1e-2", "a log range needs LOW > 0"),
        ("learning-rate=log:1e-2:1e-5", "LOW must be below HIGH"),
        ("learning-rate=float:1e-3:1e-3", "LOW must be below HIGH"),
        ("learning-rate=uniform:0:1", "the form is log:, float:, int: or cat:"),
        ("num-steps=int:32:512.5", "LOW and HIGH must be integers"),
        ("num-steps=int:32:512:step=0", "step must be positive"),
        ("num-steps=int:32:512:linear", "the third part is log or step=Q"),
        ("ent-coef=float:0:nan", "finite"),
        ("anneal-lr=cat:true,,false", "cat needs values"),
    ],
)
def test_malformed_search_strings_are_refused(item, message):
    with pytest.raises(LaunchError, match=message):
        tune.parse_search(item)


def test_search_strings_read_as_optuna_distributions():
    assert tune.parse_search("learning-rate=log:1e-5:1e-2") == tune.Param("learning-rate", "float", 1e-5, 1e-2, True)
    assert tune.parse_search("--num-steps=int:32:512:log").spec() == "num-steps=int:32:512:log"
    assert tune.parse_search("ent-coef=float:0:0.05:step=0.01").step == 0.01
    assert tune.parse_search("anneal-lr=cat:true,false").choices == ("true", "false")
    assert tune.aggregate([0.0, 1.0, 2.0, 100.0], "iqm") == 1.5 and tune.aggregate([0.0, 1.0, 2.0, 101.0], "mean") == 26.0


@pytest.mark.unit
def test_the_values_the_scripts_parser_sees_are_each_ranges_edges_and_every_choice():
    assert searched_values(tune.parse_search("num-steps=int:32:512:log")) == [32, 512]
    assert searched_values(tune.parse_search("learning-rate=log:1e-5:1e-2")) == [1e-5, 1e-2]
    assert searched_values(tune.parse_search("sampler=cat:serial,async")) == ["serial", "async"]


@pytest.mark.unit
def test_tune_json_records_a_storage_file_of_the_folder_relative_to_it(tmp_path):
    """So a moved or copied folder opens its own study; a file outside the folder (a journal two folders share)
    stays absolute, and a database server is its URL."""
    root, moved = tmp_path / "tune", tmp_path / "moved"
    cases = {
        f"sqlite:///{root}/study.db": "sqlite:///study.db",
        f"journal:{root}/sub/study.log": "journal:sub/study.log",
        f"journal:{tmp_path}/shared.log": f"journal:{tmp_path}/shared.log",
        "postgresql://user@host/db": "postgresql://user@host/db",
    }
    for url, recorded in cases.items():
        assert tune_folder.recorded_storage(url, root) == recorded
        assert tune_folder.storage_from_record(recorded, root) == url
    assert tune_folder.storage_from_record("sqlite:///study.db", moved) == f"sqlite:///{moved}/study.db"


@pytest.mark.unit
def test_each_part_of_the_tune_says_what_it_guarantees():
    for module in (search_space, study_module, tune_folder, tune_display, tune_report):
        assert "Guarantees" in (module.__doc__ or ""), module.__name__
    assert tune.Tune.__doc__ and tune.main.__doc__


@pytest.fixture(scope="module")
def ppo_fields():
    """ppo_atari's Args, read once (tune.script_fields imports the script in a subprocess)."""
    return tune.script_fields(str(ROOT / "algos" / "ppo_atari.py"))


@pytest.mark.parametrize(
    "item, message",
    [
        ("learning-rat=log:1e-5:1e-2", "ppo_atari has no flag --learning-rat (did you mean learning-rate?)"),
        ("seed=int:1:5", "--seed is set by the launcher"),
        ("num-steps=float:32:512", "refuses --num-steps 32.0 (beside the flags of every run): Error parsing --num-steps"),
        ("num-steps=int:0:512", "refuses --num-steps 0 (beside the flags of every run): --num-steps must be positive"),
        # two more ranges and one more parse error with the slow tests (8 s each: the script's parser run for real)
        pytest.param(
            "gamma=float:0.9:1.5",
            "refuses --gamma 1.5 (beside the flags of every run): --gamma must be in [0, 1], got 1.5",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "learning-rate=log:1e-5:2",
            "refuses --learning-rate 2.0 (beside the flags of every run): --learning-rate must be in (0, 1)",
            marks=pytest.mark.slow,
        ),
        ("anneal-lr=cat:yes,no", "--anneal-lr is a switch: search it as cat:true,false"),
        ("sampler=cat:serial,threads", "refuses --sampler threads (beside the flags of every run): invalid choice 'threads'"),
        pytest.param(
            "num-envs=cat:4,eight",
            "refuses --num-envs eight (beside the flags of every run): Error parsing --num-envs",
            marks=pytest.mark.slow,
        ),
        ("clip-coef=float:0.1:0.3", "--clip-coef is also given among the flags of every run"),
    ],
)
def test_search_strings_are_checked_against_the_scripts_args(ppo_fields, monkeypatch, tmp_path, capsys, item, message):
    """Names against the script's Args (unknown, the launcher's, given to every run, a switch's form); types and
    ranges by the script's own parser, which sees each range's LOW and HIGH and every choice: the one judge."""
    monkeypatch.setattr(tune, "script_fields", lambda path: ppo_fields)

    def started(*_):
        raise AssertionError(f"{item}: the tune started, the search was not refused")

    monkeypatch.setattr(tune, "Tune", started)
    monkeypatch.setattr(tune, "dry_run", started)
    root = tmp_path / "tune"
    code = tune.main(
        [str(root), "--script", "ppo_atari", "--env-ids", "CartPole-v1", "--seeds", "1", "--trials", "2", "--search", item]
        + ["--", "--clip-coef", "0.2"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and message in err, err
    assert not root.exists()  # refused before anything is created


def test_bad_tune_arguments_exit_2_with_one_line(tmp_path):
    """From the command line: one error: line, exit 2, nothing created (the script's Args read for real)."""
    root = tmp_path / "tune"
    for extra in (
        ["--search", "learning-rate=log:1e-5:1e-2", "num-steps=int:32:512.5"],
        ["--search", "anneal-lr=cat:on,off"],
        ["--search", "learning-rate=log:1e-5:1e-2", "--target-scores", "Acrobot-v1=-500:0"],
        ["--search", "learning-rate=log:1e-5:1e-2", "--sampler", "annealing"],
    ):
        out = subprocess.run(
            [
                sys.executable,
                TUNE,
                str(root),
                "--script",
                "ppo_atari",
                "--env-ids",
                "CartPole-v1",
                "--seeds",
                "1",
                "--trials",
                "2",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 2 and out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
        assert not out.stdout and not root.exists()


# ---------------------------------------------------------------------------------------------- real searches


@pytest.mark.slow
@two_cores
def test_a_search_over_a_bad_range_finds_a_better_learning_rate(tmp_path):
    """learning-rate over [1e-6, 0.5]: much of it learns nothing in 8k steps. Seeded TPE and bit-reproducible
    serial runs make the trials the same every time; the best must beat the worst by a clear margin (0.3 of
    CartPole's 500, from greedy evaluation returns). About 3 minutes on two shared cores: slow."""
    root = tmp_path / "tune"
    cmd = command(
        root,
        "--pruner",
        "none",
        "--sampler-seed",
        "3",
        "--target-scores",
        "CartPole-v1=0:500",
        total=8192,
        seeds=("1", "2"),
        trials=6,
        search=("learning-rate=log:1e-6:0.5",),
    )
    out, err = finish(start(cmd))
    assert "trial 5 complete" in out, out + err
    s = study(root)
    done = [t for t in s.trials if t.state == TrialState.COMPLETE]
    assert len(done) == 6, [(t.number, t.state) for t in s.trials]
    best, worst = s.best_trial, min(done, key=lambda t: t.value)
    assert best.value - worst.value >= 0.3, [(t.params, t.value) for t in done]
    # the value is the runs' own: the mean of each seed's eval.json over 500
    evals = [json.loads((f / "eval.json").read_text())["mean"] for f in trial_runs(root, best.number)]
    assert best.value == pytest.approx(sum(evals) / len(evals) / 500)
    report = (root / "tune-report" / "report.md").read_text()
    assert f"--learning-rate {best.params['learning-rate']!r}" in report and "python algos/ppo_atari.py" in report
    for name in ("trials.csv", "importances.json", "history.png", "slices.png", "parallel.png"):
        assert (root / "tune-report" / name).is_file(), name
    assert len((root / "tune-report" / "trials.csv").read_text().strip().splitlines()) == 1 + 6
    again = subprocess.run([sys.executable, TUNE, str(root), "--report"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and f"Best: trial {best.number}" in again.stdout, again.stderr


@two_cores
@pytest.mark.slow  # 41 s: CI's 40 minutes (the flag checks made every tune test longer); the pruner's unit tests stay
def test_a_pruned_trial_leaves_its_runs_ended_and_recorded(tmp_path):
    """ThresholdPruner(lower=1000) prunes each trial at its first report (raw CartPole returns stay below): of
    its three runs two run on the two slots (SIGTERMed: checkpoint, exit 130) and one is still queued (dropped);
    every run's launch.json says pruned, nothing is left running, and the next trial gets the slots."""
    root = tmp_path / "tune"
    cmd = command(
        root, "--pruner", "threshold:lower=1000", "--prune-every", "1024", total=60000, seeds=("1", "2", "3"), trials=2
    )
    out, err = finish(start(cmd))
    assert "trial 0 pruned at step 1024" in out and "trial 1 started" in out, out + err
    s = study(root)
    assert [t.state for t in s.trials] == [TrialState.PRUNED] * 2
    for t in s.trials:
        assert t.user_attrs["pruned_at_step"] == 1024 and 1024 in t.intermediate_values
        ran = 0
        for folder in trial_runs(root, t.number):
            rec = record(folder)
            assert rec["state"] == "pruned" and rec["pruned"]["trial"] == t.number, rec
            if rec["attempts"]:
                ran += 1
                assert rec["exit_code"] == 130 and (folder / "checkpoint.pt").is_file()
                assert int(progress(folder)[-1]["global_step"]) < 60000  # stopped, not finished
            else:
                assert not (folder / "progress.csv").exists()
        assert ran == 2


@two_cores
def test_an_interrupted_tune_resumed_with_the_same_command_ends_with_exactly_trials(tmp_path):
    root = tmp_path / "tune"
    cmd = command(root, "--pruner", "none", total=3072, seeds=("1", "2"), trials=2)  # 12 rows: interrupted at the 4th
    proc = start(cmd)
    deadline = time.time() + 120
    while True:  # trial 0's two runs running, each past a few progress rows
        folders = trial_runs(root, 0)
        rows = [len((f / "progress.csv").read_text().splitlines()) if (f / "progress.csv").exists() else 0 for f in folders]
        if len(rows) == 2 and min(rows) >= 4:
            break
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    pids = [record(f)["pid"] for f in folders]
    os.kill(proc.pid, signal.SIGINT)
    out, err = finish(proc, timeout=150)
    assert proc.returncode == 130, out + err
    for pid in pids:
        assert_no_leftovers(pid)
    t0 = study(root).trials[0]
    assert t0.state == TrialState.WAITING and t0.user_attrs["interrupted"] == 1
    for f in folders:
        assert record(f)["state"] == "interrupted" and (f / "checkpoint.pt").is_file()
    out, err = finish(start(cmd))
    assert "trial 0 resumed" in out, out + err
    trials = study(root).trials
    assert [t.number for t in trials] == [0, 1]
    assert all(t.state == TrialState.COMPLETE for t in trials), [(t.number, t.state) for t in trials]
    assert len({t.user_attrs["flags"] for t in trials}) == 2  # two different trials, none run twice
    for f in folders:
        rec = record(f)
        assert rec["state"] == "done" and len(rec["attempts"]) == 2 and rec["attempts"][-1]["resumed"]
    for t in trials:
        for f in trial_runs(root, t.number):
            steps = [int(r["global_step"]) for r in progress(f)]
            assert steps == sorted(set(steps)) and steps[-1] == 3072, (f, steps[-5:])


@two_cores
@pytest.mark.slow  # 46 s a storage: CI's 40 minutes; tune's interrupted-and-resumed test keeps a whole study in CI
@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_two_tune_processes_share_one_study_without_overlap(tmp_path, storage):
    """Two processes, one core each. sqlite: the default storage in one shared root (asks serialised by its lock);
    journal: one journal file and two roots (nothing shared but the storage: a surplus ask is failed unrun)."""
    roots = [tmp_path / "tune", tmp_path / "tune"] if storage == "sqlite" else [tmp_path / "a", tmp_path / "b"]
    url = f"journal:{tmp_path / 'study.log'}" if storage == "journal" else None
    extra = ["--pruner", "none", "--study-name", "shared", *(["--storage", url] if url else [])]
    procs = [
        start(command(root, *extra, total=1024, trials=4, taskset=str(cpu)))
        for root, cpu in zip(roots, (physical_cores()[0][0], physical_cores()[1][0]))
    ]
    outs = [finish(p) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    s = study(roots[0], "shared", tune.make_storage(url, roots[0])[0] if url else None)
    counted = [t for t in s.trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(counted) == 4, [(t.number, t.state, t.user_attrs) for t in s.trials]
    assert all(t.user_attrs.get("surplus") for t in s.trials if t.state == TrialState.FAIL)
    started = [
        {int(line.split("trial ")[1].split()[0]) for line in out.splitlines() if " started: " in line} for out, _ in outs
    ]
    assert not started[0] & started[1] and started[0] | started[1] == {t.number for t in counted}, started
    assert all(started), started  # both processes ran trials
    for t in counted:
        root = roots[0] if t.number in started[0] else roots[1]
        (folder,) = trial_runs(root, t.number)
        assert len(record(folder)["attempts"]) == 1  # each run ran once


@pytest.mark.slow
def test_tune_workers_as_submitit_jobs_share_a_journal_study(tmp_path):
    """--slurm --cluster local --workers 2: two tune processes as submitit jobs on one journal file; together they
    end the study at exactly --trials, each trial run by one of them."""
    pytest.importorskip("submitit")
    root = tmp_path / "tune"
    cmd = command(
        root,
        "--pruner",
        "none",
        "--storage",
        f"journal:{tmp_path / 'study.log'}",
        "--slurm",
        "--cluster",
        "local",
        "--workers",
        "2",
        "--time",
        "5",
        total=1024,
        trials=3,
    )
    out, err = finish(start(cmd))
    assert "2 tune worker(s) submitted (local)" in out, out + err
    s = study(root, storage=tune.make_storage(f"journal:{tmp_path / 'study.log'}", root)[0])
    assert sorted(t.number for t in s.trials if t.state == TrialState.COMPLETE) == [0, 1, 2]
    logs = [p.read_text() for p in (root / ".workers").glob("*/stdout.log")]
    assert len(logs) == 2
    started = [{line.split("trial ")[1].split()[0] for line in log.splitlines() if " started: " in line} for log in logs]
    assert not started[0] & started[1] and started[0] | started[1] == {"0", "1", "2"}, started
