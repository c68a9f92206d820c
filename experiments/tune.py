"""Hyperparameter search over the launcher: Optuna picks each trial's flags, the launcher's slots run them.

    python experiments/tune.py runs/tune-ppo --script ppo_atari --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 \\
        --trials 40 --search "learning-rate=log:1e-5:1e-2" "ent-coef=float:0:0.05" "num-steps=int:32:512:log" \\
        "anneal-lr=cat:true,false" --target-scores CartPole-v1=0:500 Acrobot-v1=-500:0 -- --total-timesteps 100000
    python experiments/tune.py runs/tune-ppo ... --dry-run        # the search space and a trial's runs; nothing starts
    python experiments/tune.py runs/tune-ppo ...                  # again after Ctrl-C: the study goes on to --trials
    python experiments/tune.py runs/tune-ppo --report             # best flags, trials.csv, importances, plots
    optuna-dashboard sqlite:///runs/tune-ppo/study.db             # the study in a browser (requirements.txt)

A trial is one set of flags (Optuna's suggestion, one value per ``--search`` entry) run on every env id x seed, each
run a normal run folder of the launcher, ``{root}/{script}/{env id}/trial{NNNN}/seed{N}`` (``launch.json``,
resumable as any run; ``experiments/report.py ROOT`` reads them, one variant per trial). Its value, which the study
maximises, is the mean (``--aggregate iqm``: the interquartile mean) over its runs of each run's score normalised by
its env's ``--target-scores ENV=LOW:HIGH`` ((score - LOW) / (HIGH - LOW); with one env id the targets may be left
out: raw scores). A run's score is ``experiments/report.py``'s: the mean of ``eval.json``'s returns where the run
evaluated (``--score auto``, the default, or ``eval``), else (``train``) the mean of its last ``--last-episodes``
training episodes from ``progress.csv``.

The search space, on the command line or as ``search`` in the ``--config`` file (the launcher's TOML form, with
``script``, ``search``, ``target_scores``, ``trials`` and the other options below as extra keys)::

    learning-rate=log:1e-5:1e-2       a float drawn log-uniformly
    ent-coef=float:0:0.05             a float drawn uniformly (float:LOW:HIGH:log, float:LOW:HIGH:step=0.01)
    num-steps=int:32:512:log          an integer (int:LOW:HIGH, int:LOW:HIGH:step=32, int:LOW:HIGH:log)
    anneal-lr=cat:true,false          one of the listed values

Each name is a flag of the script's ``Args`` (read from the script itself, in a child process); an unknown flag, a
flag the launcher sets or an empty range is one ``error:`` line and exit 2 before anything starts
(``experiments/search_space.py``). The script's own parser and pre-start checks (``experiments/flags.py``:
``RL_CHECK_ONLY``) are the one judge of the rest: they see the flags of a run of each env id and each seed, and each
searched range's LOW and HIGH and each ``cat`` value (the other searched flags at the script's defaults); a value
the script would refuse (``--seeds -1``, an env id it cannot make, a float for an integer flag, a bound outside its
declared range) is one ``error:`` line, exit 2, before the first trial or run folder exists.

Optuna does the search: ``--sampler`` (default ``tpe``; ``random``, ``cmaes``, ``gp``, ``qmc``, ``grid``... or any
``optuna.samplers`` class, with ``NAME:KEY=VALUE,...`` arguments) and ``--pruner`` (default ``median``; ``none``,
``percentile``, ``hyperband``, ``successive-halving``, ``threshold``, ``patient``, ``wilcoxon``, with arguments the
same way). The study lives in ``--storage``: by default ``sqlite:///{root}/study.db``; any Optuna RDB URL
(PostgreSQL, MySQL) or ``journal:PATH`` (a journal file: the one to use on a shared filesystem). Several tune
processes given the same command and storage (on one machine, each under its own ``taskset``; on several machines
or as SLURM jobs: ``--slurm --workers N``) work on one study: each asks Optuna for its own trials (a trial is run by
the process that asked for it; the ask is serialised by a lock in the root, and a trial that would exceed
``--trials`` all the same is failed unrun, marked ``surplus``), and every process stops when the study holds
``--trials`` trials. The study records the tune's arguments: another script, env ids, seeds, flags, search space,
targets or aggregate on the same study is refused (one line).

One study per tune folder (``experiments/tune_folder.py``): ``{root}/tune.json`` records the study's name and its
storage (a SQLite or journal file inside the folder by its path relative to the folder, so a moved or copied folder
opens its own copy), and each run's ``launch.json`` records its study (name and uid). Given neither
``--study-name`` nor ``--storage``, a folder's later commands use the recorded ones; another study or storage in
the same folder is refused (its trials would take the first study's run folders of the same number as their own),
and so is a folder whose runs belong to another study or whose study file is gone.

Pruning: every ``--prune-every`` steps (default a tenth of the runs' ``--total-timesteps``) a trial reports the
aggregate of its runs' normalised training score up to that step (its last ``--last-episodes`` episodes), from the
progress rows, once every run of it that has started has passed the step; a trial the pruner stops has its running
runs SIGTERMed (each writes its checkpoint and exits 130), its queued ones dropped, every run's ``launch.json``
state ``pruned``, and its slots go to the next trial.

Resuming: Ctrl-C or SIGTERM stops every run (a checkpoint each, exit 130), puts this process's unfinished trials back
in the study's queue (``WAITING``, attribute ``interrupted``) and exits 130; the same command takes them up first
(the same trial number, parameters and folders: finished runs kept, interrupted ones resumed from their
checkpoints) and goes on to ``--trials`` complete or pruned trials. A trial whose process died without that (a
SIGKILL, a lost node) is queued again once its heartbeat is ``--stale-after`` seconds old, or at once when its
process is known dead on this machine. A trial with a failed run (exit 1 or 2) is failed (its error line kept as an
attribute) and does not count; after ``--max-failures`` failed trials no new trial starts.

Results: a live table (trial, state, value, parameters, runs done) like the launcher's; at the end and on demand
(``--report``) in ``{root}/tune-report``: ``report.md`` (printed: every trial by value, the best trial's flags as a
ready command line and as a launcher command that re-runs them beside the defaults on fresh seeds), ``trials.csv``,
``importances.json`` (PED-ANOVA, no extra package) and Optuna's matplotlib plots (optimisation history, parallel
coordinates, slices, importances, intermediate values) as PNG.

Exit status: 0 when the study holds ``--trials`` finished trials (or this process has no trial left to run); 1 when
``--max-failures`` trials failed; 130 after Ctrl-C or SIGTERM; 2 for a bad argument, ``--config`` file, tune folder,
storage or flag of the runs, or a damaged record in the folder: one ``error:`` line (docs/contract.md), before
anything is created or changed.

This module is the command line and the loop (``Tune``); the parts are modules of their own, each saying in its
docstring what it guarantees: ``search_space`` (``--search`` parsed, its names checked against the script's ``Args``),
``study`` (storage, sampler and pruner factories, the checked ``Setup``, a trial's value), ``tune_folder``
(``tune.json``, the run records, one study per folder), ``tune_display`` (the live table) and ``tune_report``
(``tune-report/``).
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C and SIGTERM wait until it has imported: experiments.flags.command (one line)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    if sys.path[0] and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # modules import once, as experiments.*

import argparse
import contextlib
import dataclasses
import fcntl
import shlex
import shutil
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments import study
from experiments.flags import Parser, command, one_line, refusals, run_options, split_tail
from experiments.grid import LaunchError, Trial, build_grid
from experiments.local import Launcher
from experiments.records import EXIT_INTERRUPTED, finished, new_record, read_json, renewed, run_meta, write_json
from experiments.search_space import Param, check_space, flag_tokens, parse_search, script_fields, searched_values
from experiments.slots import Slot, child_env, local_slots, make_slots
from experiments.status import progress_of
from experiments.study import Setup, aggregate, make_storage
from experiments.tune_display import TuneDisplay
from experiments.tune_folder import check_runs, check_storage_kept, storage_file, write_record
from experiments.tune_report import report_only, write_report
from shared.affinity import physical_cores
from shared.progress import read_rows

# Param, parse_search, aggregate and make_storage: the search space's and the study's, named here as before the cut
__all__ = ["Param", "Tune", "aggregate", "check_flags", "main", "make_storage", "parse_search", "parser"]

# A heartbeat of our own (the user attribute "heartbeat"): Optuna's (RDBStorage(heartbeat_interval=...), then
# fail_stale_trials) serves RDB storages only, not the JournalStorage of the pinned Optuna (5.0: no BaseHeartbeat),
# and it fails a stale trial, whose retry is a new trial (another number, other run folders), where a tune queues
# it again under its own number so that its runs resume from their checkpoints.
HEARTBEAT_S = 30.0  # how often a process stamps its running trials
PRUNE_POLL_S = 2.0  # how often the running trials' progress rows are read for pruning


def parser() -> argparse.ArgumentParser:
    """tune.py's arguments; a bad one is one ``error:`` line and exit 2 (``experiments.flags.Parser``)."""
    p = Parser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Flags after `--` go to every run (so do --flags). The module docstring has the forms and the file.",
    )
    s = run_options(p, "tune folder: runs, study.db, report", "submit --workers tune processes as SLURM jobs")
    s.add_argument("--workers", type=int, default=1, help="with --slurm: tune processes (jobs) on the study")
    s.add_argument("--cpus-per-worker", type=int, default=None, help="CPUs of each job (default --cores-per-run)")
    s.add_argument("--gpus-per-worker", type=int, default=0, help="GPUs of each job")
    p.add_argument("--script", "--scripts", dest="script", nargs="+", help="the algos/ script (ppo_atari) or a path")
    forms = "a searched flag: log:LOW:HIGH, float:LOW:HIGH[:log|:step=Q], int:LOW:HIGH[:log|:step=K], cat:A,B"
    p.add_argument("--search", action="append", nargs="+", default=[], metavar="NAME=FORM", help=forms)
    p.add_argument("--target-scores", nargs="+", metavar="ENV=LOW:HIGH", help="score normalised (score - LOW) / (HIGH - LOW)")
    p.add_argument("--trials", type=int, help="complete or pruned trials the study ends with")
    p.add_argument("--aggregate", choices=["mean", "iqm"], default=None, help="over a trial's runs (default mean)")
    p.add_argument("--score", choices=["auto", "eval", "train"], help="a run's: eval.json where present, or training's")
    p.add_argument("--last-episodes", type=int, default=None, help="training episodes behind a train score (100)")
    p.add_argument("--sampler", default=None, help="NAME[:KEY=VALUE,...] (default tpe)")
    p.add_argument("--sampler-seed", type=int, default=None, help="seed of the sampler")
    p.add_argument("--pruner", default=None, help="NAME[:KEY=VALUE,...] (default median; none: no pruning)")
    p.add_argument("--prune-every", type=int, default=None, help="steps between reports (default total / 10)")
    p.add_argument("--storage", default=None, help="Optuna storage URL or journal:PATH (default sqlite in the root)")
    p.add_argument("--study-name", default=None, help="study name in the storage (default the root's name)")
    p.add_argument("--max-failures", type=int, default=5, help="failed trials after which no new trial starts")
    p.add_argument("--stale-after", type=float, default=300.0, help="seconds without a heartbeat: a trial queued again")
    p.add_argument("--report", action="store_true", help="write the results (best flags, CSV, plots) and exit")
    return p


@dataclasses.dataclass
class TrialRuns:
    """One trial this process runs: its Optuna trial, flags and runs."""

    number: int
    trial: Any  # optuna.Trial
    params: dict
    flags: list[str]
    runs: list[Trial]
    state: str = "running"  # running, pruning, complete, pruned, failed, interrupted
    value: float | None = None
    next_k: int = 1  # the next pruning report: step next_k * interval
    error: str | None = None
    last_report: float | None = None


class Tune:
    """One tune process on a study: asks the study for trials while a slot is free, runs each trial's runs on this
    machine's slots (the launcher's ``Launcher``), reports their progress to the pruner, tells the study each
    trial's end, and puts its unfinished trials back in the study's queue when stopped.

    Made only after every check of ``main`` passed; creating it opens (or creates) the study and, for a new tune
    folder, the folder. A refusal it can only make then (another tune's arguments on the study, a run of another
    study in the folder, a storage that does not answer) is a ``LaunchError`` after which what this call created
    is removed again: the tune folder it made, the study file it made, the study it added to a storage."""

    def __init__(self, st: Setup, a: argparse.Namespace, slots: list[Slot]):
        self.st, self.a, self.slots = st, a, slots
        self.host, self.pid = socket.gethostname(), os.getpid()
        url = st.storage or study.default_storage(st.root)
        file = storage_file(url)
        made_root = not st.root.exists()
        made_lock = not (st.root / ".tune.lock").exists()
        made_file = file is not None and not file[1].exists()
        self.made_study = False
        try:
            self._open_study()
        except BaseException:
            self._undo(made_root, made_lock, file[1] if made_file and file else None)
            raise
        self.mine: dict[int, TrialRuns] = {}
        self.by_run: dict[str, TrialRuns] = {}
        self.runs: list[Trial] = []
        self.records: dict[str, dict] = {}
        self.meta = run_meta()
        self.interval: int | None = st.prune_every
        self.exhausted: str | None = None  # why no new trial may start
        self.more = True  # whether to ask the study for another trial when a slot is free
        self.last_heartbeat = 0.0
        self.last_prune_poll = 0.0

    def _open_study(self) -> None:
        import optuna

        st = self.st
        with self.root_lock():  # the processes of one root create a new study database one at a time
            self.storage, self.storage_url = make_storage(st.storage, st.root)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.sampler = study.make_sampler(st.sampler, self.a.sampler_seed, st.space)
        self.pruner = study.make_pruner(st.pruner)
        try:
            with self.root_lock():
                names = {s.study_name for s in optuna.get_all_study_summaries(self.storage, include_best_trial=False)}
                self.made_study = st.study_name not in names
                # an existing study is loaded, not created again: create_study(load_if_exists=True) appends a
                # creation record to a journal each time, so a refusal below would have changed the storage
                if self.made_study:
                    try:
                        self.study = optuna.create_study(
                            storage=self.storage,
                            study_name=st.study_name,
                            direction="maximize",
                            sampler=self.sampler,
                            pruner=self.pruner,
                        )
                    except optuna.exceptions.DuplicatedStudyError:  # another root's process made it meanwhile
                        self.made_study = False
                if not self.made_study:
                    self.study = optuna.load_study(
                        storage=self.storage, study_name=st.study_name, sampler=self.sampler, pruner=self.pruner
                    )
                recorded = self.study.user_attrs.get("tune")
                if recorded is None:
                    self.study.set_user_attr("tune", st.spec())
                elif recorded != st.spec():
                    diff = [k for k in st.spec() if recorded.get(k) != st.spec()[k]]
                    raise LaunchError(
                        f"study {st.study_name!r} in {self.storage_url} was made with other {', '.join(diff)}: "
                        f"give the same arguments, or another --study-name"
                    )
                # the study's identity, which its runs record: a study made again under the same name (its file
                # deleted, another storage) is another study, and its trials must not take these runs as theirs
                self.uid = self.study.user_attrs.get("uid")
                if self.uid is None:
                    self.uid = uuid.uuid4().hex
                    self.study.set_user_attr("uid", self.uid)
                check_runs(st.root, st.study_name, self.uid)
        except LaunchError:
            raise
        except Exception as e:
            raise LaunchError(f"--storage {self.storage_url}: {type(e).__name__}: {e}") from None

    def _undo(self, made_root: bool, made_lock: bool, made_file: Path | None) -> None:
        """What a refused ``__init__`` created, removed (see the class docstring)."""
        if self.made_study and getattr(self, "storage", None) is not None:
            with contextlib.suppress(Exception):
                import optuna

                optuna.delete_study(study_name=self.st.study_name, storage=self.storage)
        if made_root:
            shutil.rmtree(self.st.root, ignore_errors=True)
            return
        for path, made in ((made_file, made_file is not None), (self.st.root / ".tune.lock", made_lock)):
            if made and path is not None:
                with contextlib.suppress(OSError):
                    path.unlink()

    @contextlib.contextmanager
    def root_lock(self):
        """The root's ``.tune.lock``: the processes of one root ask for trials one at a time."""
        self.st.root.mkdir(parents=True, exist_ok=True)
        with open(self.st.root / ".tune.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # -- the study

    def trial_id(self, number: int) -> int:
        """The storage's id of trial ``number``, by Optuna's public storage API (a Trial keeps its own private)."""
        return self.storage.get_trial_id_from_study_id_trial_number(
            self.storage.get_study_id_from_name(self.st.study_name), number
        )

    def _alive_here(self, owner: str | None) -> bool | None:
        """Whether the process named ``host:pid`` lives (None: another host, unknown)."""
        host, _, pid = (owner or "").rpartition(":")
        if host != self.host or not pid.isdigit():
            return None
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return b"tune.py" in f.read()
        except OSError:
            return False

    def requeue_stale(self) -> None:
        """Other processes' running trials whose process is gone: back to WAITING (called under the root lock)."""
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.number in self.mine:
                continue
            owner = t.user_attrs.get("owner")
            beat = t.user_attrs.get("heartbeat") or (t.datetime_start.timestamp() if t.datetime_start else time.time())
            alive = self._alive_here(owner)
            if alive is False or (alive is None and time.time() - beat > self.a.stale_after):
                self.requeue(t)
                self.display.note(f"trial {t.number}: its process ({owner}) is gone: queued again")

    def requeue(self, t) -> None:
        """Trial ``t`` (a Trial or FrozenTrial) back in the study's queue, its ``interrupted`` count one more, no
        owner; a storage that fails meanwhile leaves it to the next process's stale check."""
        from optuna.trial import TrialState

        with contextlib.suppress(Exception):
            trial_id = self.trial_id(t.number)
            self.storage.set_trial_user_attr(trial_id, "interrupted", t.user_attrs.get("interrupted", 0) + 1)
            self.storage.set_trial_user_attr(trial_id, "owner", None)
            self.storage.set_trial_state_values(trial_id, TrialState.WAITING)

    def counts(self) -> dict[str, int]:
        from optuna.trial import TrialState

        out = {s.name.lower(): 0 for s in TrialState}
        for t in self.study.get_trials(deepcopy=False):
            key = "surplus" if t.user_attrs.get("surplus") else t.state.name.lower()
            out[key] = out.get(key, 0) + 1
        return out

    def ask(self) -> TrialRuns | None:
        """A trial for this process: a queued (interrupted) one first, else a new one while the study holds fewer
        than --trials; None when there is none to run."""
        from optuna.trial import TrialState

        with self.root_lock():
            self.requeue_stale()
            c = self.counts()
            if c["fail"] >= self.a.max_failures:
                self.exhausted = f"{c['fail']} trials failed (--max-failures {self.a.max_failures})"
                return None
            live = c["complete"] + c["pruned"] + c["running"] + c["waiting"]
            if live >= self.st.trials and not c["waiting"]:
                return None
            trial = self.study.ask()
            frozen = self.storage.get_trial(self.trial_id(trial.number))
            resumed = bool(frozen.params) or "flags" in frozen.user_attrs
            if not resumed:
                ahead = [
                    t
                    for t in self.study.get_trials(deepcopy=False)
                    if t.number <= trial.number
                    and t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
                    and not t.user_attrs.get("surplus")
                ]
                if len(ahead) > self.st.trials:  # another root's process asked at the same time
                    trial.set_user_attr("surplus", True)
                    self.study.tell(trial, state=TrialState.FAIL)
                    return None
            params = {p.name: p.suggest(trial) for p in self.st.space}
            trial.set_user_attr("owner", f"{self.host}:{self.pid}")
            trial.set_user_attr("heartbeat", time.time())
        flags = [tok for p in self.st.space for tok in flag_tokens(p, params[p.name], self.st.fields)]
        st = self.st
        runs = build_grid(st.root, [st.script], st.env_ids, st.seeds, st.common, [[(f"trial{trial.number:04d}", flags)]])
        if not resumed:
            trial.set_user_attr("flags", shlex.join(flags))
            trial.set_user_attr("runs", [r.rel for r in runs])
        tr = TrialRuns(trial.number, trial, params, flags, runs)
        reported = frozen.intermediate_values
        if reported and self.interval:
            tr.next_k = max(reported) // self.interval + 1
        return tr

    # -- runs

    def add(self, tr: TrialRuns) -> None:
        self.mine[tr.number] = tr
        todo = []
        for r in tr.runs:
            base = {**new_record(r, self.meta), "trial": tr.number, "study": {"name": self.st.study_name, "uid": self.uid}}
            rec = renewed(read_json(r.folder / "launch.json"), base)
            rec.setdefault("attempts", [])
            self.records[r.rel] = rec
            self.runs.append(r)
            self.by_run[r.rel] = tr
            if not finished(r.folder, rec):
                rec["state"] = "queued"
                todo.append(r)
            r.folder.mkdir(parents=True, exist_ok=True)
            write_json(r.folder / "launch.json", rec)
        how = "resumed" if len(todo) < len(tr.runs) or tr.trial.user_attrs.get("interrupted") else "started"
        self.display.note(f"trial {tr.number} {how}: {shlex.join(tr.flags)} ({len(tr.runs)} runs, {len(todo)} to run)")
        self.launcher.queue.extend(todo)
        if not todo:
            self.complete(tr)

    def active(self) -> list[TrialRuns]:
        return [t for t in self.mine.values() if t.state in ("running", "pruning")]

    def children_of(self, tr: TrialRuns) -> list:
        return [c for c in self.launcher.children.values() if c.run in tr.runs]

    def on_ended(self, run: Trial, state: str) -> None:
        tr = self.by_run[run.rel]
        if tr.state in ("pruning", "pruned"):  # runs ending together: the trial may be told pruned at the first
            self.mark_pruned(run)
            if tr.state == "pruning" and not self.children_of(tr):
                self.finish_pruned(tr)
            return
        if tr.state != "running":
            return
        if state == "failed":
            tr.error = self.records[run.rel].get("error")
            self.fail(tr, f"{run.rel}: {tr.error}")
        elif state == "done" and all(finished(r.folder, self.records[r.rel]) for r in tr.runs):
            self.complete(tr)

    def tell(self, tr: TrialRuns, state: str, note: str) -> None:
        """The trial's end (complete, pruned, failed) told to the study and shown; its slots may take a new trial."""
        from optuna.trial import TrialState

        self.more = self.exhausted is None
        tr.state = state
        self.study.tell(tr.trial, tr.value, state=TrialState[{"failed": "FAIL"}.get(state, state.upper())])
        self.display.note(f"trial {tr.number} {state}{note}")

    def complete(self, tr: TrialRuns) -> None:
        values = [study.normalised(self.st, r.env_id, study.run_score(self.st, r)) for r in tr.runs]
        if None in values:
            r = tr.runs[values.index(None)]
            self.fail(tr, f"{r.rel} has no score (no evaluation and no finished episode)")
            return
        tr.value = aggregate(values, self.st.aggregate)
        self.tell(tr, "complete", f": value {tr.value:.4g}")

    def fail(self, tr: TrialRuns, error: str) -> None:
        tr.state, tr.error = "failed", error
        self.drop_queued(tr, "queued")
        self.launcher.stop_children(tr.runs)
        tr.trial.set_user_attr("error", error)
        self.tell(tr, "failed", f": {error}")

    def drop_queued(self, tr: TrialRuns, state: str) -> None:
        for r in [r for r in self.launcher.queue if r in tr.runs]:
            self.launcher.queue.remove(r)
            self.records[r.rel]["state"] = state
            write_json(r.folder / "launch.json", self.records[r.rel])

    def mark_pruned(self, run: Trial) -> None:
        rec = self.records[run.rel]
        rec["state"], rec["pruned"] = "pruned", {"trial": self.by_run[run.rel].number, "at_step": progress_of(run)["step"]}
        write_json(run.folder / "launch.json", rec)

    def prune(self, tr: TrialRuns, step: int) -> None:
        tr.state = "pruning"
        tr.trial.set_user_attr("pruned_at_step", step)
        queued = [r for r in self.launcher.queue if r in tr.runs]
        self.drop_queued(tr, "pruned")
        for r in queued:
            self.mark_pruned(r)
        for r in tr.runs:  # finished before the prune: still recorded as the pruned trial's
            if finished(r.folder, self.records[r.rel]):
                self.records[r.rel]["pruned"] = {"trial": tr.number, "finished_before": True}
                write_json(r.folder / "launch.json", self.records[r.rel])
        self.display.note(f"trial {tr.number} pruned at step {step}: stopping its runs (each writes a checkpoint)")
        self.launcher.stop_children(tr.runs)
        if not self.children_of(tr):
            self.finish_pruned(tr)

    def finish_pruned(self, tr: TrialRuns) -> None:
        self.tell(tr, "pruned", ": its runs ended")

    def report_progress(self, tr: TrialRuns) -> None:
        """Intermediate values from the progress rows; the pruner's decision."""
        started = [r for r in tr.runs if self.records[r.rel].get("attempts")]
        if not started:
            return
        if self.interval is None:
            total = progress_of(started[0])["total"]
            if not total:
                return
            self.interval = max(total // 10, 1)
        rows = {}
        for r in started:
            try:
                rows[r.rel] = read_rows(r.folder / "progress.csv")
            except OSError:
                return
            if not rows[r.rel]:
                return
        reached = min(int(rows[r.rel][-1]["global_step"]) for r in started)
        total = progress_of(started[0])["total"] or 0
        while tr.state == "running":
            step = tr.next_k * self.interval
            if step > reached or (total and step >= total):
                return
            tr.next_k += 1
            values = [study.normalised(self.st, r.env_id, study.score_at(self.st, rows[r.rel], step)) for r in started]
            if any(v is None for v in values):
                continue
            tr.last_report = aggregate(values, self.st.aggregate)
            tr.trial.report(tr.last_report, step)
            if tr.trial.should_prune():
                self.prune(tr, step)

    def heartbeat(self) -> None:
        for tr in self.active():
            with contextlib.suppress(Exception):
                tr.trial.set_user_attr("heartbeat", time.time())

    def interrupt(self) -> None:
        """After the runs stopped: this process's unfinished trials back in the study's queue."""

        for tr in self.active():
            if tr.state == "pruning":
                for r in tr.runs:
                    if self.records[r.rel]["state"] in ("interrupted", "queued", "running"):
                        self.mark_pruned(r)
                self.finish_pruned(tr)
                continue
            self.requeue(tr.trial)
            tr.state = "interrupted"
            self.display.note(f"trial {tr.number} interrupted: queued again for the next start")

    # -- the loop

    def run(self) -> int:
        slots = self.slots
        self.display = TuneDisplay(self, plain=self.a.plain or not sys.stdout.isatty(), status_every=self.a.status_every)
        self.launcher = Launcher(self.runs, self.records, slots, self.display, self.a.stop_timeout, self.meta)
        write_record(self.st.root, self.st.spec(), self.st.script, self.storage_url, self.st.study_name, self.st.trials)
        self.display.note(
            f"study {self.st.study_name!r} in {self.storage_url}: {self.st.trials} trials of "
            f"{len(self.st.env_ids) * len(self.st.seeds)} runs, {len(slots)} slot(s) of "
            f"{self.a.cores_per_run} core(s) here"
        )
        self.more = True
        try:
            with self.launcher.supervising():
                while True:
                    if self.launcher.stop_signal is not None:
                        break
                    if self.more and not self.launcher.queue and len(self.launcher.free) > 0:
                        tr = self.ask()
                        if tr is None:
                            self.more = False
                        else:
                            self.add(tr)
                            continue
                    self.launcher.step()
                    for run, state in self.launcher.ended:
                        self.on_ended(run, state)
                    self.launcher.ended.clear()
                    now = time.time()
                    if now - self.last_prune_poll >= PRUNE_POLL_S:
                        self.last_prune_poll = now
                        for tr in self.active():
                            if tr.state == "running":
                                self.report_progress(tr)
                    if now - self.last_heartbeat >= HEARTBEAT_S:
                        self.last_heartbeat = now
                        self.heartbeat()
                    if not self.more and not self.active() and not self.launcher.children:
                        break
                    time.sleep(0.1)
                if self.launcher.stop_signal is not None:
                    self.launcher.stop_all()
                    for run, state in self.launcher.ended:
                        self.on_ended(run, state)
                    self.launcher.ended.clear()
        finally:
            if self.launcher.stop_signal is not None or self.active():
                self.interrupt()
            self.display.close()
        c = self.counts()
        print(
            f"study {self.st.study_name!r}: {c['complete']} complete, {c['pruned']} pruned, {c['fail']} failed, "
            f"{c['running']} running elsewhere, {c['waiting']} queued (of --trials {self.st.trials})"
        )
        if self.launcher.stop_signal is not None:
            return EXIT_INTERRUPTED
        if self.exhausted:
            print(f"stopped: {self.exhausted}")
            return 1
        write_report(self.st, self.study, self.storage_url)
        return 0


# ---------------------------------------------------------------------------------------------- the command


def check_flags(st: Setup, jobs: int | None = None, env: dict[str, str] | None = None) -> None:
    """The flags this study will pass, checked by the script's own parser and pre-start checks before any trial
    or run folder exists (``experiments.flags.refusals``, the script under ``RL_CHECK_ONLY``): a run of each env id
    and of each seed with the flags of every run, and each searched value at the edges of its range (LOW, HIGH,
    every ``cat`` value; the other searched flags at the script's defaults). The first refusal in that order is a
    ``LaunchError`` with the script's own reason. Each check imports the script (seconds): they run ``jobs`` at a
    time, identical ones once, all of them (stopping at the first to end refused would name whichever check
    finished first: a bad seed reported as a searched value's refusal). ``env``: the environment the runs get where
    it differs from this process's (a slot's: ``experiments.slots.child_env``)."""
    stem = Path(st.script).stem
    runs = build_grid(st.root, [st.script], st.env_ids, st.seeds, st.common, [[("trial0000", [])]])
    first = runs[0]
    checks: list[tuple[str, list[str]]] = []
    labels: list[str] = []
    shown = lambda r: shlex.join(r.flags()[:-4])  # without --out-dir and --run-name, which are the launcher's own
    for r in runs:  # every env id with the first seed, every seed with the first env id
        if r.env_id == first.env_id or r.seed == first.seed:
            checks.append((r.script_path, r.flags()))
            labels.append(f"{stem} refuses the flags of a run ({shown(r)})")
    for p in st.space:
        for v in searched_values(p):
            tokens = flag_tokens(p, v, st.fields)
            r = dataclasses.replace(first, variant=(("trial0000", tuple(tokens)),))
            checks.append((r.script_path, r.flags()))
            labels.append(f"--search {p.spec()}: {stem} refuses {shlex.join(tokens)} (beside the flags of every run)")
    n = jobs or max(1, min(4, len(os.sched_getaffinity(0))))
    refused = refusals(checks, jobs=n, env=env)
    if refused:
        index, reason = refused[0]
        raise LaunchError(f"{labels[index]}: {reason}")


def dry_run(st: Setup, slots: list[Slot]) -> int:
    print(
        f"study {st.study_name!r} in {st.storage or study.default_storage(st.root)}, sampler {st.sampler}, "
        f"pruner {st.pruner}, {st.trials} trials"
    )
    for p in st.space:
        print(f"  {p.spec():<40} -> --{p.name}")
    print(f"{len(slots)} slot(s) of {slots[0].cores if slots else 0} physical core(s); each trial runs:")
    flags = [tok for p in st.space for tok in flag_tokens(p, f"<{p.name}>", st.fields)] if st.space else []
    for r in build_grid(st.root, [st.script], st.env_ids, st.seeds, st.common, [[("trialNNNN", flags)]]):
        print(f"  {r.rel}\n    {shlex.join(r.command())}")
    return 0


SLURM_SWITCHES = ["--slurm", "--wait"]  # the SLURM options without a value, and those with one:
SLURM_OPTIONS = "--workers --cluster --partition --time --cpus-per-worker --gpus-per-worker --mem-gb --slurm-param".split()


def worker_command(argv: list[str], tail: list[str]) -> list[str]:
    """This tune's command line without its SLURM options: what each worker job runs (paths made absolute)."""
    out, i = [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in SLURM_SWITCHES + SLURM_OPTIONS:
            i += 1 + (name in SLURM_OPTIONS and "=" not in argv[i])
            continue
        out.append(argv[i])
        i += 1
    if out and not out[0].startswith("-"):  # the root, relative to this directory
        out[0] = str(Path(out[0]).resolve())
    return [sys.executable, str(Path(__file__).resolve()), *out, "--plain", *(["--", *tail] if tail else [])]


@one_line
def main(argv: Sequence[str] | None = None) -> int:
    """tune.py's command line (the module docstring); returns the exit status. Every check is made before
    anything is created or changed: the arguments and the ``--config`` file (``study.setup_from``: the folder, its
    ``tune.json`` and run records, the storage), the search space's names against the script's ``Args``, the
    sampler and pruner, this machine's slots, then the runs' flags with the script's own parser (``check_flags``)."""
    argv, tail = split_tail(argv)
    try:
        a = parser().parse_args(argv)
    except SystemExit as e:  # Parser: the error: line is written; --help: exit 0
        return e.code if isinstance(e.code, int) else 2
    st = study.setup_from(a, tail)
    if a.report:
        return report_only(st)
    if st.trials is None:
        raise LaunchError("--trials: how many trials the study ends with")
    check_storage_kept(st.root, st.storage or study.default_storage(st.root))
    check_runs(st.root, st.study_name, None)
    st.fields = script_fields(st.script)
    st.space = check_space(st.space, st.fields, Path(st.script).stem, st.common)
    if not st.space:
        raise LaunchError("--search: nothing to search (give NAME=FORM, e.g. learning-rate=log:1e-5:1e-2)")
    study.make_sampler(st.sampler, a.sampler_seed, st.space)
    study.make_pruner(st.pruner)
    slots = [] if a.slurm else local_slots(a)  # a worker job's slots are its node's, made there
    # the checks see what a run sees: a slot's environment (its GPUs, or none with --gpus-per-run 0)
    check_flags(st, env=child_env(slots[:1]) if slots else None)
    if a.dry_run:
        return dry_run(st, slots or make_slots(physical_cores(), a.cores_per_run))
    if a.slurm:
        from experiments.slurm import submit_workers

        return submit_workers(a, worker_command(argv, tail), st.root)
    return Tune(st, a, slots).run()


if __name__ == "__main__":
    sys.exit(command(main))
