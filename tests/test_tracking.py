"""Weights & Biases tracking (shared/tracking.py), offline (no network here): what an offline W&B run holds, read
back from its transaction log; resuming into the same run; one W&B run for a 2-rank job; the failures."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from shared import tracking
from tests.helpers import ROOT, run

pytest.importorskip("wandb")

CARTPOLE = ["--preset", "cartpole", "--eval-episodes", "2"]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))


def records(path: Path) -> list:
    """The protobuf records of an offline run's ``run-<id>.wandb`` (a LevelDB-style log of 32 KiB blocks after
    a 7-byte W&B header; records of type FULL, or FIRST .. LAST when split)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, out, pos, part = path.read_bytes(), [], 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += 32768 - pos % 32768
            continue
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(part)
            out.append(record)
            part = b""
    return out


def history(path: Path) -> list[dict]:
    return [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records(path)
        if r.WhichOneof("record_type") == "history"
    ]


def config(path: Path) -> dict:
    """The config the W&B run started with (its run record)."""
    (start,) = [r.run for r in records(path) if r.WhichOneof("record_type") == "run"]
    return {i.key: json.loads(i.value_json) for i in start.config.update}


def offline_runs(folder: Path) -> list[Path]:
    return sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))


def test_a_tracked_run_logs_its_rows_and_config_and_a_resume_continues_the_same_wandb_run(tmp_path):
    out = run("ppo_atari.py", *CARTPOLE, "--total-timesteps", "2048", "--track", "--out-dir", str(tmp_path), "--run-name", "r")
    assert out.returncode == 0, out.stderr[-3000:]
    folder = tmp_path / "r"
    (first,) = offline_runs(folder)
    run_id = (folder / "wandb_id").read_text().strip()
    assert first.name == f"run-{run_id}.wandb"
    rows = history(first)
    tb_steps = [int(r["global_step"]) for r in rows if "charts/SPS" in r]  # one per progress row
    with open(folder / "progress.csv") as f:
        assert tb_steps == [int(line.split(",")[0]) for line in list(f)[1:]]
    returns = [r for r in rows if "charts/episodic_return" in r]
    assert len(returns) >= 50 and all(r["charts/episodic_return"] > 0 for r in returns)
    assert any("eval/episodic_return" in r for r in rows) and any("losses/value_loss" in r for r in rows)
    cfg = config(first)
    assert cfg["script"] == "ppo_atari" and cfg["total_timesteps"] == 2048 and cfg["env_id"] == "CartPole-v1"
    assert "git_commit" in cfg and cfg["track"] is True

    out = run("ppo_atari.py", *CARTPOLE, "--total-timesteps", "4096", "--track", "--resume", str(folder))
    assert out.returncode == 0, out.stderr[-3000:]
    runs = offline_runs(folder)
    assert len(runs) == 2 and {p.name for p in runs} == {f"run-{run_id}.wandb"}  # the same W&B run, continued
    second = [p for p in runs if p != first][0]
    steps = [int(r["global_step"]) for r in history(second)]
    assert min(steps) > 2048 and max(steps) == 4096  # the step axis goes on increasing


@pytest.mark.slow  # for CI's 30 minutes; a one-process tracked run and its resume stay in CI
def test_a_two_rank_job_makes_exactly_one_wandb_run(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "algos" / "ppo_atari.py"),
        *CARTPOLE,
        "--total-timesteps",
        "2048",
        "--num-envs",
        "2",
        "--track",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(list(tmp_path.rglob("offline-run-*"))) == 1
    assert max(int(r["global_step"]) for r in history(offline_runs(tmp_path / "r")[0])) == 2048


def test_wandb_that_cannot_start_exits_2_in_one_line_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")  # and no API key anywhere: W&B refuses to start
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / ".netrc"))
    out = run(
        "ppo_atari.py",
        *CARTPOLE,
        "--total-timesteps",
        "2048",
        "--track",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Weights & Biases did not start" in lines[0] and "WANDB_MODE=offline" in lines[0]
    assert not (tmp_path / "r").exists()  # nothing started, no run folder


def test_a_wandb_failure_during_training_warns_once_and_training_goes_on(capsys):
    class Broken:
        calls = 0

        def log(self, values):
            Broken.calls += 1
            raise ConnectionError("network lost")

    class Writer:
        scalars: list = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, value, step))

    tracker = tracking.Tracker(Broken())
    tb = tracker.tee(Writer())
    for step in range(3):
        tb.add_scalar("charts/SPS", 1.0, step)
    assert Writer.scalars == [("charts/SPS", 1.0, s) for s in range(3)]  # TensorBoard keeps everything
    assert Broken.calls == 1 and tracker.run is None
    err = capsys.readouterr().err
    assert err.count("warning: Weights & Biases stopped logging (ConnectionError: network lost)") == 1
    tracker.finish(0)  # nothing left to close: no error
