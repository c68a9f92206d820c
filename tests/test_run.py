"""shared/run.py and shared/progress.py: additive progress columns, the periodic tasks (rows, evaluation,
checkpoints by steps and by wall time), the final row, the early-stop rule, the end of a run on every path, and
the checks made before anything starts (bf16 warning, memory)."""

from __future__ import annotations

import csv
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from shared import cli
from shared.procs import WorkerError
from shared.progress import ProgressLog
from shared.run import EXIT_INTERRUPTED, Run


@dataclass
class FakeArgs:
    env_id: str = "CartPole-v1"
    seed: int = 3
    out_dir: str = ""
    run_name: str = "r"
    resume: str = ""
    device: str = "cpu"
    sampler: str = "serial"
    total_timesteps: int = 1000
    log_every: int = 100
    eval_every: int = 0
    eval_episodes: int = 0
    eval_envs: int = 2
    checkpoint_every: int = 0
    checkpoint_minutes: float = 0.0
    capture_video: bool = False
    stop_at_return: float | None = None
    buffer_size: int = 10
    track: bool = False


def make_env(args, render: bool = False):
    return lambda: gym.wrappers.TimeLimit(gym.make("CartPole-v1").unwrapped, 7)


def new_run(tmp_path, **kw) -> tuple[Run, torch.nn.Module]:
    run = Run(FakeArgs(out_dir=str(tmp_path), **kw), "script", make_env, action_space=gym.spaces.Discrete).setup()
    model = torch.nn.Linear(2, 2)
    run.begin(lambda obs: 0, model=model)
    return run, model


def rows(path) -> tuple[list[str], list[dict]]:
    with open(path / "progress.csv", newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_a_new_metric_mid_run_becomes_a_column_and_earlier_rows_leave_it_empty(tmp_path):
    log = ProgressLog(tmp_path, total_steps=300)
    log.episode(10.0, 5, 100)
    log.row(100, loss=1.5)
    log.row(200, loss=1.0, kl=0.01)
    log.row(300, kl=torch.tensor(0.02))  # a 0-d tensor is read when the row is written
    log.close()
    header, body = rows(tmp_path)
    assert header == ["global_step", "wall_time_s", "sps", "episodes", "return_mean", "loss", "kl"]
    assert [r["global_step"] for r in body] == ["100", "200", "300"]
    assert [r["kl"] for r in body][:2] == ["", "0.01"] and float(body[2]["kl"]) == pytest.approx(0.02)
    assert [r["loss"] for r in body] == ["1.5", "1.0", ""]
    assert body[0]["return_mean"] == "10.0" and body[1]["return_mean"] == ""
    assert not list(tmp_path.glob(".progress*"))  # the rewrite left no temporary file


def test_a_resumed_log_keeps_its_columns_and_drops_rows_past_the_checkpoint(tmp_path):
    log = ProgressLog(tmp_path, 1000)
    log.row(100, loss=1.5)
    log.row(200, loss=1.2)  # written after the checkpoint at 100, by a run then killed
    log.close()
    again = ProgressLog(tmp_path, 1000, start_step=100, resumed=True)
    again.row(200, loss=0.5, kl=1.0)
    again.close()
    header, body = rows(tmp_path)
    assert header[-2:] == ["loss", "kl"] and [r["loss"] for r in body] == ["1.5", "0.5"]


def test_the_console_line_says_how_far_the_run_is_and_when_it_ends(tmp_path, capsys):
    log = ProgressLog(tmp_path, total_steps=1000)
    log.row(250, loss=1.0)
    log.close()
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("step       250/1000 ( 25%)") and " eta 0:" in line and "loss 1" in line


def test_periodic_writes_rows_when_due_and_finish_writes_the_last_step_once(tmp_path):
    run, _ = new_run(tmp_path)
    with run:
        for step in (50, 100, 130):
            assert not run.periodic(step, loss=step / 10)
        run.finish(130)
    assert run.exit_code == 0
    _, body = rows(run.path)
    assert [(r["global_step"], r["loss"]) for r in body] == [("100", "10.0"), ("130", "13.0")]
    assert torch.load(run.path / "checkpoint.pt", weights_only=True)["global_step"] == 130


def test_on_policy_rows_count_iterations(tmp_path):
    run = Run(FakeArgs(out_dir=str(tmp_path), log_every=2), "script", make_env, iteration_steps=32).setup()
    run.begin(lambda obs: 0)
    with run:
        for it in range(1, 6):
            run.periodic(32 * it, loss=float(it))
        run.finish(160)
    _, body = rows(run.path)
    assert [r["global_step"] for r in body] == ["64", "128", "160"]  # every 2 iterations, and the last one


def test_on_policy_rows_stay_on_multiples_of_log_every_after_a_resume(tmp_path):
    def first_run(**kw):
        run = Run(FakeArgs(out_dir=str(tmp_path), log_every=3, **kw), "script", make_env, iteration_steps=32).setup()
        start = run.begin(lambda obs: 0)
        return run, start

    run, _ = first_run()
    with run:
        for it in range(1, 6):
            run.periodic(32 * it)
        run.finish(160)  # 5 iterations: a row at 96, the last at 160, the checkpoint at 160
    run, start = first_run(resume=str(run.path))
    assert start.global_step == 160
    with run:
        for it in range(6, 10):
            run.periodic(32 * it)
        run.finish(288)
    _, body = rows(run.path)
    assert [r["global_step"] for r in body] == ["96", "160", "192", "288"]


def test_checkpoints_come_every_n_steps(tmp_path):
    run, model = new_run(tmp_path, checkpoint_every=100)
    with run:
        run.periodic(90)
        assert not (run.path / "checkpoint.pt").exists()
        with torch.no_grad():
            model.weight.fill_(7.0)
        run.periodic(120, updates=3)
        saved = torch.load(run.path / "checkpoint.pt", weights_only=True)
        assert saved["global_step"] == 120 and saved["updates"] == 3 and bool((saved["model"]["weight"] == 7).all())
        run.periodic(150)
        assert torch.load(run.path / "checkpoint.pt", weights_only=True)["global_step"] == 120  # next at 200
        run.finish(150)


def test_checkpoints_come_every_n_minutes_of_wall_time(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("shared.run.time.time", lambda: clock[0])
    run, _ = new_run(tmp_path, checkpoint_minutes=15)
    with run:
        clock[0] += 14 * 60
        run.periodic(10)
        assert not (run.path / "checkpoint.pt").exists()
        clock[0] += 2 * 60
        run.periodic(20)
        assert torch.load(run.path / "checkpoint.pt", weights_only=True)["global_step"] == 20
        clock[0] += 10 * 60  # 10 minutes after the last one: not yet
        run.periodic(30)
        assert torch.load(run.path / "checkpoint.pt", weights_only=True)["global_step"] == 20
        run.finish(30)


def test_the_stop_rule_needs_n_episodes_at_or_above_the_threshold(tmp_path, capsys):
    run = Run(FakeArgs(out_dir=str(tmp_path), stop_at_return=11.5), "script", make_env, stop_window=2).setup()
    run.begin(lambda obs: 0)
    with run:
        for r in [1.0, 9.0, 11.0]:
            run.episodes([(r, 1)], 0)
        assert not run.periodic(10)  # the last 2 average 10.0
        run.episodes([(12.0, 1)], 0)
        assert run.periodic(42)
        run.finish(42)
    assert "mean return of the last 2 episodes 11.5 >= 11.5 at step 42: stopping" in capsys.readouterr().out


def test_in_a_torchrun_job_the_ranks_agree_on_stopping_every_256_steps_or_64_iterations(tmp_path, monkeypatch):
    """An off-policy loop calls periodic at every env step: under torchrun, the agreement on stopping (one all-reduce)
    comes at the first iteration 256 or more job steps past the last one, or the 64th iteration since (where steps
    stall: async samplers still starting), the same iteration on every rank (their global_step and iteration counts
    are the same); each iteration of a longer stride (a PPO rollout) agrees at once. A signal, or the threshold, stops
    the loop at the next agreement. Single-process runs decide at every iteration (the test above)."""
    from shared import distributed, signals
    from shared.run import AGREE_EVERY_ITERATIONS, AGREE_EVERY_STEPS

    agreed = []

    def any_rank(*flags):
        agreed.append(step)
        return [bool(f) for f in flags]

    monkeypatch.setattr(distributed, "any_rank", any_rank)
    run, _ = new_run(tmp_path, stop_at_return=5.0)
    seen = {}  # checked after the run: inside ``with run``, any error but an assert's becomes exit code 1
    with run:
        monkeypatch.setattr(distributed, "in_lockstep", lambda: True)
        for step in range(2, 1202, 2):  # 2 ranks x 1 env: 64 iterations come before 256 steps
            if step == 700:  # a Ctrl-C on some rank
                monkeypatch.setattr(signals, "signalled", lambda: True)
            if run._should_stop(step):
                break
        seen["signal"] = list(agreed), step
        monkeypatch.setattr(signals, "signalled", lambda: False)
        run._interrupted = False
        agreed.clear()
        for step in range(1000, 1000 + 6 * 100, 100):  # 100 steps an iteration: 256 steps come first
            run._should_stop(step)
        seen["strides"] = list(agreed)
        agreed.clear()
        for step in range(2818, 2818 + 4 * 2048, 2048):  # rollouts of 2048 steps: each agrees
            run._should_stop(step)
        seen["rollouts"] = list(agreed)
        agreed.clear()
        for _ in range(70):  # steps stalled (async samplers starting): the iterations still bring an agreement
            run._should_stop(step)
        seen["stalled"] = len(agreed)
        agreed.clear()
        monkeypatch.setattr(distributed, "in_lockstep", lambda: False)  # (a job shares its episodes at rows)
        run.episodes([(9.0, 1)] * 20, 0)  # the threshold: reached at the next agreement
        monkeypatch.setattr(distributed, "in_lockstep", lambda: True)
        seen["threshold"] = [run._should_stop(step := 9000)]
        seen["threshold"] += [run._should_stop(step := 9218), list(agreed)]
        monkeypatch.setattr(distributed, "in_lockstep", lambda: False)
        run.finish(9218)
    assert run.exit_code == 0 and (AGREE_EVERY_STEPS, AGREE_EVERY_ITERATIONS) == (256, 64)
    assert seen["signal"] == ([2, 130, 258, 386, 514, 642, 770], 770)  # stopped there
    assert seen["strides"] == [1100, 1400]  # 1026 the next agreement after 770
    assert seen["rollouts"] == [2818, 4866, 6914, 8962]
    assert seen["stalled"] == 1
    assert seen["threshold"] == [False, True, [9218]]


def test_no_threshold_never_stops(tmp_path):
    run, _ = new_run(tmp_path)
    with run:
        for _ in range(30):
            run.episodes([(1e6, 1)], 0)
        assert not run.periodic(1)
        run.finish(1)


def test_evaluations_go_into_the_next_row_and_eval_json(tmp_path):
    calls = []

    def act(obs, starts):
        calls.append(starts)
        return np.zeros(len(obs), np.int64)

    run = Run(FakeArgs(out_dir=str(tmp_path), eval_every=100, eval_episodes=3), "script", make_env).setup()
    run.begin(act)
    with run:
        run.periodic(100)
        run.finish(100)
    saved = json.loads((run.path / "eval.json").read_text())
    returns = saved["returns"]
    assert len(returns) == 3 and all(1 <= r <= 7 for r in returns) and saved["global_step"] == 100
    assert saved["lengths"] == [int(r) for r in returns]  # CartPole: a reward of 1 a step
    assert sum(int(s.sum()) for s in calls) == 3 and calls[0].all()  # 3 episodes, each with one start: the final
    # evaluation at the step of the periodic one does not play the same episodes again
    assert {len(s) for s in calls} == {2}  # on two envs at once
    _, body = rows(run.path)
    assert float(body[0]["eval_return"]) == pytest.approx(sum(returns) / 3)


def test_the_final_evaluation_plays_after_a_periodic_one_at_an_earlier_step(tmp_path):
    begun = []

    def act(obs, starts):
        begun.append(int(starts.sum()))
        return np.zeros(len(obs), np.int64)

    run = Run(FakeArgs(out_dir=str(tmp_path), eval_every=100, eval_episodes=3), "script", make_env).setup()
    run.begin(act)
    with run:
        run.periodic(100)
        run.finish(120)
    assert sum(begun) == 6 and json.loads((run.path / "eval.json").read_text())["global_step"] == 120


class Held:
    def __init__(self):
        self.stopped = 0

    def stop(self):
        self.stopped += 1


@pytest.mark.parametrize("error, code", [(None, 0), (KeyboardInterrupt, EXIT_INTERRUPTED), (WorkerError, 1)])
def test_a_run_ends_the_same_way_on_every_path(tmp_path, error, code, capsys):
    run, _ = new_run(tmp_path)
    held = run.hold(Held())
    with run:
        run.periodic(64, loss=1.0)
        if error is not None:
            raise error("boom")
    assert run.exit_code == code and held.stopped == 1
    assert run.progress._csv_file.closed  # the run folder is closed on every path
    ckpt = run.path / "checkpoint.pt"
    if error is KeyboardInterrupt:
        assert torch.load(ckpt, weights_only=True)["global_step"] == 64
        _, body = rows(run.path)
        assert body[-1]["global_step"] == "64"  # the state at the interruption is logged
    elif error is WorkerError:  # the learner survived its sampler: what it learned is kept
        assert torch.load(ckpt, weights_only=True)["global_step"] == 64
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            "error: the sampler process failed (WorkerError); the learner's checkpoint at step 64 is written"
        )
    else:
        assert not ckpt.exists()


def test_other_errors_end_with_their_traceback_and_a_last_line(tmp_path, capsys):
    run, _ = new_run(tmp_path)
    held = run.hold(Held())
    with run:
        raise FloatingPointError("loss is nan")
    assert run.exit_code == 1 and held.stopped == 1 and run.progress._csv_file.closed
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("Traceback") and err[-1] == "error: FloatingPointError: loss is nan"


def test_a_wrong_action_space_exits_2_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        Run(FakeArgs(out_dir=str(tmp_path)), "script", make_env, action_space=gym.spaces.Box)
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "error: --env-id CartPole-v1: script needs a continuous (Box) action space, got Discrete(2)\n"
    )


def test_sizes_the_machine_cannot_hold_exit_2_in_one_line_naming_the_flags_and_both_figures(tmp_path, monkeypatch, capsys):
    """Run.allocating: the replay's own check (NotEnoughMemory, before allocating), numpy's and torch's refusals;
    an error that is no allocation's goes through untouched."""
    from shared import buffer

    monkeypatch.setattr(buffer, "available_memory", lambda: 3 * 2**30)
    run = Run(FakeArgs(out_dir=str(tmp_path)), "script", make_env).setup()
    with pytest.raises(SystemExit) as e, run.allocating("buffer_size"):
        buffer.zeros((10, 2**30), "uint8", shared=True)  # shared memory is never refused: only the check stops it
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "error: --buffer-size 10: a [10, 1073741824] uint8 array needs 10.0 GiB, and 3.0 GiB of memory are available here\n"
    )
    with pytest.raises(SystemExit) as e, run.allocating("buffer_size", "seed"):
        torch.zeros(2**50, dtype=torch.uint8)  # refused by torch's allocator
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith(
        "error: --buffer-size 10, --seed 3: the allocation was refused (1048576.0 GiB in one tensor), and "
    )
    with pytest.raises(ValueError), run.allocating("buffer_size"):
        raise ValueError("not about memory")
    with run.allocating("buffer_size"):
        buffer.zeros((1, 2**20), "uint8", shared=True)  # one that fits is made
    assert not (tmp_path / "r").exists()  # nothing of the run on disk before begin
    run.args.eval_only = True  # evaluating a checkpoint: the replay is made but never written, so never refused
    with run.allocating("buffer_size"):
        buffer.zeros((10, 2**30), "uint8", shared=True)
    with pytest.raises(buffer.NotEnoughMemory):  # and the check is back after it
        buffer.zeros((10, 2**30), "uint8", shared=True)


def test_a_rollout_whose_observations_cannot_fit_exits_2_before_anything_starts(tmp_path, monkeypatch, capsys):
    from shared import buffer

    monkeypatch.setattr(buffer, "available_memory", lambda: 2**20)

    @dataclass
    class OnPolicyArgs(FakeArgs):
        num_envs: int = 8
        num_steps: int = 8192

    with pytest.raises(SystemExit) as e:  # CartPole: 16 bytes an observation, 65536 steps: 1 MiB
        Run(OnPolicyArgs(out_dir=str(tmp_path)), "script", make_env, iteration_steps=8 * 8192 + 8)
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "error: --num-envs 8 x --num-steps 8192: a rollout of 65544 steps needs 0.0 "
        "GiB, and 0.0 GiB of memory are available here\n"
    )
    Run(OnPolicyArgs(out_dir=str(tmp_path)), "script", make_env, iteration_steps=8 * 8192)  # fits exactly


def test_bf16_on_a_cpu_without_it_warns_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "cpu_has_bf16", lambda: False)
    assert cli.resolve_device("cpu", bf16=True).type == "cpu"
    assert capsys.readouterr().err.startswith("warning: --bf16 on a CPU without AVX512-BF16 or AMX")
    monkeypatch.setattr(cli, "cpu_has_bf16", lambda: True)
    cli.resolve_device("cpu", bf16=True)
    cli.resolve_device("cpu", bf16=False)
    assert capsys.readouterr().err == ""


def test_sigusr1_prints_where_every_thread_is_and_the_process_goes_on(capfd):
    import os
    import signal

    from shared import signals

    signals.raise_on_signals()
    os.kill(os.getpid(), signal.SIGUSR1)  # what a user (or a test waiting on a hung run) sends
    err = capfd.readouterr().err
    assert "most recent call first" in err and "test_run.py" in err


def test_a_statistic_gone_to_nan_ends_the_run_at_the_row_and_keeps_the_last_checkpoint(tmp_path, capsys):
    """Statistics stay on the device between rows (tensors); the row reads them: a non-finite one ends the run
    with exit 1 and a last line naming it, and no checkpoint is written over the last good one."""
    run, model = new_run(tmp_path, checkpoint_every=100)
    with run:
        run.periodic(100, loss=torch.tensor(0.5), updates=1)  # a row and a checkpoint at step 100
        with torch.no_grad():
            model.weight.fill_(float("nan"))
        run.periodic(150, loss=torch.tensor(float("nan")), updates=2)  # neither due: not read, nothing raised
        run.periodic(200, loss=[torch.tensor(1.0), torch.tensor(float("nan"))], updates=3)
    assert run.exit_code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: FloatingPointError: loss is nan at step 200: training diverged (the last checkpoint is kept)"
    )
    saved = torch.load(run.path / "checkpoint.pt", weights_only=True)
    assert saved["global_step"] == 100 and bool(torch.isfinite(saved["model"]["weight"]).all())
    assert [r["loss"] for r in rows(run.path)[1]] == ["0.5", "nan"]


def test_a_checkpoint_due_without_a_row_is_not_written_from_a_diverged_run(tmp_path, capsys):
    run, _ = new_run(tmp_path, checkpoint_every=50, log_every=1000)
    with run:
        run.periodic(60, loss=torch.tensor(float("inf")))
    assert run.exit_code == 1 and not (run.path / "checkpoint.pt").exists()
    assert "error: FloatingPointError: loss is inf at step 60" in capsys.readouterr().err


def test_an_interrupted_run_with_a_nan_statistic_writes_no_checkpoint(tmp_path, capsys):
    run, _ = new_run(tmp_path)
    with run:
        run.periodic(10, loss=torch.tensor(float("nan")))
        raise KeyboardInterrupt
    assert run.exit_code == 1 and not (run.path / "checkpoint.pt").exists()
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: FloatingPointError: loss is nan")


def test_a_run_that_fails_to_begin_leaves_the_process_group(tmp_path, monkeypatch, capsys):
    from shared import distributed

    ended = []
    monkeypatch.setattr(distributed, "end", lambda: ended.append(True))
    run = Run(FakeArgs(out_dir=str(tmp_path), track=True), "script", make_env, action_space=gym.spaces.Discrete).setup()
    monkeypatch.setattr("shared.tracking.start", lambda *a: (_ for _ in ()).throw(RuntimeError("W&B is down")))
    with pytest.raises(SystemExit):
        run.begin(lambda obs: 0)
    assert ended == [True] and capsys.readouterr().err == "error: W&B is down\n"
    with pytest.raises(SystemExit), run.allocating():  # a bad argument found while the networks are made
        cli.bad_args("observations the network cannot take")
    assert ended == [True, True]


def test_a_generator_saved_on_another_kind_of_device_is_reseeded_from_it_with_one_warning(capsys):
    """A CUDA run's noise generator (a 16-byte Philox state) resumed on a CPU, whose generator keeps a Mersenne
    Twister state: reseeded from the saved state, the same way every time, and said; the same kind restores
    exactly, silently."""
    from shared.checkpoint import restore, state_of

    same = torch.Generator().manual_seed(9)
    restore(state_of({"noise": torch.Generator().manual_seed(5)}), {"noise": same}, None, "x")
    assert torch.equal(torch.rand(3, generator=same), torch.rand(3, generator=torch.Generator().manual_seed(5)))
    assert capsys.readouterr().err == ""
    philox = torch.tensor([5, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0], dtype=torch.uint8)  # seed, offset
    a, b, other = torch.Generator(), torch.Generator(), torch.Generator()
    for g, state in ((a, philox), (b, philox), (other, philox.roll(1))):
        restore({"noise": state}, {"noise": g}, None, "x")
    first = torch.rand(4, generator=a)
    assert torch.equal(first, torch.rand(4, generator=b)) and not torch.equal(first, torch.rand(4, generator=other))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("warning: --resume: the generator 'noise'") for line in err)


def test_resume_from_a_file_that_is_not_our_checkpoint_exits_2_in_one_short_line(tmp_path, capsys):
    """torch's weights_only refusal is a page of advice (safe globals, trusting the source): one line says why."""
    from shared import checkpoint

    text, pickled, weights = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    text.write_text("hello\n")
    torch.save({"obj": FakeArgs()}, pickled)  # a Python object: weights_only refuses it
    torch.save({"w": torch.zeros(2)}, weights)  # a state_dict: readable, not a run's checkpoint
    for f, why in [
        (text, "(KeyError: 101)"),
        (pickled, "(UnpicklingError: Unsupported global: GLOBAL tests.test_run.FakeArgs "),
        (weights, "(no args and global_step in it)"),
    ]:
        with pytest.raises(SystemExit) as e:
            checkpoint.load(f, "CartPole-v1")
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and len(err) < 300, err
        assert err.startswith(f"error: --resume {f}: not a checkpoint these scripts wrote {why}"), err


def test_run_only_checks_and_setup_is_the_one_call_that_changes_the_process(tmp_path):
    import signal

    from shared import signals

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    run = Run(FakeArgs(out_dir=str(tmp_path)), "script", make_env, action_space=gym.spaces.Discrete)
    assert torch.equal(torch.rand(1), before)  # not seeded
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # no handler installed
    assert run.affinity is None and not any(tmp_path.iterdir())
    with pytest.raises(RuntimeError, match="run.setup"):
        run.begin(lambda obs: 0)
    with pytest.raises(RuntimeError, match="run.setup"), run.allocating():
        pass
    run.setup()
    torch.manual_seed(FakeArgs.seed)
    seeded = torch.rand(1)
    run.setup()
    assert torch.equal(torch.rand(1), seeded)  # seeded with --seed
    assert signal.getsignal(signal.SIGTERM) is signals._raise and run.affinity is not None
    signals.raise_on_signals()


def test_a_signal_the_ranks_agree_on_is_a_decision_of_periodic_not_an_exception(tmp_path, capsys):
    """Under torchrun, SIGTERM only sets a flag; periodic returns True (stop) and finish ends the run as Ctrl-C
    does: the last row, the checkpoint, exit code 130, no final evaluation."""
    import signal

    from shared import signals

    run, _ = new_run(tmp_path, eval_episodes=2)
    signals.flag_on_signals()  # what shared.distributed.start does under torchrun
    decisions = []
    try:
        with run:
            decisions.append(run.periodic(10, loss=1.0))
            signal.raise_signal(signal.SIGTERM)
            decisions.append(run.periodic(20, loss=1.0))  # no KeyboardInterrupt: a decision
            run.finish(20)
    finally:
        signals.raise_on_signals()
    assert decisions == [False, True]
    assert run.exit_code == EXIT_INTERRUPTED
    assert torch.load(run.path / "checkpoint.pt", weights_only=True)["global_step"] == 20
    assert rows(run.path)[1][-1]["global_step"] == "20"
    assert not (run.path / "eval.json").exists()
    assert "interrupted at step 20: writing checkpoint" in capsys.readouterr().out


def test_a_ctrl_c_swallowed_by_a_finalizer_still_stops_the_loop_at_the_next_periodic(tmp_path, monkeypatch):
    """Python runs the handler at its next check in the main thread, which may be inside a finalizer the garbage
    collector runs: the KeyboardInterrupt is printed as "Exception ignored" and dropped. The run must still stop
    as for Ctrl-C at the next ``periodic`` (checkpoint, exit 130), not train on as if nothing came."""
    import weakref

    run, _ = new_run(tmp_path, eval_episodes=2)
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)  # where Python reports what it dropped
    decisions = []
    with run:
        decisions.append(run.periodic(10, loss=1.0))
        weakref.finalize(model := torch.nn.Linear(1, 1), signal.raise_signal, signal.SIGINT)
        del model  # its finalizer runs now and gets the KeyboardInterrupt, which Python drops
        decisions.append(run.periodic(20, loss=1.0))
        run.finish(20)
    assert [type(d.exc_value) for d in dropped] == [KeyboardInterrupt]  # swallowed, not raised in the loop
    assert decisions == [False, True] and run.exit_code == EXIT_INTERRUPTED
    assert torch.load(run.path / "checkpoint.pt", weights_only=True)["global_step"] == 20
    assert not (run.path / "eval.json").exists()


@dataclass
class Bf16Args(FakeArgs):
    bf16: bool = True
    compile: bool = True


def test_start_sampler_hands_the_sampler_args_with_bf16_as_its_cpu_can_honour_it(tmp_path, monkeypatch):
    import shared.run as run_module
    from shared import precision

    started = []
    monkeypatch.setattr(run_module, "Worker", lambda target, args, name: started.append((target, args, name)) or name)
    run, _ = new_run(tmp_path)
    try:
        for has_bf16 in (False, True):
            monkeypatch.setattr(precision, "cpu_has_bf16", lambda h=has_bf16: h)
            args = Bf16Args()
            assert run.start_sampler(print, args, "buffer") == "sampler"  # held by the run, returned
            target, (main, sampler_args, affinity, _pid, device, compile), name = started[-1]
            assert (target, main, name, affinity) == (run_module.sampler_entry, print, "sampler", run.affinity)
            assert sampler_args[1:] == ("buffer",) and sampler_args[0].bf16 is has_bf16
            assert device == torch.device("cpu") and compile is False  # a CPU sampler acts eagerly
            assert args.bf16 is True  # the learner's own args unchanged
    finally:
        run._held.clear()
        run.__exit__(None, None, None)


def test_start_sampler_on_a_gpu_learner_hands_the_sampler_its_gpu_bf16_and_compile(tmp_path, monkeypatch):
    """A learner on a GPU: the sampler acts on that GPU (``proc.device``), in bf16 as the learner does whatever the
    sampler's CPU has, and under --compile its acting step is graphed there (its process enables compiling)."""
    import shared.run as run_module
    from shared import precision

    started = []
    monkeypatch.setattr(run_module, "Worker", lambda target, args, name: started.append((target, args, name)) or name)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    run, _ = new_run(tmp_path)
    learner = run.device
    try:
        run.device = torch.device("cuda", 1)  # the device is only read here: no GPU needed
        for compile in (False, True):
            run.start_sampler(print, Bf16Args(compile=compile), "buffer")
            _, (_, sampler_args, _, _, device, compiled), _ = started[-1]
            assert device == torch.device("cuda", 1) and compiled is compile
            assert sampler_args[0].bf16 is True
    finally:
        run.device = learner
        run._held.clear()
        run.__exit__(None, None, None)


@pytest.mark.parametrize("error", [KeyboardInterrupt, WorkerError])
def test_a_sampler_killed_holding_the_replay_lock_still_leaves_the_learners_checkpoint(tmp_path, error, capsys):
    """Saving the shared replay waits on its lock and raises WorkerError when the sampler holding it is dead (a
    SIGTERM to the whole job can kill it mid-append): the checkpoint is written without the replay."""

    class DeadPeersReplay:
        cursor = 5

        def save(self, f):
            raise WorkerError("the sampler process was killed (signal 15)")

    run, _ = new_run(tmp_path)
    run._replay = DeadPeersReplay()
    with run:
        run.periodic(64, loss=1.0)
        raise error("boom")
    state = torch.load(run.path / "checkpoint.pt", weights_only=True)
    assert state["global_step"] == 64 and "replay_cursor" not in state  # a resume starts with an empty replay
    assert not (run.path / "replay.npz").exists()
    assert "warning: --save-replay: the replay is not saved" in capsys.readouterr().err


def test_a_signal_during_a_checkpoint_raises_once_it_is_written_and_the_state_is_not_written_twice(tmp_path):
    """A Ctrl-C during the replay's long write (--save-replay) no longer throws that write away to redo it on the
    way out: the checkpoint started is finished, the signal raises after it, and the exit path finds the same
    state on disk and writes nothing more."""

    class SlowReplay:
        cursor, writes = 5, 0

        def save(self, f):
            SlowReplay.writes += 1
            if SlowReplay.writes == 1:  # once: a regression fails this test, not the whole pytest session
                os.kill(os.getpid(), signal.SIGINT)  # arrives mid-write
            time.sleep(0.2)
            Path(f).write_bytes(b"replay")

    run, _ = new_run(tmp_path, checkpoint_every=64)
    run._replay = SlowReplay()
    with run:
        run.periodic(64, loss=1.0)  # a checkpoint is due: the signal raises after it
        raise AssertionError("not reached: the signal raised in periodic")
    assert run.exit_code == EXIT_INTERRUPTED and SlowReplay.writes == 1
    assert (run.path / "replay.npz").read_bytes() == b"replay"
    assert torch.load(run.path / "checkpoint.pt", weights_only=True)["replay_cursor"] == 5


@pytest.mark.parametrize(
    "script, flags, refused",
    [
        ("ppo_atari", ["--env-id", "ALE/NoSuchGame-v5"], "--env-id"),  # parse_args
        ("ppo_atari", ["--env-id", "Pendulum-v1"], "--env-id Pendulum-v1: ppo_atari needs a discrete"),  # Run(...)
        ("dqn_atari", ["--preset", "cartpole", "--buffer-size", "2000000000"], "--buffer-size 2000000000"),  # allocating
    ],
)
def test_check_only_makes_every_check_before_begin_and_exits_0_with_nothing_written(tmp_path: Path, script, flags, refused):
    """RL_CHECK_ONLY (how experiments/ checks the flags it passes): good flags exit 0 with nothing on disk; bad ones
    give the script's own one-line refusal and exit 2, wherever it is made before Run.begin: the flags, Run's own
    checks, the sizes the machine cannot hold."""
    import subprocess

    path = str(Path(__file__).resolve().parents[1] / "algos" / f"{script}.py")
    env = {**os.environ, "RL_CHECK_ONLY": "1"}
    out = ["--out-dir", str(tmp_path / "runs")]
    if script == "dqn_atari":  # good flags (one script is enough): every check passes, exit 0, nothing written
        ok = subprocess.run([sys.executable, path, "--preset", "cartpole", *out], env=env, capture_output=True, text=True)
        assert ok.returncode == 0 and not ok.stdout.strip(), ok.stderr
    bad = subprocess.run([sys.executable, path, *flags, *out], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip().startswith(f"error: {refused}"), bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_begin_refuses_an_act_that_evaluation_would_never_fully_call(tmp_path):
    """Run.begin checks the evaluation act first (shared.evaluation.check_act): a renamed keyword is a TypeError
    before the run folder exists, not an evaluation that silently drops it."""
    run = Run(FakeArgs(out_dir=str(tmp_path)), "script", make_env, action_space=gym.spaces.Discrete).setup()
    with pytest.raises(TypeError, match="masks"):
        run.begin(lambda obs, masks=None: 0, model=torch.nn.Linear(2, 2))
    assert not (tmp_path / "r").exists()
