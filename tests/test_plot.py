"""experiments/plot.py: smoothing and the seed band against plain definitions, run folders to a PNG, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments import plot
from tests.helpers import ROOT

finite = st.floats(-1e6, 1e6, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(finite, min_size=1, max_size=50), st.integers(1, 10))
def test_smooth_is_the_trailing_mean(ys, window):
    got = [y for _, y in plot.smooth(list(enumerate(ys)), window)]
    want = [np.mean(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)


def test_band_is_mean_min_max_where_every_run_has_data():
    a = [(0, 0.0), (10, 10.0), (20, 20.0)]
    b = [(5, 0.0), (15, 20.0)]  # reaches only 15: the grid stops there
    x, mean, lo, hi = plot.band([a, b], points=3)
    np.testing.assert_allclose(x, [5, 10, 15])
    ya, yb = np.interp(x, [0, 10, 20], [0, 10, 20]), np.interp(x, [5, 15], [0, 20])
    np.testing.assert_allclose(mean, (ya + yb) / 2)
    np.testing.assert_allclose(lo, np.minimum(ya, yb))
    np.testing.assert_allclose(hi, np.maximum(ya, yb))


def _run_folder(path, script, env_id, seed, rows):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"script": script, "args": {"env_id": env_id, "seed": seed}}))
    lines = ["global_step,wall_time_s,sps,episodes,return_mean"]
    lines += [f"{s},{s / 100},100,{i},{'' if r is None else r}" for i, (s, r) in enumerate(rows)]
    (path / "progress.csv").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("x", ["global_step", "wall_time"])
def test_run_folders_grouped_by_script_and_env_make_a_png(x, tmp_path):
    _run_folder(tmp_path / "a1", "ppo_atari", "CartPole-v1", 1, [(100, 10.0), (200, None), (300, 30.0)])
    _run_folder(tmp_path / "a2", "ppo_atari", "CartPole-v1", 2, [(100, 20.0), (300, 40.0)])
    _run_folder(tmp_path / "b1", "dqn_atari", "CartPole-v1", 1, [(100, 5.0), (300, 9.0)])
    _run_folder(tmp_path / "c1", "sac_mujoco", "Pendulum-v1", 1, [(100, -900.0), (300, -300.0)])
    assert plot.read_run(tmp_path / "a1")[2] == [(100.0, 10.0), (300.0, 30.0)]  # rows without episodes skipped
    out = tmp_path / "o" / "fig.png"
    assert plot.main([str(tmp_path / n) for n in ("a1", "a2", "b1", "c1")] + ["--out", str(out), "--x", x]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_that_is_not_a_run_exits_2_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "plot.py"), str(tmp_path), "--out", str(tmp_path / "x.png")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {tmp_path}: not a run folder (no config.json or progress.csv)"]


@pytest.mark.parametrize("damage", ["config", "progress", "out_is_a_folder", "out_under_a_file"])
def test_a_damaged_run_or_a_bad_out_is_one_line_and_no_png(damage, tmp_path, capsys):
    """In-process: a config.json without its strings, a return that is not a number, an --out that cannot be a
    PNG's path; each one error: line, exit 2, nothing written (these were tracebacks)."""
    _run_folder(tmp_path / "a1", "ppo_atari", "CartPole-v1", 1, [(100, 10.0), (200, 20.0)])
    (tmp_path / "file").write_text("x")
    out = {"out_is_a_folder": tmp_path / "a1", "out_under_a_file": tmp_path / "file" / "x.png"}.get(damage, tmp_path / "x.png")
    if damage == "config":
        (tmp_path / "a1" / "config.json").write_text(json.dumps({"script": "ppo_atari", "args": []}))
    if damage == "progress":
        (tmp_path / "a1" / "progress.csv").write_text("global_step,return_mean\n100,abc\n")
    with pytest.raises(SystemExit) as e:
        plot.main([str(tmp_path / "a1"), "--out", str(out)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert not list(tmp_path.rglob("*.png"))
