"""optuna-dashboard (requirements.txt) over the storage of a study that experiments/tune.py ran: served on a free local
port from the storage ``tune.json`` records, and opened in headless Chromium (Debian's, driven by Playwright as
tests/test_site.py drives it), which must show the study by its name with its trials.

The study runs tests/tune_script.py (a stand-in for a script of algos/, a fraction of a second a run) through
``tune.main``. Slow: a browser and a web server, about half a minute."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from experiments import tune
from experiments.tune_folder import storage_from_record
from tests.helpers import ROOT
from tests.test_site import CHROMIUM, FLAGS

pytestmark = pytest.mark.slow

SCRIPT = str(ROOT / "tests" / "tune_script.py")
NAME = "dashboard-check"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def study_folder(tmp_path_factory) -> Path:
    """A finished study of three trials, as tune.py writes it (its own folder, storage and tune.json)."""
    root = tmp_path_factory.mktemp("dash") / "tune"
    argv = [str(root), "--script", SCRIPT, "--env-ids", "CartPole-v1", "--seeds", "1", "--trials", "3",
            "--study-name", NAME, "--search", "learning-rate=log:1e-4:1e-2", "--pruner", "none", "--plain",
            "--", "--total-timesteps", "300"]  # fmt: skip
    assert tune.main(argv) == 0
    return root


@pytest.fixture
def dashboard(study_folder):
    """optuna-dashboard serving the study's recorded storage; its URL once it answers."""
    exe = shutil.which("optuna-dashboard") or str(Path(sys.executable).parent / "optuna-dashboard")
    if not Path(exe).exists():
        pytest.fail("optuna-dashboard is not installed (pip install -r requirements.txt)")
    storage = storage_from_record(json.loads((study_folder / "tune.json").read_text())["storage"], study_folder)
    port = free_port()
    proc = subprocess.Popen(
        [exe, storage, "--host", "127.0.0.1", "--port", str(port), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90  # a wait for the server to answer, not a timing claim about it
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/studies", timeout=5) as r:
                    studies = json.loads(r.read())
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    pytest.fail(f"optuna-dashboard did not answer:\n{proc.communicate()[0][-3000:]}")
                time.sleep(0.2)
        yield url, studies
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_optuna_dashboard_shows_a_tune_study_in_chromium(dashboard):
    url, studies = dashboard
    (listed,) = [s for s in studies["study_summaries"] if s["study_name"] == NAME]
    if not Path(CHROMIUM).exists():
        if os.environ.get("SITE_BROWSER_REQUIRED") == "1":
            pytest.fail(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            page.goto(f"{url}/dashboard", wait_until="load")
            page.get_by_text(NAME).first.wait_for(timeout=60_000)  # the study list, drawn by the page's script
            page.goto(f"{url}/dashboard/studies/{listed['study_id']}/trials", wait_until="load")
            page.get_by_text("Trial 2").first.wait_for(timeout=60_000)  # its third trial, as tune.py numbered it
            assert not errors, errors
        finally:
            browser.close()
