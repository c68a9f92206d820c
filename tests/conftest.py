"""Test tiers. ``unit``: the in-process tests (no script started as a subprocess), about a minute in all, the
inner loop (``python -m pytest -m unit``). The default run (CI) adds the subprocess runs of the scripts; ``slow``
(``-m slow``) holds the long learning and torchrun checks. A test is ``unit`` when nothing it runs starts a
script: its source, its fixtures' and the source of every function of the test modules they call (followed
transitively) are read here, so a new in-process test joins the tier unedited and a helper that starts a script
keeps its callers out of it."""

from __future__ import annotations

import inspect
import re

import pytest

# Calls that start a script or a process tree the test waits for (tests/helpers.py and the tests' own helpers),
# by name (``fake_run(`` is not ``run(``), and words that only such code uses.
STARTS_A_SCRIPT = {"run", "start", "_start", "launch", "assert_killed", "Popen", "_job", "_two_ranks"}
WORDS = ("torchrun", "subprocess")
NAME = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def body(func) -> str:
    """The source of ``func`` without its ``def`` line's name (so ``def run(...)`` does not count as a call)."""
    source = inspect.getsource(func)
    return source.split(":", 1)[1] if source.lstrip().startswith(("def ", "async def", "@")) else source


def starts_a_script(func, seen: set) -> bool:
    """True when ``func``, or a function of the tests' own modules it calls, starts a script."""
    if func in seen:
        return False
    seen.add(func)
    try:
        source = body(func)
    except (OSError, TypeError):
        return False
    called = set(NAME.findall(source))
    if called & STARTS_A_SCRIPT or any(word in source for word in WORDS):
        return True
    names = getattr(func, "__globals__", {})
    for name in called:
        callee = names.get(name)
        ours = inspect.isfunction(callee) and callee.__module__.startswith("tests") and callee.__module__ != __name__
        if ours and starts_a_script(callee, seen):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("unit") or item.get_closest_marker("slow"):
            continue
        if not hasattr(item, "function"):
            continue
        seen: set = set()
        fixtures = [
            d.func
            for defs in item._fixtureinfo.name2fixturedefs.values()
            for d in defs
            if getattr(d.func, "__module__", "").startswith("tests")
        ]  # pytest's own start nothing
        if not any(starts_a_script(f, seen) for f in [item.function, *fixtures]):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _an_assertion_inside_with_run_fails_the_test(monkeypatch):
    """``Run.__exit__`` ends a run cleanly on any error (it reports it and sets exit code 1), which would swallow a
    test's own failed ``assert`` inside ``with run:``: here that AssertionError goes on up and fails the test."""
    from shared.run import Run

    exit_ = Run.__exit__

    def __exit__(self, kind, error, tb):
        handled = exit_(self, kind, error, tb)
        return handled and not (kind is not None and issubclass(kind, AssertionError))

    monkeypatch.setattr(Run, "__exit__", __exit__)
