"""SAC's update alone, in updates per second, four ways side by side on one device: where a compiled SAC's time per
step goes on a GPU, and what capturing the whole update as one CUDA graph would gain.

Compiled SAC on an H200 ran 155.8 SPS (6.4 ms per step, one update per step) where LeanRL reports 725 on an H100
(docs/gpu.md). ``--compile`` today compiles the three losses and the acting step (CUDA graphs through torch's
``reduce-overhead``); the backward calls, the three optimiser steps, zeroing the gradients and the target update
run eagerly, one launch at a time, and each compiled call pays its Python wrappers. LeanRL instead captures the
whole update, backward and optimiser steps included, as one CUDA graph. This measures the update of
``algos/sac_mujoco.py`` (its own ``sac_update``, networks and losses, imported, not copied) on a replay-shaped
batch uploaded from numpy each time, as the script does:

- ``eager``: as the script runs without ``--compile``;
- ``compile``: as with ``--compile`` (``shared.compiling.enable``);
- ``graph`` (CUDA only): the same ``sac_update`` captured once as one ``torch.cuda.CUDAGraph`` after three warm-up
  updates on a side stream, then replayed, the uploaded batch copied into the captured one first (Adam made
  ``capturable``, so its step counts live on the GPU);
- ``graph-compile`` (CUDA only): as ``graph`` with the three losses compiled without CUDA graphs of their own
  (inductor's fused kernels inside the one captured graph, as LeanRL does).

On a CPU only the first two run; ``--hidden 8 --batch-size 8`` makes the arithmetic negligible, so that what is
left is the host's own cost per update: the part a GPU cannot hide unless the update is one graph.

    python benchmarks/update_speed.py [--device cpu] [--hidden 256] [--batch-size 256] [--updates 300]
                                      [--modes eager compile graph graph-compile]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))

MODES = ("eager", "compile", "graph", "graph-compile")
OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah


def sac_updates_per_second(device: str, mode: str, hidden: int = 256, batch_size: int = 256,
                           updates: int = 300) -> float:
    """Updates per second of ``algos/sac_mujoco.py``'s ``sac_update`` run ``mode`` way on ``device``, timed over
    ``updates`` updates after ``updates // 4`` untimed ones (compiling and capturing happen in those)."""
    import gymnasium as gym
    import numpy as np
    import sac_mujoco as sac
    import torch

    from shared import compiling

    dev = torch.device(device)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode.startswith("graph") and dev.type != "cuda":
        raise ValueError(f"{mode} needs a CUDA device")
    torch.manual_seed(1)
    args = sac.Args(hidden=hidden, batch_size=batch_size)
    box = lambda n: gym.spaces.Box(-1.0, 1.0, (n,), np.float32)
    run = SimpleNamespace(device=dev, obs_space=box(OBS_DIM), act_space=box(ACT_DIM))
    actor, critics, target_critics, log_alpha, optimizers, obs_norm = sac.make_learner(args, run)
    rng = np.random.default_rng(1)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    batch = SimpleNamespace(observation=f32(batch_size, OBS_DIM), next_observation=f32(batch_size, OBS_DIM),
                            action=np.tanh(f32(batch_size, ACT_DIM)), n_step_return=f32(batch_size),
                            terminated_n=np.zeros(batch_size, np.float32),
                            bootstrap_discount=np.full(batch_size, 0.99, np.float32))
    update = lambda: sac.sac_update(actor, critics, target_critics, log_alpha, optimizers, batch,
                                    obs_norm, args, dev)
    saved = {name: getattr(sac, name) for name in ("sac_critic_loss", "sac_actor_loss", "sac_alpha_loss",
                                                   "to_tensors")}
    try:
        if mode == "compile":
            compiling.enable(dev)
        if mode == "graph-compile":  # the losses as inductor kernels, no CUDA graphs of their own
            for name in ("sac_critic_loss", "sac_actor_loss", "sac_alpha_loss"):
                setattr(sac, name, torch.compile(saved[name].__wrapped__, fullgraph=True, dynamic=False))
        if mode.startswith("graph"):
            update = _graphed(sac, saved["to_tensors"], update, optimizers, batch, obs_norm, dev)
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
            raise RuntimeError(f"{mode}: the updates left parameter tensors {unchanged} of actor, critics and log "
                               f"alpha unchanged")
        return updates / seconds
    finally:
        for name, fn in saved.items():
            setattr(sac, name, fn)
        compiling.disable()


def _graphed(sac, to_tensors, update, optimizers, batch, obs_norm, dev):
    """``update`` captured once as one CUDA graph; the returned function uploads the batch, copies it into the
    captured tensors and replays the graph (module docstring)."""
    import torch

    for opt in optimizers.values():  # Adam keeps its step counts on the GPU, as capture needs
        for group in opt.param_groups:
            group["capturable"] = True
    static = to_tensors(batch, obs_norm, dev)
    sac.to_tensors = lambda *_: static  # sac_update reads the captured batch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), warnings.catch_warnings():  # warm-up off the capture: Adam's state, compiling
        warnings.filterwarnings("ignore", message=".*capturable=True.*")  # Adam says it runs outside a capture
        for _ in range(3):
            update()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = update()

    def replay():
        for key, value in to_tensors(batch, obs_norm, dev).items():
            static[key].copy_(value, non_blocking=True)
        graph.replay()
        return out

    return replay


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
    if a.modes and device.type != "cuda" and any(m.startswith("graph") for m in a.modes):
        p.error(f"the graph modes need a CUDA device, not {a.device}")
    modes = a.modes or [m for m in MODES if device.type == "cuda" or not m.startswith("graph")]
    print(f"SAC update (HalfCheetah shapes), hidden {a.hidden}, batch {a.batch_size}, {a.updates} timed updates, "
          f"device {a.device}")
    base = None
    for mode in modes:
        ups = sac_updates_per_second(a.device, mode, a.hidden, a.batch_size, a.updates)
        base = base or ups
        print(f"  {mode:14s} {ups:9.1f} updates/s  {1e3 / ups:7.3f} ms each  {ups / base:5.2f}x {modes[0]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
