"""Which CPU cores each process of a run uses, and a compact string form of that assignment.

Guarantees
- ``make_affinity()`` with no arguments uses every core this process may run on, pins nothing, and sets
  torch's thread count to the number of physical cores: right for a laptop.
- ``make_affinity(mode, n_workers)`` splits the cores between sampler workers and the learner: ``serial``
  gives the learner all of them; ``parallel`` spreads workers one physical core each (round-robin when there
  are more workers than cores) and lets the learner use all cores, since it runs while workers wait;
  ``async`` gives the learner half the cores (at least one; one when the learner is on a GPU,
  ``gpu_learner``) and the rest to one sampler worker (every script's async mode runs one sampler process),
  so they never share; with ``n_workers`` given, the rest are spread one physical core per worker.
- ``encode()``/``decode()`` round-trip an ``Affinity`` through a shell-safe string such as
  ``L0-1+W2,3+T2`` (learner cores, ``,`` between workers, ``.`` between cpu items, ``T`` torch threads,
  ``N`` no pinning), and ``slot_code(run_slot, n_slots)`` gives each of several runs on one machine an equal,
  disjoint share of the cores, so a launcher can hand each its slot.
- Under torchrun with several ranks on this machine (``LOCAL_WORLD_SIZE`` > 1), ``make_affinity(mode)``
  without ``cpus`` gives local rank r the r-th of ``LOCAL_WORLD_SIZE`` equal, disjoint shares of the physical
  cores, pinned (more ranks than cores: no pinning, one torch thread each), and splits that share as above.
- ``apply_learner()`` / ``apply_worker(i)`` pin the calling process (``os.sched_setaffinity``; skipped where
  unsupported) and set torch's intra-op threads to match (a pinned worker: one per physical core it holds;
  an unpinned one: one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["Affinity", "available_cpus", "physical_cores", "make_affinity", "slot_code"]


def available_cpus() -> tuple[int, ...]:
    """Logical CPUs this process may run on."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS
        return tuple(range(os.cpu_count() or 1))


def physical_cores(cpus: tuple[int, ...] | None = None) -> list[tuple[int, ...]]:
    """Group logical CPUs into physical cores (hyperthread siblings together), from sysfs where readable."""
    cpus = available_cpus() if cpus is None else tuple(cpus)
    groups: dict[tuple[str, str], list[int]] = {}
    for c in cpus:
        topo = f"/sys/devices/system/cpu/cpu{c}/topology"
        try:
            with open(f"{topo}/physical_package_id") as f:
                pkg = f.read().strip()
            with open(f"{topo}/core_id") as f:
                core = f.read().strip()
        except OSError:
            pkg, core = "0", f"cpu{c}"
        groups.setdefault((pkg, core), []).append(c)
    return sorted((tuple(sorted(g)) for g in groups.values()), key=lambda g: g[0])


@dataclass(frozen=True)
class Affinity:
    """One run's cores: the learner's, each sampler worker's, torch threads, and whether to pin."""

    learner_cpus: tuple[int, ...]
    worker_cpus: tuple[tuple[int, ...], ...] = field(default_factory=tuple)
    torch_threads: int = 1
    pin: bool = True

    def __post_init__(self):
        if not self.learner_cpus:
            raise ValueError("learner_cpus must name at least one cpu")
        if any(not w for w in self.worker_cpus):
            raise ValueError("every worker needs at least one cpu")
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be positive, got {self.torch_threads}")

    @property
    def n_workers(self) -> int:
        return len(self.worker_cpus)

    def encode(self) -> str:
        parts = ["L" + _cpulist(self.learner_cpus)]
        if self.worker_cpus:
            parts.append("W" + ",".join(_cpulist(w) for w in self.worker_cpus))
        parts.append(f"T{self.torch_threads}")
        if not self.pin:
            parts.append("N")
        return "+".join(parts)

    @classmethod
    def decode(cls, code: str) -> Affinity:
        learner, workers, threads, pin = None, (), None, True
        try:
            for part in code.strip().split("+"):
                key, val = part[:1], part[1:]
                if key == "L":
                    learner = _parse_cpulist(val)
                elif key == "W":
                    workers = tuple(_parse_cpulist(w) for w in val.split(","))
                elif key == "T":
                    threads = int(val)
                elif key == "N" and not val:
                    pin = False
                else:
                    raise ValueError(f"unknown part {part!r}")
        except ValueError as e:
            raise ValueError(f"bad affinity code {code!r}: {e}") from None
        if learner is None:
            raise ValueError(f"bad affinity code {code!r}: no learner part (L...)")
        return cls(learner, workers, threads if threads is not None else len(learner), pin)

    def apply_learner(self) -> None:
        """Pin the calling process to the learner's cores and set torch's thread count."""
        _apply(self.learner_cpus, self.torch_threads, self.pin)

    def apply_worker(self, i: int) -> None:
        """Pin the calling process to worker ``i``'s cores, one torch thread per physical core among them when
        they are its own (pinned), else one (unpinned cores may be shared: with other ranks, or anything else)."""
        _apply(self.worker_cpus[i], len(physical_cores(self.worker_cpus[i])) if self.pin else 1, self.pin)


def make_affinity(
    mode: str = "serial",
    n_workers: int | None = None,
    cpus: tuple[int, ...] | None = None,
    pin: bool | None = None,
    gpu_learner: bool = False,
) -> Affinity:
    """Split ``cpus`` (default: all available) for a run in ``mode`` with ``n_workers`` sampler workers.

    ``n_workers`` defaults to one per physical core (``parallel``) or one holding every core left after the
    learner (``async``), which keeps one core when ``gpu_learner`` (it only feeds the GPU) and half otherwise.
    ``pin`` defaults to True when ``cpus`` is given and False otherwise.
    """
    if mode not in ("serial", "parallel", "async"):
        raise ValueError(f"mode must be serial, parallel or async, got {mode!r}")
    if n_workers is not None and n_workers < 0:
        raise ValueError(f"n_workers must be non-negative, got {n_workers}")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if cpus is None and local_world > 1:  # torchrun: the local ranks share the machine's cores
        cores = physical_cores()
        if local_world > len(cores):  # more ranks than cores: share them all, one torch thread each
            everything = available_cpus()
            n = n_workers if n_workers is not None else (0 if mode == "serial" else 1)
            return Affinity(everything, (everything,) * n, 1, False)
        per = len(cores) // local_world
        r = int(os.environ.get("LOCAL_RANK", 0))
        cpus, pin = tuple(c for g in cores[r * per : (r + 1) * per] for c in g), True if pin is None else pin
    pin = (cpus is not None) if pin is None else pin
    cores = physical_cores(cpus)
    if not cores:
        raise ValueError("no cpus to assign")
    everything = tuple(c for g in cores for c in g)
    if mode == "serial":
        return Affinity(everything, (), len(cores), pin)
    if mode == "parallel":
        n = len(cores) if n_workers is None else n_workers
        workers = tuple(cores[i % len(cores)] for i in range(n))
        return Affinity(everything, workers, len(cores), pin)
    n_learn = 1 if gpu_learner else max(1, len(cores) // 2)
    learner_cores, sampler_cores = cores[:n_learn], cores[n_learn:] or cores[:1]  # one core: they must share
    if n_workers is None:  # the one sampler process, on every core the learner leaves
        workers = (tuple(c for g in sampler_cores for c in g),)
    else:
        workers = tuple(sampler_cores[i % len(sampler_cores)] for i in range(n_workers))
    return Affinity(tuple(c for g in learner_cores for c in g), workers, n_learn, pin)


def slot_code(
    run_slot: int, n_slots: int, mode: str = "serial", n_workers: int | None = None, cpus: tuple[int, ...] | None = None
) -> str:
    """Affinity code for run ``run_slot`` of ``n_slots`` sharing this machine (disjoint physical cores)."""
    cores = physical_cores(cpus)
    if not 1 <= n_slots <= len(cores):
        raise ValueError(f"n_slots must be between 1 and the {len(cores)} physical cores, got {n_slots}")
    if not 0 <= run_slot < n_slots:
        raise ValueError(f"run_slot must be in [0, {n_slots}), got {run_slot}")
    per = len(cores) // n_slots
    mine = cores[run_slot * per : (run_slot + 1) * per]
    return make_affinity(mode, n_workers, tuple(c for g in mine for c in g), pin=True).encode()


def _apply(cpus: tuple[int, ...], threads: int, pin: bool) -> None:
    if pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    import torch

    torch.set_num_threads(threads)


def _cpulist(cpus: tuple[int, ...]) -> str:
    items, cs, i = [], sorted(cpus), 0
    while i < len(cs):
        j = i
        while j + 1 < len(cs) and cs[j + 1] == cs[j] + 1:
            j += 1
        items.append(str(cs[i]) if i == j else f"{cs[i]}-{cs[j]}")
        i = j + 1
    return ".".join(items)


def _parse_cpulist(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for item in text.split("."):
        a, sep, b = item.partition("-")
        lo, hi = int(a), int(b) if sep else int(a)
        if lo < 0 or hi < lo:
            raise ValueError(f"bad cpu range {item!r}")
        out.extend(range(lo, hi + 1))
    if not out:
        raise ValueError("empty cpu list")
    return tuple(out)
