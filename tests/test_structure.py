"""The shape of the code itself: shared/ and experiments/ import without cycles (lazy imports inside functions
included), each of their modules says what it guarantees in a docstring, and every flag with a fixed set of values
is a Literal (tyro then refuses anything else with exit 2)."""

from __future__ import annotations

import ast
import dataclasses
import sys
import typing
from pathlib import Path

import pytest

from tests.helpers import ROOT, refusal


def import_graph(package: Path, name: str = "shared") -> dict[str, set[str]]:
    """module -> the modules of the package ``name`` it imports anywhere in its file (top level or inside a
    function)."""
    graph: dict[str, set[str]] = {}
    for f in sorted(package.glob("*.py")):
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == name:
                    deps |= {a.name for a in node.names}
                elif node.module.startswith(f"{name}."):
                    deps.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[1] for a in node.names if a.name.startswith(f"{name}.")}
        graph[f.stem] = deps - {f.stem}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(n: str, path: list[str]) -> list[str] | None:
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return path[path.index(d) :] + [d] if d in path else [n, d]
            if d not in state and (c := visit(d, path + [d])):
                return c
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n, [n])):
            return c
    return None


@pytest.mark.unit
def test_algos_stays_within_its_code_lines():
    """Issue 68: algos/ at most 3,764 code lines (not blank, comment or docstring), counted as
    benchmarks/checks/code_size.py counts them: a change that adds lines to a script takes as many out elsewhere."""
    from benchmarks.checks import code_size

    total = sum(code_size.measure(p)["code"] for p in (ROOT / "algos").glob("*.py"))
    assert total <= code_size.TOTAL, f"algos/: {total} code lines, over {code_size.TOTAL} (benchmarks/checks/code_size.py)"


@pytest.mark.unit
def test_shared_has_no_import_cycle():
    assert find_cycle(import_graph(ROOT / "shared")) is None, find_cycle(import_graph(ROOT / "shared"))


@pytest.mark.unit
def test_experiments_has_no_import_cycle():
    graph = import_graph(ROOT / "experiments", "experiments")
    assert graph["launch"] >= {"grid", "local", "slurm"}, graph  # the graph sees this package's imports
    assert find_cycle(graph) is None, find_cycle(graph)


@pytest.mark.unit
@pytest.mark.parametrize("package", ["shared", "experiments"])
def test_every_module_says_what_it_guarantees(package):
    missing = [f.name for f in sorted((ROOT / package).glob("*.py")) if not ast.get_docstring(ast.parse(f.read_text()))]
    assert not missing, f"{package}/: modules without a docstring: {missing}"


@pytest.mark.unit
def test_the_cycle_finder_finds_a_lazy_cycle(tmp_path):
    (tmp_path / "a.py").write_text("from shared import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from shared.a import x\n")
    assert find_cycle(import_graph(tmp_path)) == ["a", "b", "a"]


# Fields whose values are a fixed set of words, in any script that has them.
CHOICE_FIELDS = {"sampler", "preset", "optimizer"}
SCRIPTS = sorted(p.stem for p in (ROOT / "algos").glob("*.py"))


@pytest.mark.unit
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_choice_flag_is_a_literal(name):
    sys.path.insert(0, str(ROOT / "algos"))
    module = __import__(name)
    hints = typing.get_type_hints(module.Args)
    for f in dataclasses.fields(module.Args):
        if f.name in CHOICE_FIELDS:
            assert typing.get_origin(hints[f.name]) is typing.Literal, f"{name}.Args.{f.name} is {hints[f.name]}"


@pytest.mark.parametrize("name", ["sac_mujoco.py", "td3_mujoco.py", "ddpg_mujoco.py"])
def test_an_unknown_sampler_is_one_line_and_exit_2(name, tmp_path):
    # In this process, before run.setup(); tests/test_continuous.py runs a refusal of each end to end.
    lines = refusal(name, "--sampler", "threads", "--env-id", "Pendulum-v1", "--out-dir", str(tmp_path))
    assert len(lines) == 1 and "--sampler" in lines[0], lines


def parallel_assignments(tree: ast.AST) -> list[int]:
    """Lines of ``a, b, c = x, y, z``: three or more targets given three or more values in one line."""
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign)
        and isinstance(n.value, ast.Tuple)
        and any(isinstance(t, ast.Tuple) and len(t.elts) > 2 for t in n.targets)
    ]


def long_docstrings(tree: ast.AST, limit: int = 4) -> list[str]:
    """Functions and classes whose docstring runs over ``limit`` lines (the reasoning belongs elsewhere)."""
    return [
        n.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.ClassDef))
        and len((ast.get_docstring(n, clean=False) or "").splitlines()) > limit
    ]


@pytest.mark.unit
def test_the_style_checks_find_what_they_look_for():
    tree = ast.parse('def f():\n    """1\n    2\n    3\n    4\n    5"""\n    a, b, c = 1, 2, 3\n    d, e = 4, 5\n')
    assert parallel_assignments(tree) == [7] and long_docstrings(tree) == ["f"]


@pytest.mark.unit
@pytest.mark.parametrize("name", SCRIPTS)
def test_one_idea_per_line(name):
    """The scripts' reading targets (issue 41): no parallel assignment of three or more values, no function
    docstring over four lines; lines over 127 characters are ruff's (pyproject.toml, E501)."""
    tree = ast.parse((ROOT / "algos" / f"{name}.py").read_text())
    assert parallel_assignments(tree) == [], f"{name}: split these assignments, one per line"
    assert long_docstrings(tree) == [], f"{name}: at most 4 docstring lines; move the reasoning to a comment"
