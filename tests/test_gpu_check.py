"""``benchmarks/gpu_check.py``, the one command for a GPU node, checked on the CPU: it runs end to end with the GPU
parts skipped, a budget cut or a SIGTERM leaves nothing running, a second run redoes only what did not pass, and
the cuda tests run every script once first. Also ``tests/count_syncs.py``'s window for CUDA's sync warnings."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check

CHECK = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")]
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
    scripts = gpu_check.SCRIPTS
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
    order = gpu_check.order_tests(ids)
    assert all("compiles_to_cuda_graphs" in i for i in order[-len(scripts) :])  # the slow ones last
    assert sorted(order) == sorted(ids)
    first = order[: len(scripts) + 1]
    assert {gpu_check.script_and_function(i)[0] for i in first} == set(scripts) | {""}
    assert all(i.endswith("-serial]") for i in first if "every_mode" in i)
    second = order[len(scripts) + 1 : 2 * len(scripts) + 2]  # then each script's sync check
    assert sum("sync_debugging" in i for i in second) == len(scripts)
    # catdqn_atari's tests are not dqn_atari's
    assert gpu_check.script_and_function(f"{f}test_x[catdqn_atari-serial]")[0] == "catdqn_atari"


FIGURE_LOG = (
    'Traceback (most recent call last):\n  File "<string>", line 6, in <module>\n'
    "    raise CalledProcessError(retcode, process.args,\nerror: RuntimeError: CUDA error: no kernel image\n"
    "subprocess.CalledProcessError: Command '['python', 'ppo_atari.py']' returned non-zero exit status 1.\n"
)


def test_wheel_names_and_the_figures_and_errors_read_from_the_logs():
    assert gpu_check.wheel_name(Path("mujoco_core-4.0.0-cp312-cp312-manylinux_2_28_x86_64.whl")) == ("mujoco-core", "4.0.0")
    assert gpu_check.wheel_name(Path("Farama_Notifications-0.0.6-py3-none-any.whl"))[0] == "farama-notifications"
    assert gpu_check.installed_version("pytest") and gpu_check.installed_version("no-such-dist-here") is None
    assert gpu_check._last_float("$ python -c ...\nA.L.E: ...\n1234.5\n\n") == 1234.5
    assert gpu_check.first_error(FIGURE_LOG).splitlines() == FIGURE_LOG.splitlines()[-2:]
    for name, (module, call, _) in gpu_check.FIGURES.items():
        assert (ROOT / "benchmarks" / f"{module}.py").exists() and name.rsplit("-", 1)[1] in call


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
    assert {c["check"] for c in results["checks"] if c["ok"]} >= {f"env {e}" for e in gpu_check.ENVS}


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
    assert "ppo_training.ours('BreakoutNoFrameskip-v4', 3072, 'serial', [], 'cpu')" in summary
    log = (tmp_path / "figures" / "ppo-serial-cpu.log").read_text()
    assert "[gpu_check] cut after 3 s: killed" in log
    assert "[gpu_check] at the cut: no progress.csv row (none yet, or none kept)" in log  # said either way
    assert not (tmp_path / "figures" / "ppo-serial-cpu.tmp").exists()  # the run folder it left is read, then gone


def test_a_cut_figure_says_how_far_its_script_got(tmp_path):
    """On the H200, eager SAC was cut with nothing to show; the rows its progress.csv had by then say how fast."""
    run = tmp_path / "tmpabc" / "b"
    run.mkdir(parents=True)
    (run / "progress.csv").write_text("global_step,wall_time_s,sps\n1500,10.0,90.0\n2000,15.0,100.0\n")
    assert gpu_check.progress_at_cut(tmp_path) == "step 2000, 2 row(s), 100.0 steps/s between the last two"
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
                "cmd": "continuous_training.ours(...)",
            }
        },
    }
    assert "      cut after 48 s (step 2000, 2 row(s), 100.0 steps/s" in gpu_check.summary(r, tmp_path)  # not cut short
    rows = "global_step,wall_time_s,sps\n1500,10.0,90.0\n2000,15.0,100.0\n"
    (run / "progress.csv").write_text(rows + "2500,1")  # a row being written is not read
    assert gpu_check.progress_at_cut(tmp_path) == "step 2000, 2 row(s), 100.0 steps/s between the last two"
    (run / "progress.csv").write_text("step,time\n1,2\n")  # not a progress.csv: no crash, nothing said
    assert gpu_check.progress_at_cut(tmp_path) is None
    (run / "progress.csv").write_text("global_step,wall_time_s,sps\n")
    assert gpu_check.progress_at_cut(tmp_path) is None


def test_a_figure_log_keeps_the_end_of_its_scripts_output(tmp_path):
    """The benchmark captures its script's output; the figure's code copies its end into the log (the rows with
    SPS and compile seconds, a warning such as a CUDA graph skipped), and its value stays the last line."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "fake_bench.py").write_text(
        "import subprocess, sys\n"
        "def ours():\n"
        "    subprocess.run([sys.executable, '-c', 'import sys; print(\"row 1\"); print(\"warn\", file=sys.stderr)'],"
        " check=True, capture_output=True, text=True)\n"
        "    subprocess.check_output([sys.executable, '-c', 'print(\"a library call\")'])\n"
        "    return 42.5\n"
    )
    code = gpu_check.FIGURE_CODE.format(module="fake_bench", call="ours()")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "  | row 1" in out.stderr and "  | warn" in out.stderr
    assert "a library call" not in out.stderr  # only what the benchmark captured of its script
    assert gpu_check._last_float(out.stderr + out.stdout) == 42.5


def test_a_script_profiled_for_a_figure_keeps_its_exit_code(tmp_path):
    """cProfile.run swallows SystemExit: the profile wrapper must not turn a failing script into a success."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import continuous_training

    fake = tmp_path / "fails.py"
    fake.write_text("import sys\nsys.exit(3)\n")
    out = subprocess.run(
        [sys.executable, "-c", continuous_training.PROFILE_CODE, str(fake), "0", str(tmp_path / "prof.out")],
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
    for p in gpu_check.descendants(pid):
        try:
            cmds.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return " ".join(cmds)


@pytest.mark.parametrize("state", ["cut", "not run: budget spent"], ids=["cut", "not-run"])
def test_a_cut_or_a_test_not_run_is_not_a_pass(state):
    r = {
        "status": "finished",
        "checks": [{"check": "import torch", "ok": True, "detail": ""}],
        "figures": {},
        "parts": {"cuda": {"state": "done", "collected": ["a", "b"], "tests": {"a": {"outcome": "passed"}}}},
    }
    assert not gpu_check.all_passed(r)
    r["parts"]["cuda"]["tests"]["b"] = {"outcome": "passed"}
    assert gpu_check.all_passed(r)
    r["figures"]["ppo-serial-cuda"] = {"state": state}
    assert not gpu_check.all_passed(r)


def test_the_update_figures_run_on_the_cpu_and_refuse_a_graph_there():
    """benchmarks/update_speed.py imports SAC's own update: a change there shows here, not first on a GPU."""
    import update_speed

    assert update_speed.sac_updates_per_second("cpu", "eager", hidden=8, batch_size=8, updates=4) > 0
    with pytest.raises(ValueError, match="needs a CUDA device"):
        update_speed.sac_updates_per_second("cpu", "compile-no-graph", hidden=8, batch_size=8, updates=4)
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "update_speed.py"), "--updates", "0"], capture_output=True, text=True
    )
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1] == (
        "update_speed.py: error: --updates must be at least 1, got 0"
    )
