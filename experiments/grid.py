"""The grid of an experiment: its flags parsed and every run of it expanded, each with its folder and command.

Guarantees
- An experiment is every combination of scripts, env ids, seeds and one variant of each level (rlpyt's
  ``VariantLevel``: a level lists complete flag sets, each with a name; levels are crossed, so two levels of 2
  and 3 variants make 6). ``build_grid`` returns them in order: scripts, env ids, variants (the last level
  fastest), seeds.
- Every run (a ``Trial``) has its own folder, ``{root}/{script}/{env id}/{variant names joined by +}/seed{N}``,
  passed to the script as ``--out-dir`` and ``--run-name``; no two runs share one (refused otherwise). Its flags
  are the common ones, then its variant's, then the launcher's (``--env-id``, ``--seed``, the folder).
- The flags the launcher sets (``RESERVED``) are refused among the common or a variant's flags; variant names
  are letters, digits and ``._=,-`` (they name folders) and unique within a level; seeds are unique.
- ``--nproc-per-node N`` among the flags is torchrun's, not the script's: it is taken out and the run's command
  becomes ``python -m torch.distributed.run --standalone --nproc-per-node N script ...`` (a variant's N before
  the common flags', before the launcher option).
- The file form (TOML or JSON, ``load_file``) is in ``experiments/launch.py``'s docstring; unknown keys and
  malformed values are refused.
- Anything refused raises ``LaunchError``: one ``error:`` line and exit 2 from the command line.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments import ROOT

RESERVED = ("--seed", "--env-id", "--out-dir", "--run-name", "--resume")  # set by the launcher for every run
NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,-]*$")


class LaunchError(Exception):
    """A bad argument or an unusable experiment: one ``error:`` line, exit 2."""


@dataclass(frozen=True)
class Trial:
    """One run of the grid (one cell: a script, an env id, a variant of each level, a seed)."""

    root: Path
    script: str  # the script's stem, which names its folder
    script_path: str
    env_id: str | None
    seed: int
    variant: tuple[tuple[str, tuple[str, ...]], ...]  # (name, flags) of one variant per level
    common: tuple[str, ...]  # flags of every run
    nproc: int = 1  # torchrun processes (slots taken)

    @property
    def variant_name(self) -> str:
        return "+".join(name for name, _ in self.variant) or "base"

    @property
    def rel(self) -> str:
        env = (self.env_id or "default").replace("/", "_")
        return f"{self.script}/{env}/{self.variant_name}/seed{self.seed}"

    @property
    def folder(self) -> Path:
        return self.root / self.rel

    def flags(self) -> list[str]:
        """The script's flags (without --resume): common, the variant's, then the launcher's."""
        out = [*self.common, *(f for _, flags in self.variant for f in flags)]
        if self.env_id is not None:
            out += ["--env-id", self.env_id]
        return out + ["--seed", str(self.seed), "--out-dir", str(self.folder.parent), "--run-name", self.folder.name]

    def command(self, resume: bool = False) -> list[str]:
        head = [sys.executable]
        if self.nproc > 1:
            head += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.nproc)]
        return [*head, self.script_path, *self.flags(), *(["--resume", str(self.folder)] if resume else [])]

    def total_from_flags(self) -> int | None:
        flags, total = self.flags(), None
        for i, f in enumerate(flags):
            with contextlib.suppress(ValueError, IndexError):
                if f == "--total-timesteps":
                    total = int(float(flags[i + 1]))
                elif f.startswith("--total-timesteps="):
                    total = int(float(f.split("=", 1)[1]))
        return total


def split_flags(flags: Any, where: str) -> list[str]:
    """Flags given as one string (split as a shell would) or a list of tokens; ``where`` names them in errors."""
    if flags is None:
        return []
    if isinstance(flags, str):
        try:
            return shlex.split(flags)
        except ValueError as e:
            raise LaunchError(f"{where}: cannot split {flags!r} into flags ({e})") from None
    if isinstance(flags, (list, tuple)) and all(isinstance(f, (str, int, float)) and not isinstance(f, bool) for f in flags):
        return [str(f) for f in flags]
    raise LaunchError(f"{where}: flags must be a string or a list of strings, got {flags!r}")


def _take_nproc(flags: list[str], where: str) -> tuple[list[str], int | None]:
    """Remove ``--nproc-per-node N`` (a torchrun option, not the script's) from ``flags``."""
    out, nproc, i = [], None, 0
    while i < len(flags):
        f = flags[i]
        value = None
        if f == "--nproc-per-node" and i + 1 < len(flags):
            value, i = flags[i + 1], i + 2
        elif f.startswith("--nproc-per-node="):
            value, i = f.split("=", 1)[1], i + 1
        else:
            out.append(f)
            i += 1
            continue
        if not value.isdigit() or int(value) < 1:
            raise LaunchError(f"{where}: --nproc-per-node must be a positive integer, got {value!r}")
        nproc = int(value)
    return out, nproc


def _check_reserved(flags: list[str], where: str) -> None:
    for f in flags:
        name = f.split("=", 1)[0]
        if name in RESERVED:
            raise LaunchError(
                f"{where}: {name} is set by the launcher for every run (use --seeds, --env-ids or the experiment root)"
            )


def resolve_script(name: str) -> Path:
    candidates = [Path(name), ROOT / name, ROOT / "algos" / name, ROOT / "algos" / f"{name}.py"]
    for c in candidates:
        if c.is_file() and c.suffix == ".py":
            return c.resolve()
    raise LaunchError(f"--scripts: no script {name!r} (give a name in algos/ such as ppo_atari, or a path)")


def parse_level(items: Sequence[str], where: str) -> list[tuple[str, list[str]]]:
    """``NAME:FLAGS`` items of one command-line level."""
    out = []
    for item in items:
        name, sep, flags = item.partition(":")
        if not sep:
            raise LaunchError(f"{where}: {item!r} is not NAME:FLAGS (e.g. 'lr1e-3:--learning-rate 1e-3')")
        out.append((name.strip(), split_flags(flags, where)))
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_strings(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(v, str) and v for v in x)


def check_values(data: dict, where: str) -> None:
    """The grid's keys as the file form gives them (``load_file``) or ``experiment.json`` records them: each of
    the right type, else ``LaunchError`` naming the key, the value and ``where``."""
    wrong = None
    if "root" in data and not (isinstance(data["root"], str) and data["root"]):
        wrong = ("root", "a folder name")
    elif "scripts" in data and not _is_strings(data["scripts"]):
        wrong = ("scripts", "a list of script names")
    elif "env_ids" in data and not _is_strings(data["env_ids"]):
        wrong = ("env_ids", "a list of env ids")
    elif "seeds" in data and not (isinstance(data["seeds"], list) and all(_is_int(s) for s in data["seeds"])):
        wrong = ("seeds", "a list of integers")
    elif "nproc_per_node" in data and not (_is_int(data["nproc_per_node"]) and data["nproc_per_node"] >= 1):
        wrong = ("nproc_per_node", "a positive integer")
    if wrong:
        raise LaunchError(f"{where}: {wrong[0]} must be {wrong[1]}, got {data[wrong[0]]!r}")
    if "flags" in data:
        split_flags(data["flags"], f"{where}: flags")


def check_env_ids(env_ids: Sequence[str]) -> None:
    """Env ids name folders (``/`` becomes ``_``): no empty one, none that would leave its folder."""
    for e in env_ids:
        if not e or e.startswith(".") or any(c.isspace() or c == "\\" for c in e) or ".." in e.split("/"):
            raise LaunchError(f"--env-ids: {e!r} is not an env id (it names the runs' folders)")


def saved_grid(experiment: dict, where: str) -> dict:
    """The grid an ``experiment.json`` recorded (``{}`` when none), checked as the file form is, its levels as
    ``parse_level`` gives them; anything of the wrong type raises ``LaunchError`` naming ``where``."""
    grid = experiment.get("grid") or {}
    if not isinstance(grid, dict):
        raise LaunchError(f"{where}: damaged, grid is not an object; move it away to start afresh")
    try:
        check_values(grid, "grid")
        levels = grid.get("levels", [])
        ok = isinstance(levels, list) and all(
            isinstance(lv, list)
            and all(
                isinstance(v, list)
                and len(v) == 2
                and isinstance(v[0], str)
                and isinstance(v[1], list)
                and all(isinstance(f, str) for f in v[1])
                for v in lv
            )
            for lv in levels
        )
        if not ok:
            raise LaunchError(f"grid: levels must be lists of [name, [flags]], got {levels!r:.80}")
        if not (isinstance(grid.get("flags", []), list)):
            raise LaunchError(f"grid: flags must be a list of strings, got {grid['flags']!r:.80}")
    except LaunchError as e:
        raise LaunchError(f"{where}: damaged, {e}; move it away to start afresh") from None
    return {**grid, "levels": [[(n, list(f)) for n, f in lv] for lv in levels]}


def load_file(path: Path, extra: Sequence[str] = ()) -> dict:
    """The file form (``experiments/launch.py``); ``extra``: the keys a caller adds (``experiments/tune.py``),
    whose values it checks itself."""
    try:
        text = path.read_bytes().decode()
    except OSError as e:
        raise LaunchError(f"--config {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise LaunchError(f"--config {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import tomllib

            data = tomllib.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise LaunchError(f"--config {path}: {' '.join(str(e).split()) or type(e).__name__}") from None
    if not isinstance(data, dict):
        raise LaunchError(f"--config {path}: expected a table of keys")
    known = ["root", "scripts", "env_ids", "seeds", "flags", "levels", *extra]
    unknown = set(data) - set(known)
    if unknown:
        raise LaunchError(f"--config {path}: unknown keys {sorted(unknown)} ({', '.join(known)})")
    check_values(data, f"--config {path}")
    levels = data.get("levels", [])
    if not isinstance(levels, list) or not all(isinstance(lv, dict) for lv in levels):
        raise LaunchError(f"--config {path}: levels must be a list of tables (name = flags)")
    data["levels"] = [
        [(str(k), split_flags(v, f"--config {path}: level {i + 1}")) for k, v in lv.items()] for i, lv in enumerate(levels)
    ]
    return data


def build_grid(
    root: Path,
    scripts: Sequence[str],
    env_ids: Sequence[str | None],
    seeds: Sequence[int],
    common: Sequence[str],
    levels: Sequence[Sequence[tuple[str, list[str]]]],
    nproc: int = 1,
) -> list[Trial]:
    """Every run of the grid, in order: scripts, env ids, variants (the last level fastest), seeds."""
    if not scripts:
        raise LaunchError("no scripts: give --scripts (or scripts in the --config file)")
    if not seeds:
        raise LaunchError("no seeds: give --seeds (or seeds in the --config file)")
    if len(set(seeds)) != len(seeds):
        raise LaunchError(f"--seeds: a seed is given twice ({list(seeds)})")
    check_env_ids([e for e in env_ids if e is not None])
    common, common_nproc = _take_nproc(list(common), "flags")
    _check_reserved(common, "flags")
    checked_levels = []
    for i, level in enumerate(levels):
        if not level:
            raise LaunchError(f"level {i + 1} has no variants")
        names = [n for n, _ in level]
        for n in names:
            if not NAME_OK.match(n):
                raise LaunchError(f"level {i + 1}: variant name {n!r} must be letters, digits and ._=,- (it names folders)")
        if len(set(names)) != len(names):
            raise LaunchError(f"level {i + 1}: a variant name is given twice ({names})")
        variants = []
        for name, flags in level:
            flags, v_nproc = _take_nproc(list(flags), f"variant {name}")
            _check_reserved(flags, f"variant {name}")
            variants.append((name, tuple(flags), v_nproc))
        checked_levels.append(variants)
    runs = []
    paths = {s: resolve_script(s) for s in scripts}
    for script, env_id in itertools.product(scripts, env_ids or [None]):
        for combo in itertools.product(*checked_levels) if checked_levels else [()]:
            n = next((v[2] for v in reversed(combo) if v[2] is not None), None) or common_nproc or nproc
            for seed in seeds:
                runs.append(
                    Trial(
                        root,
                        paths[script].stem,
                        str(paths[script]),
                        env_id,
                        int(seed),
                        tuple((name, flags) for name, flags, _ in combo),
                        tuple(common),
                        n,
                    )
                )
    rels = [r.rel for r in runs]
    if len(set(rels)) != len(rels):
        raise LaunchError("two runs would share a folder (the same script name twice in --scripts?)")
    return runs
