"""experiments/launch.py: the grid, slots and pinning, Ctrl-C and resuming, failing variants, --dry-run, submitit.

The runs are tiny CartPole runs of algos/ppo_atari.py over slots of one physical core."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments import launch
from experiments.display import Display
from experiments.flags import CHECK_ONLY
from experiments.grid import LaunchError, build_grid, load_file, split_flags
from experiments.records import begin_attempt, end_attempt
from experiments.slots import child_env, make_slots
from experiments.status import progress_of
from shared.affinity import physical_cores, slot_code
from shared.procs import descendants, process_table
from tests.helpers import ROOT, assert_no_leftovers, progress

LAUNCH = str(ROOT / "experiments" / "launch.py")
TINY = ["--preset", "cartpole", "--eval-episodes", "1"]
GRID = [
    "--scripts",
    "ppo_atari",
    "--env-ids",
    "CartPole-v1",
    "--seeds",
    "1",
    "2",
    "--level",
    "lr1e-3:--learning-rate 1e-3",
    "lr3e-4:--learning-rate 3e-4",
]
RUNS = [f"ppo_atari/CartPole-v1/{v}/seed{s}" for v in ("lr1e-3", "lr3e-4") for s in (1, 2)]
two_cores = pytest.mark.skipif(len(physical_cores()) < 2, reason="needs two physical cores for two slots")


def command(root: Path, *extra: str, total: int = 2048, grid=GRID) -> list[str]:
    return [
        sys.executable,
        LAUNCH,
        str(root),
        *grid,
        "--cores-per-run",
        "1",
        "--plain",
        *extra,
        "--",
        *TINY,
        "--total-timesteps",
        str(total),
    ]


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"launcher did not end in {timeout} s\n{out[-3000:]}\n{err[-3000:]}") from None
    assert_no_leftovers(proc.pid)
    return out, err


def children(pid: int) -> dict[int, dict]:
    """The launcher's running scripts: pid -> run folder, allowed CPUs, OMP_NUM_THREADS."""
    out = {}
    for entry in [stat.pid for stat in process_table().values() if stat.ppid == pid]:
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().decode().split("\0")
            if not any(c.endswith("ppo_atari.py") for c in cmd):  # forked, not yet the script
                continue
            with open(f"/proc/{entry}/status") as f:
                allowed = next(ln.split(":")[1].strip() for ln in f if ln.startswith("Cpus_allowed_list"))
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(kv.split("=", 1) for kv in f.read().decode().split("\0") if "=" in kv)
        except (OSError, StopIteration, ValueError):
            continue
        if not env:  # it exited between the reads: an ended process's environ reads empty (its memory is gone)
            continue
        if env.get(CHECK_ONLY):  # the launcher's check of the flags (experiments/flags.py) before any run: not a run
            continue
        folder = Path(cmd[cmd.index("--out-dir") + 1]) / cmd[cmd.index("--run-name") + 1]
        out[int(entry)] = {"folder": folder, "cpus": launch_cpus(allowed), "omp": env.get("OMP_NUM_THREADS")}
    return out


def launch_cpus(text: str) -> set[int]:
    cpus = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def record(root: Path, rel: str) -> dict:
    return json.loads((root / rel / "launch.json").read_text())


def assert_steps_increase(folder: Path) -> list[int]:
    steps = [int(r["global_step"]) for r in progress(folder)]
    assert steps and all(b > a for a, b in zip(steps, steps[1:])), steps
    return steps


# ---------------------------------------------------------------------------------------------- pure parts


def test_grid_from_file_crosses_levels_and_names_folders(tmp_path):
    cfg = tmp_path / "exp.toml"
    cfg.write_text(
        'scripts = ["ppo_atari", "a2c_atari"]\nenv_ids = ["CartPole-v1"]\nseeds = [3, 4]\n'
        'flags = "--preset cartpole"\n'
        '[[levels]]\nlr1 = "--learning-rate 1e-3"\nlr2 = "--learning-rate 2e-3"\n'
        '[[levels]]\nn4 = ["--num-envs", "4"]\nddp = "--num-envs 2 --nproc-per-node 2"\n'
    )
    data = load_file(cfg)
    runs = build_grid(
        tmp_path, data["scripts"], data["env_ids"], data["seeds"], split_flags(data["flags"], ""), data["levels"]
    )
    assert len(runs) == 2 * 2 * 2 * 2
    assert runs[0].rel == "ppo_atari/CartPole-v1/lr1+n4/seed3"
    ddp = next(r for r in runs if r.rel == "a2c_atari/CartPole-v1/lr2+ddp/seed4")
    assert ddp.nproc == 2 and "--nproc-per-node" not in ddp.flags()
    assert ddp.command()[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    flags = ddp.flags()
    assert flags[:6] == ["--preset", "cartpole", "--learning-rate", "2e-3", "--num-envs", "2"]
    assert flags[flags.index("--out-dir") + 1] == str(ddp.folder.parent) and flags[-1] == "seed4"
    assert ddp.command(resume=True)[-2:] == ["--resume", str(ddp.folder)]
    with pytest.raises(LaunchError, match="--seed is set by the launcher"):
        build_grid(tmp_path, ["ppo_atari"], [], [1], ["--seed", "3"], [])
    with pytest.raises(LaunchError, match="no script"):
        build_grid(tmp_path, ["no_such_script"], [], [1], [], [])


def test_slots_keep_hyperthreads_together_and_share_gpus():
    cores = [(0, 4), (1, 5), (2, 6), (3, 7)]  # 4 physical cores, 2 hyperthreads each
    slots = make_slots(cores, 2)
    assert [s.cpus for s in slots] == [(0, 1, 4, 5), (2, 3, 6, 7)] and all(s.cores == 2 for s in slots)
    assert [s.gpus for s in make_slots(cores, 1, n_gpus=2)] == [("0",), ("1",), ("0",), ("1",)]
    assert [s.gpus for s in make_slots(cores, 1, n_gpus=2, gpus_per_run=1)] == [("0",), ("1",)]
    assert len(make_slots(cores, 1, n_gpus=1, runs_per_gpu=3)) == 3
    hidden = make_slots(cores, 1, n_gpus=2, gpus_per_run=0)
    env = child_env(hidden[:1], base={})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["OMP_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1"
    assert child_env(make_slots(cores, 2, n_gpus=2)[1:], base={})["CUDA_VISIBLE_DEVICES"] == "1"
    with pytest.raises(LaunchError):
        make_slots(cores, 5)
    real = physical_cores()  # on this machine's topology the codes are shared/affinity.py's slot codes
    n = len(real)
    assert [s.code for s in make_slots(real, 1)] == [slot_code(i, n) for i in range(n)]


def test_fresh_start_sets_stale_files_aside_and_status_reads_progress(tmp_path):
    run = build_grid(tmp_path, ["ppo_atari"], ["CartPole-v1"], [1], ["--total-timesteps", "1000"], [])[0]
    run.folder.mkdir(parents=True)
    (run.folder / "config.json").write_text(json.dumps({"args": {"total_timesteps": 1000}}))
    (run.folder / "progress.csv").write_text(
        "global_step,wall_time_s,sps,episodes,return_mean,loss\n250,1.0,250.0,3,12.5,0.1\r\n500,2.0,100.0,3,,0.1\r\n600,2"
    )
    p = progress_of(run)  # the last complete row; the latest return; a row being written is skipped
    assert p == {"step": 500, "total": 1000, "return": 12.5, "sps": 100.0}
    records = {run.rel: {"state": "running", "attempts": []}}
    assert Display([run], records, plain=True, status_every=0).summary_line().endswith("ETA 5s")
    # no checkpoint: the earlier attempt's files move to .stale/1 and the script starts afresh
    cmd, attempt = begin_attempt(run, {"attempts": []}, None)
    assert "--resume" not in cmd and not attempt["resumed"]
    assert sorted(p.name for p in (run.folder / ".stale" / "1").iterdir()) == ["config.json", "progress.csv"]
    assert not (run.folder / "progress.csv").exists()
    (run.folder / "checkpoint.pt").write_bytes(b"x")  # a checkpoint: resumed in place
    cmd, attempt = begin_attempt(run, {"attempts": []}, None)
    assert cmd[-2:] == ["--resume", str(run.folder)] and attempt["resumed"] and (run.folder / "checkpoint.pt").exists()


def test_a_torchrun_job_ended_by_a_signal_the_launcher_did_not_send_is_interrupted_not_failed(tmp_path):
    """SLURM's preemption SIGTERMs every process of the job: the ranks checkpoint and exit 130, torchrun exits 1
    with its SignalException (tests/test_distributed.py shows it); the attempt is interrupted, and resumes."""
    ddp = build_grid(tmp_path, ["ppo_atari"], ["CartPole-v1"], [1], [], [], nproc=2)[0]
    one = build_grid(tmp_path, ["a2c_atari"], ["CartPole-v1"], [1], [], [])[0]
    for run in (ddp, one):
        run.folder.mkdir(parents=True)
        record = {"attempts": [{"stderr_offset": 0}], "state": "running"}
        (run.folder / "stderr.log").write_text(
            "W1126 api.py:753] Received 15 death signal, shutting down workers\n"
            "Traceback (most recent call last):\n  ...\ntorch.distributed.elastic."
            "multiprocessing.api.SignalException: Process 10112 got signal: 15\n"
        )
        assert end_attempt(run, record, 1, signalled=False) == ("interrupted" if run is ddp else "failed")
    record = {"attempts": [{"stderr_offset": 0}], "state": "running"}
    (ddp.folder / "stderr.log").write_text("error: rank 1 lost contact with another rank\n")
    assert end_attempt(ddp, record, 1, signalled=False) == "failed"


def test_bad_launcher_arguments_exit_2(tmp_path, capsys):
    assert launch.main([str(tmp_path / "x"), "--scripts", "ppo_atari", "--seeds", "1", "--level", "no-colon"]) == 2
    assert capsys.readouterr().err.startswith("error: --level 1")
    assert launch.main([str(tmp_path / "x"), "--scripts", "ppo_atari", "--seeds", "1", "--", "--run-name", "a"]) == 2
    assert not (tmp_path / "x").exists()


def test_dry_run_prints_every_run_and_changes_nothing(tmp_path):
    root = tmp_path / "exp"
    (root / RUNS[0]).mkdir(parents=True)
    (root / RUNS[0] / "checkpoint.pt").write_bytes(b"x")  # an interrupted run: it would be resumed
    before = sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    out = subprocess.run(command(root, "--dry-run"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted((str(p), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
    for rel in RUNS:
        assert rel in out.stdout
    assert out.stdout.count("--out-dir") == 4 and "--resume" in out.stdout and "resume " in out.stdout
    assert "slot 0: cpus" in out.stdout and "OMP_NUM_THREADS=" in out.stdout


# ---------------------------------------------------------------------------------------------- real runs


@two_cores
def test_four_runs_over_two_pinned_slots(tmp_path):
    root = tmp_path / "exp"
    proc = start(command(root))
    seen: dict[int, dict] = {}
    overlaps = []
    while proc.poll() is None:
        now = children(proc.pid)
        seen.update(now)
        cpus = [c["cpus"] for c in now.values()]
        if any(a & b for i, a in enumerate(cpus) for b in cpus[i + 1 :]):
            overlaps.append(now)
        time.sleep(0.05)
    out, err = finish(proc)
    assert proc.returncode == 0, out + err
    assert not overlaps, overlaps
    slot_cpus = {frozenset(g) for g in physical_cores()[:2]}
    assert len(seen) >= 3, seen  # each run lasts seconds: nearly every child is seen
    for info in seen.values():
        assert frozenset(info["cpus"]) in slot_cpus, info  # one physical core each
        assert info["omp"] == "1"
    for rel in RUNS:
        rec = record(root, rel)
        assert rec["state"] == "done" and rec["exit_code"] == 0
        assert (root / rel / "checkpoint.pt").is_file() and (root / rel / "stdout.log").is_file()
        assert rec["command"][rec["command"].index("--run-name") + 1] == rel.rsplit("/", 1)[1]
        assert frozenset(rec["attempts"][-1]["cpus"]) in slot_cpus
        assert "torch" in rec["versions"] and "commit" in rec["git"]
        assert assert_steps_increase(root / rel)[-1] == 2048
    for info in seen.values():
        assert any(str(info["folder"]) == str(root / rel) for rel in RUNS)
    assert json.loads((root / "status.json").read_text())["counts"]["done"] == 4
    again = subprocess.run(command(root), capture_output=True, text=True, timeout=60)  # all finished: skipped
    assert again.returncode == 0 and "0 to run, 4 skipped" in again.stdout, again.stdout + again.stderr


@two_cores
def test_ctrl_c_checkpoints_every_run_and_the_same_command_finishes_them(tmp_path):
    root = tmp_path / "exp"
    cmd = command(root, total=6144)  # 24 rows: the interrupt comes at the third, seconds before a run could end
    proc = start(cmd)
    deadline = time.time() + 120
    while True:  # both slots busy and each run past its first progress row
        running = [
            rel
            for rel in RUNS
            if (root / rel / "launch.json").exists()
            and record(root, rel)["state"] == "running"
            and (root / rel / "progress.csv").exists()
            and len((root / rel / "progress.csv").read_text().splitlines()) >= 3
        ]
        if len(running) == 2:
            break
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    pids = [record(root, rel)["pid"] for rel in running]
    os.kill(proc.pid, signal.SIGINT)
    out, err = finish(proc, timeout=150)
    assert proc.returncode == 130, out + err
    for pid in pids:
        assert_no_leftovers(pid)  # each script ran in a session of its own
    for rel in RUNS:
        rec = record(root, rel)
        if rel in running:
            assert rec["state"] == "interrupted" and rec["exit_code"] == 130, rec
            assert (root / rel / "checkpoint.pt").is_file()
        else:
            assert rec["state"] == "queued" and not (root / rel / "progress.csv").exists()
    proc = start(cmd)
    out, err = finish(proc)
    assert proc.returncode == 0, out + err
    for rel in RUNS:
        rec = record(root, rel)
        assert rec["state"] == "done" and rec["attempts"][-1]["resumed"] == (rel in running)
        assert assert_steps_increase(root / rel)[-1] == 6144


# A script that passes the launcher's check of its flags (RL_CHECK_ONLY) and fails only once running with --fail,
# as a run does that is refused a size it cannot allocate or loses an env worker; otherwise it finishes at once.
FAILS_WHEN_RUNNING = """
import argparse, os, pathlib, sys
p = argparse.ArgumentParser()
for f in ("--seed", "--out-dir", "--run-name", "--env-id", "--resume"):
    p.add_argument(f)
p.add_argument("--fail", action="store_true")
a, _ = p.parse_known_args()
if os.environ.get("RL_CHECK_ONLY"):
    sys.exit(0)
folder = pathlib.Path(a.out_dir) / a.run_name
folder.mkdir(parents=True, exist_ok=True)
if a.fail:
    print("error: failed while running", file=sys.stderr)
    sys.exit(2)
(folder / "checkpoint.pt").write_bytes(b"x")
"""


def test_a_bad_variant_fails_alone(tmp_path):
    """A variant whose run fails after it started (its flags passed the check) fails alone: the other variant
    finishes, the summary names the failure, and the same command does not rerun it without --retry-failed."""
    root, script = tmp_path / "exp", tmp_path / "fails.py"
    script.write_text(FAILS_WHEN_RUNNING)
    grid = ["--scripts", str(script), "--env-ids", "CartPole-v1", "--seeds", "1", "--level", "bad:--fail", "ok:"]
    out = subprocess.run(command(root, grid=grid, total=1024), capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    bad, ok = record(root, "fails/CartPole-v1/bad/seed1"), record(root, "fails/CartPole-v1/ok/seed1")
    assert bad["state"] == "failed" and bad["exit_code"] == 2
    assert bad["error"] == "error: failed while running"
    assert ok["state"] == "done" and ok["exit_code"] == 0
    summary = out.stdout[out.stdout.index("2 runs:") :]
    assert "failed fails/CartPole-v1/bad/seed1: exit 2: error: failed while running" in summary
    again = subprocess.run(command(root, grid=grid, total=1024), capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "--retry-failed reruns it" in again.stdout  # not rerun without the flag
    assert len(record(root, "fails/CartPole-v1/bad/seed1")["attempts"]) == 1


def test_submitit_local_executor_runs_to_completion(tmp_path):
    pytest.importorskip("submitit")
    root = tmp_path / "exp"
    grid = ["--scripts", "ppo_atari", "--env-ids", "CartPole-v1", "--seeds", "1"]
    out = subprocess.run(
        command(root, "--slurm", "--cluster", "local", "--time", "5", grid=grid, total=1024),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rec = record(root, "ppo_atari/CartPole-v1/base/seed1")
    assert rec["state"] == "done" and rec["exit_code"] == 0 and rec["attempts"][-1]["slurm_job_id"]
    assert (root / "ppo_atari/CartPole-v1/base/seed1/checkpoint.pt").is_file()
    assert json.loads((root / "slurm_jobs.json").read_text())["ppo_atari/CartPole-v1/base/seed1"]["cluster"] == "local"


# ---------------------------------------------------------------------------------------------- slow


@pytest.mark.slow
@two_cores
def test_torchrun_variant_takes_two_slots(tmp_path):
    root = tmp_path / "exp"
    grid = [
        "--scripts",
        "ppo_atari",
        "--env-ids",
        "CartPole-v1",
        "--seeds",
        "1",
        "--level",
        "one:--num-envs 4",
        "ddp:--num-envs 4 --nproc-per-node 2",
    ]
    proc = start(command(root, grid=grid, total=4096))
    seen_ranks, together = [], []
    while proc.poll() is None:
        now = children(proc.pid)
        if len(now) > 1:
            together.append(now)
        ranks = [p for p in descendants(proc.pid, zombies=True) if "LOCAL_RANK" in _environ(p)]
        if ranks:
            seen_ranks.append({p: _allowed(p) for p in ranks})
        time.sleep(0.05)
    out, err = finish(proc)
    assert proc.returncode == 0, out + err
    assert not together  # the torchrun run holds both slots: nothing runs beside it
    assert record(root, "ppo_atari/CartPole-v1/ddp/seed1")["attempts"][-1]["slots"] == [0, 1]
    full = [s for s in seen_ranks if len(s) == 2]
    assert full, seen_ranks
    a, b = full[-1].values()  # the ranks (pinned once started) split the run's two cores
    assert len(a) == len(b) == 1 and not a & b, full[-1]


def _environ(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _allowed(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return launch_cpus(next(ln.split(":")[1].strip() for ln in f if ln.startswith("Cpus_allowed_list")))
    except (OSError, StopIteration):
        return set()


@pytest.mark.slow
def test_submitit_timeout_checkpoints_and_the_requeued_job_resumes(tmp_path):
    """--time 1: submitit's local controller sends the timeout signal 30 s before the minute is up; the job
    SIGTERMs the script (checkpoint, exit 130) and requeues itself; the requeued job resumes the run."""
    pytest.importorskip("submitit")
    root = tmp_path / "exp"
    grid = ["--scripts", "ppo_atari", "--env-ids", "CartPole-v1", "--seeds", "1"]
    out = subprocess.run(
        command(root, "--slurm", "--cluster", "local", "--time", "1", grid=grid, total=400_000),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rec = record(root, "ppo_atari/CartPole-v1/base/seed1")
    first, last = rec["attempts"][0], rec["attempts"][-1]
    assert first["exit_code"] == 130 and not first["resumed"], rec["attempts"]
    assert last["exit_code"] == 0 and last["resumed"] and rec["state"] == "done"
    assert assert_steps_increase(root / "ppo_atari/CartPole-v1/base/seed1")[-1] == 400_000 // 256 * 256
