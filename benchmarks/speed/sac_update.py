"""SAC's update alone, in updates per second, side by side on one device: what ``--compile`` does to the update of
``algos/sac_mujoco.py`` (its own ``sac_update``, networks and losses, imported, not copied), on a replay-shaped batch
uploaded from numpy each time, as the script does:

- ``eager``: as the script runs without ``--compile``;
- ``compile``: as with ``--compile`` (``shared.compiling.enable``): the losses compiled by inductor and, on CUDA, the
  whole update (forward, backward, optimiser steps, target update) one CUDA graph, replayed (``@graphed``);
- ``compile-no-graph`` (CUDA only): the same without the capture (``RL_COMPILE_GRAPHS=0``): the graph protocol's
  copies, then every kernel launched one at a time;
- ``graph-eager`` (CUDA only): the capture of eager kernels (dynamo's ``eager`` backend): what the graph alone gains.

Before issue 61 (27e77f9, one H200): eager 136.7, the old ``--compile`` (each loss its own CUDA graph, backward and
optimiser steps launched one at a time) 192.8, the whole update captured by hand 1,853.5, with compiled losses
2,642.6 updates/s. On a CPU only the first two run; ``--hidden 8 --batch-size 8`` makes the arithmetic
negligible, so that what is left is the host's own cost per update.

    python benchmarks/speed/sac_update.py [--device cpu] [--hidden 256] [--batch-size 256] [--updates 300]
                                      [--modes eager compile compile-no-graph graph-eager]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))

MODES = ("eager", "compile", "compile-no-graph", "graph-eager")
CUDA_ONLY = ("compile-no-graph", "graph-eager")
OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah


def sac_updates_per_second(device: str, mode: str, hidden: int = 256, batch_size: int = 256, updates: int = 300) -> float:
    """Updates per second of ``algos/sac_mujoco.py``'s ``sac_update`` run ``mode`` way on ``device``, timed over
    ``updates`` updates after ``updates // 4`` untimed ones (compiling and capturing happen in those)."""
    import gymnasium as gym
    import numpy as np
    import sac_mujoco as sac
    import torch

    from shared import compiling
    from shared.normalize import upload_batch

    dev = torch.device(device)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode in CUDA_ONLY and dev.type != "cuda":
        raise ValueError(f"{mode} needs a CUDA device")
    torch.manual_seed(1)
    args = sac.Args(hidden=hidden, batch_size=batch_size)
    box = lambda n: gym.spaces.Box(-1.0, 1.0, (n,), np.float32)
    run = SimpleNamespace(device=dev, obs_space=box(OBS_DIM), act_space=box(ACT_DIM))
    actor, critics, target_critics, log_alpha, optimizers, obs_norm = sac.make_learner(args, run)
    rng = np.random.default_rng(1)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    batch = dict(  # the replay batch's fields the update reads (sac.HOST_ONLY aside)
        observation=f32(batch_size, OBS_DIM),
        next_observation=f32(batch_size, OBS_DIM),
        action=np.tanh(f32(batch_size, ACT_DIM)),
        n_step_return=f32(batch_size),
        terminated_n=np.zeros(batch_size, np.float32),
        bootstrap_discount=np.full(batch_size, 0.99, np.float32),
    )

    def update():
        b = upload_batch(batch, obs_norm, dev)
        return sac.sac_update(actor, critics, target_critics, log_alpha, optimizers, b, args)

    env = {"compile-no-graph": ("RL_COMPILE_GRAPHS", "0"), "graph-eager": ("RL_COMPILE_BACKEND", "eager")}.get(mode)
    saved_env = os.environ.get(env[0]) if env else None
    try:
        if env:
            os.environ[env[0]] = env[1]
        if mode != "eager":
            compiling.enable(dev)
        for _ in range(max(3, updates // 4)):
            update()
        _sync(dev)
        # what the timed updates must change: the live parameters the script acts and learns with (a captured
        # graph that wrote elsewhere would be timed doing nothing useful)
        before = [t.detach().clone() for t in (*actor.parameters(), *critics.parameters(), log_alpha)]
        start = time.perf_counter()
        for _ in range(updates):
            stats = update()
        _sync(dev)
        seconds = time.perf_counter() - start
        if not all(bool(torch.isfinite(v).all()) for v in stats.values()):
            raise RuntimeError(f"{mode}: a statistic is not finite: {stats}")
        after = (*actor.parameters(), *critics.parameters(), log_alpha)
        unchanged = [i for i, (a, b) in enumerate(zip(before, after)) if torch.equal(a, b)]
        if unchanged:
            raise RuntimeError(
                f"{mode}: the updates left parameter tensors {unchanged} of actor, critics and log alpha unchanged"
            )
        return updates / seconds
    finally:
        compiling.disable()
        if env and saved_env is None:
            os.environ.pop(env[0], None)
        elif env:
            os.environ[env[0]] = saved_env


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--modes", nargs="*", choices=MODES, default=None, help="default: every mode the device runs")
    a = p.parse_args()
    for name in ("hidden", "batch_size", "updates"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    try:
        import torch

        device = torch.device(a.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            p.error(f"--device {a.device}: no CUDA device here")
    except RuntimeError as e:
        p.error(f"--device {a.device}: {e}")
    if a.modes and device.type != "cuda" and any(m in CUDA_ONLY for m in a.modes):
        p.error(f"{', '.join(CUDA_ONLY)} need a CUDA device, not {a.device}")
    modes = a.modes or [m for m in MODES if device.type == "cuda" or m not in CUDA_ONLY]
    print(
        f"SAC update (HalfCheetah shapes), hidden {a.hidden}, batch {a.batch_size}, {a.updates} timed updates, "
        f"device {a.device}"
    )
    base = None
    for mode in modes:
        ups = sac_updates_per_second(a.device, mode, a.hidden, a.batch_size, a.updates)
        base = base or ups
        print(f"  {mode:14s} {ups:9.1f} updates/s  {1e3 / ups:7.3f} ms each  {ups / base:5.2f}x {modes[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
