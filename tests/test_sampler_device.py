"""Where the async sampler process acts: on the learner's GPU where the learner has one (issue 67, item 4: its acting
step as cheap as parallel's, not a network on the sampler's CPU), else on the CPU. This machine has no GPU, so a
script's sampler is shown to act on ``proc.device`` by giving it the ``meta`` device: every script's sampler must then
fail where its acting step reads its actions back to the host (a meta tensor has no data), having run on meta up to
there; one that acted on a CPU of its own runs to the end, one with a tensor left on the CPU fails on mixed devices.
What meta lets through and CUDA would not: a CPU random generator (DQN's --noisy, not run here) and CPU index tensors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shared.run import sampler_device
from tests.helpers import ROOT

FLAGS = {
    "ppo_atari": ["--preset", "cartpole", "--total-timesteps", "512", "--num-envs", "4"],
    "a2c_atari": ["--preset", "cartpole", "--total-timesteps", "512"],
    "ppo_lstm": ["--preset", "cartpole", "--total-timesteps", "1024"],
    "ppo_mujoco": ["--preset", "pendulum", "--total-timesteps", "1024", "--num-envs", "2"],
    "dqn_atari": ["--preset", "cartpole", "--total-timesteps", "1500", "--min-steps-learn", "300"],
    "catdqn_atari": ["--preset", "cartpole", "--total-timesteps", "1500", "--min-steps-learn", "300"],
    "r2d1_atari": ["--preset", "memory", "--total-timesteps", "2000"],
    **{
        name: ["--preset", "pendulum", "--total-timesteps", "600", "--min-steps-learn", "300", "--batch-size", "64"]
        for name in ("sac_mujoco", "td3_mujoco", "ddpg_mujoco")
    },
}

# Before the script's __main__ block: the learner hands its sampler the meta device (the spawned sampler imports the
# copy too, which patches its own module, unused there).
ON_META = """
import contextlib
import shared.run
shared.run.sampler_device = lambda learner: torch.device("meta")
_autocast = torch.autocast  # which refuses the meta device: there, no autocast (no --bf16 here: it would change nothing)
torch.autocast = lambda kind, *a, **k: contextlib.nullcontext() if kind == "meta" else _autocast(kind, *a, **k)
"""


def test_the_sampler_acts_on_the_learners_gpu_and_on_the_cpu_otherwise():
    assert sampler_device(torch.device("cpu")) == torch.device("cpu")
    assert sampler_device(torch.device("cuda", 1)) == torch.device("cuda", 1)  # the rank's own GPU under torchrun
    assert sampler_device(torch.device("mps")) == torch.device("cpu")


# CI runs one of each family (the others are slow: CI's 40 minutes)
@pytest.mark.parametrize(
    "name", [n if n in ("ppo_atari", "dqn_atari") else pytest.param(n, marks=pytest.mark.slow) for n in FLAGS]
)
def test_each_scripts_sampler_acts_on_the_device_it_is_given(name: str, tmp_path: Path):
    text = (ROOT / "algos" / f"{name}.py").read_text()
    main_block = 'if __name__ == "__main__":'
    copy = tmp_path / f"{name}.py"
    copy.write_text(text.replace(main_block, ON_META + "\n\n" + main_block))
    cmd = [sys.executable, str(copy), *FLAGS[name], "--sampler", "async", "--eval-episodes", "0", "--out-dir", "runs"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the sampler process failed" in done.stderr, done.stderr[-3000:]
    # the acting step ran on the meta device up to its read back to the host: network, inputs and state all there (one
    # tensor left on a CPU of its own fails earlier, on mixed devices: "not on the expected device", "same device")
    assert "Cannot copy out of meta tensor" in done.stderr, done.stderr[-3000:]
    assert "expected device" not in done.stderr and "same device" not in done.stderr, done.stderr[-3000:]
