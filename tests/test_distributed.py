"""Training under torchrun (shared/distributed.py) on CPU with gloo: averaged gradients against the gradient of
the whole batch, learning with 2 ranks, two "nodes" on this machine, statistics of every rank, a killed rank,
Ctrl-C, bad arguments, resuming on another world size."""

from __future__ import annotations

import contextlib
import csv
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from shared import distributed
from tests import dist_updates
from tests.helpers import ROOT, assert_no_leftovers, progress, script

PPO_CARTPOLE = [
    "--env-id",
    "CartPole-v1",
    "--num-envs",
    "4",
    "--num-steps",
    "32",
    "--num-minibatches",
    "1",
    "--update-epochs",
    "20",
    "--gae-lambda",
    "0.8",
    "--gamma",
    "0.98",
    "--ent-coef",
    "0",
    "--learning-rate",
    "1e-3",
    "--clip-coef",
    "0.2",
    "--no-clip-vloss",
    "--eval-episodes",
    "0",
]
DQN_CARTPOLE = [
    "--env-id",
    "CartPole-v1",
    "--num-envs",
    "2",
    "--buffer-size",
    "50000",
    "--min-steps-learn",
    "1000",
    "--batch-size",
    "64",
    "--optimizer",
    "adam",
    "--eps-decay-steps",
    "20000",
    "--eps-end",
    "0.02",
    "--n-step-return",
    "3",
    "--replay-ratio",
    "16",
    "--learning-rate",
    "1e-3",
    "--dueling",
    "--target-update-interval",
    "250",
    "--eval-episodes",
    "0",
]
PENDULUM = ["--env-id", "Pendulum-v1", "--min-steps-learn", "1000", "--log-every", "1000", "--eval-episodes", "0"]


def torchrun(*args: str, nproc: int = 2, extra: tuple[str, ...] = ("--standalone",)) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *extra, "--nproc-per-node", str(nproc), *args]


def launch(cmd: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (torchrun starts each rank in a session of its own,
    so the launcher's session does not cover them; every test passes its own tmp_path)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text.encode() in cmd and state != "Z" and int(entry) != os.getpid():
            pids.append(int(entry))
    return pids


def wait(proc: subprocess.Popen, timeout: float, tag: str) -> tuple[int, str, str]:
    """Return code, stdout and stderr; fails the test (killing what it started) on a timeout or when a process
    whose command line holds ``tag`` is left behind."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *mentioning(tag)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"did not end within {timeout} s\n{out[-2000:]}\n{err[-3000:]}") from None
    assert_no_leftovers(proc.pid)
    deadline = time.time() + 5
    while mentioning(tag) and time.time() < deadline:
        time.sleep(0.1)
    left = mentioning(tag)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"
    return proc.returncode, out, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """What torchrun sets for a rank (for tests that need each rank's own exit code)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------- one process


def test_without_torchrun_everything_is_the_identity(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    x = torch.randn(100, dtype=torch.float64)
    mean, std = distributed.mean_std(x)
    assert mean == x.mean() and std == x.std()
    assert distributed.any_rank(True) == [True] and distributed.any_rank(False, True) == [False, True]
    assert distributed.min_over_ranks(7) == 7 and distributed.gather_objects("a") == ["a"]
    assert not distributed.in_lockstep() and distributed.rank_seed(5) == 5 and distributed.env_seed(5, 8) == 5
    distributed.start(torch.device("cpu"))  # a no-op with one process: no process group
    assert not torch.distributed.is_initialized()


def test_every_env_of_every_rank_gets_its_own_seed(monkeypatch):
    seeds = []
    for r in range(4):
        monkeypatch.setenv("RANK", str(r))
        base = distributed.env_seed(1, 8)
        seeds += [base + i for i in range(8)]  # gymnasium seeds env i with seed + i
    assert len(set(seeds)) == 32
    monkeypatch.setenv("RANK", "1")
    assert distributed.rank_seed(1) != 1


# ---------------------------------------------------------------------------------------------- two ranks


@pytest.mark.parametrize("graphed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_averaged_gradients_equal_the_gradient_of_the_whole_batch_and_rows_cover_every_rank(graphed, tmp_path):
    """PPO (on-policy), DQN (value-based) and DDPG (actor-critic): two ranks with half a batch each end with the
    parameters one process reaches on the whole batch; the ranks' parameters are identical; a nudged parameter
    is caught; a progress row counts every rank's episodes. ``graphed``: the ranks run the --compile protocol
    (shared.compiling.graphed: static inputs, the all-reduce through ``collective``; aot_eager), the single
    process eager."""
    port, out = free_port(), tmp_path / "ranks.pt"
    env = {"DIST_GRAPHED": "1", "RL_COMPILE_BACKEND": "aot_eager", "RL_COMPILE_STRICT": "1"} if graphed else {}
    procs = [
        launch([sys.executable, "-m", "tests.dist_updates", str(out), str(tmp_path)], {**rank_env(r, 2, port), **env})
        for r in range(2)
    ]
    for p in procs:
        rc, _, err = wait(p, 180, str(tmp_path))
        assert rc == 0, err[-3000:]
    report = torch.load(out, weights_only=False)
    whole, halves = dist_updates.updates(None), report["ranks"]
    assert whole.keys() == halves[0].keys()
    for k, v in whole.items():
        torch.testing.assert_close(halves[0][k], v, rtol=1e-5, atol=1e-6, msg=k)
        assert torch.equal(halves[0][k], halves[1][k]), k
    one_half = dist_updates.updates(0)  # the test can fail: half a batch alone is not the whole batch's update
    assert any(not torch.allclose(one_half[k], v, rtol=1e-5, atol=1e-6) for k, v in whole.items())

    assert all("Actor" in m and "[1]" in m for m in report["diverged"]), report["diverged"]
    assert report["stop"] == [True, True]  # mean of 1, 2, 3, 10 is 4 >= 3.9 on both ranks
    with open(tmp_path / "rows" / "progress.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert row["episodes"] == "4" and float(row["return_mean"]) == 4.0
    assert float(row["loss"]) == 0.5 and row["updates"] == "7"  # a mean over ranks; a value equal on both stays


def _reached(stdout: str, threshold: str) -> int:
    m = re.search(rf"mean return of the last \d+ episodes (-?[\d.]+) >= {threshold} at step (\d+)", stdout)
    assert m, stdout[-2000:]
    return int(m.group(2))


# All with the slow tests (pytest -m slow), for CI's 30 minutes: PPO's (40 s on 2 cores) is checked in CI in its
# parts. Each update of two ranks is the whole batch's update of one process, the stop rule is agreed by the
# ranks and a row counts every rank's episodes (test_averaged_gradients_equal_..._rows_cover_every_rank); each env
# of each rank has a seed of its own (test_every_env_of_every_rank_gets_its_own_seed); a two-rank PPO job runs to
# its end with one console (test_two_nodes_on_this_machine, test_a_two_rank_run_resumes_in_one_process); one
# process with the same settings learns (test_ppo.py's test_ppo_learns_cartpole_in_every_mode).
@pytest.mark.parametrize(
    "name, flags, threshold, steps",
    [
        pytest.param("ppo_atari.py", PPO_CARTPOLE, "450.0", 150_000, marks=pytest.mark.slow),
        pytest.param("dqn_atari.py", DQN_CARTPOLE, "475.0", 100_000, marks=pytest.mark.slow),
        pytest.param("sac_mujoco.py", PENDULUM, "-250.0", 20_000, marks=pytest.mark.slow),
        pytest.param(
            "ppo_mujoco.py",
            ["--preset", "pendulum", "--num-envs", "4", "--eval-episodes", "0"],
            "500.0",
            150_000,
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "ppo_lstm.py",
            ["--preset", "cartpole", "--num-envs", "4", "--eval-episodes", "0"],
            "475.0",
            150_000,
            marks=pytest.mark.slow,
        ),
    ],
    ids=["ppo", "dqn", "sac", "ppo_mujoco", "ppo_lstm"],
)
def test_two_ranks_learn_as_one_process_does(name, flags, threshold, steps, tmp_path):
    """The single-process tests' thresholds and step budgets (the job's steps), with half the envs per rank."""
    cmd = torchrun(
        script(name),
        *flags,
        "--total-timesteps",
        str(steps),
        "--stop-at-return",
        threshold,
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    )
    rc, out, err = wait(launch(cmd), 600, str(tmp_path))
    assert rc == 0, err[-3000:]
    assert _reached(out, threshold) <= steps
    assert len(re.findall("mean return of the last", out)) == 1  # rank 1 prints nothing on stdout
    rows = progress(tmp_path / "r")
    assert [int(r["global_step"]) for r in rows] == sorted({int(r["global_step"]) for r in rows})
    assert (tmp_path / "r" / "checkpoint.pt").exists()


@pytest.mark.slow  # 14 s, for CI's 30 minutes; two ranks on one node stay in CI
def test_two_nodes_on_this_machine(tmp_path):
    """Two torchrun launches, one process each, meeting at 127.0.0.1 (as two machines would)."""
    port = free_port()
    flags = [script("ppo_atari.py"), *PPO_CARTPOLE, "--total-timesteps", "2048", "--out-dir", str(tmp_path), "--run-name", "r"]
    nodes = [
        launch(
            torchrun(
                *flags,
                nproc=1,
                extra=("--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1", "--master-port", str(port)),
            )
        )
        for n in range(2)
    ]
    outs = []
    for n in nodes:
        rc, out, err = wait(n, 300, str(tmp_path))
        assert rc == 0, err[-3000:]
        outs.append(out)
    rows = progress(tmp_path / "r")
    steps = [int(r["global_step"]) for r in rows]
    assert steps[-1] == 2048 and steps == sorted(set(steps))  # 2 ranks x 4 envs x 32 steps x 8 iterations
    assert "step      2048/2048" in outs[0] and "step " not in outs[1]  # rank 1 prints nothing on stdout
    assert (tmp_path / "r" / "checkpoint.pt").exists()


def test_a_killed_rank_ends_the_job_within_60_s(tmp_path):
    proc = launch(
        torchrun(
            script("dqn_atari.py"),
            *DQN_CARTPOLE,
            "--total-timesteps",
            "10000000",
            "--checkpoint-every",
            "2000",
            "--log-every",
            "500",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            "r",
        )
    )
    ckpt = tmp_path / "r" / "checkpoint.pt"
    wait_for(ckpt.exists, 120, "a checkpoint")

    def rank1() -> int | None:
        for pid in mentioning(str(tmp_path)):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if b"RANK=1" in f.read().split(b"\0"):
                        return pid
            except OSError:
                continue
        return None

    wait_for(lambda: rank1() is not None, 30, "rank 1")
    os.kill(rank1(), signal.SIGKILL)
    t0 = time.time()
    rc, _, err = wait(proc, 90, str(tmp_path))
    assert rc != 0 and time.time() - t0 < 60
    assert "error: rank 0 lost contact with another rank" in err, err[-3000:]
    torch.load(ckpt, weights_only=True)  # the last checkpoint is intact


@pytest.mark.parametrize("sampler", ["serial", pytest.param("async", marks=pytest.mark.slow)])
def test_ctrl_c_checkpoints_and_every_rank_exits_130(sampler, tmp_path):
    """Each rank started as torchrun starts it, so that each one's exit code can be read."""
    port = free_port()
    args = [
        script("ppo_atari.py"),
        *PPO_CARTPOLE,
        "--total-timesteps",
        "10000000",
        "--sampler",
        sampler,
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    ]
    ranks = [launch([sys.executable, *args], rank_env(r, 2, port)) for r in range(2)]
    wait_for(lambda: (tmp_path / "r" / "progress.csv").exists() and len(progress(tmp_path / "r")) >= 2, 120, "progress rows")
    for r in ranks:  # as the terminal does: every process gets SIGINT
        os.killpg(r.pid, signal.SIGINT)
    results = [wait(r, 60, str(tmp_path)) for r in ranks]
    assert [rc for rc, _, _ in results] == [130, 130], results[0][2][-2000:] + results[1][2][-2000:]
    state = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert int(progress(tmp_path / "r")[-1]["global_step"]) == state["global_step"]


@pytest.mark.parametrize("who", ["torchrun", "every process"])
def test_sigterm_to_torchrun_checkpoints_and_ends_every_rank_and_torchrun_reports_it_as_documented(who, tmp_path):
    """What docs/contract.md says a user sees: SIGTERM to torchrun alone (kill, a launcher) or to every process of
    the job (SLURM's preemption and scancel): torchrun forwards it, the ranks agree on it, rank 0 writes the
    checkpoint of the last row's step, every rank ends before torchrun's grace period (no SIGKILL), nothing is
    left; torchrun itself then exits 1 with its own SignalException traceback (torch's code, not the script's)."""
    proc = launch(
        torchrun(
            script("ppo_atari.py"),
            *PPO_CARTPOLE,
            "--total-timesteps",
            "10000000",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            "r",
        )
    )
    wait_for(lambda: (tmp_path / "r" / "progress.csv").exists() and len(progress(tmp_path / "r")) >= 2, 120, "progress rows")
    # every process once, as SLURM signals them: torchrun's command line mentions tmp_path too, and a second SIGTERM
    # inside its handler raced its death-signal line with a traceback of its own
    for pid in [proc.pid] if who == "torchrun" else {proc.pid, *mentioning(str(tmp_path))}:
        os.kill(pid, signal.SIGTERM)
    rc, out, err = wait(proc, 90, str(tmp_path))
    assert rc == 1, err[-3000:]
    assert re.search(r"interrupted at step \d+: writing checkpoint", out), out[-2000:]
    assert err.strip().splitlines()[-1].endswith(f"SignalException: Process {proc.pid} got signal: 15"), err[-2000:]
    assert "SIGKILL" not in err and "Traceback" not in err.split("Received 15 death signal")[0], err[-3000:]
    state = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert int(progress(tmp_path / "r")[-1]["global_step"]) == state["global_step"]


def test_bad_arguments_exit_2_on_every_rank_before_the_group_starts(tmp_path):
    cmd = torchrun(script("ppo_atari.py"), "--num-envs", "0", "--out-dir", str(tmp_path))
    rc, out, err = wait(launch(cmd), 120, str(tmp_path))
    assert rc != 0 and "error: --num-envs must be positive, got 0" in err, err[-3000:]
    assert re.search(r"exitcode\s*: 2 ", err), err[-3000:]  # the root cause torchrun reports: a rank's exit 2
    # torchrun SIGTERMs the other ranks once one has failed (the second may not get to its line): each rank's own
    # exit code and line, from ranks started alone
    port = free_port()
    ranks = [
        launch([sys.executable, script("ppo_atari.py"), "--num-envs", "0", "--out-dir", str(tmp_path)], rank_env(r, 2, port))
        for r in range(2)
    ]
    for r in ranks:
        rc, _, err = wait(r, 60, str(tmp_path))
        assert rc == 2 and err.strip().splitlines() == ["error: --num-envs must be positive, got 0"], err


def test_a_two_rank_run_resumes_in_one_process(tmp_path):
    rc, _, err = wait(
        launch(
            torchrun(
                script("ppo_atari.py"),
                *PPO_CARTPOLE,
                "--total-timesteps",
                "2048",
                "--out-dir",
                str(tmp_path),
                "--run-name",
                "r",
            )
        ),
        300,
        str(tmp_path),
    )
    assert rc == 0, err[-3000:]
    # bare: the run's flags come back from its folder
    rc, out, err = wait(
        launch([sys.executable, script("ppo_atari.py"), "--total-timesteps", "3072", "--resume", str(tmp_path / "r")]),
        300,
        str(tmp_path),
    )
    assert rc == 0, err[-3000:]
    steps = [int(r["global_step"]) for r in progress(tmp_path / "r")]
    assert steps[-1] == 3072 and steps == sorted(set(steps))
