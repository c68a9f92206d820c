"""The GPU check's pytest plugin (``python -m pytest -p benchmarks.gpu.pytest_order``, the repository on
PYTHONPATH): with ``GPU_CHECK_ORDER``, the tests run round-robin over scripts so that the first round runs every
script once (a budget cut after it has still covered them all); ``GPU_CHECK_COLLECTED`` receives the ids collected,
``GPU_CHECK_SKIP`` names the ids to leave out (an earlier run's passes), and ``GPU_CHECK_REPORTS`` one JSON line per
test outcome, written by the controlling process only."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

SCRIPTS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "algos").glob("*.py"))

try:
    import pytest

    _last = pytest.hookimpl(trylast=True)  # after pytest's own -m and -k selection and the conftest's marks
except ImportError:  # the check itself runs without pytest, and then says so
    _last = lambda f: f
_worker: str | None = None


def script_and_function(nodeid: str) -> tuple[str, str]:
    """(script, test function) of a test id; script is "" when no script of algos/ is among its parameters."""
    func, _, params = nodeid.partition("[")
    tokens = set(re.split(r"[-\]]", params))
    return next((s for s in SCRIPTS if s in tokens), ""), func


LAST = ("compiles_to_cuda_graphs",)  # slow (inductor compiles each script, minutes for the LSTMs): after the rest


def order_tests(ids: list[str]) -> list[str]:
    """Round-robin over scripts, each script's tests round-robin over test functions: the first round runs every
    script once, so a budget cut after it has still covered them all. The tests of ``LAST`` come after all others."""
    late = [i for i in ids if any(name in i for name in LAST)]
    if late:
        return order_tests([i for i in ids if i not in late]) + late
    groups: dict[str, dict[str, list[str]]] = {}
    for i in ids:
        script, func = script_and_function(i)
        groups.setdefault(script, {}).setdefault(func, []).append(i)
    per_script = []
    for funcs in groups.values():
        lists = list(funcs.values())
        per_script.append([x for k in range(max(map(len, lists))) for li in lists if k < len(li) for x in [li[k]]])
    return [x for k in range(max(map(len, per_script), default=0)) for g in per_script if k < len(g) for x in [g[k]]]


def pytest_configure(config):
    global _worker
    _worker = getattr(config, "workerinput", {}).get("workerid") if hasattr(config, "workerinput") else None


@_last
def pytest_collection_modifyitems(session, config, items):
    if os.environ.get("GPU_CHECK_ORDER"):
        by_id = {i.nodeid: i for i in items}
        items[:] = [by_id[n] for n in order_tests(list(by_id))]
    if _worker in (None, "gw0") and os.environ.get("GPU_CHECK_COLLECTED"):
        Path(os.environ["GPU_CHECK_COLLECTED"]).write_text("".join(i.nodeid + "\n" for i in items))
    skip = os.environ.get("GPU_CHECK_SKIP")
    if skip:
        done = set(Path(skip).read_text().split("\n"))
        keep = [i for i in items if i.nodeid not in done]
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in done])
        items[:] = keep


def pytest_runtest_logreport(report):
    path = os.environ.get("GPU_CHECK_REPORTS")
    if not path or _worker is not None or (report.when != "call" and report.outcome == "passed"):
        return
    error = ""
    if report.failed:
        lines = report.longreprtext.splitlines()
        error = "\n".join([ln for ln in lines if ln.startswith("E ")][:3] or lines[-2:])
    elif report.skipped and isinstance(report.longrepr, tuple):
        error = str(report.longrepr[2])
    outcome = "error" if report.failed and report.when != "call" else report.outcome
    with open(path, "a") as f:
        f.write(json.dumps({"id": report.nodeid, "outcome": outcome, "error": error[:600]}) + "\n")
