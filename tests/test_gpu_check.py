"""``benchmarks/gpu/check.py``, the one command for a GPU node, checked on the CPU: it runs end to end with the GPU
parts skipped, a budget cut or a SIGTERM leaves nothing running, a second run redoes only what did not pass, and
the cuda tests run every script once first. The race beside LeanRL (``benchmarks/gpu/race.py``): its median per-row SPS
after a burn-in, its reading of LeanRL's tqdm line, its commands, the part with stand-ins, and (slow) a dry run of
our scripts. Also ``tests/count_syncs.py``'s window for CUDA's sync warnings."""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from benchmarks import script_speed
from benchmarks.gpu import check as gpu_check
from benchmarks.gpu import commands, figures, probe, pytest_order, race, wheels
from benchmarks.gpu import summary as gpu_summary
from shared.procs import descendants
from tests.helpers import ROOT

CHECK = [sys.executable, str(ROOT / "benchmarks" / "gpu" / "check.py")]
SYNC = "called a synchronizing CUDA operation"  # the text of CUDA's sync debug warning (c10/cuda)


def test_cuda_sync_warnings_are_counted_only_inside_the_loop(monkeypatch):
    """The learner's ``.to(device)`` before ``with run:`` and what ``Run.__exit__`` does after it are not the loop's
    syncs: a warning there is dropped, as the CPU counter counts copies up only inside ``with run:``."""
    from tests import count_syncs

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    monkeypatch.setattr(count_syncs, "sites", collections.Counter())
    monkeypatch.setattr(count_syncs, "in_loop", False)

    class Run:  # shared.run.Run's window, wrapped as count_syncs.main wraps it
        def __enter__(self):
            warnings.warn(SYNC, stacklevel=1)  # Run.__enter__'s own work: already inside
            return self

        def __exit__(self, *exc):
            warnings.warn(SYNC, stacklevel=1)  # the final checkpoint: outside
            return False

    Run.__enter__ = count_syncs._loop_flag(Run.__enter__, True)
    Run.__exit__ = count_syncs._loop_flag(Run.__exit__, False)
    with warnings.catch_warnings(record=True) as shown:
        count_syncs._cuda_warnings()
        warnings.warn(SYNC, stacklevel=1)  # setup: Agent(...).to(run.device)
        with Run():
            warnings.warn(SYNC, stacklevel=1)
            warnings.warn(SYNC, stacklevel=1)
        warnings.warn(SYNC, stacklevel=1)
        warnings.warn("something else", stacklevel=1)  # not CUDA's: shown as usual, never counted
    assert sum(count_syncs.sites.values()) == 3 and [str(w.message) for w in shown] == ["something else"]
    assert all(k.startswith("cuda:") for k in count_syncs.sites), count_syncs.sites


def test_the_cuda_tests_run_every_script_once_first():
    scripts = pytest_order.SCRIPTS
    f = "tests/test_cuda.py::"
    ids = [
        f"{f}test_every_script_runs_on_the_gpu_in_every_mode[{s}-{m}]"
        for s in scripts
        for m in ("serial", "parallel", "async")
    ]
    ids += [f"{f}test_cuda_sync_debugging_finds_no_sync_in_the_loop[{s}]" for s in scripts]
    ids += [f"{f}test_every_script_compiles_to_cuda_graphs_without_a_skip_or_recompile[{s}]" for s in scripts]
    ids += [
        f"{f}test_a_gpu_checkpoint_loads_with_plain_torch_load_on_a_machine_without_one",
        f"{f}test_two_ranks_train_over_nccl",
    ]
    order = pytest_order.order_tests(ids)
    assert all("compiles_to_cuda_graphs" in i for i in order[-len(scripts) :])  # the slow ones last
    assert sorted(order) == sorted(ids)
    first = order[: len(scripts) + 1]
    assert {pytest_order.script_and_function(i)[0] for i in first} == set(scripts) | {""}
    assert all(i.endswith("-serial]") for i in first if "every_mode" in i)
    second = order[len(scripts) + 1 : 2 * len(scripts) + 2]  # then each script's sync check
    assert sum("sync_debugging" in i for i in second) == len(scripts)
    # catdqn_atari's tests are not dqn_atari's
    assert pytest_order.script_and_function(f"{f}test_x[catdqn_atari-serial]")[0] == "catdqn_atari"


FIGURE_LOG = (
    'Traceback (most recent call last):\n  File "<string>", line 6, in <module>\n'
    "    raise CalledProcessError(retcode, process.args,\nerror: RuntimeError: CUDA error: no kernel image\n"
    "subprocess.CalledProcessError: Command '['python', 'ppo_atari.py']' returned non-zero exit status 1.\n"
)


def test_wheel_names_and_the_figures_and_errors_read_from_the_logs():
    assert wheels.wheel_name(Path("mujoco_core-4.0.0-cp312-cp312-manylinux_2_28_x86_64.whl")) == ("mujoco-core", "4.0.0")
    assert wheels.wheel_name(Path("Farama_Notifications-0.0.6-py3-none-any.whl"))[0] == "farama-notifications"
    assert wheels.installed_version("pytest") and wheels.installed_version("no-such-dist-here") is None
    assert gpu_summary.last_float("$ python -c ...\nA.L.E: ...\n1234.5\n\n") == 1234.5
    assert gpu_summary.first_error(FIGURE_LOG).splitlines() == FIGURE_LOG.splitlines()[-2:]
    for name, fig in figures.FIGURES.items():  # a call of a function the benchmark defines, on the device it names
        source = (ROOT / "benchmarks" / "speed" / f"{fig.module}.py").read_text()
        assert f"\ndef {fig.function}(" in source and name.rsplit("-", 1)[1] in fig.call, name
    assert (
        figures.FIGURES["ppo-serial-cpu"].cmd == "ppo_atari_vs_sb3.ours('BreakoutNoFrameskip-v4', 3072, 'serial', [], 'cpu')"
    )


def _wheel(folder: Path, dist: str, version: str) -> Path:
    """A minimal pure-Python wheel of one empty module."""
    mod, info = dist.replace("-", "_"), f"{dist.replace('-', '_')}-{version}.dist-info"
    path = folder / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{mod}/__init__.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"{mod}/__init__.py,,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


def _left_running(out: Path, wait: float = 5.0) -> list[int]:
    """Processes started by the check that wrote ``out`` (they carry its mark in their environment)."""
    mark = f"{gpu_check.MARK}={out}".encode()
    deadline = time.time() + wait
    while True:
        left = []
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                if mark in Path(f"/proc/{d}/environ").read_bytes().split(b"\0"):
                    left.append(int(d))
            except OSError:
                continue
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


def check_run(out: Path, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*CHECK, str(out), *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout, env={**os.environ, **(env or {})}
    )
    assert _left_running(out) == []
    return proc


def test_it_runs_end_to_end_on_the_cpu(tmp_path):
    """Install (into a --target folder), every import and env, no CUDA device: the cuda tests and figures say so."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "gpu-check-dummy", "1.0")
    (wheels / "pytest-0.1-py3-none-any.whl").write_bytes(b"")  # the node has pytest: never opened
    out = check_run(tmp_path / "out", "--wheels", str(wheels), env={"PIP_TARGET": str(tmp_path / "site")})
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (tmp_path / "site" / "gpu_check_dummy" / "__init__.py").exists(), summary
    assert "installed gpu-check-dummy 1.0" in summary and "kept the node's own pytest" in summary
    assert re.search(r"^checks: [1-9]\d* passed, 0 failed$", summary, re.M), summary
    assert "cuda tests: skipped: no CUDA device" in summary and "figures: skipped: no CUDA device" in summary
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["status"] == "finished" and results["node"]["cuda"] is False
    assert {c["check"] for c in results["checks"] if c["ok"]} >= {f"env {e}" for e in probe.ENVS}


def test_a_second_run_redoes_only_the_tests_that_did_not_pass(tmp_path):
    """A pytest part (here the unit tier, narrowed to three of this file's tests) after an earlier run in which
    one passed, one failed and one did not run: only the last two run, and the summary counts all three."""
    ids = [
        "tests/test_gpu_check.py::test_the_cuda_tests_run_every_script_once_first",
        "tests/test_gpu_check.py::test_a_cut_or_a_test_not_run_is_not_a_pass[cut]",
        "tests/test_gpu_check.py::test_a_cut_or_a_test_not_run_is_not_a_pass[not-run]",
    ]
    (tmp_path / "first").mkdir()
    cuda = {"state": "done", "tests": {"tests/test_cuda.py::test_x": {"outcome": "passed", "error": ""}}}
    (tmp_path / "first" / "results.json").write_text(
        json.dumps(
            {
                "figures": {},
                "parts": {
                    "unit": {
                        "tests": {
                            ids[0]: {"outcome": "passed", "error": ""},
                            ids[1]: {"outcome": "failed", "error": "E  assert 0"},
                        }
                    },
                    "cuda": cuda,
                },
            }
        )
    )
    out = check_run(
        tmp_path / "second",
        "--parts",
        "unit",
        "--redo",
        str(tmp_path / "first"),
        "--wheels",
        "",
        "--pytest-args",
        "tests/test_gpu_check.py -k 'every_script_once or not_a_pass'",
    )
    summary = (tmp_path / "second" / "summary.txt").read_text()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert ": 3 passed (1 in the earlier run), 0 failed; done" in summary, summary
    ran = [json.loads(ln)["id"] for ln in (tmp_path / "second" / "unit.jsonl").read_text().splitlines()]
    assert ran == ids[1:]
    assert (tmp_path / "second" / "unit.collected").read_text().split() == ids
    # the cuda part, not redone, is kept as the earlier run left it: the next --redo from here still knows it
    kept = json.loads((tmp_path / "second" / "results.json").read_text())["parts"]["cuda"]
    assert kept["tests"] == cuda["tests"] and "cuda tests: done [earlier run, not redone]" in summary, summary


def test_a_tiny_budget_cuts_a_figure_and_leaves_nothing_running(tmp_path):
    """The figure (a python that starts algos/ppo_atari.py) is cut after 3 s: its whole tree is killed, the
    summary says so, the exit is 1."""
    out = check_run(tmp_path, "--parts", "figures", "--figures", "ppo-serial-cpu", "--figure-s", "3", "--wheels", "")
    summary = (tmp_path / "summary.txt").read_text()
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ppo-serial-cpu     cut after 3 s" in summary, summary
    assert "ppo_atari_vs_sb3.ours('BreakoutNoFrameskip-v4', 3072, 'serial', [], 'cpu')" in summary
    log = (tmp_path / "figures" / "ppo-serial-cpu.log").read_text()
    assert "[gpu_check] cut after 3 s: killed" in log
    assert "[gpu_check] at the cut: no progress.csv row (none yet, or none kept)" in log  # said either way
    assert not (tmp_path / "figures" / "ppo-serial-cpu.tmp").exists()  # the run folder it left is read, then gone


def test_a_cut_figure_says_how_far_its_script_got(tmp_path):
    """On the H200, eager SAC was cut with nothing to show; the rows its progress.csv had by then say how fast."""
    run = tmp_path / "tmpabc" / "b"
    run.mkdir(parents=True)
    (run / "progress.csv").write_text("global_step,wall_time_s,sps\n1500,10.0,90.0\n2000,15.0,100.0\n")
    assert figures.progress_at_cut(tmp_path) == "step 2000, 2 row(s), 100.0 steps/s between the last two"
    r = {
        "started": "t",
        "status": "finished",
        "elapsed_s": 1,
        "budget_s": 2,
        "argv": [],
        "node": {},
        "checks": [],
        "figures": {
            "sac-serial-cuda": {
                "state": "cut after 48 s (step 2000, 2 row(s), 100.0 steps/s between the last two)",
                "cmd": "sac_td3_ddpg_vs_sb3.ours(...)",
            }
        },
    }
    assert "      cut after 48 s (step 2000, 2 row(s), 100.0 steps/s" in gpu_summary.summary(r, tmp_path)  # not cut short
    rows = "global_step,wall_time_s,sps\n1500,10.0,90.0\n2000,15.0,100.0\n"
    (run / "progress.csv").write_text(rows + "2500,1")  # a row being written is not read
    assert figures.progress_at_cut(tmp_path) == "step 2000, 2 row(s), 100.0 steps/s between the last two"
    (run / "progress.csv").write_text("step,time\n1,2\n")  # not a progress.csv: no crash, nothing said
    assert figures.progress_at_cut(tmp_path) is None
    (run / "progress.csv").write_text("global_step,wall_time_s,sps\n")
    assert figures.progress_at_cut(tmp_path) is None


def test_a_figure_log_keeps_the_end_of_its_scripts_output(tmp_path):
    """The benchmark captures its script's output; the figure's code copies its end into the log (the rows with
    SPS and compile seconds, a warning such as a CUDA graph skipped), and its value stays the last line."""
    (tmp_path / "benchmarks" / "speed").mkdir(parents=True)
    (tmp_path / "benchmarks" / "speed" / "fake_bench.py").write_text(
        "import subprocess, sys\n"
        "def ours():\n"
        "    subprocess.run([sys.executable, '-c', 'import sys; print(\"row 1\"); print(\"warn\", file=sys.stderr)'],"
        " check=True, capture_output=True, text=True)\n"
        "    subprocess.check_output([sys.executable, '-c', 'print(\"a library call\")'])\n"
        "    return 42.5\n"
    )
    code = figures.FIGURE_CODE.format(module="fake_bench", call="ours()")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "  | row 1" in out.stderr and "  | warn" in out.stderr
    assert "a library call" not in out.stderr  # only what the benchmark captured of its script
    assert gpu_summary.last_float(out.stderr + out.stdout) == 42.5


def test_a_script_profiled_for_a_figure_keeps_its_exit_code(tmp_path):
    """cProfile.run swallows SystemExit: the profile wrapper must not turn a failing script into a success."""
    from benchmarks.speed import sac_td3_ddpg_vs_sb3 as continuous_training

    fake = tmp_path / "fails.py"
    fake.write_text("import sys\nsys.exit(3)\n")
    out = subprocess.run(
        [sys.executable, "-c", continuous_training.PROFILE_CODE, "0", str(tmp_path / "prof.out"), str(fake)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 3, out.stderr
    assert (tmp_path / "prof.out").exists()  # the profile is written either way


def test_a_sigterm_mid_part_kills_the_tree_and_keeps_the_summary(tmp_path):
    proc = subprocess.Popen(
        [*CHECK, str(tmp_path), "--parts", "figures", "--figures", "ppo-serial-cpu", "--figure-s", "120", "--wheels", ""],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    log = tmp_path / "figures" / "ppo-serial-cpu.log"
    deadline = time.time() + 120
    while not (log.exists() and "ppo_atari" in _tree_commands(proc.pid)) and time.time() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _left_running(tmp_path) == []
    results = json.loads((tmp_path / "results.json").read_text())
    assert proc.returncode == 1 and results["status"] == "interrupted (SIGTERM)", results


def _tree_commands(pid: int) -> str:
    """The command lines of ``pid``'s descendants, joined."""
    cmds = []
    for p in descendants(pid):
        try:
            cmds.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return " ".join(cmds)


def test_ending_a_commands_tree_leaves_this_processs_resource_tracker_alone(tmp_path):
    """``run_cmd`` kills what its command left, but not the processes that were there before it, nor the resource
    tracker of the process that runs the check (a test process calls its parts): killed, the tracker would leave that
    process's shared memory behind at its exit, and the next spawn there warns "resource_tracker: process died
    unexpectedly"."""
    from multiprocessing import resource_tracker

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # there before the command
    try:
        resource_tracker.ensure_running()
        tracker = resource_tracker._resource_tracker._pid
        rc, cut, _ = commands.run_cmd([sys.executable, "-c", "pass"], tmp_path / "log", 30, grace=0.5)
        assert (rc, cut) == (0, False)
        for pid in (tracker, other.pid):
            with open(f"/proc/{pid}/stat") as f:  # FileNotFoundError: killed and reaped
                assert f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"), f"{pid} was killed"
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("state", ["cut", "not run: budget spent"], ids=["cut", "not-run"])
def test_a_cut_or_a_test_not_run_is_not_a_pass(state):
    r = {
        "status": "finished",
        "checks": [{"check": "import torch", "ok": True, "detail": ""}],
        "figures": {},
        "parts": {"cuda": {"state": "done", "collected": ["a", "b"], "tests": {"a": {"outcome": "passed"}}}},
    }
    assert not gpu_summary.all_passed(r)
    r["parts"]["cuda"]["tests"]["b"] = {"outcome": "passed"}
    assert gpu_summary.all_passed(r)
    r["figures"]["ppo-serial-cuda"] = {"state": state}
    assert not gpu_summary.all_passed(r)


def test_the_update_figures_run_on_the_cpu_and_refuse_a_graph_there():
    """benchmarks/speed/sac_update.py imports SAC's own update: a change there shows here, not first on a GPU."""
    from benchmarks.speed import sac_update as update_speed

    assert update_speed.sac_updates_per_second("cpu", "eager", hidden=8, batch_size=8, updates=4) > 0
    with pytest.raises(ValueError, match="needs a CUDA device"):
        update_speed.sac_updates_per_second("cpu", "compile-no-graph", hidden=8, batch_size=8, updates=4)
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "speed" / "sac_update.py"), "--updates", "0"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1] == (
        "sac_update.py: error: --updates must be at least 1, got 0"
    )


# --- the race beside LeanRL (benchmarks/gpu/race.py, gpu_check's race and long parts) -------------------------------

# An async PPO run as the H200 showed it (2026-11-28): the first row pays start-up and compiling, the second comes
# from a rollout that was already waiting (40,960 SPS), then the steady state, with one slow row (a gc pass, say).
# Rows every 1,024 steps (8 envs x 128); the times are exact in milliseconds, as progress.csv rounds them.
PROGRESS = """global_step,wall_time_s,sps,episodes,return_mean
1024,30.000,34.1,0,
2048,30.025,40960.0,3,1.0
3072,30.613,1741.5,5,1.0
4096,31.253,1600.0,7,
5120,31.853,1706.7,9,2.0
6144,32.365,2000.0,12,
7168,33.645,800.0,14,1.0
8192,34.270,1638.4,16,
"""
# after the 3-rollout burn-in (intervals from step 3,072 on): 1600, 1706.7, 2000, 800, 1638.4 SPS
MEDIAN = 1638.4


def _median_after_burn_in(rows: list[dict]) -> float:
    return script_speed.window_sps(script_speed.intervals_from_rows(rows), burn_in=3072)["median"]


def _rate(first: dict, last: dict) -> float:
    """Steps per second from one row to another."""
    steps = int(last["global_step"]) - int(first["global_step"])
    return round(steps / (float(last["wall_time_s"]) - float(first["wall_time_s"])), 1)


def _mean_after_burn_in(rows: list[dict]) -> float:  # a mutant: the window's mean instead of its median
    return _rate(rows[2], rows[-1])


def _median_with_burn_in(rows: list[dict]) -> float:  # a mutant: every interval, the burn-in's too
    return script_speed.window_sps(script_speed.intervals_from_rows(rows), burn_in=0)["median"]


def _the_old_figure(rows: list[dict]) -> float:  # a mutant: ppo_training.ours's (first row to last) on 3 rows
    return _rate(rows[0], rows[2])


def _check_figure(helper, path: Path) -> None:
    from shared.progress import read_rows

    assert helper(read_rows(path)) == MEDIAN


def test_the_race_figure_is_the_median_per_row_sps_after_the_burn_in(tmp_path):
    """From a hand-made progress.csv: the median of the per-row SPS whose interval starts at or after the burn-in,
    with the window's mean, its rows and steps beside it; and the same check fails on a mean, on a window that
    includes the burn-in, and on the old two-row figure (3,340.9 here: the async artefact)."""
    path = tmp_path / "progress.csv"
    path.write_text(PROGRESS)
    got = script_speed.progress_sps(path, burn_in=3072, min_steps=5000)
    assert got == {
        "median": MEDIAN,
        "mean": 1400.1,  # 5,120 steps in 3.657 s: the slow row weighs on the mean, not on the median
        "intervals": 5,
        "from": 3072,
        "to": 8192,
        "steps": 5120,
        "min": 800.0,
        "max": 2000.0,
        "short": False,
    }
    assert script_speed.progress_sps(path, burn_in=3072, min_steps=30_000)["short"]  # under the 30k steps asked for
    _check_figure(_median_after_burn_in, path)
    for mutant, value in ((_mean_after_burn_in, 1400.1), (_median_with_burn_in, 1706.7), (_the_old_figure, 3340.9)):
        from shared.progress import read_rows

        assert mutant(read_rows(path)) == value
        with pytest.raises(AssertionError):
            _check_figure(mutant, path)
    with pytest.raises(ValueError, match="no interval starts at or after step 9000"):
        script_speed.progress_sps(path, burn_in=9000)
    # a compiled run's rows carry compile_s (shared.compiling.report): the last row's is given
    path.write_text(PROGRESS.replace("return_mean\n", "return_mean,compile_s\n").replace("1638.4,16,\n", "1638.4,16,,24.5\n"))
    assert script_speed.progress_sps(path, 3072)["compile_s"] == 24.5


def _tqdm_line(desc: str, n: int, total: int) -> str:
    """One redraw of tqdm's bar as LeanRL's scripts print it (``\\r`` first; the description, when set, then ": ")."""
    pct = 100 * n // total
    bar = "█" * (pct // 10) + " " * (10 - pct // 10)
    return f"\r{desc + ': ' if desc else ''}{pct:3d}%|{bar}| {n}/{total} [00:05<00:20, 97.1it/s]"


def _leanrl_output(descs: list[tuple[int, str]], total: int) -> str:
    """A LeanRL script's output: warnings first, then tqdm's redraws. Each description (set at its step) is drawn
    with a counter that lags (tqdm syncs it only when it redraws on its own) and redrawn several times, as
    the scripts showed on the CPU."""
    out = [
        "/venv/lib/python3.12/site-packages/tyro/_parsers.py:365: UserWarning: The field `target-kl` is annotated ...\n",
        "  warnings.warn(message)\n",
        _tqdm_line("", 0, total),
    ]
    lag = 0
    for step, desc in descs:
        out += [_tqdm_line(desc, lag, total), _tqdm_line(desc, lag + 1, total), _tqdm_line(desc, min(step, total), total)]
        lag = step - 3
    return "".join(out) + _tqdm_line(descs[-1][1], total, total) + "\n"


def test_leanrl_speeds_are_read_from_its_tqdm_line_by_its_schedule():
    """PPO Atari prints the SPS of its own 10 iterations; SAC and TD3 the mean since their clock started (0.0 at
    the start itself), every 100 steps, regrouped here to our rows' 500."""
    ppo = next(r for r in race.plan("ppo-atari").runs if r.kind == "leanrl")
    speeds = [4900.0, 5012.3, 5101.7, 4988.0]
    text = _leanrl_output(
        [
            (10240 * (k + 1), f"speed: {v: 4.1f} sps, reward avg: 0.01, reward max: 1.00, returns:  1.50,lr:  0.00")
            for k, v in enumerate(speeds)
        ],
        40,
    )
    assert "\r" in text and race.tqdm_speeds(text) == speeds
    got = script_speed.window_sps(race.leanrl_intervals(speeds, ppo.schedule), ppo.burn_in, ppo.min_steps)
    assert (got["from"], got["to"], got["intervals"], got["short"]) == (3072, 40960, 4, False)
    assert got["median"] == round((4988.0 + 5012.3) / 2, 1)
    assert got["mean"] == round(37888 / (7168 / 4900.0 + 10240 / 5012.3 + 10240 / 5101.7 + 10240 / 4988.0), 1)

    # SAC: 100 intervals of 100 steps from step 10,000 (learning from 5,000, 5,000 of burn-in), at known rates
    sac = next(r for r in race.plan("sac").runs if r.kind == "leanrl")
    rates = [700.0 + 10 * (i % 7) - (300 if i in (30, 31) else 0) for i in range(100)]
    seconds = [100 / v for v in rates]
    cumulative = [100 * (k + 1) / sum(seconds[: k + 1]) for k in range(100)]
    descs = [(10_000, f"{0.0: 4.4f} sps, ")] + [
        (10_000 + 100 * (k + 1), f"{v: 4.4f} sps, global_step={10_000 + 100 * k}, episodic_return= nan (max=-inf)")
        for k, v in enumerate(cumulative)
    ]
    text = _leanrl_output(descs, 20_001)
    assert race.tqdm_speeds(text) == [0.0] + [float(f"{v:.4f}") for v in cumulative]
    got = script_speed.window_sps(
        race.leanrl_intervals(race.tqdm_speeds(text), sac.schedule), sac.burn_in, sac.min_steps, sac.every
    )
    per_500 = [500 / sum(seconds[i : i + 5]) for i in range(0, 100, 5)]
    assert (got["from"], got["to"], got["intervals"], got["short"]) == (10_000, 20_000, 20, False)
    assert got["median"] == pytest.approx(sorted(per_500)[9] / 2 + sorted(per_500)[10] / 2, abs=0.11)
    assert got["mean"] == pytest.approx(10_000 / sum(seconds), abs=0.11)
    # a run cut before its clock started shows no speed: no figure, said as a ValueError
    with pytest.raises(ValueError):
        script_speed.window_sps(
            race.leanrl_intervals(race.tqdm_speeds(_leanrl_output([(10_000, " 0.0000 sps, ")], 20_001)), sac.schedule), 10_000
        )


def test_the_contexts_item_times_an_act_beside_a_learner_and_leaves_neither_thread_nor_process():
    """``contexts``: the runs' calls and their line; on the CPU each mode gives a time, an unknown one is refused, and
    the learner (a thread, or a child process) is gone when the figure is."""
    from benchmarks.speed import contexts

    alone, process, thread, duty = race.plan("contexts").runs  # one run for each of contexts.MODES, in order
    assert [f"acting_us({m!r}," in r.argv[-1] for m, r in zip(contexts.MODES, (alone, process, thread, duty))] == [True] * 4
    assert "acting_us('process', 'cuda', 5.0)" in process.argv[-1] and process.unit == "us an act"
    assert [r.label for r in (alone, process, thread, duty)] == ["alone", "beside process", "beside thread", "beside duty"]
    item = {"runs": {"alone": {"value": 200.0}, "beside process": {"value": 500.0}, "beside thread": {"value": 250.0}}}
    assert race.contexts_line(item) == "over alone: beside process 2.50x, beside thread 1.25x; process over thread 2.00x"
    assert race.contexts_line({"runs": {"beside thread": {"value": 250.0}}}) == ""  # nothing to divide by
    with pytest.raises(ValueError, match="mode must be one of"):
        contexts.acting_us("elsewhere", "cpu", 0.1)
    for mode in contexts.MODES:
        assert contexts.acting_us(mode, "cpu", 0.2, batch=8) > 0
        assert "contexts-learner" not in [t.name for t in threading.enumerate()]
        assert "contexts as c" not in _tree_commands(os.getpid())
    assert contexts.acting_us("alone", "cpu", 0.0, batch=8) > 0  # a window too short for two steps: still a figure


def test_a_contexts_learner_that_fails_is_an_error_not_a_figure_alone(monkeypatch):
    """A learner thread that raises, before its first update or after it, ends the figure with its error at once:
    neither a wait for a learner that will never be ready nor the step alone's time under another name."""
    from benchmarks.speed import contexts

    def broken(*args, ready=None, **kwargs):
        raise OSError("no device")

    def dies_later(*args, ready=None, **kwargs):
        ready.set()
        time.sleep(0.05)
        raise OSError("lost the device")

    for learn, said in ((broken, "no device"), (dies_later, "lost the device")):
        monkeypatch.setattr(contexts, "learn", lambda dev, duty, batch, stop, ready, f=learn: f(ready=ready))
        t = time.monotonic()
        with pytest.raises(RuntimeError, match=said):
            contexts.acting_us("thread", "cpu", 0.5, batch=8)
        assert time.monotonic() - t < 10


def test_the_long_line_puts_the_runs_last_return_beside_cleanrls_published_one():
    long = {"steps": 2_500_000, "state": "cut after 400 s", "reached": 1_200_000, "rows": 90, "return_mean": 187.3}
    (line,) = gpu_summary.race_lines({"long": long})
    assert "last return_mean 187.3 (CleanRL's published after 40M frames, 4x this run's: 414.66 +- 28.09)" in line
    (unrun,) = gpu_summary.race_lines({"long": {"steps": 2_500_000, "state": "not run: budget spent"}})
    assert "CleanRL" not in unrun  # no run, nothing to put beside it
    (no_episode,) = gpu_summary.race_lines({"long": {**long, "return_mean": None, "sps": 3000.0}})
    assert "CleanRL" not in no_episode  # not beside the SPS, as if it were CleanRL's


def test_the_race_commands_take_the_same_window_on_both_sides(monkeypatch):
    """Each pair's commands: compiled with CUDA graphs on both sides, the same steps, a burn-in that ends where
    LeanRL's clock starts, windows of 30k+ (PPO) and 10k (replay) steps; the dry plan is the same on the CPU. The
    envs' scaling adds a row on the node's own thread count where it has more than 8 (the ceiling item's)."""
    leanrl = Path("/peers/leanrl")
    for name in race.ORDER:
        for dry in (False, True):
            for run in race.plan(name, dry).runs:
                argv = race.leanrl_argv(run, leanrl)
                if run.kind == "ours":
                    assert (ROOT / argv[0]).exists() and ("--compile" in argv) != dry, argv
                    assert argv[argv.index("--device") + 1] == ("cpu" if dry else "cuda")
                elif run.kind == "leanrl":
                    assert argv[0].startswith("/peers/leanrl/") and argv[0].endswith("_torchcompile.py")
                    assert ("--no-cuda" in argv) == dry and ("--cudagraphs" in argv) != dry
                    assert not any(a.startswith("LEANRL/") for a in argv)

    def flag(run, name):
        return run.argv[run.argv.index(name) + 1]

    ours, ours_async, lean = race.plan("ppo-atari").runs
    assert flag(ours, "--sampler") == "parallel" and flag(ours_async, "--sampler") == "async"
    assert flag(ours, "--total-timesteps") == flag(lean, "--total-timesteps") == "40960"
    assert flag(lean, "--measure-burnin") == "4" and ours.burn_in == lean.burn_in == 3 * 1024  # LeanRL's clock
    assert 40960 - ours.burn_in >= ours.min_steps == 30_000 and lean.schedule.kind == "windows"
    ours, lean = race.plan("ppo-mujoco").runs
    assert flag(ours, "--env-id") == flag(lean, "--env-id") == "HalfCheetah-v5"  # LeanRL's default is v4
    assert flag(ours, "--total-timesteps") == flag(lean, "--total-timesteps") == "40960" and ours.burn_in == 3 * 2048
    assert lean.schedule == race.Schedule("cumulative", 6144, 20480, 20480) and 40960 - 6144 >= 30_000
    for name in ("td3", "sac"):
        ours, lean = race.plan(name).runs
        assert flag(ours, "--min-steps-learn") == flag(lean, "--learning-starts") == "5000"
        assert flag(lean, "--measure-burnin") == "5000" and ours.burn_in == lean.burn_in == 10_000
        assert int(flag(ours, "--total-timesteps")) - ours.burn_in == ours.min_steps == 10_000
        assert flag(lean, "--total-timesteps") == "20001"  # its last print is at step 20,000
        assert lean.every == int(flag(ours, "--log-every")) == 500
    assert [r.label for r in race.plan("ddpg").runs] == ["ours"]  # LeanRL has no DDPG
    (dqn,) = race.plan("dqn").runs
    assert dqn.burn_in == 2000 + 5000 and int(flag(dqn, "--total-timesteps")) - dqn.burn_in == 10_000
    (envs,) = race.plan("envs").runs
    assert "envs_only('BreakoutNoFrameskip-v4', 8, 'parallel', 10.0)" in envs.argv[-1]
    monkeypatch.setattr(race.os, "cpu_count", lambda: 8)  # a node of 8: the ceiling item's count is among them
    one, four, *threads = race.plan("envs-threads").runs
    assert "envs_only('BreakoutNoFrameskip-v4', 1, 'serial', 5.0)" in one.argv[-1]
    assert "envs_only('BreakoutNoFrameskip-v4', 4, 'serial', 5.0)" in four.argv[-1]  # DQN's and C51's ceiling
    assert [r.label for r in threads] == ["8 on 1 thread", "8 on 2 threads", "8 on 4 threads", "8 on 8 threads"]
    assert all(f"8, 'parallel', 5.0, threads={k})" in r.argv[-1] for r, k in zip(threads, race.THREADS))
    monkeypatch.setattr(race.os, "cpu_count", lambda: 16)  # a node of 16: the ceiling item's 16 threads as well
    *_, sixteen = race.plan("envs-threads").runs
    assert sixteen.label == "8 on 16 threads" and "threads=16)" in sixteen.argv[-1]
    assert [r.label for r in race.plan("envs-threads", dry=True).runs][2:] == ["2 on 1 thread", "2 on 2 threads"]
    assert race.run_line(sixteen.label, {"value": 1.0}).index("1.0") == race.run_line("ours", {"value": 1.0}).index("1.0")
    assert race.long_argv(Path("/x/runs/long"))[:6] == [
        "algos/ppo_atari.py",
        "--env-id",
        "BreakoutNoFrameskip-v4",
        "--total-timesteps",
        "2500000",
        "--sampler",
    ]
    with pytest.raises(ValueError, match="unknown race item"):
        race.plan("ppo-lstm")


FAKE_OURS = """import sys
out = sys.argv[sys.argv.index('--out-dir') + 1] + '/' + sys.argv[sys.argv.index('--run-name') + 1]
import os; os.makedirs(out)
t = [0.0, 5.0, 5.5, 6.0, 6.5, 7.1]  # rows every 1,000 steps; after the 2-row burn-in: 2000, 2000, 2000, 1666.7 SPS
with open(out + '/progress.csv', 'w') as f:
    f.write('global_step,wall_time_s,sps\\n' + ''.join(f'{1000 * (i + 1)},{x},0\\n' for i, x in enumerate(t)))
"""
FAKE_LEANRL = """import sys
# with params.to_module(qnet):   (as in LeanRL's SAC and TD3: the race runs a copy with race.LEANRL_EDITS made)
assert ('params.to_module(qnet)' + ':') not in open(__file__).read(), 'the kit file ran, not the edited copy'
for k, v in enumerate([1000.0, 1000.0, 1000.0, 1000.0]):
    sys.stderr.write(f'\\rspeed: {v + k: 4.1f} sps, lr: 0.00:  50%|#####     | 2/4 [00:01<00:01, 2.0it/s]')
sys.stderr.write('\\n')
"""


def test_the_race_part_runs_each_side_reads_its_figure_and_says_what_it_skipped(tmp_path, monkeypatch):
    """gpu_check's race part with stand-in runs (each a subprocess of a few lines): ours read from the
    progress.csv it writes, LeanRL from its tqdm line, a benchmark's number from its last line; LeanRL's side is
    skipped without its scripts; the summary gives each figure with its window, and ours/LeanRL."""
    leanrl = tmp_path / "leanrl"
    (leanrl / "stubs").mkdir(parents=True)
    (leanrl / "fake_torchcompile.py").write_text(FAKE_LEANRL)
    (leanrl / "plain_torchcompile.py").write_text(FAKE_LEANRL.replace("to_module(qnet):", "to_module(net):"))

    def plan(name, dry=False):
        runs = [
            race.Run("ours", "ours", ["-c", FAKE_OURS], burn_in=2000, min_steps=3000),
            race.Run(
                "LeanRL",
                "leanrl",
                ["LEANRL/fake_torchcompile.py"],
                2000,
                3000,
                schedule=race.Schedule("windows", 2000, 3000, 1000),
                edited=True,
            ),
        ]
        if name == "envs":
            burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint(3000.0)"
            return race.Item(name, "the ceiling", [race.Run("envs only", "value", ["-c", burn])])
        if name == "envs-threads":
            figures = {"1 env, serial": 900.0, "8 on 1 thread": 1000.0, "8 on 2 threads": 1900.0}
            return race.Item(name, "the scaling", [race.Run(k, "value", ["-c", f"print({v})"]) for k, v in figures.items()])
        other = "LEANRL/missing_torchcompile.py" if name == "td3" else "LEANRL/plain_torchcompile.py"
        return race.Item(
            name,
            f"{name}, a stand-in",
            runs if name == "ppo-atari" else runs[:1] + [race.Run("LeanRL", "leanrl", [other], 2000, edited=True)],
        )

    monkeypatch.setattr(race, "plan", plan)
    args = argparse.Namespace(
        out=str(tmp_path / "out"),
        budget=120,
        redo=None,
        parts=["race"],
        race=["envs", "envs-threads", "ppo-atari", "td3", "sac"],
        leanrl=str(leanrl),
        race_run_s=60,
        dry=True,
        wheels="",
    )
    check = gpu_check.Check(args)
    check.r["race"] = {}
    check.race()
    got = check.r["race"]
    assert got["envs"]["runs"]["envs only"]["value"] == 3000.0
    assert got["envs"]["runs"]["envs only"]["cpu_s"] >= 0.25  # the CPU time of the run's processes: 0.3 s burnt there
    ours, lean = got["ppo-atari"]["runs"]["ours"], got["ppo-atari"]["runs"]["LeanRL"]
    assert (ours["median"], ours["mean"], ours["intervals"], ours["from"], ours["to"]) == (2000.0, 1904.8, 4, 2000, 6000)
    assert (lean["median"], lean["intervals"], lean["prints"], lean["from"], lean["to"]) == (1001.5, 4, 4, 2000, 6000)
    assert got["ppo-atari"]["state"] == "done" and lean["cmd"].endswith("fake_torchcompile.py (an edited copy)")
    assert len(lean["edits"]) == 1 and "params.to_module(qnet):" in (leanrl / "fake_torchcompile.py").read_text()
    # a script that must take the edit and does not match it is not run as it is
    plain = got["sac"]["runs"]["LeanRL"]
    assert plain["state"] == "not run: race.LEANRL_EDITS matched nothing in plain_torchcompile.py", plain
    assert got["sac"]["state"] == "incomplete" and "cmd" not in plain
    assert got["td3"]["runs"]["LeanRL"]["state"].startswith("skipped: no missing_torchcompile.py in --leanrl")
    assert got["td3"]["state"] == "done"  # ours has its figure, LeanRL's side was skipped and says why
    check.r["status"] = "finished"
    text = gpu_summary.summary(check.r, tmp_path)
    assert "    ours/LeanRL: ours 2.00 (window mean 1.90)" in text, text
    assert "    ours               2000.0 SPS  [mean 1904.8; 4 intervals, steps 2,000->6,000, 1667-2000;" in text, text
    assert "of the envs-only ceiling (3000 SPS): ours 0.67, LeanRL 0.33" in text, text
    assert "    8 on 2 threads     1900.0 SPS" in text, text
    assert "    over 1 thread: 2 threads 1.90x" in text, text
    assert re.search(r"envs only +3000\.0 SPS  \(wall \d+ s, \d+\.\d cores busy\)", text), text
    assert race.busy({"cpu_s": 29.0, "wall_s": 10.0}) == ", 2.9 cores busy" and race.busy({"wall_s": 10.0}) == ""
    assert "LeanRL's packages: no LeanRL wheels" in text
    assert "1 edit(s): race.LEANRL_EDITS" in text, text
    assert "LeanRL          not run: race.LEANRL_EDITS matched nothing in plain_torchcompile.py" in text, text
    assert not gpu_summary.all_passed(check.r)  # sac's LeanRL side did not run
    del check.r["race"]["sac"]
    assert gpu_summary.all_passed(check.r)
    # the budget spent: what is left says so, and is not a pass
    check.deadline = time.monotonic()
    check.r["race"] = {}
    check.race()
    assert check.r["race"]["envs"]["runs"]["envs only"]["state"] == "not run: budget spent"
    assert not gpu_summary.all_passed(check.r)


@pytest.mark.slow
def test_the_dry_race_and_long_parts_run_our_scripts_on_the_cpu(tmp_path):
    """``--dry``: the race's and long part's plumbing with our real scripts on the CPU (tiny windows, no
    compiling), LeanRL's side a stand-in that prints SAC's tqdm line; a second call resumes the long run."""
    leanrl = tmp_path / "leanrl"
    (leanrl / "stubs").mkdir(parents=True)
    lines = [_tqdm_line("", 0, 401)] + [_tqdm_line(f"{v: 4.4f} sps, ", 290, 401) for v in (0.0, 90.0, 95.0)]
    (leanrl / "sac_continuous_action_torchcompile.py").write_text(  # with the line race.LEANRL_EDITS changes
        f"import sys; sys.stderr.write({''.join(lines)!r} + '\\n')\nedited = {race.LEANRL_EDITS[0][0]!r}\n"
    )
    common = ["--dry", "--leanrl", str(leanrl), "--wheels", "", "--long-dir", str(tmp_path / "runs" / "long")]
    out = check_run(tmp_path / "a", "--parts", "race,long", "--race", "envs", "sac", "--long-steps", "64", *common)
    summary = (tmp_path / "a" / "summary.txt").read_text()
    assert out.returncode == 0, summary + out.stderr[-3000:]
    results = json.loads((tmp_path / "a" / "results.json").read_text())
    sac = results["race"]["sac"]["runs"]
    assert sac["ours"]["median"] > 0 and (sac["ours"]["from"], sac["ours"]["to"]) == (200, 400)
    # its means since the clock started: 90.0 at step 300, 95.0 at 400, so the steps 300-400 ran at 100.6 SPS
    assert sac["LeanRL"]["median"] == pytest.approx((90 + 100 / (200 / 95 - 100 / 90)) / 2, abs=0.1)
    assert sac["LeanRL"]["intervals"] == 2 and len(sac["LeanRL"]["edits"]) == 1
    assert results["long"]["reached"] == 64 and (tmp_path / "a" / "long-progress.csv").exists()
    assert not list((tmp_path / "a" / "race" / "sac-ours").glob("*.pt"))  # the checkpoint does not come back
    out = check_run(tmp_path / "b", "--parts", "long", "--long-steps", "128", *common)
    assert out.returncode == 0, out.stdout[-3000:]
    long = json.loads((tmp_path / "b" / "results.json").read_text())["long"]
    assert long["resumed"] and long["reached"] == 128


@pytest.mark.slow
def test_our_scripts_accept_every_flag_of_the_gpu_race():
    """Each of our race commands (the GPU plan, on the CPU) passes its script's own checks (RL_CHECK_ONLY: every
    check made, nothing started or written): a flag a script does not know would otherwise surface on the node."""
    cmds = [r.argv for name in race.ORDER for r in race.plan(name).runs if r.kind == "ours"]
    cmds.append(race.long_argv(ROOT / "runs" / "gpu-check-flags-test-none"))
    for argv in cmds:
        argv = [*argv, "--out-dir", "/nonexistent-never-written"] if "--out-dir" not in argv else list(argv)
        argv[argv.index("--device") + 1] = "cpu"
        out = subprocess.run(
            [sys.executable, *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "RL_CHECK_ONLY": "1"},
        )
        assert out.returncode == 0, (argv, out.stderr[-2000:])


@pytest.mark.unit
def test_leanrl_scripts_get_the_edit_that_lets_them_compile_on_torch_2_11():
    """LeanRL's SAC and TD3 keep to_module's default in batched_qf, which dynamo cannot guard on torch 2.11 (their
    first update raised NameError: SYNTHETIC_LOCAL on the node): the race runs them with the kit's edit (a) made there,
    and nothing else changed."""
    text = "def batched_qf(params, obs):\n    with params.to_module(qnet):\n        return qnet(obs)\n"
    edited, made = race.leanrl_edited(text)
    assert edited == text.replace("to_module(qnet):", "to_module(qnet, preserve_module_state=False):") and len(made) == 1
    assert race.leanrl_edited(edited) == (edited, [])  # made once; a script without the line is run as it is


def test_the_node_line_says_what_the_cores_may_give(tmp_path):
    """The cgroup's CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``): the least over the process's own cgroup and
    every parent up to the root, unlimited ("none") told apart from unread (None); the physical cores, the model and
    ``os.cpu_count()`` beside the cores counted. A quota below them caps the envs' threads."""
    from benchmarks.gpu.probe import cpu_quota

    v2 = tmp_path / "v2"
    (v2 / "job" / "step").mkdir(parents=True)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(v2, "0::/\n") == "none"
    (v2 / "job" / "step" / "cpu.max").write_text("800000 100000\n")
    assert cpu_quota(v2, "0::/job/step\n") == 8.0  # its own cgroup's, not the root's
    (v2 / "job" / "cpu.max").write_text("200000 100000\n")
    assert cpu_quota(v2, "0::/job/step\n") == 2.0  # a parent's quota binds its children
    (v2 / "job" / "step" / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(v2, "0::/job/step\n") == 2.0
    (v2 / "job" / "cpu.max").write_text("abc 100000\n")
    assert cpu_quota(v2, "0::/job/step\n") == "none"  # a level that is not two numbers is skipped, not raised
    v1 = tmp_path / "v1"
    for d, quota in (("cpu", "-1"), ("cpu/slice", "250000"), ("cpu/x", "100000")):
        (v1 / d).mkdir(parents=True, exist_ok=True)
        (v1 / d / "cpu.cfs_quota_us").write_text(quota + "\n")
        (v1 / d / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(v1, "4:memory:/x\n1:cpu,cpuacct:/\n") == "none"  # the memory controller's path is not the cpu's
    assert cpu_quota(v1, "4:memory:/x\n1:cpu,cpuacct:/slice\n") == 2.5
    assert cpu_quota(tmp_path / "none", "") is None
    v = {"torch": "2.11", "cores": 16, "cpu_count": 16, "physical_cores": 8, "cpu_quota": 4.0, "cpu_model": "Xeon"}
    assert gpu_summary.versions_line(v).endswith("16 cores (8 physical, at most 4.0 by the cgroup's quota; Xeon)")
    assert gpu_summary.versions_line({**v, "cpu_quota": "none"}).endswith("(8 physical, no cgroup quota; Xeon)")
    unread = {**v, "cpu_quota": None, "physical_cores": None, "cpu_model": None, "cpu_count": 32}
    assert gpu_summary.versions_line(unread).endswith("16 cores (cgroup quota unread, os.cpu_count() 32)")
    assert gpu_summary.versions_line({"torch": "2.11", "cores": 16}).endswith("16 cores")  # an earlier results file
