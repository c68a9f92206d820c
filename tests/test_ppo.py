"""algos/ppo_atari.py: GAE against the definition, learning in every sampling mode, Atari smoke runs, resume,
determinism, bad arguments, interruption and a killed sampler."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import (
    ROOT,
    assert_killed_sampler_ends_the_run,
    assert_no_leftovers,
    finish,
    gae_by_definition,
    our_shm,
    progress,
    refusal,
    run,
    start,
    wait_for_progress_row,
)

sys.path.insert(0, str(ROOT / "algos"))
import ppo_atari

# The script's cartpole preset (rl-zoo's PPO settings): the learning test below is that preset's test.
CARTPOLE = ["--preset", "cartpole", "--eval-episodes", "0"]
ATARI_SMOKE = ["--num-envs", "4", "--num-steps", "16", "--total-timesteps", "256", "--eval-episodes", "0"]


# ---------------------------------------------------------------------------------------------- GAE


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_definition_with_truncation_and_reset_rows(seed):
    rng = np.random.default_rng(seed)
    T, B = 12, 5
    term = rng.random((T, B)) < 0.1
    trunc = rng.random((T, B)) < 0.1
    life_lost = rng.random((T, B)) < 0.05
    ended = term | trunc
    reset = np.zeros((T, B), bool)
    reset[1:] = ended[:-1]  # the row after an ended one only resets the env
    terminated = term | life_lost
    r, v, nv = rng.normal(size=(T, B)), rng.normal(size=(T, B)), rng.normal(size=B)
    f = lambda x: np.asarray(x, np.float32)
    adv, ret = ppo_atari.compute_gae(f(r), f(v), f(nv), f(terminated), f(ended), f(reset), 0.99, 0.95)
    expected = gae_by_definition(r, v, nv, terminated, ended, reset, 0.99, 0.95)
    np.testing.assert_allclose(adv, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, expected + v, rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_from_the_final_observation_and_termination_does_not():
    # Row 0 is truncated: its successor (row 1, a reset row) holds the final observation's value 10.
    f = lambda x: np.array(x, np.float32)
    r, v = f([[1.0], [0.0]]), f([[2.0], [10.0]])
    ended, reset = f([[1.0], [0.0]]), f([[0.0], [1.0]])
    adv, _ = ppo_atari.compute_gae(r, v, f([5.0]), f([[0.0], [0.0]]), ended, reset, 0.5, 0.9)
    assert adv[0, 0] == pytest.approx(1.0 + 0.5 * 10.0 - 2.0)
    assert adv[1, 0] == 0.0  # reset rows carry no advantage (and are masked out of the loss)
    adv, _ = ppo_atari.compute_gae(r, v, f([5.0]), f([[1.0], [0.0]]), ended, reset, 0.5, 0.9)
    assert adv[0, 0] == pytest.approx(1.0 - 2.0)


# ---------------------------------------------------------------------------------------------- learning


# Parallel (45 s) and async (22 s) with the slow tests, for CI's 30 minutes.
@pytest.mark.parametrize(
    "sampler", ["serial", pytest.param("parallel", marks=pytest.mark.slow), pytest.param("async", marks=pytest.mark.slow)]
)
def test_ppo_learns_cartpole_in_every_mode(sampler, tmp_path):
    out = run(
        "ppo_atari.py",
        *CARTPOLE,
        "--sampler",
        sampler,
        "--total-timesteps",
        "150000",
        "--stop-at-return",
        "450",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"mean return of the last 20 episodes ([\d.]+) >= 450", out.stdout)
    assert m, f"did not reach 450 within 150k steps:\n{out.stdout[-2000:]}"
    rows = progress(tmp_path / "r")
    assert int(rows[-1]["global_step"]) <= 150_000


# ---------------------------------------------------------------------------------------------- Atari


# async (24 s) with the slow tests; CI keeps async PPO in test_dict_obs's shared-memory run
@pytest.mark.parametrize(
    "sampler", ["serial", pytest.param("parallel", marks=pytest.mark.slow), pytest.param("async", marks=pytest.mark.slow)]
)
def test_atari_smoke_checkpoint_and_resume(sampler, tmp_path):
    out = run("ppo_atari.py", *ATARI_SMOKE, "--sampler", sampler, "--out-dir", str(tmp_path), "--run-name", "a", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "a"
    rows = progress(run_dir)
    assert list(rows[0])[:5] == ["global_step", "wall_time_s", "sps", "episodes", "return_mean"]
    assert [int(r["global_step"]) for r in rows] == [64, 128, 192, 256]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] == 256 and ckpt["args"]["sampler"] == sampler
    agent = ppo_atari.Agent((4, 84, 84), 4)
    agent.load_state_dict(ckpt["model"])
    out = run(
        "ppo_atari.py",
        *ATARI_SMOKE[:-4],
        "--total-timesteps",
        "384",
        "--eval-episodes",
        "0",
        "--sampler",
        sampler,
        "--resume",
        str(run_dir),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = progress(run_dir)
    assert [int(r["global_step"]) for r in rows] == [64, 128, 192, 256, 320, 384]
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"] == 384


def test_serial_runs_are_reproducible(tmp_path):
    for name in ("x", "y"):
        out = run("ppo_atari.py", *CARTPOLE, "--total-timesteps", "4096", "--out-dir", str(tmp_path), "--run-name", name)
        assert out.returncode == 0, out.stderr[-2000:]
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("wall_time_s", "sps")} for r in rows]
    a, b = strip(progress(tmp_path / "x")), strip(progress(tmp_path / "y"))
    assert len(a) == 16 and a == b
    ca = torch.load(tmp_path / "x" / "checkpoint.pt", weights_only=True)["model"]
    cb = torch.load(tmp_path / "y" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(ca[k], cb[k]) for k in ca)


# ---------------------------------------------------------------------------------------------- errors


BAD_ARGUMENTS = [
    (["--num-envs", "0"], "--num-envs"),
    (["--num-steps", "-5"], "--num-steps"),
    (["--num-minibatches", "3"], "--num-minibatches"),
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--sampler", "threads"], "--sampler"),
    (["--num-envs", "abc"], "--num-envs"),
    (["--resume", "/nonexistent/run"], "--resume"),
]


@pytest.mark.parametrize("bad, words", BAD_ARGUMENTS)
def test_bad_arguments_exit_2_with_one_line(bad, words, tmp_path):
    lines = refusal("ppo_atari.py", *bad, "--out-dir", str(tmp_path))  # in this process, before run.setup()
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], lines
    assert not any(tmp_path.iterdir())  # nothing started, no run folder


def test_a_bad_argument_exits_2_from_the_command_line(tmp_path):
    """One case end to end: the process's exit code and its whole stderr, and no run folder."""
    bad, words = BAD_ARGUMENTS[3]
    out = run("ppo_atari.py", *bad, "--out-dir", str(tmp_path), timeout=60)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], out.stderr
    assert not any(tmp_path.iterdir())  # nothing started, no run folder


def _start(args, tmp_path):
    return start("ppo_atari.py", *args, "--out-dir", str(tmp_path), "--run-name", "i")


@pytest.mark.parametrize("sampler, sig", [("async", signal.SIGINT), ("serial", signal.SIGTERM)])
def test_interrupt_writes_checkpoint_and_ends_every_process(sampler, sig, tmp_path):
    shm_before = our_shm()
    proc = _start([*CARTPOLE, "--sampler", sampler, "--total-timesteps", "10000000"], tmp_path)
    wait_for_progress_row(tmp_path / "i", proc)
    os.killpg(proc.pid, sig)  # as Ctrl-C does: the whole foreground group gets the signal
    err = finish(proc)
    assert proc.returncode == 130, err
    assert_no_leftovers(proc.pid)
    ckpt = torch.load(tmp_path / "i" / "checkpoint.pt", weights_only=True)
    assert ckpt["global_step"] >= 256
    assert our_shm() <= shm_before


def test_killed_sampler_ends_the_run_with_exit_1(tmp_path):
    assert_killed_sampler_ends_the_run(
        "ppo_atari.py", [*CARTPOLE, "--sampler", "async", "--total-timesteps", "10000000"], tmp_path / "i"
    )


def test_evaluation_writes_returns_and_a_video(tmp_path):
    out = run(
        "ppo_atari.py",
        *CARTPOLE[:-2],
        "--total-timesteps",
        "512",
        "--eval-episodes",
        "2",
        "--capture-video",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "e",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    ev = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert len(ev["returns"]) == 2 and ev["mean"] == pytest.approx(np.mean(ev["returns"]))
    videos = list((tmp_path / "e" / "videos").glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 1000


# --------------------------------------------------------------------------------------- researcher's edit


def test_a_new_loss_term_is_three_lines_in_ppo_loss_and_is_logged(tmp_path):
    """The researcher's edit (a) of issue 52: a new term of PPO's loss (an L2 penalty on the logits), logged, is three
    lines added to ``ppo_loss`` and nothing else; the run trains, evaluates, and its progress.csv has the column."""
    folder = Path(tempfile.mkdtemp(prefix="tmp_loss_term_", dir=ROOT))
    try:
        src = (ROOT / "algos" / "ppo_atari.py").read_text()
        anchor = "    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss\n"
        assert src.count(anchor) == 1
        term = "    logit_l2 = mean(logits.pow(2).mean(1))\n" + anchor + "    loss = loss + 1e-3 * logit_l2\n"
        edited = src.replace(anchor, term).replace(
            '"entropy": entropy.detach(),\n', '"entropy": entropy.detach(),\n        "logit_l2": logit_l2.detach(),\n'
        )
        added = [line for line in difflib.ndiff(src.splitlines(), edited.splitlines()) if line.startswith(("+ ", "- "))]
        assert len(added) == 3 and all(line.startswith("+ ") for line in added), added
        (folder / "ppo_l2.py").write_text(edited)
        out = run(
            str(folder / "ppo_l2.py"),
            "--preset",
            "cartpole",
            "--total-timesteps",
            "2048",
            "--eval-episodes",
            "2",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            "l2",
        )
        assert out.returncode == 0, out.stderr[-3000:]
        rows = progress(tmp_path / "l2")
        values = [float(r["logit_l2"]) for r in rows]
        assert values and all(np.isfinite(values)) and values[-1] > 0
        assert len(json.loads((tmp_path / "l2" / "eval.json").read_text())["returns"]) == 2
    finally:
        shutil.rmtree(folder)
