"""shared/run.py: additive progress columns, the final row, the early-stop rule, the shutdown guard and
evaluation."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass

import gymnasium as gym
import pytest

from shared.procs import WorkerError
from shared.run import EXIT_INTERRUPTED, RunFolder, evaluate


@dataclass
class FakeArgs:
    env_id: str = "CartPole-v1"
    seed: int = 3
    out_dir: str = ""
    run_name: str = "r"


def rows(path) -> tuple[list[str], list[dict]]:
    with open(path / "progress.csv", newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_a_new_metric_mid_run_becomes_a_column_and_earlier_rows_leave_it_empty(tmp_path):
    run = RunFolder(FakeArgs(out_dir=str(tmp_path)), "script")
    run.episode(10.0, 5, 100)
    run.row(100, loss=1.5)
    run.row(200, loss=1.0, kl=0.01)
    run.row(300, kl=0.02)
    run.close()
    header, body = rows(run.path)
    assert header == ["global_step", "wall_time_s", "sps", "episodes", "return_mean", "loss", "kl"]
    assert [r["global_step"] for r in body] == ["100", "200", "300"]
    assert [r["kl"] for r in body] == ["", "0.01", "0.02"]
    assert [r["loss"] for r in body] == ["1.5", "1.0", ""]
    assert body[0]["return_mean"] == "10.0" and body[1]["return_mean"] == ""
    assert not list(run.path.glob(".progress*"))  # the rewrite left no temporary file


def test_a_resumed_run_keeps_its_columns(tmp_path):
    run = RunFolder(FakeArgs(out_dir=str(tmp_path)), "script")
    run.row(100, loss=1.5)
    run.close()
    again = RunFolder(FakeArgs(out_dir=str(tmp_path)), "script", folder=run.path, resumed={"global_step": 100})
    again.row(200, loss=0.5, kl=1.0)
    again.close()
    header, body = rows(run.path)
    assert header[-2:] == ["loss", "kl"] and [r["loss"] for r in body] == ["1.5", "0.5"]
    assert (run.path / "config.resume-100.json").exists()


def test_finish_writes_the_last_step_once(tmp_path):
    run = RunFolder(FakeArgs(out_dir=str(tmp_path)), "script")
    run.row(100, loss=2.0)
    run.finish(130)
    run.finish(130)
    run.close()
    _, body = rows(run.path)
    assert [(r["global_step"], r["loss"]) for r in body] == [("100", "2.0"), ("130", "2.0")]


def test_should_stop_needs_n_episodes_at_or_above_the_threshold(tmp_path, capsys):
    run = RunFolder(FakeArgs(out_dir=str(tmp_path)), "script")
    assert not run.should_stop(None, 1, 0)
    for r in [1.0, 9.0, 11.0]:
        run.episode(r, 1, 0)
    assert not run.should_stop(10.5, 2, 0)  # the last 2 average 10.0
    run.episode(12.0, 1, 0)
    assert not run.should_stop(10.0, 5, 0)  # only 4 episodes
    assert run.should_stop(11.5, 2, 42)
    assert "mean return of the last 2 episodes 11.5 >= 11.5 at step 42: stopping" in capsys.readouterr().out
    run.close()


class Held:
    def __init__(self):
        self.stopped = 0

    def stop(self):
        self.stopped += 1


@pytest.mark.parametrize("error, code", [(None, 0), (KeyboardInterrupt, EXIT_INTERRUPTED), (WorkerError, 1)])
def test_guard_ends_every_run_the_same_way(tmp_path, error, code, capsys):
    run = RunFolder(FakeArgs(out_dir=str(tmp_path)), "script")
    step = 0
    held = Held()
    with run.guard(lambda: {"global_step": step, "weights": [1, 2]}) as guard:
        guard.hold(held)
        step = 64
        run.row(32, loss=1.0)
        if error is not None:
            raise error("boom")
    assert guard.exit_code == code and held.stopped == 1
    assert run._csv_file.closed  # the run folder is closed on every path
    ckpt = run.path / "checkpoint.pt"
    if error is KeyboardInterrupt:
        import torch

        assert torch.load(ckpt, weights_only=True)["global_step"] == 64
        _, body = rows(run.path)
        assert body[-1]["global_step"] == "64"  # the state at the interruption is logged
    elif error is WorkerError:  # the learner survived its sampler: what it learned is kept
        import torch

        assert torch.load(ckpt, weights_only=True)["global_step"] == 64
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "error: the sampler process failed (WorkerError); the learner's checkpoint at step 64 is written")
    else:
        assert not ckpt.exists()


def test_guard_ends_other_errors_with_their_traceback_and_a_last_line(tmp_path, capsys):
    run = RunFolder(FakeArgs(out_dir=str(tmp_path)), "script")
    held = Held()
    with run.guard(lambda: {"global_step": 0}) as guard:
        guard.hold(held)
        raise FloatingPointError("loss is nan")
    assert guard.exit_code == 1 and held.stopped == 1 and run._csv_file.closed
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("Traceback") and err[-1] == "error: FloatingPointError: loss is nan"


def test_evaluate_plays_whole_episodes_and_tells_the_policy_where_they_start(tmp_path):
    run = RunFolder(FakeArgs(out_dir=str(tmp_path)), "script")
    calls = []

    def act(obs, last_reward):
        calls.append(last_reward)
        return 0

    env = gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, 7)
    returns = evaluate(run, env, act, episodes=3, seed=1, global_step=10)
    run.close()
    assert len(returns) == 3 and all(1 <= r <= 7 for r in returns)
    assert calls.count(None) == 3 and calls[0] is None and len(calls) == sum(returns)
    saved = json.loads((run.path / "eval.json").read_text())
    assert saved["returns"] == returns and saved["mean"] == pytest.approx(sum(returns) / 3)


def test_bf16_on_a_cpu_without_it_warns_in_one_line(monkeypatch, capsys):
    import shared.run as run_module

    monkeypatch.setattr(run_module, "cpu_has_bf16", lambda: False)
    assert run_module.resolve_device("cpu", bf16=True).type == "cpu"
    assert capsys.readouterr().err.startswith("warning: --bf16 on a CPU without native bfloat16")
    monkeypatch.setattr(run_module, "cpu_has_bf16", lambda: True)
    run_module.resolve_device("cpu", bf16=True)
    run_module.resolve_device("cpu", bf16=False)
    assert capsys.readouterr().err == ""
