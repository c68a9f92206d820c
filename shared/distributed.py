"""Synchronous data-parallel training on torch.distributed, for scripts launched by ``torchrun``.

Every rank steps its own envs (and keeps its own replay); every update averages the gradients of all ranks
(one flattened all-reduce per backward pass), so the parameters, which start as rank 0's, stay identical.
This is DD-PPO's and rlpyt's SyncRl's scheme, on torch's own engine (gloo on CPU, NCCL on CUDA).

Guarantees
- Without torchrun (``WORLD_SIZE`` unset or 1) ``start`` does nothing and every other function is the
  identity or a no-op: a single-process run is bit-identical to one that never imports this module.
- ``rank()``, ``world_size()``, ``local_rank()`` read torchrun's environment variables, so they are right
  before ``start``, and in a rank's own spawned sampler processes (which inherit them).
- ``start(device)`` joins the process group with a ``TIMEOUT_S`` timeout on every collective (torch's
  default is 30 minutes): a rank that dies or hangs ends its peers' collectives with an error, never a hang.
  From then until ``end()`` a SIGINT or SIGTERM only sets a flag (``shared.signals``): the ranks agree on it
  with ``any_rank`` (the run does so once per loop iteration), so every rank leaves its loop at the same
  iteration and rank 0 writes the checkpoint. ``end()`` leaves the group and makes signals raise again; it
  raises nothing itself: the caller reads ``signals.signalled()``.
- ``share(*modules)`` copies rank 0's parameters and buffers to every rank and remembers the modules;
  ``check_in_sync()`` compares a checksum of them across ranks and raises ``RanksDiverged`` naming the first
  module that differs. ``rank_seed(seed)`` is ``seed`` on rank 0 and a stream of its own on every other rank.
- Agreements (``any_rank``, ``min_over_ranks``, ``gather_objects``) run on a CPU (gloo) group, also when the
  gradients go over NCCL, so deciding to stop or log never waits on a GPU.
- ``env_seed(seed, num_envs)`` gives rank r's env i the seed ``seed + r * num_envs + i`` (gymnasium adds i):
  every env of the job gets a distinct seed.
- ``average_gradients(module)`` replaces each gradient by the mean over ranks: with equal per-rank batches,
  the gradient of the concatenated batch. Every all-reduce goes through ``shared.compiling.collective``: inside
  a ``@graphed`` update's capture it runs between two graphs at each replay, never inside one. ``mean_std(x)``
  is ``x.mean(), x.std()`` over every rank's ``x``.
- ``any_rank(*flags)``, ``min_over_ranks(n)`` and ``gather_objects(obj)`` are the agreements the loops need:
  every decision that changes how many collectives a rank runs (a stop, how many updates are due) is reduced
  first, so no rank waits in a collective its peers skipped.
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import numpy as np

from shared import compiling, signals

__all__ = [
    "TIMEOUT_S",
    "RanksDiverged",
    "any_rank",
    "average_gradients",
    "check_in_sync",
    "end",
    "env_seed",
    "gather_objects",
    "in_lockstep",
    "is_main",
    "local_rank",
    "lost_peer",
    "mean_std",
    "min_over_ranks",
    "moments",
    "rank",
    "rank_seed",
    "share",
    "start",
    "world_size",
]

TIMEOUT_S = 30.0  # longest wait in any collective; torchrun SIGKILLs a rank 30 s after asking it to stop
SLOW_TIMEOUT_S = 3600.0  # a gather after an evaluation: ranks may play episodes of very different lengths
SEED_STRIDE = 1_000_003  # ranks > 0 seed torch and numpy with seed + rank * SEED_STRIDE

# "cpu_group": the agreements' gloo group (None: the default group is gloo already).
_state: dict[str, Any] = {"active": False, "modules": [], "slow_group": None, "cpu_group": None}


class RanksDiverged(RuntimeError):
    """The ranks' parameters differ: their updates were not the same."""


def rank() -> int:
    return int(os.environ.get("RANK", 0))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def is_main() -> bool:
    return rank() == 0


def in_lockstep() -> bool:
    """True between ``start`` and ``end`` of a job with more than one rank: collectives are allowed."""
    return bool(_state["active"])


def start(device: Any) -> None:
    """Join the process group (NCCL for a CUDA ``device``, gloo otherwise); call after the arguments are
    checked, so a bad argument exits 2 on every rank before any rank waits for another."""
    if world_size() <= 1:
        return
    import torch
    import torch.distributed as dist

    backend = "nccl" if getattr(device, "type", "cpu") == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device)
        # A collective that times out (a peer died or hung) raises in this rank's Python, where the run ends it
        # cleanly; without it NCCL's watchdog aborts the whole process (SIGABRT) and nothing is cleaned up.
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    # The first optimizer step imports torch._dynamo and with it torch.distributed.nn, whose functions take the
    # default group as a default argument: imported after init_process_group, they hold the group (its gloo threads,
    # rank 0's store) past destroy_process_group into the interpreter's teardown, where it now and then ended a
    # finished rank with SIGABRT. Imported before, they hold None.
    import torch._dynamo

    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    _state["slow_group"] = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=SLOW_TIMEOUT_S))
    if backend != "gloo":
        _state["cpu_group"] = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    _state["active"] = True
    signals.flag_on_signals()


def end() -> None:
    """Collectives are over (the loop is done): the process group is left and signals raise KeyboardInterrupt
    again; one that came since the last agreement is still in ``signals.signalled()``."""
    if not _state["active"]:
        return
    import torch.distributed as dist

    _state["active"] = False
    signals.raise_on_signals()
    if dist.is_initialized():
        dist.destroy_process_group()
    # Our own references would keep the other groups (and their threads) alive into the teardown too (see start).
    _state["slow_group"] = _state["cpu_group"] = None


def lost_peer(error: BaseException | None) -> bool:
    """Whether ``error`` is a collective that failed because another rank died, hung or closed its connection."""
    if error is None or not in_lockstep():
        return False
    import torch.distributed as dist

    if isinstance(error, dist.DistError):
        return True
    signs = ("gloo", "NCCL", "Connection reset", "Connection closed", "Timed out", "timed out")
    return isinstance(error, RuntimeError) and any(k in str(error) for k in signs)


def _params(thing: Any) -> list:
    """The parameters of a module, or a lone tensor (SAC's log alpha) as a list of one."""
    return list(thing.parameters()) if hasattr(thing, "parameters") else [thing]


def _tensor(values, device=None):
    import torch

    return torch.as_tensor(np.asarray(values, np.float64), device=device)


def share(*modules: Any) -> None:
    """Rank 0's parameters and buffers (of modules, or lone tensors) go to every rank; they are the ones
    ``check_in_sync`` compares."""
    if not in_lockstep():
        return
    import torch
    import torch.distributed as dist

    _state["modules"] = list(modules)
    with torch.no_grad():
        for m in modules:
            for t in _params(m) + (list(m.buffers()) if hasattr(m, "buffers") else []):
                dist.broadcast(t.data, src=0)


def rank_seed(seed: int) -> int:
    """``seed`` on rank 0 (so a single process is unchanged), a stream of its own on every other rank."""
    return seed + rank() * SEED_STRIDE


def env_seed(seed: int, num_envs: int) -> int:
    """The seed for a rank's ``envs.reset(seed=...)`` of ``num_envs`` envs: distinct from every other rank's."""
    return seed + rank() * num_envs


def average_gradients(*modules: Any) -> None:
    """Every gradient of ``modules`` (or lone tensors) becomes its mean over ranks: call it between
    ``backward`` and clipping / ``step``."""
    if not in_lockstep():
        return
    import torch
    import torch.distributed as dist

    grads = [p.grad for m in modules for p in _params(m) if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    compiling.collective(lambda: dist.all_reduce(flat))  # inside a CUDA graph's capture: between two graphs
    flat /= world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def mean_std(x: Any, weight: Any = None) -> tuple[Any, Any]:
    """Mean and (unbiased) standard deviation of tensor ``x`` over the elements of every rank; with ``weight`` (0 or
    1 per element, the PPO family's final rows weigh 0), over the elements of weight 1."""
    import torch

    if weight is None and not in_lockstep():
        return x.mean(), x.std()
    w = torch.ones_like(x) if weight is None else weight.to(x.dtype)
    s = torch.stack([(x * w).sum(), (x * x * w).sum(), w.sum()]).double()  # no host-to-device copy
    if in_lockstep():
        import torch.distributed as dist

        compiling.collective(lambda: dist.all_reduce(s))
    n = s[2]
    mean = s[0] / n.clamp(min=1)
    var = (s[1] - n * mean * mean) / (n - 1).clamp(min=1)
    return mean.to(x.dtype), var.clamp(min=0).sqrt().to(x.dtype)


def moments(x: Any) -> tuple[Any, Any, Any]:
    """Count (a 0-d tensor), mean and (population) variance over dimension 0 of tensor ``x`` ``[N, D]`` and of
    every rank's ``x``, in float64, on ``x``'s device (nothing is read on the host). Two reductions (the sum, then
    the squared deviations from the global mean) so that a large mean costs no precision."""
    import torch

    x = x.double()
    # The count filled on the device: a host number copied up would wait on a GPU.
    s = torch.cat([x.sum(0), torch.full((1,), float(len(x)), dtype=torch.float64, device=x.device)])
    if in_lockstep():
        import torch.distributed as dist

        compiling.collective(lambda: dist.all_reduce(s))
    n = s[-1]
    mean = s[:-1] / n.clamp(min=1.0)
    sq = ((x - mean) ** 2).sum(0)
    if in_lockstep():
        compiling.collective(lambda: dist.all_reduce(sq))
    return n, mean, sq / n.clamp(min=1.0)


def any_rank(*flags: bool) -> list[bool]:
    """Each flag, True on every rank when it is set on any rank."""
    if not in_lockstep():
        return [bool(f) for f in flags]
    import torch.distributed as dist

    t = _tensor([float(f) for f in flags])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_state["cpu_group"])
    return [v > 0 for v in t.tolist()]


def min_over_ranks(n: int) -> int:
    """The smallest ``n`` of all ranks (e.g. how far the slowest rank's sampler got)."""
    if not in_lockstep():
        return n
    import torch.distributed as dist

    t = _tensor([n])
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=_state["cpu_group"])
    return int(t.item())


def gather_objects(obj: Any, slow: bool = False) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank. ``slow``: after work whose length differs
    between ranks (an evaluation), waited for up to ``SLOW_TIMEOUT_S`` instead of ``TIMEOUT_S``."""
    if not in_lockstep():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj, group=_state["slow_group"] if slow else _state["cpu_group"])
    return out


def _bits(t: Any) -> Any:
    """``t``'s elements as integers of the same width (int64, for an exact sum)."""
    import torch

    as_int = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()]
    return t.detach().reshape(-1).view(as_int).long()


def check_in_sync() -> None:
    """Raise ``RanksDiverged`` when any shared module's parameters differ between ranks."""
    if not in_lockstep() or not _state["modules"]:
        return
    import torch

    with torch.no_grad():
        # The sum of the parameters' bits as integers: exact and independent of the order of the sum, so equal
        # parameters always give equal checksums (a float sum may differ in its last bits between GPU models).
        # One host transfer for all of them (a .item() per parameter would sync a GPU once per tensor). A module of
        # buffers alone (a RunningNorm of returns) has no parameters to compare: 0.
        sums = [
            int(torch.stack([_bits(p).sum() for p in ps]).sum().cpu()) if (ps := _params(m)) else 0 for m in _state["modules"]
        ]
    every = gather_objects(sums)
    for i, mine in enumerate(every[0]):
        differing = [r for r, theirs in enumerate(every) if theirs[i] != mine]
        if differing:
            name = type(_state["modules"][i]).__name__
            raise RanksDiverged(
                f"the parameters of {name} (module {i}) on rank(s) {differing} differ from rank "
                f"0's: the ranks' updates were not the same"
            )
