"""Ctrl-C while an experiments/ command starts (issue 68): at every moment from the command's first statement until it
writes, one line on stderr, exit 130, and nothing written; the code before printed a ``KeyboardInterrupt`` traceback
when the Ctrl-C came while it imported (its first tenth of a second and more).

Each command runs as a user runs it (``python experiments/<name>.py ...``, in a session of its own) and gets SIGINT
at several moments after it was spawned, sent to its whole process group as a terminal's Ctrl-C is (the checks it
runs as subprocesses get it too). A moment that would fall before the command's first statement waits for it:
until then the interpreter's own start-up holds the signal (site's imports, compiling the file), where Python
prints its traceback whatever the command says. The first statement is seen from outside in /proc: the command
blocks SIGINT there (and catches SIGTERM once its imports are done), which Python alone never does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, assert_no_leftovers

MOMENTS = (0.02, 0.1, 0.3)  # seconds after the spawn
RUN = "ppo_atari/CartPole-v1/base/seed1"


def experiment(root: Path, seeds: int) -> Path:
    """An experiment root as a launch leaves it: ``seeds`` runs of ppo_atari, the first one finished and scored."""
    grid = {"scripts": [str(ROOT / "algos" / "ppo_atari.py")], "env_ids": ["CartPole-v1"], "seeds": list(range(1, seeds + 1)),
            "flags": ["--preset", "cartpole"], "levels": []}  # fmt: skip
    folder = root / RUN
    folder.mkdir(parents=True)
    (root / "experiment.json").write_text(json.dumps({"root": str(root), "grid": grid, "launches": []}))
    record = {"script": "ppo_atari", "env_id": "CartPole-v1", "seed": 1, "variant": {"name": "base"}, "state": "done",
              "exit_code": 0, "attempts": []}  # fmt: skip
    (folder / "launch.json").write_text(json.dumps(record))
    config = {"script": "ppo_atari", "args": {"env_id": "CartPole-v1", "seed": 1, "total_timesteps": 200}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "progress.csv").write_text("global_step,wall_time_s,sps,episodes,return_mean\n100,1,100,5,10\n200,2,100,9,20\n")
    return root


def command(name: str, base: Path) -> list[str]:
    """``python experiments/<name>.py`` with arguments that keep it starting for a while (seconds for the ones
    that check a script's flags, which import torch; reading many runs for status)."""
    exp, script = base / "exp", str(ROOT / "experiments" / f"{name}.py")
    tail = ["--", "--preset", "cartpole", "--total-timesteps", "512"]
    args = {
        "launch": [str(base / "new"), "--scripts", "ppo_atari", "--env-ids", "CartPole-v1", "--seeds", "1", *tail],
        "tune": [str(base / "new"), "--script", "ppo_atari", "--env-ids", "CartPole-v1", "--seeds", "1", "--trials", "1",
                 "--search", "learning-rate=log:1e-4:1e-2", "--plain", *tail],
        "report": [str(exp), "--reps", "100"],
        "status": [str(exp)],
        "plot": [str(exp / RUN), "--out", str(base / "curve.png")],
    }[name]  # fmt: skip
    experiment(exp, seeds=3000 if name == "status" else 1)
    return [sys.executable, script, *args]


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    return {str(p): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns) for p in [root, *root.rglob("*")]}


def has_begun(pid: int) -> bool:
    """The command ran its first statement: SIGINT blocked (while it imports) or SIGTERM caught (after)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    blocked, caught = int(fields["SigBlk"], 16), int(fields["SigCgt"], 16)
    return bool(blocked >> (signal.SIGINT - 1) & 1 or caught >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("name", ["launch", "tune", "report", "status", "plot"])
def test_ctrl_c_while_a_command_starts_is_one_line_exit_130_and_nothing_written(name, moment, tmp_path):
    cmd = command(name, tmp_path)
    before = snapshot(tmp_path)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    spawned = time.monotonic()
    time.sleep(moment)
    deadline = time.monotonic() + 2.0  # the code before never showed its first statement: it gets the signal then
    while time.monotonic() < deadline and proc.poll() is None and not has_begun(proc.pid):
        time.sleep(0.001)
    assert proc.poll() is None, f"{name} ended before the Ctrl-C: {proc.communicate()}"
    os.killpg(proc.pid, signal.SIGINT)
    late = time.monotonic() - spawned
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        assert_no_leftovers(proc.pid)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130 and lines == ["interrupted (SIGINT)"], (name, late, proc.returncode, err[-3000:])
    assert snapshot(tmp_path) == before, f"{name} wrote something before it was interrupted at {late:.3f} s"
