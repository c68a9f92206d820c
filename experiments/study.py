"""What a study is: its storage, sampler and pruner made from their command-line forms, the checked ``Setup`` of
a tune, and how a trial is scored.

Guarantees
- ``check_storage`` refuses, with one ``LaunchError`` and without creating or opening anything, a ``--storage``
  that cannot hold a study: not a URL SQLAlchemy reads (``bogus://``), a database kind it does not know, a
  driver that is not installed (``mysql://`` without MySQLdb, ``postgresql://`` without psycopg: the package to
  install named), an in-memory SQLite database, a SQLite or journal path that is a folder, a file that is not a
  SQLite database, or a file that could not be created where it would be (a parent that is a file, or not
  writable). With ``must_exist`` (``--report``) a storage file that does not exist is refused: nothing to
  report, and nothing made. ``make_storage`` then opens it (creating the file and its folder where needed).
- ``make_sampler`` and ``make_pruner`` build ``optuna.samplers``/``optuna.pruners`` objects from
  ``NAME[:KEY=VALUE,...]`` (a class name, or the short one Optuna's class names give: ``tpe``, ``median``); a
  wrong name or argument is one ``LaunchError``.
- ``setup_from`` turns the command line and the ``--config`` file into a ``Setup`` or raises ``LaunchError``
  naming the argument: every value is checked for its type and range here (``experiments.flags.check_options``: the options of
  this process, ``--cores-per-run`` to ``--slurm-param``), before anything is created; the grid passes the
  launcher's own checks (``experiments/grid.py``), and the tune folder, its ``tune.json`` and the study's
  storage theirs (``experiments/tune_folder.py``, ``check_storage``). ``Setup.spec()`` is what the study records
  and compares on every later start.
- A trial's value is the ``--aggregate`` (``aggregate``: the mean, or rliable's IQM) over its runs of each run's
  score (``run_score``: ``experiments/report.py``'s ``read_result``) normalised by its env's ``--target-scores``
  (``normalised``); a run without a score gives None, never a number. ``score_at`` is the same training score
  up to a step, what the pruner is told.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

from experiments.flags import check_creatable, check_options
from experiments.grid import LaunchError, Trial, build_grid, load_file, resolve_script, split_flags
from experiments.search_space import Param, parse_search
from experiments.tune_folder import check_root, check_same_study, read_record, storage_file

DRIVERS = {"MySQLdb": "mysqlclient", "psycopg2": "psycopg2-binary", "pymysql": "PyMySQL", "psycopg": "psycopg"}


def parse_targets(items: Sequence[str] | dict, env_ids: Sequence[str | None]) -> dict[str, tuple[float, float]]:
    """``ENV=LOW:HIGH`` items (or the file's table: env id = "LOW:HIGH" or [LOW, HIGH]) -> {env: (low, high)}."""
    if isinstance(items, dict):  # anything but a string or a pair reads as no range: refused below, in one line
        items = [
            f"{k}={v if isinstance(v, str) else ':'.join(map(str, v)) if isinstance(v, list) else ''}"
            for k, v in items.items()
        ]
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


def _optuna_class(text: str, flag: str, module, base: type) -> tuple[str, type, dict]:
    """``NAME[:KEY=VALUE,...]`` -> (class name, the class in ``module``, its keyword arguments). NAME is a class of
    ``module`` deriving from ``base``, by its name or by its name without the kind in any case (``tpe``, ``cmaes``,
    ``successive-halving``; ``none`` is ``NopPruner``), else a LaunchError naming the choices."""
    name, kwargs = _spec_args(text, flag)
    kind = base.__name__.removeprefix("Base")  # Sampler, Pruner
    known = {n: c for n in dir(module) if isinstance(c := getattr(module, n), type) and issubclass(c, base) and c is not base}
    short = {n.removesuffix(kind).lower(): n for n in known}
    short |= {"none": short["nop"]} if "nop" in short else {}
    cls_name = name if name in known else short.get(name.lower().replace("-", "").replace("_", ""), "")
    if cls_name not in known:
        raise LaunchError(f"{flag} {text!r}: unknown (one of {', '.join(sorted(short))}, or an {module.__name__} class)")
    return cls_name, known[cls_name], kwargs


def make_sampler(text: str, seed: int | None, space: list[Param]):
    import optuna

    cls_name, cls, kwargs = _optuna_class(text, "--sampler", optuna.samplers, optuna.samplers.BaseSampler)
    if cls_name == "GridSampler" and "search_space" not in kwargs:
        if any(p.kind != "cat" and p.step is None and p.kind != "int" for p in space):
            raise LaunchError("--sampler grid: every searched float needs a step (float:LOW:HIGH:step=Q) or cat: values")
        kwargs["search_space"] = {p.name: _grid_values(p) for p in space}
    if seed is not None and "seed" not in kwargs and "seed" in _params_of(cls):
        kwargs["seed"] = seed
    try:
        with _quiet():
            return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise LaunchError(f"--sampler {text!r}: {e}") from None


@contextlib.contextmanager
def _quiet():
    """Optuna's ExperimentalWarning for a class the user chose (gp, wilcoxon, patient) unsaid: stderr holds one
    ``error:`` line when a command is refused, and nothing else of ours when it runs."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


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

    cls_name, cls, kwargs = _optuna_class(text, "--pruner", optuna.pruners, optuna.pruners.BasePruner)
    if cls_name == "PatientPruner" and "wrapped_pruner" not in kwargs:
        kwargs["wrapped_pruner"] = optuna.pruners.MedianPruner()
        kwargs.setdefault("patience", 1)
    try:
        with _quiet():
            return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise LaunchError(f"--pruner {text!r}: {e}") from None


# ---------------------------------------------------------------------------------------------- storage


def default_storage(root: Path) -> str:
    return f"sqlite:///{root / 'study.db'}"


def check_storage(url: str, must_exist: bool = False, given: bool = True) -> None:
    """The storage refusals of the module docstring; opens and creates nothing. ``given``: the URL is the
    command's ``--storage`` (named so in a refusal), not the default or the recorded one."""
    where = f"--storage {url}" if given else f"the study's storage {url}"
    file = storage_file(url)
    if file is None and url.startswith("journal:"):
        raise LaunchError(f"{where}: journal:PATH needs a file path")
    if file is None or file[0] == "sqlite":
        import sqlalchemy
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        try:  # what opening the storage does first (RDBStorage's create_engine): it connects to nothing, makes nothing
            engine = sqlalchemy.create_engine(url)
        except NoSuchModuleError:  # an ArgumentError too: first
            kind = url.split(":", 1)[0]
            raise LaunchError(f"{where}: SQLAlchemy knows no database kind {kind!r} (sqlite, postgresql, ...)") from None
        except ArgumentError:
            raise LaunchError(f"{where}: not a storage URL (sqlite:///PATH, postgresql://..., journal:PATH)") from None
        except ImportError as e:  # the driver: a package of its own
            name = getattr(e, "name", None) or str(e)
            package = DRIVERS.get(name.split(".")[0], name)
            raise LaunchError(f"{where}: its driver {name} is not installed (pip install {package})") from None
        if file is None and engine.url.get_backend_name() == "sqlite":
            raise LaunchError(f"{where}: an in-memory SQLite database keeps no study: give sqlite:///PATH")
        if file is None:
            return  # a database server: whether it answers is known when the tune connects
    kind, path = file
    if path.is_dir():
        raise LaunchError(f"{where}: {path} is a folder, not a {kind} file")
    if path.exists():
        if not os.access(path, os.R_OK | os.W_OK):
            raise LaunchError(f"{where}: {path} cannot be read and written (permission denied)")
        if kind == "sqlite" and path.stat().st_size:
            with open(path, "rb") as f:
                if f.read(16) != b"SQLite format 3\x00":
                    raise LaunchError(f"{where}: {path} is not a SQLite database")
        return
    if must_exist:
        raise LaunchError(f"{where}: {path} does not exist: no study to report")
    check_creatable(path.parent, where)


def make_storage(url: str | None, root: Path):
    """The storage (``default_storage(root)`` when ``url`` is None) opened, with its URL; the file and its folder
    created where needed. Call ``check_storage`` first: what fails here is what only opening it shows (a server
    that does not answer)."""
    import optuna

    url = url or default_storage(root)
    try:
        file = storage_file(url)
        if file is not None:
            file[1].parent.mkdir(parents=True, exist_ok=True)
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend, JournalStorage

            return JournalStorage(JournalFileBackend(str(file[1]))), url
        kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
        for attempt in range(5):  # two processes creating a new database's tables at once: the later one retries
            try:
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs), url
            except Exception as e:
                if "already exists" not in str(e) or attempt == 4:
                    raise
                time.sleep(0.5 + random.random())
    except Exception as e:  # a server that does not answer, a database that cannot be read
        raise LaunchError(f"--storage {url}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


# ---------------------------------------------------------------------------------------------- the setup


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
        return {
            "script": Path(self.script).stem,
            "env_ids": list(self.env_ids),
            "seeds": list(self.seeds),
            "flags": list(self.common),
            "search": [p.spec() for p in self.space],
            "target_scores": {k: list(v) for k, v in sorted(self.targets.items())},
            "aggregate": self.aggregate,
            "score": self.score,
            "last_episodes": self.last_episodes,
        }


# the --config file's tune keys and the types each takes (flags: split_flags; levels: refused)
CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "root": (str,),
    "script": (str, list),
    "scripts": (str, list),
    "env_ids": (list,),
    "seeds": (list,),
    "search": (list, dict),
    "target_scores": (dict, list),
    "trials": (int,),
    "aggregate": (str,),
    "score": (str,),
    "last_episodes": (int,),
    "sampler": (str,),
    "pruner": (str,),
    "storage": (str,),
    "study_name": (str,),
    "prune_every": (int,),
}


TUNE_KEYS = tuple(k for k in CONFIG_TYPES if k not in ("root", "scripts", "env_ids", "seeds"))  # the launcher's own


def _check_config(data: dict, path: Path) -> None:
    for key, types in CONFIG_TYPES.items():
        v = data.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, types):
            kinds = " or ".join(
                {"str": "a string", "list": "a list", "int": "an integer", "dict": "a table"}[t.__name__] for t in types
            )
            raise LaunchError(f"--config {path}: {key} is {v!r}, not {kinds}")
    for key, kind in (("env_ids", str), ("seeds", int), ("script", str), ("scripts", str)):
        v = data.get(key)
        if isinstance(v, list) and not all(isinstance(x, kind) and not isinstance(x, bool) for x in v):
            raise LaunchError(f"--config {path}: {key} must list {'strings' if kind is str else 'integers'}, got {v!r}")


def _positive(name: str, v, allow_none: bool = True) -> None:
    if (v is None and not allow_none) or (v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1)):
        raise LaunchError(f"{name} must be a positive integer, got {v!r}")


def setup_from(a: argparse.Namespace, tail: list[str]) -> Setup:
    """The ``Setup`` of this command (see the module docstring); reads files, creates nothing."""
    check_options(a)  # experiments.flags': those of this process
    data = load_file(a.config, extra=TUNE_KEYS) if a.config else {}
    if a.config:
        _check_config(data, a.config)
    if data.get("levels"):
        raise LaunchError(f"--config {a.config}: a tune has no levels (its trials are the variants): use search")
    root_s = a.root or data.get("root")
    if not root_s:
        raise LaunchError("no tune folder: give it first (or `root` in the --config file)")
    root = Path(root_s).resolve()
    check_root(root)
    saved = read_record(root)
    if a.report and not saved and not (a.storage or data.get("storage")):
        raise LaunchError(f"no tune in {root} (no tune.json): nothing to report")
    script_l = a.script or data.get("script") or data.get("scripts") or saved.get("script")
    if isinstance(script_l, str):
        script_l = [script_l]
    if a.report and not a.script and saved:  # the root alone: what its last tune ran
        data = {**{k: v for k, v in saved.items() if k not in ("storage", "study_name")}, **data}
    if not script_l:
        raise LaunchError("no script: give --script (or script in the --config file)")
    if len(script_l) != 1:
        raise LaunchError(f"--script: a tune searches one script, got {len(script_l)}")
    script = str(resolve_script(script_l[0]))
    env_ids = a.env_ids or data.get("env_ids") or [None]
    seeds = a.seeds if a.seeds is not None else data.get("seeds", [])
    if not seeds or not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
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
    _positive("--trials", trials)
    last = a.last_episodes if a.last_episodes is not None else data.get("last_episodes", 100)
    prune_every = a.prune_every if a.prune_every is not None else data.get("prune_every")
    _positive("--last-episodes", last)
    _positive("--prune-every", prune_every)
    aggregate = a.aggregate or data.get("aggregate", "mean")
    score = a.score or data.get("score", "auto")
    if aggregate not in ("mean", "iqm") or score not in ("auto", "eval", "train"):
        raise LaunchError(f"aggregate is mean or iqm and score is auto, eval or train (got {aggregate!r}, {score!r})")
    study_name, storage = check_same_study(
        root, saved, a.study_name or data.get("study_name"), a.storage or data.get("storage")
    )
    check_storage(storage or default_storage(root), must_exist=a.report, given=bool(a.storage or data.get("storage")))
    return Setup(
        root,
        script,
        list(env_ids),
        list(seeds),
        common,
        space,
        {},
        targets,
        trials,
        aggregate,
        score,
        last,
        a.sampler or data.get("sampler", "tpe"),
        a.pruner or data.get("pruner", "median"),
        prune_every,
        storage,
        study_name,
    )


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
