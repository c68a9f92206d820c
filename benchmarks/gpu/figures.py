"""The GPU figures: each a call of a speed benchmark's own function (``benchmarks/speed/<module>.py``), on
``cuda`` beside the same on ``cpu``, in the order they run (the compiled figures first, so that a budget cut drops
the least), and the code a figure runs in its own Python: the call's value is its last line, and the end of the
output the benchmark captured of its script is copied into the figure's log."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BREAKOUT = "BreakoutNoFrameskip-v4"
PPO_STEPS, SAC_STEPS, DQN_STEPS = 3072, 1000, 2000  # 3 rollouts (2 timed); 1,000 steps learning; 2,000 learning
DEV = "DEV"  # in a pair's arguments: cuda for one figure, cpu for the other


@dataclass(frozen=True)
class Figure:
    """``module.function(*args, **kwargs)``, a number in ``unit``. ``weight`` multiplies the per-figure budget: a
    compiled figure compiles first (inductor: tens of seconds, outside its timed window); a replay script's fills
    its replay first and then learns 1,000-2,000 steps, one update each (on an H200, eager SAC and DQN did not
    finish within 24 s)."""

    module: str
    function: str
    args: tuple
    unit: str = "SPS"
    kwargs: tuple[tuple[str, object], ...] = ()
    weight: int = 1

    @property
    def call(self) -> str:
        return f"{self.function}({', '.join([*map(repr, self.args), *(f'{k}={v!r}' for k, v in self.kwargs)])})"

    @property
    def cmd(self) -> str:
        return f"{self.module}.{self.call}"

    @property
    def device(self) -> str:
        return "cuda" if "cuda" in self.args else "cpu"

    def code(self) -> str:
        return FIGURE_CODE.format(module=self.module, call=self.call)


def _figures() -> dict[str, Figure]:
    """name -> figure, in the order they run: the compiled GPU figures first, then pairs (cuda, then the same on
    cpu) of what matters most, so that a budget cut drops the least."""
    figs: dict[str, Figure] = {}

    def pair(name: str, module: str, function: str, args: tuple, unit: str = "SPS", weight: int = 1) -> None:
        for dev in ("cuda", "cpu"):
            figs[f"{name}-{dev}"] = Figure(module, function, tuple(dev if a == DEV else a for a in args), unit, (), weight)

    def compiled(name: str, module: str, function: str, args: tuple, unit: str = "SPS", **kwargs) -> None:
        figs[name] = Figure(module, function, args, unit, tuple(kwargs.items()), weight=3)

    ppo, dqn, sac = "ppo_atari_vs_sb3", "dqn_atari_vs_sb3", "sac_td3_ddpg_vs_sb3"
    pair("ppo-serial", ppo, "ours", (BREAKOUT, PPO_STEPS, "serial", [], DEV))
    # --compile beside eager on the same GPU (issue 42; LeanRL's H100 figures in docs/gpu.md): compiling happens in
    # the first rollout and update, before each benchmark's timed window.
    compiled("ppo-serial-compile-cuda", ppo, "ours", (BREAKOUT, PPO_STEPS, "serial", ["--compile"], "cuda"))
    figs["sb3-ppo-cuda"] = Figure(ppo, "sb3", (BREAKOUT, PPO_STEPS, "cuda"))
    # the envs alone, random actions (no policy, no GPU): what bounds the PPO figures above if the GPU does not
    figs["ppo-envs-serial"] = Figure("ppo_sampling", "envs_only", (BREAKOUT, 8, "serial", 10.0))
    # SAC's update alone (benchmarks/speed/sac_update.py): eager, --compile (the whole update one CUDA graph), the
    # same without the capture, and the capture of eager kernels
    for mode in ("eager", "compile", "compile-no-graph", "graph-eager"):
        weight = 3 if "compile" in mode else 1
        figs[f"sac-update-{mode}-cuda"] = Figure(
            "sac_update", "sac_updates_per_second", ("cuda", mode), "updates/s", weight=weight
        )
    figs["sac-update-eager-cpu"] = Figure("sac_update", "sac_updates_per_second", ("cpu", "eager"), "updates/s")
    pair("sac-serial", sac, "ours", ("sac_mujoco.py", "HalfCheetah-v5", SAC_STEPS, "serial", [], DEV), weight=2)
    figs["sb3-sac-cuda"] = Figure(sac, "sb3", ("sac", "HalfCheetah-v5", SAC_STEPS, "cuda"), weight=2)
    cheetah = ("HalfCheetah-v5", SAC_STEPS, "serial", ["--compile"], "cuda")
    compiled("sac-serial-compile-cuda", sac, "ours", ("sac_mujoco.py", *cheetah))
    # the same compiled SAC under cProfile: where the host's time per step goes (the figure's log holds the table)
    compiled("sac-profile-compile-cuda", sac, "ours", ("sac_mujoco.py", *cheetah), profile_top=30)
    pair("dqn-serial", dqn, "ours", ("dqn_atari.py", BREAKOUT, DQN_STEPS, "serial", [], DEV), weight=2)
    compiled("dqn-serial-compile-cuda", dqn, "ours", ("dqn_atari.py", BREAKOUT, DQN_STEPS, "serial", ["--compile"], "cuda"))
    r2d1 = ("r2d1_atari", "learner_sequences_per_second")
    figs["r2d1-learner-cuda"] = Figure(*r2d1, (5, "cuda", 2500.0), "sequences/s")
    figs["r2d1-learner-cpu"] = Figure(*r2d1, (1, "cpu", 2500.0), "sequences/s")
    pair("ppo-parallel", ppo, "ours", (BREAKOUT, PPO_STEPS, "parallel", [], DEV))
    pair("ppo-async", ppo, "ours", (BREAKOUT, PPO_STEPS, "async", [], DEV))
    pair("c51-serial", dqn, "ours", ("catdqn_atari.py", BREAKOUT, DQN_STEPS, "serial", [], DEV), weight=2)
    # --compile, each update and acting step one CUDA graph (issue 61), beside LeanRL's H100 figures (docs/gpu.md)
    for sampler in ("parallel", "async"):
        compiled(f"ppo-{sampler}-compile-cuda", ppo, "ours", (BREAKOUT, PPO_STEPS, sampler, ["--compile"], "cuda"))
    for script in ("td3", "ddpg"):
        compiled(f"{script}-serial-compile-cuda", sac, "ours", (f"{script}_mujoco.py", *cheetah))
    ppo_mujoco = ("HalfCheetah-v5", 3 * 2048, 1, "serial", "cuda", ("--compile",))
    compiled("ppo-mujoco-compile-cuda", "ppo_mujoco_vs_sb3", "ours", ppo_mujoco)
    compiled("c51-serial-compile-cuda", dqn, "ours", ("catdqn_atari.py", BREAKOUT, DQN_STEPS, "serial", ["--compile"], "cuda"))
    compiled("r2d1-learner-compile-cuda", *r2d1, (5, "cuda", 2500.0), "sequences/s", compile=True)
    # most valuable first (issue 61): the compiled figures beside LeanRL's, then the eager ones and the CPU side
    first = [
        "ppo-parallel-compile-cuda",
        "ppo-async-compile-cuda",
        "sac-serial-compile-cuda",
        "td3-serial-compile-cuda",
        "ppo-mujoco-compile-cuda",
        "dqn-serial-compile-cuda",
        "c51-serial-compile-cuda",
        "ddpg-serial-compile-cuda",
        "ppo-serial-compile-cuda",
        "sac-update-compile-cuda",
        "sac-profile-compile-cuda",
        "r2d1-learner-compile-cuda",
    ]
    return {**{k: figs[k] for k in first}, **{k: v for k, v in figs.items() if k not in first}}


FIGURES = _figures()
# the training figures of ours that SB3 ran beside on the same GPU (not the envs alone, not a run under cProfile)
BESIDE_SB3 = ("ppo-serial-cuda", "ppo-serial-compile-cuda", "sac-serial-cuda", "sac-serial-compile-cuda")
# The benchmark captures its script's output; the wrapper copies its end into the figure's log, so a slow or
# failed figure shows the script's own rows (SPS, compile seconds) and warnings (a CUDA graph skipped, say).
FIGURE_CODE = """import subprocess, sys
import torch
from benchmarks.speed import {module} as b
_run = subprocess.run
def _tee(*args, **kwargs):
    r = _run(*args, **kwargs)
    if not kwargs.get('capture_output'):
        return r  # a library's own call (check_output goes through run too), not the benchmark's of its script
    for name in ('stdout', 'stderr'):
        text = getattr(r, name, None)
        if isinstance(text, bytes):
            text = text.decode(errors='replace')
        for line in (text or '').splitlines()[-40:]:
            print('  | ' + line, file=sys.stderr)
    return r
subprocess.run = _tee
try:
    print(b.{call})
except subprocess.CalledProcessError as e:  # the script's own error, which the benchmark captured
    print((e.stderr or '')[-4000:], file=sys.stderr)
    raise
"""


def inductor_cache_dir() -> str:
    """Where inductor caches its kernels when nothing says otherwise (its default, under the temp folder)."""
    import getpass
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")


def progress_at_cut(tmp: Path) -> str | None:
    """How far a cut figure's script got, from the complete rows of the newest progress.csv under ``tmp``: the
    last row's step and its ``sps`` (the steps per second since the row before; None without a row)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from shared.progress import read_rows  # light: no torch

    for path in sorted(tmp.rglob("progress.csv"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            rows = read_rows(path)
            got = f"step {int(rows[-1]['global_step'])}, {len(rows)} row(s)" if rows else None
            if got and len(rows) > 1:  # a first row's sps counts the start-up too
                got += f", {float(rows[-1]['sps']):.1f} steps/s between the last two"
        except (OSError, KeyError, ValueError):
            continue
        return got
    return None
