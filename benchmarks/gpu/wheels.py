"""The wheels a GPU node is given (``.whl/``): which of them it needs, by name and version read from the file
name, never a downgrade: a wheel is installed when the node lacks its distribution or has an older version."""

from __future__ import annotations

import re
from pathlib import Path


def wheel_name(path: Path) -> tuple[str, str]:
    """(distribution name, normalized as importlib.metadata finds it; version) of a wheel file's name."""
    name, ver = path.name.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), ver


def older(have: str, want: str) -> bool:
    """Whether version ``have`` is older than ``want`` (their leading numbers compared: enough for releases)."""

    def nums(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.match(r"[\d.]*", v).group().split(".") if x)

    return nums(have) < nums(want)


def installed_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def wanted(wheels: list[Path]) -> tuple[list[tuple[Path, str]], list[str]]:
    """(the wheels to install, each with its label; the node's own distributions kept, as labels)."""
    todo, kept = [], []
    for w in wheels:
        dist, ver = wheel_name(w)
        have = installed_version(dist)
        if have and not older(have, ver):
            kept.append(f"{dist} {have}" + ("" if have == ver else f" (wheel {ver})"))
        else:
            todo.append((w, f"{dist} {ver}" + (f" (over {have})" if have else "")))
    return todo, kept
