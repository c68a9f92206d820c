"""Hyperparameter search over the launcher: Optuna picks each trial's flags, the launcher's slots run them.

    python experiments/tune.py runs/tune-ppo --script ppo_atari --env-ids CartPole-v1 Acrobot-v1 --seeds 1 2 3 \\
        --trials 40 --search "learning-rate=log:1e-5:1e-2" "ent-coef=float:0:0.05" "num-steps=int:32:512:log" \\
        "anneal-lr=cat:true,false" --target-scores CartPole-v1=0:500 Acrobot-v1=-500:0 -- --total-timesteps 100000
    python experiments/tune.py runs/tune-ppo ... --dry-run        # the search space and a trial's runs; nothing starts
    python experiments/tune.py runs/tune-ppo ...                  # again after Ctrl-C: the study goes on to --trials
    python experiments/tune.py runs/tune-ppo --report             # best flags, trials.csv, importances, plots
    optuna-dashboard sqlite:///runs/tune-ppo/study.db             # the study in a browser (pip install optuna-dashboard)

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
flag the launcher sets, a form that does not fit the flag's type, a range outside the flag's declared range
(``shared.argtypes.Range``) or an empty one is one ``error:`` line and exit 2 before anything starts.

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
``--max-failures`` trials failed; 130 after Ctrl-C or SIGTERM; 2 for bad arguments, with one ``error:`` line.
"""

# ruff: noqa: E402 (the repository goes on sys.path before its imports, as in launch.py)
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import fcntl
import json
import math
import os
import random
import shlex
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Find the repository without an install step, as experiments/launch.py does (see there).
_HERE = Path(__file__).resolve().parent
if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == _HERE:
    del sys.path[0]
sys.path.insert(0, str(next(p for p in _HERE.parents if (p / "shared" / "__init__.py").exists())))

from experiments.display import LiveView
from experiments.grid import RESERVED, LaunchError, Trial, build_grid, load_file, resolve_script, split_flags
from experiments.local import Launcher
from experiments.records import (
    EXIT_INTERRUPTED,
    STATES,
    finished,
    git_info,
    new_record,
    package_versions,
    read_json,
    write_json,
)
from experiments.slots import gpu_count, make_slots
from experiments.status import progress_of
from shared.affinity import physical_cores
from shared.progress import read_rows

__all__ = ["Param", "main", "parse_search", "parser"]

TUNE_KEYS = ("script", "search", "target_scores", "trials", "aggregate", "score", "last_episodes", "sampler",
             "pruner", "storage", "study_name", "prune_every")
HEARTBEAT_S = 30.0  # how often a process stamps its running trials
PRUNE_POLL_S = 2.0  # how often the running trials' progress rows are read for pruning
SAMPLERS = {"tpe": "TPESampler", "random": "RandomSampler", "cmaes": "CmaEsSampler", "gp": "GPSampler",
            "qmc": "QMCSampler", "grid": "GridSampler", "bruteforce": "BruteForceSampler", "nsgaii": "NSGAIISampler"}
PRUNERS = {"none": "NopPruner", "nop": "NopPruner", "median": "MedianPruner", "percentile": "PercentilePruner",
           "hyperband": "HyperbandPruner", "successive-halving": "SuccessiveHalvingPruner",
           "threshold": "ThresholdPruner", "patient": "PatientPruner", "wilcoxon": "WilcoxonPruner"}


# ---------------------------------------------------------------------------------------------- search space


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched flag: ``name`` as on the command line (``learning-rate``), its distribution."""

    name: str
    kind: str  # float, int or cat
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: float | None = None
    choices: tuple[str, ...] = ()

    @property
    def field(self) -> str:
        return self.name.replace("-", "_")

    def spec(self) -> str:
        """The canonical search string (what the study records)."""
        if self.kind == "cat":
            return f"{self.name}=cat:{','.join(self.choices)}"
        tail = ":log" if self.log else f":step={_num(self.step)}" if self.step is not None else ""
        return f"{self.name}={self.kind}:{_num(self.low)}:{_num(self.high)}{tail}"

    def suggest(self, trial) -> Any:
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_categorical(self.name, list(self.choices))


def _num(x: float | None) -> str:
    return repr(int(x)) if x is not None and float(x).is_integer() and abs(x) < 1e15 else repr(x)


def parse_search(item: str) -> Param:
    """``NAME=log:LOW:HIGH``, ``NAME=float:LOW:HIGH[:log|:step=Q]``, ``NAME=int:LOW:HIGH[:log|:step=K]`` or
    ``NAME=cat:A,B,...``; a malformed one raises ``LaunchError``."""
    where = f"--search {item!r}"
    name, sep, spec = item.partition("=")
    name = name.strip().removeprefix("--")
    if not sep or not name or not spec:
        raise LaunchError(f"{where}: not NAME=FORM (e.g. learning-rate=log:1e-5:1e-2)")
    kind, _, rest = spec.partition(":")
    if kind == "cat":
        choices = tuple(c.strip() for c in rest.split(","))
        if not rest or any(not c for c in choices):
            raise LaunchError(f"{where}: cat needs values separated by commas (cat:true,false)")
        if len(set(choices)) != len(choices):
            raise LaunchError(f"{where}: a value is listed twice")
        return Param(name, "cat", choices=choices)
    if kind not in ("log", "float", "int"):
        raise LaunchError(f"{where}: the form is log:, float:, int: or cat:, not {kind!r}")
    parts = rest.split(":")
    if len(parts) < 2 or len(parts) > 3 or (kind == "log" and len(parts) != 2):
        raise LaunchError(f"{where}: expected {kind}:LOW:HIGH" + ("" if kind == "log" else "[:log|:step=Q]"))
    try:
        low, high = (int(p) if kind == "int" else float(p) for p in parts[:2])
    except ValueError:
        raise LaunchError(f"{where}: LOW and HIGH must be {'integers' if kind == 'int' else 'numbers'}") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise LaunchError(f"{where}: LOW and HIGH must be finite")
    log, step = kind == "log", None
    if len(parts) == 3:
        if parts[2] == "log":
            log = True
        elif parts[2].startswith("step="):
            try:
                step = int(parts[2][5:]) if kind == "int" else float(parts[2][5:])
            except ValueError:
                raise LaunchError(f"{where}: step= takes a {'integer' if kind == 'int' else 'number'}") from None
            if not (math.isfinite(step) and step > 0) or step > high - low:
                raise LaunchError(f"{where}: step must be positive and at most HIGH - LOW")
        else:
            raise LaunchError(f"{where}: the third part is log or step=Q, not {parts[2]!r}")
    if not low < high:
        raise LaunchError(f"{where}: LOW must be below HIGH")
    if log and low <= 0:
        raise LaunchError(f"{where}: a log range needs LOW > 0")
    return Param(name, "int" if kind == "int" else "float", float(low), float(high), log, step)


PROBE = r"""
import dataclasses, importlib.util, json, sys, types, typing
spec = importlib.util.spec_from_file_location("_tune_probe", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["_tune_probe"] = module
spec.loader.exec_module(module)
cls = getattr(module, "Args", None)
out = None
if dataclasses.is_dataclass(cls):
    hints, out = typing.get_type_hints(cls, include_extras=True), {}
    for f in dataclasses.fields(cls):
        t, ranges = hints.get(f.name), []
        if typing.get_origin(t) is typing.Annotated:
            t, *meta = typing.get_args(t)
            ranges = [{k: getattr(m, k) for k in ("gt", "ge", "lt", "le")} for m in meta
                      if all(hasattr(m, k) for k in ("gt", "ge", "lt", "le", "allows"))]
        optional = False
        if typing.get_origin(t) in (typing.Union, types.UnionType):
            inner = [a for a in typing.get_args(t) if a is not type(None)]
            optional, t = len(inner) < len(typing.get_args(t)), inner[0] if len(inner) == 1 else t
        if typing.get_origin(t) is typing.Literal:
            kind, choices = "literal", [str(c) for c in typing.get_args(t)]
        else:
            kind, choices = (t.__name__ if t in (bool, int, float, str) else "other"), None
        out[f.name] = {"kind": kind, "choices": choices, "ranges": ranges, "optional": optional}
print("\n@@ARGS@@" + json.dumps(out))
"""


def script_fields(script_path: str) -> dict[str, dict]:
    """The script's ``Args`` fields (kind, Literal choices, declared ranges), read by importing it in a child
    process (torch and the script's imports stay out of this one, which forks the runs)."""
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, script_path], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"cannot read the flags of {script_path}: {e}") from None
    marker = out.stdout.rfind("@@ARGS@@")
    if out.returncode != 0 or marker < 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise LaunchError(f"cannot read the flags of {script_path}: {last}")
    fields = json.loads(out.stdout[marker + len("@@ARGS@@") :])
    if not fields:
        raise LaunchError(f"{script_path} has no dataclass Args to search over")
    return fields


def _allowed(value: float, ranges: list[dict]) -> bool:
    for r in ranges:
        if ((r["gt"] is not None and not value > r["gt"]) or (r["ge"] is not None and not value >= r["ge"])
                or (r["lt"] is not None and not value < r["lt"]) or (r["le"] is not None and not value <= r["le"])):
            return False
    return True


def _range_text(ranges: list[dict]) -> str:
    parts = []
    for r in ranges:
        lo = f"({r['gt']}" if r["gt"] is not None else f"[{r['ge']}" if r["ge"] is not None else "(-inf"
        hi = f"{r['lt']})" if r["lt"] is not None else f"{r['le']}]" if r["le"] is not None else "inf)"
        parts.append(f"{lo}, {hi}")
    return " and ".join(parts)


def check_space(params: list[Param], fields: dict[str, dict], script: str, common: list[str]) -> list[Param]:
    """Each searched flag against the script's ``Args``; returns the params with bool choices normalised."""
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise LaunchError(f"--search: a flag is searched twice ({names})")
    given = {f.split("=", 1)[0] for f in common if f.startswith("--")}
    out = []
    for p in params:
        where = f"--search {p.spec()}"
        field = fields.get(p.field)
        if field is None:
            near = difflib.get_close_matches(p.field, list(fields), n=1)
            hint = f" (did you mean {near[0].replace('_', '-')}?)" if near else ""
            raise LaunchError(f"{where}: {script} has no flag --{p.name}{hint}")
        if f"--{p.name}" in RESERVED:
            raise LaunchError(f"{where}: --{p.name} is set by the launcher for every run")
        if f"--{p.name}" in given or f"--no-{p.name}" in given:
            raise LaunchError(f"{where}: --{p.name} is also given among the flags of every run")
        kind, ranges = field["kind"], field["ranges"]
        if p.kind == "float" and kind != "float":
            raise LaunchError(f"{where}: --{p.name} takes {_kind_text(field)}, not a float")
        if p.kind == "int" and kind not in ("int", "float"):
            raise LaunchError(f"{where}: --{p.name} takes {_kind_text(field)}, not an integer")
        if p.kind in ("float", "int"):
            for v in (p.low, p.high):
                if not _allowed(v, ranges):
                    raise LaunchError(f"{where}: --{p.name} must be in {_range_text(ranges)}, the range reaches {_num(v)}")
            out.append(p)
            continue
        choices = []
        for c in p.choices:
            if kind == "bool":
                if c.lower() not in ("true", "false"):
                    raise LaunchError(f"{where}: --{p.name} is a switch: its values are true and false, not {c!r}")
                choices.append(c.lower())
                continue
            if kind == "literal" and c not in field["choices"]:
                raise LaunchError(f"{where}: --{p.name} takes one of {', '.join(field['choices'])}, not {c!r}")
            if kind in ("int", "float"):
                try:
                    v = int(c) if kind == "int" else float(c)
                except ValueError:
                    raise LaunchError(f"{where}: --{p.name} takes {_kind_text(field)}, not {c!r}") from None
                if not math.isfinite(v) or not _allowed(v, ranges):
                    raise LaunchError(f"{where}: --{p.name} must be in {_range_text(ranges)}, not {c}")
            if kind == "other":
                raise LaunchError(f"{where}: --{p.name} is not a number, switch, string or choice: it cannot be searched")
            choices.append(c)
        if len(set(choices)) != len(choices):
            raise LaunchError(f"{where}: a value is listed twice")
        out.append(dataclasses.replace(p, choices=tuple(choices)))
    return out


def _kind_text(field: dict) -> str:
    return {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
            "literal": "one of " + ", ".join(field.get("choices") or [])}.get(field["kind"], "a value")


def flag_tokens(p: Param, value: Any, fields: dict[str, dict]) -> list[str]:
    """The script's flags for one searched value: a switch as ``--name``/``--no-name``, else ``--name VALUE``."""
    if fields.get(p.field, {}).get("kind") == "bool":
        if str(value).startswith("<"):  # --dry-run's placeholder
            return [f"--[no-]{p.name}"]
        return [f"--{p.name}"] if str(value).lower() == "true" else [f"--no-{p.name}"]
    return [f"--{p.name}", repr(value) if isinstance(value, float) else str(value)]


# ---------------------------------------------------------------------------------------------- arguments


def parse_targets(items: Sequence[str] | dict, env_ids: Sequence[str | None]) -> dict[str, tuple[float, float]]:
    if isinstance(items, dict):
        items = [f"{k}={v if isinstance(v, str) else ':'.join(map(str, v))}" for k, v in items.items()]
    out = {}
    for item in items:
        env, sep, rng = str(item).partition("=")
        lo, sep2, hi = rng.partition(":")
        try:
            low, high = float(lo), float(hi)
        except ValueError:
            low = high = math.nan
        if not sep or not sep2 or not (math.isfinite(low) and math.isfinite(high)) or low == high:
            raise LaunchError(f"--target-scores {item!r}: not ENV=LOW:HIGH with two different numbers (CartPole-v1=0:500)")
        if env not in env_ids:
            raise LaunchError(f"--target-scores {item!r}: {env} is not among --env-ids")
        out[env] = (low, high)
    missing = [e for e in env_ids if e not in out]
    if missing and len(env_ids) > 1:
        raise LaunchError(f"--target-scores: several env ids are averaged: give each a LOW:HIGH (missing {missing[0]})")
    return out


def _spec_args(text: str, where: str) -> tuple[str, dict]:
    """``NAME`` or ``NAME:KEY=VALUE,...`` (values read as JSON where they parse: numbers, true/false, null)."""
    name, _, rest = text.partition(":")
    kwargs = {}
    for kv in filter(None, rest.split(",")):
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            raise LaunchError(f"{where} {text!r}: arguments are KEY=VALUE separated by commas")
        try:
            kwargs[k.strip()] = json.loads(v)
        except ValueError:
            kwargs[k.strip()] = v
    return name.strip(), kwargs


def _optuna_class(text: str, flag: str, names: dict[str, str], module, base: type) -> tuple[str, type, dict]:
    """``NAME[:KEY=VALUE,...]`` -> (class name, the class in ``module``, its keyword arguments); a short name from
    ``names`` or a class name of ``module`` deriving from ``base``, else a LaunchError naming the choices."""
    name, kwargs = _spec_args(text, flag)
    cls_name = names.get(name.lower().replace("_", "-"), name)
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise LaunchError(f"{flag} {text!r}: unknown (one of {', '.join(names)}, or an {module.__name__} class)")
    return cls_name, cls, kwargs


def make_sampler(text: str, seed: int | None, space: list[Param]):
    import optuna

    cls_name, cls, kwargs = _optuna_class(text, "--sampler", SAMPLERS, optuna.samplers, optuna.samplers.BaseSampler)
    if cls_name == "GridSampler" and "search_space" not in kwargs:
        if any(p.kind != "cat" and p.step is None and p.kind != "int" for p in space):
            raise LaunchError("--sampler grid: every searched float needs a step (float:LOW:HIGH:step=Q) or cat: values")
        kwargs["search_space"] = {p.name: _grid_values(p) for p in space}
    if seed is not None and "seed" not in kwargs and "seed" in _params_of(cls):
        kwargs["seed"] = seed
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise LaunchError(f"--sampler {text!r}: {e}") from None


def _grid_values(p: Param) -> list:
    if p.kind == "cat":
        return list(p.choices)
    step = p.step or 1
    n = int(math.floor((p.high - p.low) / step + 1e-9))
    return [int(p.low + i * step) if p.kind == "int" else p.low + i * step for i in range(n + 1)]


def _params_of(cls) -> set[str]:
    import inspect

    with contextlib.suppress(TypeError, ValueError):
        return set(inspect.signature(cls).parameters)
    return set()


def make_pruner(text: str):
    import optuna

    cls_name, cls, kwargs = _optuna_class(text, "--pruner", PRUNERS, optuna.pruners, optuna.pruners.BasePruner)
    if cls_name == "PatientPruner" and "wrapped_pruner" not in kwargs:
        kwargs["wrapped_pruner"] = optuna.pruners.MedianPruner()
        kwargs.setdefault("patience", 1)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise LaunchError(f"--pruner {text!r}: {e}") from None


def make_storage(url: str | None, root: Path):
    """``sqlite:///{root}/study.db`` by default, an RDB URL, or ``journal:PATH`` (a journal file)."""
    import optuna

    if not url:
        url = f"sqlite:///{root / 'study.db'}"
    try:
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend, JournalStorage

            path = Path(url[len("journal:") :]).expanduser()
            path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(path))), url
        kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
        if url.startswith("sqlite:///"):
            Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(5):  # two processes creating a new database's tables at once: the later one retries
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs), url
            except Exception as e:
                if "already exists" not in str(e) or attempt == 4:
                    raise
                time.sleep(0.5 + random.random())
    except Exception as e:  # an unknown dialect, a missing driver, a server that does not answer
        raise LaunchError(f"--storage {url}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Flags after `--` go to every run (so do --flags). The module docstring has the forms and the file.")
    p.add_argument("root", nargs="?", help="tune folder (or `root` in the --config file): runs, study.db, report")
    p.add_argument("--config", type=Path, help="the launcher's TOML/JSON form with tune keys (search, trials, ...)")
    p.add_argument("--script", "--scripts", dest="script", nargs="+", help="the algos/ script (ppo_atari) or a path")
    p.add_argument("--env-ids", nargs="+", help="gymnasium ids (left out: the script's default)")
    p.add_argument("--seeds", nargs="+", type=int, help="every trial runs each seed on each env id")
    p.add_argument("--flags", default="", help="flags for every run, one string")
    p.add_argument("--search", action="append", nargs="+", default=[], metavar="NAME=FORM",
                   help="a searched flag: log:LOW:HIGH, float:LOW:HIGH[:log|:step=Q], int:LOW:HIGH[:log|:step=K], cat:A,B")
    p.add_argument("--target-scores", nargs="+", default=None, metavar="ENV=LOW:HIGH",
                   help="each env's score normalised (score - LOW) / (HIGH - LOW)")
    p.add_argument("--trials", type=int, help="complete or pruned trials the study ends with")
    p.add_argument("--aggregate", choices=["mean", "iqm"], default=None, help="over a trial's runs (default mean)")
    p.add_argument("--score", choices=["auto", "eval", "train"], default=None,
                   help="a run's score: eval.json where present (auto), or the last training episodes (train)")
    p.add_argument("--last-episodes", type=int, default=None, help="training episodes behind a train score (100)")
    p.add_argument("--sampler", default=None, help="NAME[:KEY=VALUE,...] (default tpe)")
    p.add_argument("--sampler-seed", type=int, default=None, help="seed of the sampler")
    p.add_argument("--pruner", default=None, help="NAME[:KEY=VALUE,...] (default median; none: no pruning)")
    p.add_argument("--prune-every", type=int, default=None, help="steps between reports (default total / 10)")
    p.add_argument("--storage", default=None, help="Optuna storage URL or journal:PATH (default sqlite in the root)")
    p.add_argument("--study-name", default=None, help="study name in the storage (default the root's name)")
    p.add_argument("--max-failures", type=int, default=5, help="failed trials after which no new trial starts")
    p.add_argument("--stale-after", type=float, default=300.0,
                   help="seconds without a heartbeat after which another process's running trial is queued again")
    p.add_argument("--report", action="store_true", help="write the results (best flags, CSV, plots) and exit")
    p.add_argument("--dry-run", action="store_true", help="print the search space and a trial's runs; change nothing")
    p.add_argument("--cores-per-run", type=int, default=1, help="physical cores per slot (default 1)")
    p.add_argument("--gpus-per-run", type=int, default=None, help="GPUs of its own per run (0: hide the GPUs)")
    p.add_argument("--runs-per-gpu", type=int, default=None, help="at most this many runs share one GPU")
    p.add_argument("--stop-timeout", type=float, default=120.0,
                   help="seconds to wait for the runs to checkpoint after Ctrl-C/SIGTERM or a prune before SIGKILL")
    p.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    p.add_argument("--status-every", type=float, default=30.0, help="seconds between summary lines (plain output)")
    s = p.add_argument_group("clusters (submitit): tune processes as jobs, each with its node's slots")
    s.add_argument("--slurm", action="store_true", help="submit --workers tune processes as SLURM jobs")
    s.add_argument("--workers", type=int, default=1, help="with --slurm: tune processes (jobs) on the study")
    s.add_argument("--cluster", choices=["auto", "slurm", "local"], default="auto",
                   help="submitit's executor: auto (SLURM where sbatch exists), slurm, or local (testing)")
    s.add_argument("--partition", default=None)
    s.add_argument("--time", type=int, default=60, help="minutes per job (the worker is requeued after)")
    s.add_argument("--cpus-per-worker", type=int, default=None, help="CPUs of each job (default --cores-per-run)")
    s.add_argument("--gpus-per-worker", type=int, default=0, help="GPUs of each job")
    s.add_argument("--mem-gb", type=float, default=None)
    s.add_argument("--slurm-param", action="append", default=[], metavar="KEY=VALUE",
                   help="any other sbatch option (e.g. account=abc)")
    s.add_argument("--wait", action="store_true", help="with --slurm: wait for the workers")
    return p


@dataclasses.dataclass
class Setup:
    """Everything a tune needs, checked: the grid's parts, the space, how a trial is scored."""

    root: Path
    script: str  # path
    env_ids: list
    seeds: list[int]
    common: list[str]
    space: list[Param]
    fields: dict[str, dict]
    targets: dict[str, tuple[float, float]]
    trials: int | None
    aggregate: str
    score: str
    last_episodes: int
    sampler: str
    pruner: str
    prune_every: int | None
    storage: str | None
    study_name: str

    def spec(self) -> dict:
        """What the study records and checks on every later start (the same study must mean the same thing)."""
        return {"script": Path(self.script).stem, "env_ids": list(self.env_ids), "seeds": list(self.seeds),
                "flags": list(self.common), "search": [p.spec() for p in self.space],
                "target_scores": {k: list(v) for k, v in sorted(self.targets.items())}, "aggregate": self.aggregate,
                "score": self.score, "last_episodes": self.last_episodes}


def setup_from(a: argparse.Namespace, tail: list[str]) -> Setup:
    data = load_file(a.config, extra=TUNE_KEYS) if a.config else {}
    if data.get("levels"):
        raise LaunchError(f"--config {a.config}: a tune has no levels (its trials are the variants): use search")
    root_s = a.root or data.get("root")
    if not root_s:
        raise LaunchError("no tune folder: give it first (or `root` in the --config file)")
    root = Path(root_s).resolve()
    saved = read_json(root / "tune.json")
    script_l = a.script or data.get("script") or data.get("scripts") or saved.get("script")
    if isinstance(script_l, str):
        script_l = [script_l]
    if a.report and not a.script and saved:  # the root alone: what its last tune ran
        data = {**saved, **data}
    if not script_l:
        raise LaunchError("no script: give --script (or script in the --config file)")
    if len(script_l) != 1:
        raise LaunchError(f"--script: a tune searches one script, got {len(script_l)}")
    script = str(resolve_script(script_l[0]))
    env_ids = a.env_ids or data.get("env_ids") or [None]
    seeds = a.seeds if a.seeds is not None else data.get("seeds", [])
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise LaunchError(f"--seeds: give integer seeds, got {seeds!r}")
    common = split_flags(data.get("flags"), "--config flags") + split_flags(a.flags, "--flags") + tail
    build_grid(root, [script], env_ids, seeds, common, [])  # the launcher's own checks of the grid
    search = [s for group in a.search for s in group]
    file_search = data.get("search", [])
    if isinstance(file_search, dict):
        file_search = [f"{k}={v}" for k, v in file_search.items()]
    if not isinstance(file_search, list):
        raise LaunchError(f"--config {a.config}: search is a table (name = form) or a list of NAME=FORM strings")
    space = [parse_search(str(s)) for s in [*file_search, *search]]
    targets = parse_targets(a.target_scores if a.target_scores is not None else data.get("target_scores", {}), env_ids)
    trials = a.trials if a.trials is not None else data.get("trials")
    if trials is not None and (not isinstance(trials, int) or trials < 1):
        raise LaunchError(f"--trials must be a positive integer, got {trials!r}")
    last = a.last_episodes if a.last_episodes is not None else data.get("last_episodes", 100)
    prune_every = a.prune_every if a.prune_every is not None else data.get("prune_every")
    for name, v in (("--last-episodes", last), ("--prune-every", prune_every), ("--max-failures", a.max_failures)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise LaunchError(f"{name} must be a positive integer, got {v!r}")
    for name, v in (("--stale-after", a.stale_after), ("--stop-timeout", a.stop_timeout)):
        if not v >= 0:
            raise LaunchError(f"{name} must be non-negative, got {v}")
    if a.workers < 1:
        raise LaunchError(f"--workers must be at least 1, got {a.workers}")
    aggregate = a.aggregate or data.get("aggregate", "mean")
    score = a.score or data.get("score", "auto")
    if aggregate not in ("mean", "iqm") or score not in ("auto", "eval", "train"):
        raise LaunchError("aggregate is mean or iqm and score is auto, eval or train")
    return Setup(root, script, list(env_ids), list(seeds), common, space, {}, targets, trials, aggregate, score, last,
                 a.sampler or data.get("sampler", "tpe"), a.pruner or data.get("pruner", "median"), prune_every,
                 a.storage or data.get("storage"), a.study_name or data.get("study_name") or root.name)


# ---------------------------------------------------------------------------------------------- scoring


def normalised(st: Setup, env_id: str | None, score: float | None) -> float | None:
    if score is None:
        return None
    low, high = st.targets.get(env_id, (0.0, 1.0))
    return (score - low) / (high - low)


def aggregate(values: list[float], how: str) -> float:
    x = sorted(values)
    if how == "iqm":  # rliable's IQM: scipy.stats.trim_mean(x, 0.25), the middle half of the runs
        cut = int(0.25 * len(x))
        x = x[cut : len(x) - cut]
    return float(sum(x) / len(x))


def run_score(st: Setup, run: Trial) -> float | None:
    from experiments.report import read_result

    return read_result(run.folder, st.score, st.last_episodes).score


def score_at(st: Setup, rows: list[dict[str, str]], step: int) -> float | None:
    from experiments.report import rows_score

    upto = [r for r in rows if int(r["global_step"]) <= step]
    return rows_score(upto, st.last_episodes)[0]


# ---------------------------------------------------------------------------------------------- the tune


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
    def __init__(self, st: Setup, a: argparse.Namespace):
        import optuna

        self.st, self.a = st, a
        self.host, self.pid = socket.gethostname(), os.getpid()
        with self.root_lock():  # the processes of one root create a new study database one at a time
            self.storage, self.storage_url = make_storage(st.storage, st.root)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.sampler = make_sampler(st.sampler, a.sampler_seed, st.space)
        self.pruner = make_pruner(st.pruner)
        try:
            with self.root_lock():
                self.study = optuna.create_study(storage=self.storage, study_name=st.study_name, direction="maximize",
                                                 sampler=self.sampler, pruner=self.pruner, load_if_exists=True)
                recorded = self.study.user_attrs.get("tune")
                if recorded is None:
                    self.study.set_user_attr("tune", st.spec())
                elif recorded != st.spec():
                    diff = [k for k in st.spec() if recorded.get(k) != st.spec()[k]]
                    raise LaunchError(f"study {st.study_name!r} in {self.storage_url} was made with other {', '.join(diff)}: "
                                      f"give the same arguments, or another --study-name")
        except LaunchError:
            raise
        except Exception as e:
            raise LaunchError(f"--storage {self.storage_url}: {type(e).__name__}: {e}") from None
        self.mine: dict[int, TrialRuns] = {}
        self.by_run: dict[str, TrialRuns] = {}
        self.runs: list[Trial] = []
        self.records: dict[str, dict] = {}
        self.meta = {"git": git_info(), "versions": package_versions()}
        self.interval: int | None = st.prune_every
        self.exhausted: str | None = None  # why no new trial may start
        self.more = True  # whether to ask the study for another trial when a slot is free
        self.last_heartbeat = 0.0
        self.last_prune_poll = 0.0

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
                with contextlib.suppress(Exception):
                    self.storage.set_trial_state_values(t._trial_id, TrialState.WAITING)
                    self.storage.set_trial_user_attr(t._trial_id, "interrupted", t.user_attrs.get("interrupted", 0) + 1)
                    self.display.note(f"trial {t.number}: its process ({owner}) is gone: queued again")

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
            frozen = self.storage.get_trial(trial._trial_id)
            resumed = bool(frozen.params) or "flags" in frozen.user_attrs
            if not resumed:
                ahead = [t for t in self.study.get_trials(deepcopy=False) if t.number <= trial.number and
                         t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
                         and not t.user_attrs.get("surplus")]
                if len(ahead) > self.st.trials:  # another root's process asked at the same time
                    trial.set_user_attr("surplus", True)
                    self.study.tell(trial, state=TrialState.FAIL)
                    return None
            params = {p.name: p.suggest(trial) for p in self.st.space}
            trial.set_user_attr("owner", f"{self.host}:{self.pid}")
            trial.set_user_attr("heartbeat", time.time())
        flags = [tok for p in self.st.space for tok in flag_tokens(p, params[p.name], self.st.fields)]
        runs = build_grid(self.st.root, [self.st.script], self.st.env_ids, self.st.seeds, self.st.common,
                          [[(f"trial{trial.number:04d}", flags)]])
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
            rec = read_json(r.folder / "launch.json")
            base = {**new_record(r, self.meta), "trial": tr.number}
            if rec.get("state") in STATES and (rec.get("attempts") or rec.get("command")):
                rec = {**rec, **{k: v for k, v in base.items() if k not in ("state", "exit_code", "error", "command",
                                                                             "attempts")}}
            else:
                rec = base
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

    def complete(self, tr: TrialRuns) -> None:
        from optuna.trial import TrialState

        self.more = self.exhausted is None

        values = []
        for r in tr.runs:
            v = normalised(self.st, r.env_id, run_score(self.st, r))
            if v is None:
                self.fail(tr, f"{r.rel} has no score (no evaluation and no finished episode)")
                return
            values.append(v)
        tr.value = aggregate(values, self.st.aggregate)
        self.study.tell(tr.trial, tr.value, state=TrialState.COMPLETE)
        tr.state = "complete"
        self.display.note(f"trial {tr.number} complete: value {tr.value:.4g}")

    def fail(self, tr: TrialRuns, error: str) -> None:
        from optuna.trial import TrialState

        self.more = self.exhausted is None

        tr.state, tr.error = "failed", error
        self.drop_queued(tr, "queued")
        self.launcher.stop_children(tr.runs)
        tr.trial.set_user_attr("error", error)
        self.study.tell(tr.trial, state=TrialState.FAIL)
        self.display.note(f"trial {tr.number} failed: {error}")

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
        from optuna.trial import TrialState

        self.more = self.exhausted is None

        self.study.tell(tr.trial, state=TrialState.PRUNED)
        tr.state = "pruned"
        self.display.note(f"trial {tr.number} pruned: its runs ended")

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
            values = [normalised(self.st, r.env_id, score_at(self.st, rows[r.rel], step)) for r in started]
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
        from optuna.trial import TrialState

        for tr in self.active():
            if tr.state == "pruning":
                for r in tr.runs:
                    if self.records[r.rel]["state"] in ("interrupted", "queued", "running"):
                        self.mark_pruned(r)
                self.finish_pruned(tr)
                continue
            with contextlib.suppress(Exception):
                tr.trial.set_user_attr("interrupted", tr.trial.user_attrs.get("interrupted", 0) + 1)
                tr.trial.set_user_attr("owner", None)
                self.storage.set_trial_state_values(tr.trial._trial_id, TrialState.WAITING)
            tr.state = "interrupted"
            self.display.note(f"trial {tr.number} interrupted: queued again for the next start")

    # -- the loop

    def run(self) -> int:
        n_gpus = gpu_count() if self.a.gpus_per_run != 0 else 0
        slots = make_slots(physical_cores(), self.a.cores_per_run, n_gpus, self.a.gpus_per_run, self.a.runs_per_gpu)
        self.display = TuneDisplay(self, plain=self.a.plain or not sys.stdout.isatty(), status_every=self.a.status_every)
        self.launcher = Launcher(self.runs, self.records, slots, self.display, self.a.stop_timeout, self.meta)
        write_json(self.st.root / "tune.json", {**self.st.spec(), "script": self.st.script, "storage": self.storage_url,
                                                "study_name": self.st.study_name, "trials": self.st.trials})
        self.display.note(f"study {self.st.study_name!r} in {self.storage_url}: {self.st.trials} trials of "
                          f"{len(self.st.env_ids) * len(self.st.seeds)} runs, {len(slots)} slot(s) of "
                          f"{self.a.cores_per_run} core(s) here")
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
        print(f"study {self.st.study_name!r}: {c['complete']} complete, {c['pruned']} pruned, {c['fail']} failed, "
              f"{c['running']} running elsewhere, {c['waiting']} queued (of --trials {self.st.trials})")
        if self.launcher.stop_signal is not None:
            return EXIT_INTERRUPTED
        if self.exhausted:
            print(f"stopped: {self.exhausted}")
            return 1
        write_report(self.st, self.study, self.storage_url)
        return 0


class TuneDisplay(LiveView):
    """The study while it runs: on a terminal (rich, not ``--plain``) one table refreshed in place at most once a
    second (trial, state, value or latest intermediate value, flags, this process's runs done and their step); plain
    lines otherwise, one per event and a summary every ``status_every`` seconds. No refresh thread."""

    SHOWN = 30  # the table's rows: the best trial and the latest ones
    TOLERATE = (Exception,)  # a storage hiccup must not stop the runs' supervision

    def __init__(self, tune: Tune, plain: bool, status_every: float):
        self.tune = tune
        super().__init__(plain, status_every)
        self._last_refresh = time.time()

    def summary_line(self) -> str:
        c, best = self.tune.counts(), self._best()
        return (f"{c['complete']} complete, {c['pruned']} pruned, {c['running']} running, {c['waiting']} queued, "
                f"{c['fail']} failed of {self.tune.st.trials}" +
                (f"; best trial {best.number}: {best.value:.4g}" if best is not None else ""))

    def _best(self):
        with contextlib.suppress(ValueError):
            return self.tune.study.best_trial
        return None

    def table(self):
        from optuna.trial import TrialState
        from rich.table import Table

        trials = self.tune.study.get_trials(deepcopy=False)
        best = self._best()
        shown = trials[-self.SHOWN :]
        if best is not None and best not in shown:
            shown = [best, *shown[1:]]
        t = Table(title=f"study {self.tune.st.study_name}: {self.summary_line()}", title_justify="left")
        for col in ("trial", "state", "value", "runs", "flags"):
            t.add_column(col, justify="right" if col in ("trial", "value") else "left",
                         overflow="fold" if col == "flags" else "ellipsis")
        colour = {TrialState.COMPLETE: "green", TrialState.PRUNED: "magenta", TrialState.FAIL: "red",
                  TrialState.RUNNING: "cyan", TrialState.WAITING: "yellow"}
        for tr in shown:
            mine = self.tune.mine.get(tr.number)
            value = tr.value if tr.value is not None else (mine.last_report if mine else None)
            runs = ""
            if mine is not None:
                recs = [self.tune.records[r.rel] for r in mine.runs]
                steps = [progress_of(r)["step"] or 0 for r, rec in zip(mine.runs, recs) if rec["state"] == "running"]
                runs = f"{sum(rec['state'] == 'done' for rec in recs)}/{len(recs)} done" + (
                    f", {len(steps)} at {min(steps):,}+" if steps else "")
            state = tr.state.name.lower() + (" (best)" if best is not None and tr.number == best.number else "")
            t.add_row(str(tr.number), f"[{colour.get(tr.state, 'white')}]{state}[/]",
                      f"{value:.4g}" if value is not None else "-", runs, tr.user_attrs.get("flags", ""))
        return t


# ---------------------------------------------------------------------------------------------- results


def best_commands(st: Setup, best) -> tuple[str, str]:
    script = Path(st.script)
    with contextlib.suppress(ValueError):
        script = script.relative_to(Path.cwd())
    flags = shlex.split(best.user_attrs.get("flags", ""))
    one = shlex.join(["python", str(script), *st.common, *flags])
    seeds = [max(st.seeds) + 100 + i for i in range(max(len(st.seeds), 5))]
    env = (["--env-ids", *[e for e in st.env_ids if e]] if any(st.env_ids) else [])
    rerun = shlex.join(["python", "experiments/launch.py", f"{st.root}-rerun", "--scripts", script.stem, *env,
                        "--seeds", *map(str, seeds), "--level", f"best:{shlex.join(flags)}", "default:", "--",
                        *st.common])
    return one, rerun


def write_report(st: Setup, study, storage_url: str) -> Path:
    """report.md, trials.csv, importances.json and the plots in ``{root}/tune-report``; report.md is printed."""
    import optuna
    from optuna.trial import TrialState

    out = st.root / "tune-report"
    out.mkdir(parents=True, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    df = study.trials_dataframe(attrs=("number", "value", "state", "params", "user_attrs", "intermediate_values",
                                       "datetime_start", "datetime_complete", "duration"))
    df.to_csv(out / "trials.csv", index=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    lines = [f"# Tune {st.study_name}", "", f"Storage `{storage_url}`; script `{Path(st.script).stem}`, env ids "
             f"{', '.join(str(e) for e in st.env_ids)}, seeds {', '.join(map(str, st.seeds))}; value: the "
             f"{st.aggregate} of the runs' normalised scores ({st.score}, targets "
             f"{', '.join(f'{k} {lo}:{hi}' for k, (lo, hi) in st.targets.items()) or 'none: raw scores'}).", "",
             f"Search: {' '.join(p.spec() for p in st.space)}. Flags of every run: `{shlex.join(st.common)}`.", ""]
    counts = {s: sum(t.state == s for t in trials) for s in TrialState}
    lines += [", ".join(f"{n} {s.name.lower()}" for s, n in counts.items() if n) + f" (of --trials {st.trials}).", ""]
    importances: dict[str, float] = {}
    if done:
        best = study.best_trial
        one, rerun = best_commands(st, best)
        lines += [f"Best: trial {best.number}, value {best.value:.4g}: `{best.user_attrs.get('flags', '')}`", "",
                  "```bash", one + "   # add --env-id and --seed", "# the best flags beside the defaults, fresh seeds:",
                  rerun, "```", ""]
        if len(done) >= 2 and st.space:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with contextlib.suppress(Exception):
                    importances = optuna.importance.get_param_importances(
                        study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
            write_json(out / "importances.json", importances)
            if importances:
                lines += ["Importances (PED-ANOVA): " + ", ".join(f"{k} {v:.3f}" for k, v in importances.items()), ""]
    lines += ["| trial | state | value | flags |", "| --- | --- | --- | --- |"]
    key = lambda t: (t.value is None, -(t.value or 0.0) if t.state == TrialState.COMPLETE else math.inf, t.number)
    for t in sorted(trials, key=key):
        value = f"{t.value:.4g}" if t.value is not None else "-"
        extra = (f" (at step {t.user_attrs['pruned_at_step']})" if "pruned_at_step" in t.user_attrs else "") + (
            f" {t.user_attrs['error']}" if t.state == TrialState.FAIL and t.user_attrs.get("error") else "")
        lines.append(f"| {t.number} | {t.state.name.lower()}{extra} | {value} | `{t.user_attrs.get('flags', '')}` |")
    plots = _plots(study, out, len(done))
    if plots:
        lines += ["", " ".join(f"![{p}]({p})" for p in plots)]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    print(text + f"\nwritten to {out}/ (report.md, trials.csv{', importances.json' if importances else ''}"
          f"{', ' + ', '.join(plots) if plots else ''})")
    return out


def _plots(study, out: Path, n_done: int) -> list[str]:
    if n_done < 1:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis
    from optuna.importance import PedAnovaImportanceEvaluator

    made = []
    figures = [("history.png", lambda: vis.plot_optimization_history(study)),
               ("parallel.png", lambda: vis.plot_parallel_coordinate(study)),
               ("slices.png", lambda: vis.plot_slice(study)),
               ("intermediate.png", lambda: vis.plot_intermediate_values(study))]
    if n_done >= 2:
        figures.append(("importances.png",
                        lambda: vis.plot_param_importances(study, evaluator=PedAnovaImportanceEvaluator())))
    for name, make in figures:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ax = make()
                fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
                fig.set_size_inches(max(fig.get_size_inches()[0], 8), max(fig.get_size_inches()[1], 5))
                fig.tight_layout()
                fig.savefig(out / name, dpi=100)
                made.append(name)
            except Exception:  # a plot Optuna cannot draw for this study (no intermediate values, one parameter)
                pass
            finally:
                plt.close("all")
    return made


# ---------------------------------------------------------------------------------------------- the command


def dry_run(st: Setup, a: argparse.Namespace) -> int:
    print(f"study {st.study_name!r} in {st.storage or 'sqlite:///' + str(st.root / 'study.db')}, sampler {st.sampler}, "
          f"pruner {st.pruner}, {st.trials} trials")
    for p in st.space:
        print(f"  {p.spec():<40} -> --{p.name}")
    slots = make_slots(physical_cores(), a.cores_per_run, 0, a.gpus_per_run, a.runs_per_gpu)
    print(f"{len(slots)} slot(s) of {a.cores_per_run} physical core(s); each trial runs:")
    flags = [tok for p in st.space for tok in flag_tokens(p, f"<{p.name}>", st.fields)] if st.space else []
    for r in build_grid(st.root, [st.script], st.env_ids, st.seeds, st.common, [[("trialNNNN", flags)]]):
        print(f"  {r.rel}\n    {shlex.join(r.command())}")
    return 0


SLURM_OPTIONS = {"--workers": 1, "--cluster": 1, "--partition": 1, "--time": 1, "--cpus-per-worker": 1,
                 "--gpus-per-worker": 1, "--mem-gb": 1, "--slurm-param": 1, "--slurm": 0, "--wait": 0}


def worker_command(argv: list[str], tail: list[str]) -> list[str]:
    """This tune's command line without its SLURM options: what each worker job runs (paths made absolute)."""
    out, i = [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in SLURM_OPTIONS:
            i += 1 + (SLURM_OPTIONS[name] if "=" not in argv[i] else 0)
            continue
        out.append(argv[i])
        i += 1
    if out and not out[0].startswith("-"):  # the root, relative to this directory
        out[0] = str(Path(out[0]).resolve())
    return [sys.executable, str(Path(__file__).resolve()), *out, "--plain", *(["--", *tail] if tail else [])]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, tail = argv[:i], argv[i + 1 :]
    a = parser().parse_args(argv)
    try:
        st = setup_from(a, tail)
        if a.report:
            return report_only(st)
        if st.trials is None:
            raise LaunchError("--trials: how many trials the study ends with")
        st.fields = script_fields(st.script)
        st.space = check_space(st.space, st.fields, Path(st.script).stem, st.common)
        if not st.space:
            raise LaunchError("--search: nothing to search (give NAME=FORM, e.g. learning-rate=log:1e-5:1e-2)")
        make_sampler(st.sampler, a.sampler_seed, st.space)
        make_pruner(st.pruner)
        if a.dry_run:
            return dry_run(st, a)
        if a.slurm:
            from experiments.slurm import submit_workers

            return submit_workers(a, worker_command(argv, tail), st.root)
        return Tune(st, a).run()
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:  # before the runs' supervision took the signals: nothing of a run started
        return EXIT_INTERRUPTED


def report_only(st: Setup) -> int:
    import optuna

    storage, url = make_storage(st.storage or read_json(st.root / "tune.json").get("storage"), st.root)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=st.study_name, storage=storage)
    except KeyError:
        raise LaunchError(f"no study {st.study_name!r} in {url}") from None
    write_report(st, study, url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
