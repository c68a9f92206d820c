"""A tune folder and the one study it belongs to: ``tune.json`` (which study, in which storage), the run records
under it, and the checks that keep runs of two studies apart.

Guarantees
- ``check_root`` refuses a tune folder that is a file or that could not be created (its nearest existing parent is
  a file, or no folder can be made in it), without creating anything (``experiments.flags.check_creatable``).
  ``storage_file`` names the file a storage URL keeps its study in (SQLite, journal), or None for a server.
- ``read_record`` returns the folder's ``tune.json`` (``{}`` where there is none); one that cannot be read, is not
  a JSON object or holds a value of the wrong type is refused in one ``LaunchError`` naming the file and the key,
  and nothing is rewritten.
- ``tune.json`` records its storage so that a moved or copied folder still finds its own study: a SQLite or
  journal file inside the folder by its path relative to the folder (``sqlite:///study.db``,
  ``journal:study.log``), one outside it by its absolute path, a database server by its URL
  (``recorded_storage``; ``storage_from_record`` reads all three, and the absolute paths of older records).
- One study per folder: a command that names another study (``--study-name``) or another storage than the one its
  ``tune.json`` records is refused (``check_same_study``); with neither given, the recorded ones are used, so
  ``tune.py COPY --report`` reports the copy's own study. Each run's ``launch.json`` records its study (name and
  the study's ``uid``, a user attribute set when the tune creates it); ``check_runs`` refuses, before a trial
  starts, a folder holding a run of another study (one that would otherwise be taken as this study's trial of
  the same number, already finished) and names the first such run, and refuses a damaged run record in one line
  (which file, what is wrong) without rewriting it. ``check_storage_kept`` refuses the case where the study is
  gone but its runs are not (a deleted ``study.db``): the tune refuses before it creates a new study there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.flags import check_creatable
from experiments.grid import LaunchError
from experiments.records import launch_problem, load_record, write_json

RUN_RECORDS = "*/*/trial[0-9]*/seed*/launch.json"  # {script}/{env id}/trial{NNNN}/seed{N}/launch.json
# tune.json's keys and the types each must have (older records may lack any of them)
RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "script": (str,),
    "storage": (str,),
    "study_name": (str,),
    "trials": (int, type(None)),
    "env_ids": (list,),
    "seeds": (list,),
    "flags": (list,),
    "search": (list,),
    "target_scores": (dict,),
    "aggregate": (str,),
    "score": (str,),
    "last_episodes": (int,),
}


def storage_file(url: str) -> tuple[str, Path] | None:
    """``("sqlite", path)`` or ``("journal", path)`` for a storage kept in a file (a relative path is relative to
    the current directory, as SQLAlchemy reads it); None for a database server or a URL that is not one."""
    if url.startswith("journal:"):
        return "journal", Path(url[len("journal:") :]).expanduser()
    if url.startswith("sqlite:///"):
        db = url[len("sqlite:///") :].split("?", 1)[0]
        return ("sqlite", Path(db)) if db and db != ":memory:" else None
    return None


def check_root(root: Path) -> None:
    check_creatable(root, f"tune folder {root}")


def _record_problem(data: dict) -> str | None:
    for key, types in RECORD_TYPES.items():
        if key in data and (not isinstance(data[key], types) or isinstance(data[key], bool)):
            return f"{key} is {json.dumps(data[key], default=str)[:60]}, not {' or '.join(t.__name__ for t in types)}"
    return None


def read_record(root: Path) -> dict[str, Any]:
    """``tune.json`` (``{}`` where there is none); a damaged one raises ``LaunchError`` (``records.load_record``)."""
    return load_record(root / "tune.json", _record_problem)


def recorded_storage(url: str, root: Path) -> str:
    """``url`` as ``tune.json`` records it (see the module docstring)."""
    file = storage_file(url)
    if file is None:
        return url
    kind, path = file
    path = path.resolve()
    try:
        path = path.relative_to(root.resolve())
    except ValueError:
        pass
    return f"sqlite:///{path}" if kind == "sqlite" else f"journal:{path}"


def storage_from_record(text: str, root: Path) -> str:
    """The URL to open for a ``tune.json`` storage: a relative file path is the folder's."""
    file = storage_file(text)
    if file is None or file[1].is_absolute():
        return text
    kind, path = file
    return f"sqlite:///{root / path}" if kind == "sqlite" else f"journal:{root / path}"


def same_storage(a: str, b: str) -> bool:
    fa, fb = storage_file(a), storage_file(b)
    if fa is None or fb is None:
        return a == b
    return fa[0] == fb[0] and fa[1].resolve() == fb[1].resolve()


def check_same_study(root: Path, saved: dict, study_name: str | None, storage: str | None) -> tuple[str, str | None]:
    """The study and storage of this command: the given ones, which must be the recorded ones where ``tune.json``
    records them, else the recorded ones (None: the defaults)."""
    where = f"tune folder {root}"
    rec_name = saved.get("study_name")
    rec_storage = storage_from_record(saved["storage"], root) if saved.get("storage") else None
    if study_name and rec_name and study_name != rec_name:
        raise LaunchError(
            f"{where} holds the runs of study {rec_name!r}: study {study_name!r} needs a folder of its "
            f"own (runs of two studies would share trial folders)"
        )
    if storage and rec_storage and not same_storage(storage, rec_storage):
        raise LaunchError(
            f"{where} holds the runs of study {rec_name or root.name!r} in {rec_storage}, not "
            f"{storage}: give that storage, or another folder"
        )
    return study_name or rec_name or root.name, storage or rec_storage


def write_record(root: Path, spec: dict, script: str, storage_url: str, study_name: str, trials: int | None) -> None:
    write_json(
        root / "tune.json",
        {**spec, "script": script, "storage": recorded_storage(storage_url, root), "study_name": study_name, "trials": trials},
    )


def _run_problem(rec: dict) -> str | None:
    """What is wrong with a trial's run record: the launcher's checks (``records.launch_problem``) and the tune's."""
    if why := launch_problem(rec):
        return why
    if "trial" in rec and (not isinstance(rec["trial"], int) or isinstance(rec["trial"], bool)):
        return f"trial is {json.dumps(rec['trial'], default=str)[:60]}, not an integer"
    study = rec.get("study")
    if study is not None and not (isinstance(study, dict) and isinstance(study.get("name"), str)):
        return f"study is {json.dumps(study, default=str)[:60]}, not {{name, uid}}"
    return None


def run_records(root: Path) -> list[tuple[Path, dict]]:
    """Every run record of the folder's trials, read; a damaged one raises ``LaunchError`` naming it and what is
    wrong (``records.load_record``), before anything is written."""
    return [(path, load_record(path, _run_problem)) for path in sorted(root.glob(RUN_RECORDS))]


def check_runs(root: Path, study_name: str, uid: str | None) -> None:
    """Refuses a run of another study among the folder's runs (see the module docstring)."""
    for path, rec in run_records(root):
        study = rec.get("study")
        if study is None:
            continue  # a run recorded before runs carried their study: the folder's tune.json said whose it is
        if study.get("name") != study_name or (uid is not None and study.get("uid") not in (None, uid)):
            raise LaunchError(
                f"{path.parent} is a run of another study ({study.get('name')!r}, uid "
                f"{study.get('uid')}) than {study_name!r} (uid {uid}): one study per tune folder; give "
                f"another folder"
            )


def check_storage_kept(root: Path, url: str) -> None:
    """Refuses a folder holding runs when the study's storage file does not exist (its study is gone, its runs
    are not): a new study would take them as its own."""
    file = storage_file(url)
    run = None if file is None or file[1].exists() else next((p.parent for p in root.glob(RUN_RECORDS)), None)
    if run is not None:
        raise LaunchError(
            f"{run} is a run of a study whose storage {file[1]} does not exist: a new study would take its runs as "
            f"its own; give another folder (or the study's storage)"
        )
