"""CPU and GPU slots: the machine cut into equal, disjoint shares, one per run, and the environment a run gets.

Guarantees (rlpyt's affinity)
- ``make_slots``: the physical cores this process may use (``shared/affinity.py``: ``physical_cores()``; start
  the launcher under ``taskset`` to give it fewer) are cut into slots of ``--cores-per-run`` cores, hyperthread
  siblings kept together. Slots are disjoint and equal; each carries its logical CPUs (a run is pinned to them:
  ``experiments/process.py``) and its ``shared.affinity`` code (what ``slot_code(i, n)`` gives over the cores
  used). The scripts' ``make_affinity`` splits only the CPUs the process may run on, so a pinned script stays
  inside its slot. A torchrun run takes N slots and its local ranks split those cores.
- GPUs (where ``torch.cuda.device_count() > 0``, asked in a child process by ``gpu_count``): the slots are spread
  over them (``CUDA_VISIBLE_DEVICES``, within the one this process was given); ``--gpus-per-run G`` gives each
  run G GPUs of its own, ``--runs-per-gpu K`` puts at most K runs on one GPU, ``--gpus-per-run 0`` hides them.
  The number of slots is cut to what the GPUs allow.
- ``child_env``: ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` set to a slot's core count (per process: a torchrun
  rank gets one slot's share), the slots' GPUs, unbuffered Python output.
- Too few cores or GPUs for the slots asked raises ``LaunchError``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.grid import LaunchError
from shared.affinity import Affinity, physical_cores


@dataclass(frozen=True)
class Slot:
    index: int
    cpus: tuple[int, ...]  # logical CPUs
    cores: int  # physical cores: the threads a run gets
    gpus: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES entries
    hide_gpus: bool = False  # GPUs exist but runs get none
    code: str = ""  # shared/affinity.py's code of the slot


def gpu_count() -> int:
    """``torch.cuda.device_count()``, asked in a child process (importing torch here would start threads before
    the launcher forks its children); 0 without any GPU device node, without asking."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    dev = Path("/dev")
    if not (any(dev.glob("nvidia[0-9]*")) or (dev / "kfd").exists()):
        return 0
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return int(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return 0


def make_slots(
    cores: Sequence[tuple[int, ...]],
    cores_per_run: int,
    n_gpus: int = 0,
    gpus_per_run: int | None = None,
    runs_per_gpu: int | None = None,
) -> list[Slot]:
    """Cut ``cores`` (physical cores, each a tuple of logical CPUs) into slots of ``cores_per_run`` and give each
    its GPUs (see the module docstring). Slots are disjoint and equal; each carries its ``shared.affinity`` code
    (what ``slot_code(i, n)`` gives over the cores used: that function reads the topology from sysfs itself)."""
    if cores_per_run < 1:
        raise LaunchError(f"--cores-per-run must be at least 1, got {cores_per_run}")
    n = len(cores) // cores_per_run
    if n == 0:
        raise LaunchError(f"--cores-per-run {cores_per_run}: only {len(cores)} physical cores here")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s.strip() for s in visible.split(",")] if visible else [str(i) for i in range(n_gpus)]
    ids = ids[:n_gpus]
    if n_gpus and gpus_per_run:
        if gpus_per_run > n_gpus:
            raise LaunchError(f"--gpus-per-run {gpus_per_run}: only {n_gpus} GPUs here")
        n = min(n, n_gpus // gpus_per_run)
    elif n_gpus and runs_per_gpu and gpus_per_run is None:
        n = min(n, n_gpus * runs_per_gpu)
    slots = []
    for i in range(n):
        cpus = tuple(sorted(c for g in cores[i * cores_per_run : (i + 1) * cores_per_run] for c in g))
        code = Affinity(cpus, (), cores_per_run, True).encode()  # = shared.affinity.slot_code on this topology
        if not n_gpus or gpus_per_run == 0:
            gpus: tuple[str, ...] = ()
        elif gpus_per_run:
            gpus = tuple(ids[i * gpus_per_run : (i + 1) * gpus_per_run])
        else:
            gpus = (ids[i % n_gpus],)
        slots.append(Slot(i, tuple(cpus), cores_per_run, gpus, bool(n_gpus) and gpus_per_run == 0, code))
    return slots


def local_slots(a) -> list[Slot]:
    """This machine's slots for a command's ``--cores-per-run``, ``--gpus-per-run`` (0: no GPU asked for) and
    ``--runs-per-gpu``."""
    n_gpus = gpu_count() if a.gpus_per_run != 0 else 0
    return make_slots(physical_cores(), a.cores_per_run, n_gpus, a.gpus_per_run, a.runs_per_gpu)


def child_env(slots: Sequence[Slot], base: dict | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    threads = str(slots[0].cores)  # per process; a torchrun rank gets one slot's share
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
    gpus = [g for s in slots for g in s.gpus]
    if gpus or any(s.hide_gpus for s in slots):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env
