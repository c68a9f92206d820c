"""The search space of a tune: each ``--search NAME=FORM`` parsed, its names checked against the script's ``Args``,
and turned into Optuna suggestions and the script's flags.

Guarantees
- ``parse_search`` reads ``NAME=log:LOW:HIGH``, ``NAME=float:LOW:HIGH[:log|:step=Q]``,
  ``NAME=int:LOW:HIGH[:log|:step=K]`` and ``NAME=cat:A,B,...`` into a ``Param``, or raises ``LaunchError``
  naming the entry and what is wrong with it (a missing part, LOW not below HIGH, a log range reaching 0, a
  non-finite bound, a step wider than the range, a value listed twice). ``Param.spec()`` is the canonical text,
  what the study records: parsing it again gives the same ``Param``.
- ``script_fields`` reads the names of the script's ``Args`` fields and which are switches (``bool``) by importing
  the script in a child process, so torch and the script's imports stay out of the tune process (which forks
  the runs).
- ``check_space`` refuses, in one ``LaunchError``, a flag the script does not have (with the nearest name), one the
  launcher sets, one also given among the flags of every run, and a switch searched as anything but
  ``cat:true,false``. A flag's type and range are the script's own parser's to judge: ``experiments/tune.py``
  hands it each range's LOW and HIGH and every choice before anything is created (``check_flags``).
- ``flag_tokens`` writes one searched value as the script's flags: ``--name``/``--no-name`` for a switch,
  ``--name VALUE`` otherwise (a float by ``repr``, so the run gets the exact value Optuna suggested).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import subprocess
import sys
from typing import Any

from experiments.grid import RESERVED, LaunchError


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
import dataclasses, importlib.util, json, sys, typing
spec = importlib.util.spec_from_file_location("_tune_probe", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["_tune_probe"] = module
spec.loader.exec_module(module)
cls = getattr(module, "Args", None)
hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
out = {f.name: {"kind": "bool" if hints.get(f.name) is bool else "other"} for f in dataclasses.fields(cls)} if hints else None
print("\n@@ARGS@@" + json.dumps(out))
"""


def script_fields(script_path: str) -> dict[str, dict]:
    """The script's ``Args`` fields, each with its ``kind`` (``bool``: a switch, else ``other``), read by importing
    the script in a child process (torch and the script's imports stay out of this one, which forks the runs)."""
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


def check_space(params: list[Param], fields: dict[str, dict], script: str, common: list[str]) -> list[Param]:
    """Each searched flag against the script's ``Args`` by name (its type and range are the script's parser's to
    judge, ``experiments.tune.check_flags``); returns the params with a switch's choices as ``true``/``false``."""
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise LaunchError(f"--search: a flag is searched twice ({names})")
    given = {f.split("=", 1)[0] for f in common if f.startswith("--")}
    out = []
    for p in params:
        where = f"--search {p.spec()}"
        if p.field not in fields:
            near = difflib.get_close_matches(p.field, list(fields), n=1)
            hint = f" (did you mean {near[0].replace('_', '-')}?)" if near else ""
            raise LaunchError(f"{where}: {script} has no flag --{p.name}{hint}")
        if f"--{p.name}" in RESERVED:
            raise LaunchError(f"{where}: --{p.name} is set by the launcher for every run")
        if f"--{p.name}" in given or f"--no-{p.name}" in given:
            raise LaunchError(f"{where}: --{p.name} is also given among the flags of every run")
        if fields[p.field]["kind"] == "bool":  # the tune writes a switch's value as --name or --no-name: its own form
            if p.kind != "cat" or any(c.lower() not in ("true", "false") for c in p.choices):
                raise LaunchError(f"{where}: --{p.name} is a switch: search it as cat:true,false")
            p = dataclasses.replace(p, choices=tuple(dict.fromkeys(c.lower() for c in p.choices)))
        out.append(p)
    return out


def flag_tokens(p: Param, value: Any, fields: dict[str, dict]) -> list[str]:
    """The script's flags for one searched value: a switch as ``--name``/``--no-name``, else ``--name VALUE``."""
    if fields.get(p.field, {}).get("kind") == "bool":
        if str(value).startswith("<"):  # --dry-run's placeholder
            return [f"--[no-]{p.name}"]
        return [f"--{p.name}"] if str(value).lower() == "true" else [f"--no-{p.name}"]
    return [f"--{p.name}", repr(value) if isinstance(value, float) else str(value)]


def searched_values(p: Param) -> list[Any]:
    """The values of ``p`` a study can reach at its edges: LOW and HIGH of a range, every choice of a ``cat``.
    Each is passed to the script's own parser before the first trial, so a bound it refuses is refused once, up
    front, not by every trial that draws near it."""
    if p.kind == "cat":
        return list(p.choices)
    if p.kind == "int":
        return [int(p.low), int(p.high)]
    return [p.low, p.high]
