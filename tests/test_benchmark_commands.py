"""Every benchmark command the documentation names still runs: each ``python benchmarks/...py`` (and ``bash
benchmarks/...sh``, ``python -m benchmarks...``) in README.md, docs/ and benchmarks/ (its README and the results
notebook) names a file that exists and that answers ``--help`` with exit 0 (a shell script: parses, ``bash -n``),
run from the repository root as the documentation says; and every benchmark has its line in benchmarks/README.md."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import ROOT

DOCS = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "generated" not in p.parts]  # not the site's build output
DOCUMENTS = [ROOT / "README.md", *DOCS, *sorted((ROOT / "benchmarks").rglob("README.md"))]
COMMAND = re.compile(r"\b(?:python3?|bash)\s+(?:-m\s+(benchmarks(?:\.\w+)+)|(benchmarks/[\w/]+\.(?:py|sh)))")


def named_commands() -> dict[str, list[str]]:
    """benchmark (a path, or a module for ``-m``) -> the documents that name it."""
    found: dict[str, list[str]] = {}
    for doc in DOCUMENTS:
        for module, path in COMMAND.findall(doc.read_text()):
            found.setdefault(module or path, []).append(str(doc.relative_to(ROOT)))
    return found


def answers_help(target: str) -> tuple[str, int, str]:
    if target.endswith(".sh"):
        cmd = ["bash", "-n", target]
    elif target.endswith(".py"):
        cmd = [sys.executable, target, "--help"]
    else:
        cmd = [sys.executable, "-m", target, "--help"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    return target, done.returncode, done.stderr[-1500:]


def test_every_documented_benchmark_command_exists_and_answers_help():  # about a minute on 2 cores: not the unit tier
    found = named_commands()
    assert len(found) >= 25, found  # the extraction itself works: the docs name most benchmarks
    missing = {t: docs for t, docs in found.items() if "/" in t and not (ROOT / t).is_file()}
    assert not missing, f"named but not there: {missing}"
    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [(t, rc, err) for t, rc, err in pool.map(answers_help, sorted(found)) if rc != 0]
    assert not failed, "\n\n".join(f"{t} (named in {found[t]}): exit {rc}\n{err}" for t, rc, err in failed)


@pytest.mark.unit
def test_every_benchmark_has_its_line_in_the_benchmarks_readme():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    bench = ROOT / "benchmarks"
    files = [p for folder in ("speed", "learning", "checks") for p in sorted((bench / folder).glob("*.[ps][yh]"))]
    files = [str(p.relative_to(ROOT)) for p in [*files, bench / "gpu" / "check.py"] if p.name != "__init__.py"]
    commands = {path for _, path in COMMAND.findall(readme)}
    unlisted = [f for f in files if f not in commands]
    assert not unlisted, f"benchmarks without a command in benchmarks/README.md: {unlisted}"
