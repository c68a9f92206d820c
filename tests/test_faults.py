"""Crashes, resumes and bad input, for every script: a run killed with SIGKILL after a checkpoint resumes with
every statistic right; checkpoints that do not fit, run folders that cannot be made and a full disk each get one
clear line."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from shared import checkpoint
from shared.files import WriteError
from tests.helpers import ROOT, assert_no_leftovers, progress, refusal, run, script

# Tiny jobs that log and checkpoint often: (flags, steps between checkpoints).
DISCRETE_REPLAY = [
    "--env-id",
    "CartPole-v1",
    "--num-envs",
    "2",
    "--buffer-size",
    "2000",
    "--min-steps-learn",
    "200",
    "--batch-size",
    "16",
    "--log-every",
    "50",
]
JOBS = {
    "ppo_atari.py": ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "16"],
    "a2c_atari.py": ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "8", "--log-every", "2"],
    "dqn_atari.py": DISCRETE_REPLAY,
    "catdqn_atari.py": DISCRETE_REPLAY,
    "r2d1_atari.py": [
        "--env-id",
        "CartPole-v1",
        "--num-envs",
        "2",
        "--hidden",
        "16",
        "--sequence-length",
        "4",
        "--burn-in-steps",
        "2",
        "--rnn-state-interval",
        "4",
        "--batch-size",
        "4",
        "--min-steps-learn",
        "200",
        "--buffer-size",
        "2000",
        "--log-every",
        "50",
        "--replay-ratio",
        "4",
    ],
    "ddpg_mujoco.py": [
        "--env-id",
        "Pendulum-v1",
        "--min-steps-learn",
        "300",
        "--batch-size",
        "32",
        "--replay-ratio",
        "32",
        "--log-every",
        "50",
        "--hidden",
        "32",
    ],
    "td3_mujoco.py": [
        "--env-id",
        "Pendulum-v1",
        "--min-steps-learn",
        "300",
        "--batch-size",
        "32",
        "--replay-ratio",
        "32",
        "--log-every",
        "50",
        "--hidden",
        "32",
    ],
    "ppo_mujoco.py": [
        "--env-id",
        "Pendulum-v1",
        "--num-envs",
        "2",
        "--num-steps",
        "16",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "2",
    ],
    "ppo_lstm.py": [
        "--env-id",
        "CartPole-v1",
        "--observe-indices",
        "0",
        "2",
        "--num-envs",
        "2",
        "--num-steps",
        "16",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "2",
        "--hidden",
        "16",
    ],
    "sac_mujoco.py": [
        "--env-id",
        "Pendulum-v1",
        "--min-steps-learn",
        "300",
        "--batch-size",
        "32",
        "--replay-ratio",
        "32",
        "--log-every",
        "50",
        "--hidden",
        "32",
    ],
}


def kill_after_checkpoint(
    name: str,
    run_dir: Path,
    flags: list[str],
    timeout: float = 120,
    every: tuple[str, ...] = ("--checkpoint-every", "400"),
    past: int = 100,
) -> int:
    """Start a long run that checkpoints every 400 steps (or as ``every`` says); SIGKILL it once it has logged
    rows past a checkpoint (as the OOM killer or a preemption would); returns the checkpoint's step."""
    proc = subprocess.Popen(
        [
            sys.executable,
            script(name),
            *flags,
            "--total-timesteps",
            "10000000",
            *every,
            "--eval-episodes",
            "0",
            "--out-dir",
            str(run_dir.parent),
            "--run-name",
            run_dir.name,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.time() + timeout
    try:
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.time() < deadline, "no checkpoint with rows past it in time"
            ckpt = run_dir / "checkpoint.pt"
            if ckpt.exists() and (run_dir / "progress.csv").exists():
                step = torch.load(ckpt, weights_only=True)["global_step"]
                rows = progress(run_dir)
                if rows and int(rows[-1]["global_step"]) > step + past:
                    break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert_no_leftovers(proc.pid)
    return int(torch.load(run_dir / "checkpoint.pt", weights_only=True)["global_step"])


# On-policy and replay in CI; the recurrent and continuous kinds (r2d1, sac, ppo_mujoco) and A2C, C51, DDPG and
# TD3, whose checkpoint code is their sibling's, with the slow tests, for CI's 30 minutes.
@pytest.mark.parametrize(
    "name", [n if n in ("ppo_atari.py", "dqn_atari.py") else pytest.param(n, marks=pytest.mark.slow) for n in JOBS]
)
def test_a_killed_run_resumes_with_monotonic_steps_and_cumulative_counts(name, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    run_dir = tmp_path / "r"
    ckpt_step = kill_after_checkpoint(name, run_dir, JOBS[name])
    saved = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert saved["script"] == name[:-3] and saved["run"]["episodes"] > 0
    out = run(
        name,
        *JOBS[name],
        "--total-timesteps",
        str(ckpt_step + 600),
        "--eval-episodes",
        "0",
        "--resume",
        str(run_dir),
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = progress(run_dir)
    steps = [int(r["global_step"]) for r in rows]
    assert all(a < b for a, b in zip(steps, steps[1:])), steps
    assert steps[-1] > ckpt_step + 500
    episodes = [int(r["episodes"]) for r in rows]
    assert all(a <= b for a, b in zip(episodes, episodes[1:])), episodes
    after = [int(r["episodes"]) for r in rows if int(r["global_step"]) > ckpt_step]
    assert after[0] >= saved["run"]["episodes"]  # continued from the checkpoint's count, not from 0
    wall = [float(r["wall_time_s"]) for r in rows]
    assert all(a <= b for a, b in zip(wall, wall[1:])), wall
    acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    tb_steps = [e.step for e in acc.Scalars("charts/SPS")]
    assert tb_steps == steps  # the killed run's events past the checkpoint are purged


def test_checkpoints_by_wall_time_alone_keep_a_killed_run(tmp_path):
    run_dir = tmp_path / "r"
    ckpt_step = kill_after_checkpoint(
        "dqn_atari.py", run_dir, DISCRETE_REPLAY, every=("--checkpoint-every", "0", "--checkpoint-minutes", "0.05"), past=0
    )
    assert ckpt_step > 0  # written by the clock: no step interval was given
    out = run(
        "dqn_atari.py",
        *DISCRETE_REPLAY,
        "--total-timesteps",
        str(ckpt_step + 300),
        "--eval-episodes",
        "0",
        "--resume",
        str(run_dir),
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [int(r["global_step"]) for r in progress(run_dir)]
    assert steps[-1] >= ckpt_step + 300 and all(a < b for a, b in zip(steps, steps[1:])), steps


def test_the_stop_criterion_row_is_logged(tmp_path):
    out = run(
        "dqn_atari.py",
        *DISCRETE_REPLAY,
        "--total-timesteps",
        "20000",
        "--log-every",
        "100000",
        "--stop-at-return",
        "15",
        "--eval-episodes",
        "0",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    stopped = int(out.stdout.split(" at step ")[1].split(":")[0])
    assert int(progress(tmp_path / "r")[-1]["global_step"]) == stopped


def test_an_out_dir_that_cannot_be_made_exits_2(tmp_path):
    lines = refusal("ppo_atari.py", "--env-id", "CartPole-v1", "--out-dir", "/proc/no/such/dir")  # in this process
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: --out-dir /proc/no/such/dir: cannot create a run folder there")


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ppo")
    out = run(
        "ppo_atari.py",
        *JOBS["ppo_atari.py"],
        "--total-timesteps",
        "64",
        "--eval-episodes",
        "0",
        "--out-dir",
        str(out_dir),
        "--run-name",
        "r",
    )
    assert out.returncode == 0, out.stderr
    return out_dir / "r"


def test_resuming_another_scripts_checkpoint_exits_2_naming_it(ppo_run):
    lines = refusal("dqn_atari.py", *DISCRETE_REPLAY, "--resume", str(ppo_run), setup=True)  # read by run.begin
    assert len(lines) == 1 and "written by ppo_atari, not dqn_atari" in lines[0], lines


def test_resuming_with_a_flag_that_changes_the_network_exits_2_naming_the_flag(tmp_path):
    first = run(
        "dqn_atari.py",
        *DISCRETE_REPLAY,
        "--total-timesteps",
        "40",
        "--eval-episodes",
        "0",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    )
    assert first.returncode == 0, first.stderr
    # The run folder records its flags: refused while parsing, before anything starts.
    lines = refusal("dqn_atari.py", "--dueling", "--resume", str(tmp_path / "r"))
    assert len(lines) == 1 and "--dueling is the run's own setting (False there, True given)" in lines[0], lines
    # A folder from before flags were recorded: the checkpoint's tensors do not fit, read by run.begin after
    # run.setup() (in this process), and the line names the flag that differs.
    for config in (tmp_path / "r").glob("config*.json"):
        config.unlink()
    lines = refusal("dqn_atari.py", *DISCRETE_REPLAY, "--dueling", "--resume", str(tmp_path / "r"), setup=True)
    lines = [ln for ln in lines if not ln.startswith("note: --resume")]  # the line saying the flags must be given
    assert len(lines) == 1 and "--dueling (False there, True here)" in lines[0], lines


def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    ckpt = tmp_path / "checkpoint.pt"
    checkpoint.save(ckpt, {"global_step": 1, "w": torch.ones(3)})

    def full_disk(state, path):  # torch writes part of the file, then fails as it does on ENOSPC
        Path(path).write_bytes(b"x" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full_disk)
    monkeypatch.setattr("shutil.disk_usage", lambda p: type("U", (), {"free": 0})())
    with pytest.raises(WriteError, match=r"cannot write .*checkpoint.pt: no space left on the device"):
        checkpoint.save(ckpt, {"global_step": 2, "w": torch.zeros(3)})
    monkeypatch.undo()
    assert torch.load(ckpt, weights_only=True)["global_step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_full_disk_while_logging_is_one_line_and_exit_1(tmp_path, capsys):
    from tests.test_run import new_run

    run, _ = new_run(tmp_path)

    class FullFile:
        closed = False

        def write(self, _):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            self.closed = True

    with run:
        import csv

        run.progress._csv_file = FullFile()
        run.progress._csv = csv.writer(run.progress._csv_file)
        run.periodic(100)  # a row is due; no new column: the open file is written
    assert run.exit_code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"error: cannot write {run.path / 'progress.csv'}: No space left on device"


def test_a_3mb_disk_ends_the_run_with_one_line_and_no_temporary_file(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=3m tmpfs {mount}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no user and mount namespaces here to mount a small tmpfs")
    cmd = (
        f"mount -t tmpfs -o size=3m tmpfs {mount} && {sys.executable} {script('ppo_atari.py')} --num-envs 2 "
        f"--num-steps 16 --total-timesteps 64 --eval-episodes 0 --out-dir {mount} --run-name r; "
        f"echo EXIT $?; ls -a {mount}/r"
    )
    out = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert "EXIT 1" in out.stdout, out.stdout + out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot write ") and "checkpoint.pt" in last and "o space left" in last, last
    assert ".checkpoint.pt.tmp" not in out.stdout  # the partial file was removed


SLOW_BEGIN = """import runpy, sys, time
sys.path.insert(0, {root!r})
import shared.run

begin = shared.run.Run.begin


def slow(self, *args, **kwargs):  # the setup before the loop (a checkpoint or a replay loading), made long
    open({mark!r}, "w").close()
    time.sleep(60)
    return begin(self, *args, **kwargs)


shared.run.Run.begin = slow
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_ctrl_c_before_the_loop_is_one_line_not_a_traceback(tmp_path):
    """Ctrl-C while a script still sets up (no ``with run:`` yet to catch it): one line, the process ended by the
    signal (a shell's 130), nothing left running."""
    mark, wrapper = tmp_path / "setting-up", tmp_path / "slow_begin.py"
    wrapper.write_text(SLOW_BEGIN.format(root=str(ROOT), mark=str(mark)))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(wrapper),
            script("ppo_atari.py"),
            "--env-id",
            "CartPole-v1",
            "--total-timesteps",
            "1000",
            "--out-dir",
            str(tmp_path / "runs"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while not mark.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGINT, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and lines[-1] == "interrupted (signal 2) outside the training loop", err[-3000:]
    assert_no_leftovers(proc.pid)
