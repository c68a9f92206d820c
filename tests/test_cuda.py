"""What only a GPU can check (marked ``cuda``; skipped where torch sees no CUDA device): every script in every
sampling mode on ``--device cuda``, CUDA's own sync debugging over the loop, a checkpoint written on the GPU
loaded on a machine without one, a two-rank NCCL job and its fault semantics. ``docs/gpu.md`` says how to run
them and what to expect."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import ROOT, assert_no_leftovers, run, script
from tests.test_syncs import COMMON, RUNS

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
SCRIPTS = list(RUNS)
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


@pytest.mark.parametrize("sampler", ["serial", "parallel", "async"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_runs_on_the_gpu_in_every_mode(name, sampler, tmp_path):
    out = run(
        f"{name}.py",
        *RUNS[name],
        *COMMON,
        "--device",
        "cuda",
        "--sampler",
        sampler,
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["hardware"]["device"].startswith("cuda") and config["hardware"]["gpu"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_cuda_sync_debugging_finds_no_sync_in_the_loop(name, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "count_syncs.py"),
            name,
            *RUNS[name],
            *COMMON,
            "--device",
            "cuda",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            "r",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    sites = json.loads(out.stdout.strip().splitlines()[-1])["sites"]
    allowed = {"row", "to_host", "upload", "optim", "cuda:row", "cuda:to_host", "cuda:optim"}
    assert {k: v for k, v in sites.items() if k not in allowed} == {}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_compiles_to_cuda_graphs_without_a_recompile(name, tmp_path):
    """--compile on CUDA (inductor; each update and acting step one CUDA graph, shared.compiling.graphed): a graph
    break or a recompile is an error under RL_COMPILE_STRICT, and the graphs were captured."""
    flags = [f for f in RUNS[name] if f != "--noisy"]  # --compile refuses the noisy layers (as tests/test_compile.py)
    out = run(
        f"{name}.py",
        *flags,
        *COMMON,
        "--device",
        "cuda",
        "--compile",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        env={"RL_COMPILE_STRICT": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["compile"]["compiled_graphs"] > 0 and config["compile"]["cuda_graphs"] >= 2, config["compile"]


@pytest.mark.parametrize("name", ["ppo_atari", "dqn_atari"])
def test_async_learners_compile_to_cuda_graphs_without_a_recompile(name, tmp_path):
    """--sampler async --compile: the learner's update one CUDA graph, no recompile (issue 61 found async compiled
    slower than eager); the sampler process acts on the same GPU, its acting step graphed in its own process."""
    out = run(
        f"{name}.py",
        *RUNS[name],
        *COMMON,
        "--device",
        "cuda",
        "--compile",
        "--sampler",
        "async",
        "--out-dir",
        str(tmp_path),
        "--run-name",
        "r",
        env={"RL_COMPILE_STRICT": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["compile"]["cuda_graphs"] >= 1, config["compile"]
    # the learner never acts here (evaluation acts through Policy, eagerly): the line is the sampler process's own
    acting = {"ppo_atari": "policy_step", "dqn_atari": "greedy_actions"}[name]
    assert re.search(rf"compiling {acting} \(\w+, on cuda:\d+\)", out.stdout), out.stdout[-3000:]


def test_a_gpu_checkpoint_loads_with_plain_torch_load_on_a_machine_without_one(tmp_path):
    out = run("dqn_atari.py", *RUNS["dqn_atari"], *COMMON, "--device", "cuda", "--out-dir", str(tmp_path), "--run-name", "r")
    assert out.returncode == 0, out.stderr[-3000:]
    load = (
        f"import torch; s = torch.load({str(tmp_path / 'r' / 'checkpoint.pt')!r}, weights_only=True); print(s['global_step'])"
    )
    cpu_only = subprocess.run(
        [sys.executable, "-c", load], capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    )
    assert cpu_only.returncode == 0, cpu_only.stderr[-2000:]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_ranks_train_over_nccl(tmp_path):
    out = subprocess.run(
        [
            *TORCHRUN,
            script("ppo_atari.py"),
            *RUNS["ppo_atari"],
            *COMMON,
            "--device",
            "cuda",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            "r",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_killed_nccl_rank_ends_the_job_with_exit_1_and_no_orphan(tmp_path):
    """With NCCL the contract must hold as with gloo: the surviving rank says which rank it lost, exits 1 (not
    134 from NCCL's watchdog), and nothing is left behind."""
    proc = subprocess.Popen(
        [
            *TORCHRUN,
            script("dqn_atari.py"),
            "--preset",
            "cartpole",
            "--total-timesteps",
            "10000000",
            "--device",
            "cuda",
            "--out-dir",
            str(tmp_path),
            "--run-name",
            "r",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(60)  # both ranks in their loop
    ranks = subprocess.run(["pgrep", "-s", str(proc.pid), "-f", "dqn_atari.py"], capture_output=True, text=True)
    os.kill(int(ranks.stdout.split()[-1]), signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert "lost contact with another rank" in err and "134" not in err
    assert_no_leftovers(proc.pid)
