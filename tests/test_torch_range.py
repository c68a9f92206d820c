"""The README's torch range at its low end: every script compiles under another interpreter's torch
(benchmarks/checks/torch_compat.py). CI installs one torch, so this runs only where ``TORCH_RANGE_PYTHON`` names an
interpreter with the other torch (``TORCH_RANGE_PYTHON=/work/venv211/bin/python python -m pytest -m slow
tests/test_torch_range.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.test_syncs import RUNS

PYTHON = os.environ.get("TORCH_RANGE_PYTHON")


@pytest.mark.slow
@pytest.mark.skipif(not PYTHON, reason="TORCH_RANGE_PYTHON is unset: no interpreter with another torch to check")
def test_every_script_compiles_on_the_other_torch():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "checks" / "torch_compat.py"), "--python", PYTHON],
        capture_output=True,
        text=True,
        timeout=3600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert f"{len(RUNS)} of {len(RUNS)} compiled" in out.stdout, out.stdout  # every script in algos/
