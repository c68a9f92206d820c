"""Test tiers. ``unit``: the in-process tests (no script started as a subprocess), about a minute in all, the
inner loop (``python -m pytest -m unit``). The default run (CI) adds the subprocess runs of the scripts; ``slow``
(``-m slow``) holds the long learning and torchrun checks. A test is ``unit`` when neither it nor its module
starts a script: marked here from its source, so a new in-process test joins the tier unedited."""

from __future__ import annotations

import inspect

import pytest

# Calls that start a script or a process tree the test waits for (tests/helpers.py and the tests' own helpers).
STARTS_A_SCRIPT = ("run(", "start(", "_start(", "launch(", "torchrun", "subprocess", "assert_killed", "Popen",
                   "_job(", "_two_ranks(")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("unit") or item.get_closest_marker("slow"):
            continue
        try:
            source = inspect.getsource(item.function)
        except (OSError, TypeError):
            continue
        body = source.split(":", 1)[1] if source.lstrip().startswith(("def ", "async def")) else source
        if not any(call in body for call in STARTS_A_SCRIPT):
            item.add_marker(pytest.mark.unit)
