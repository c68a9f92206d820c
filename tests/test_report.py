"""experiments/report.py against hand computation on a fixed synthetic experiment (fake run folders)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rliable")
from benchmarks.learning import atari100k
from experiments import report

EVAL = {1: 10.0, 2: 20.0, 3: 30.0, 4: 100.0}  # ppo_atari on CartPole-v1: eval.json means per seed


def fake_run(
    root: Path,
    script: str,
    env: str,
    variant: str,
    seed: int,
    rows: list[tuple[int, int, float | None]],
    eval_returns: list[float] | None = None,
    state: str = "done",
) -> Path:
    """A run folder as the launcher and a script leave it; ``rows``: (global_step, episodes, return_mean)."""
    folder = root / script / env / variant / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "launch.json").write_text(
        json.dumps({"script": script, "env_id": env, "seed": seed, "state": state, "variant": {"name": variant, "levels": []}})
    )
    (folder / "config.json").write_text(
        json.dumps({"script": script, "args": {"env_id": env, "seed": seed, "total_timesteps": rows[-1][0]}})
    )
    with open(folder / "progress.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["global_step", "wall_time_s", "sps", "episodes", "return_mean", "loss"])
        for step, episodes, ret in rows:
            w.writerow([step, step / 100, 100.0, episodes, "" if ret is None else ret, 0.5])
    if eval_returns is not None:
        (folder / "eval.json").write_text(
            json.dumps({"global_step": rows[-1][0], "returns": eval_returns, "mean": float(np.mean(eval_returns))})
        )
    return folder


@pytest.fixture
def experiment(tmp_path) -> Path:
    root = tmp_path / "exp"
    for seed, mean in EVAL.items():  # eval.json present: the source is eval
        fake_run(root, "ppo_atari", "CartPole-v1", "base", seed, [(100, 5, 8.0), (200, 10, 9.0)], [mean - 1.0, mean + 1.0])
    fake_run(root, "ppo_atari", "CartPole-v1", "base", 5, [(100, 5, 1.0)], [500.0], state="interrupted")
    # a2c_atari: progress.csv only; rows (episodes so far, mean of the new ones)
    for seed, offset in ((1, 0.0), (2, 6.0), (3, 12.0)):
        fake_run(
            root,
            "a2c_atari",
            "CartPole-v1",
            "base",
            seed,
            [(100, 5, 1.0 + offset), (200, 5, None), (300, 10, 2.0 + offset), (400, 20, 3.0 + offset)],
        )
    for seed, mean in ((1, -200.0), (2, -100.0)):
        fake_run(root, "ppo_atari", "Acrobot-v1", "base", seed, [(100, 2, -500.0)], [mean])
        fake_run(root, "a2c_atari", "Acrobot-v1", "base", seed, [(100, 4, mean / 2)])
    return root


def test_train_score_weights_rows_by_their_episodes(experiment):
    progress = experiment / "a2c_atari/CartPole-v1/base/seed1/progress.csv"
    # last 12 episodes: the 10 of the last row (mean 3) and 2 of the row before (mean 2)
    assert report.train_score(progress, 12) == (pytest.approx((10 * 3.0 + 2 * 2.0) / 12), 12)
    assert report.train_score(progress, 100) == (pytest.approx((5 * 1.0 + 5 * 2.0 + 10 * 3.0) / 20), 20)


def test_group_statistics_match_hand_computation(experiment):
    groups = {(g.script, g.env_id): g for g in report.collect(experiment, "auto", 12, False)}
    ppo = groups[("ppo_atari", "CartPole-v1")]
    assert ppo.source == "eval" and ppo.left_out == 1  # the interrupted seed 5 is left out
    x = np.array(list(EVAL.values()))
    np.testing.assert_allclose(ppo.scores, x)
    s = report.group_stats(ppo.scores, reps=2000, seed=0)
    assert s["n"] == 4 and s["mean"] == pytest.approx(40.0)
    assert s["std"] == pytest.approx(math.sqrt(((x - 40.0) ** 2).sum() / 3))
    assert s["iqm"] == pytest.approx((20.0 + 30.0) / 2)  # 4 seeds: the middle two
    assert x.min() <= s["mean_lo"] < s["mean"] < s["mean_hi"] <= x.max()
    assert x.min() <= s["iqm_lo"] <= s["iqm"] <= s["iqm_hi"] <= x.max()
    assert report.group_stats(ppo.scores, reps=2000, seed=0) == s  # the bootstrap is seeded
    a2c = groups[("a2c_atari", "CartPole-v1")]
    assert a2c.source == "train"
    np.testing.assert_allclose(a2c.scores, [(10 * (3 + o) + 2 * (2 + o)) / 12 for o in (0.0, 6.0, 12.0)])
    s = report.group_stats(a2c.scores, reps=2000, seed=0)
    assert s["iqm"] == pytest.approx(a2c.scores.mean())  # 3 seeds: trim_mean(0.25) cuts none
    assert s["mean_lo"] <= s["mean"] <= s["mean_hi"]
    one = report.group_stats(np.array([7.0]), reps=100, seed=0)  # one seed: no interval, not [7, 7]
    assert one["mean"] == one["iqm"] == 7.0 and math.isnan(one["std"])
    assert all(math.isnan(one[k]) for k in ("mean_lo", "mean_hi", "iqm_lo", "iqm_hi"))
    same = report.group_stats(np.array([7.0, 7.0]), reps=100, seed=0)  # seeds that agree: every resample is 7
    assert same["mean_lo"] == same["mean_hi"] == same["iqm_lo"] == same["iqm_hi"] == 7.0


def test_the_bootstrap_is_reproducible_whatever_numpys_global_generator_holds():
    """rliable draws its resamples from np.random's global generator: the same seed gives the same interval
    after the global generator moved, and the caller's global stream is left where it was."""
    x = np.linspace(0.0, 1.0, 10) ** 2  # ten distinct seeds: interval ends differ between unseeded bootstraps
    np.random.seed(1)
    first = report.group_stats(x, reps=500, seed=0)
    np.random.seed(2)
    expected_next = np.random.rand()
    np.random.seed(2)
    assert report.group_stats(x, reps=500, seed=0) == first
    assert np.random.rand() == expected_next
    assert report.group_stats(x, reps=500, seed=1) != first


def test_one_seed_per_task_gives_aggregates_without_intervals(tmp_path):
    """A stratified bootstrap over one run per task can only return the point: the report says there is no
    interval ('-') rather than printing [x, x], and so does benchmarks/learning/atari100k.py's table; two seeds give one."""
    root = tmp_path / "exp"
    for env, mean in (("RoadRunnerNoFrameskip-v4", 7845.0), ("FreewayNoFrameskip-v4", 14.8)):
        fake_run(root, "catdqn_atari", env, "base", 1, [(100, 2, 1.0)], [mean])
    refs = {"RoadRunnerNoFrameskip-v4": (11.5, 7845.0), "FreewayNoFrameskip-v4": (0.0, 29.6)}
    groups = report.collect(root, "auto", 100, False)
    points, cis, notes, taus, (profiles, bands), _ = report.aggregates(groups, refs, reps=200, seed=0)
    np.testing.assert_allclose(points["catdqn_atari base"], [0.75, 0.75, 0.75, 0.25])  # HNS 1.0 and 0.5
    assert np.isnan(cis["catdqn_atari base"]).all() and np.isnan(bands["catdqn_atari base"]).all()
    text = atari100k.table(root, ["RoadRunner", "Freeway"], reps=200)
    assert "| mean | 0.750 | " in text and "one seed: no interval" in text
    for env, mean in (("RoadRunnerNoFrameskip-v4", 3934.0), ("FreewayNoFrameskip-v4", 29.6)):
        fake_run(root, "catdqn_atari", env, "base", 2, [(100, 2, 1.0)], [mean])
    points, cis, *_ = report.aggregates(report.collect(root, "auto", 100, False), refs, reps=200, seed=0)
    lo, hi = cis["catdqn_atari base"]
    assert np.isfinite(lo).all() and np.all(lo <= points["catdqn_atari base"] + 1e-12)
    assert np.all(points["catdqn_atari base"] <= hi + 1e-12) and lo[0] < hi[0]
    text = atari100k.table(root, ["RoadRunner", "Freeway"], reps=200)
    assert "95% stratified bootstrap intervals" in text and "| mean | 0.750 [" in text


def test_normalised_aggregates_and_the_written_report(experiment, tmp_path):
    refs_file = tmp_path / "refs.json"
    refs_file.write_text(
        json.dumps({"CartPole-v1": {"random": 0.0, "human": 100.0}, "Acrobot-v1": {"random": -500.0, "reference": 0.0}})
    )
    refs = report.load_reference(refs_file)
    groups = report.collect(experiment, "auto", 12, False)
    points, cis, notes, taus, prof, matrices = report.aggregates(groups, refs, reps=500, seed=0)
    ppo = matrices["ppo_atari base"]
    # tasks sorted (Acrobot, CartPole); 2 seeds on Acrobot: the first 2 seeds of each task
    np.testing.assert_allclose(ppo, [[0.6, 0.1], [0.8, 0.2]])
    assert notes["ppo_atari base"] == (["Acrobot-v1", "CartPole-v1"], 2)
    mean, median, iqm, gap = points["ppo_atari base"]
    # rliable: mean and median of the per-task means; IQM and optimality gap over every run of every task
    assert mean == pytest.approx(ppo.mean()) and median == pytest.approx(np.median(ppo.mean(axis=0)))
    assert iqm == pytest.approx(np.mean(np.sort(ppo.ravel())[1:3]))
    assert gap == pytest.approx(np.mean(1 - np.minimum(ppo, 1)))
    lo, hi = cis["ppo_atari base"]
    assert np.all(lo <= points["ppo_atari base"] + 1e-12) and np.all(points["ppo_atari base"] <= hi + 1e-12)
    profiles, bands = prof
    np.testing.assert_allclose(profiles["ppo_atari base"], [np.mean(ppo > t) for t in taus])

    out = tmp_path / "out"
    assert (
        report.main(
            [str(experiment), "--reference", str(refs_file), "--out", str(out), "--last-episodes", "12", "--reps", "200"]
        )
        == 0
    )
    text = (out / "report.md").read_text()
    assert "| ppo_atari | CartPole-v1 | base | 4 | eval | 40.0 |" in text
    assert "| a2c_atari | CartPole-v1 | base | 3 | train |" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| ppo_atari | CartPole-v1 |"))
    assert row.endswith("| 1 |")  # left out: the interrupted run
    for name in ("aggregates.png", "profiles.png", "curves_CartPole-v1.png", "curves_Acrobot-v1.png"):
        assert (out / name).stat().st_size > 1000, name


def test_bad_input_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        report.main([str(tmp_path)])
    assert e.value.code == 2 and "no run folders" in capsys.readouterr().err
    (tmp_path / "refs.json").write_text(json.dumps({"CartPole-v1": {"human": 1}}))
    with pytest.raises(SystemExit) as e:
        report.main([str(tmp_path), "--reference", str(tmp_path / "refs.json")])
    assert e.value.code == 2 and "needs a 'random' score" in capsys.readouterr().err


def snapshot(root: Path) -> dict[str, tuple[bytes | None, int]]:
    return {str(p): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns) for p in [root, *root.rglob("*")]}


def without_dac_override() -> None:
    """In the child, before it runs the report: root's power to read and enter any folder dropped from the
    capabilities it keeps through exec (PR_CAPBSET_DROP of CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), so a folder's
    mode bits hold for root as for anyone."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.parametrize("case", ["out_under_proc", "unreadable_experiment"])
def test_an_out_that_cannot_be_made_or_an_unreadable_experiment_is_one_line(experiment, tmp_path, case):
    """Both were tracebacks (issue 68): --out under /proc failed making the folder after the statistics, and an
    experiment folder this user may not enter failed its --out check (exists() raises there)."""
    import os
    import subprocess
    import sys

    from tests.helpers import ROOT

    extra, setup = ["--no-curves", "--reps", "100"], None
    if case == "out_under_proc":
        extra += ["--out", "/proc/no/report"]
    else:
        os.chmod(experiment, 0)
        setup = without_dac_override if os.geteuid() == 0 else None
    before = snapshot(tmp_path)
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "experiments" / "report.py"), str(experiment), *extra],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=setup,
        )
    finally:
        os.chmod(experiment, 0o755)
    said = "cannot make a folder in /proc" if case == "out_under_proc" else "cannot be read (Permission denied)"
    assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert said in done.stderr and not done.stdout, done.stderr
    assert snapshot(tmp_path) == before
