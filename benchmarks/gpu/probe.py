"""The node's checks, run in a child Python by the GPU check's first part: every import (the required and optional
packages, shared/'s modules, the scripts), a few envs, a CUDA matmul and convolution, and the versions. One JSON
line per check (``{"check", "ok", "detail"}``), then ``{"versions": {...}}``: a check that hangs or crashes the child
still leaves the lines before it.

    python -c "from benchmarks.gpu.probe import probe; probe()"
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "algos").glob("*.py"))
REQUIRED = ["torch", "numpy", "gymnasium", "ale_py", "mujoco", "glfw", "tyro", "cv2", "numba", "pytest", "hypothesis"]
OPTIONAL = [
    "stable_baselines3",
    "xdist",
    "sb3_contrib",
    "tensorboard",
    "matplotlib",
    "pandas",
    "rich",
    "rliable",
    "arch",
    "submitit",
    "moviepy",
    "wandb",
    "psutil",
]
ENVS = ["CartPole-v1", "Pendulum-v1", "InvertedPendulum-v5", "HalfCheetah-v5", "BreakoutNoFrameskip-v4", "ale-py vector env"]
BREAKOUT = "BreakoutNoFrameskip-v4"


def cpu_quota(root: Path = Path("/sys/fs/cgroup"), own: str | None = None) -> float | str | None:
    """The cores this process may use at most by its cgroup's CPU quota (quota over period), the least of every level
    from its own cgroup (``own``: /proc/self/cgroup's text) up to the root, since a parent's quota binds its children
    too: cgroup v2's ``cpu.max``, else v1's ``cpu.cfs_quota_us``. ``"none"`` where every level read says unlimited,
    None where no level could be read. A quota below the cores counted explains env steps that do not scale with
    their threads."""
    if own is None:
        try:
            own = Path("/proc/self/cgroup").read_text()
        except OSError:
            own = ""
    paths = {}
    for line in own.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2].strip().strip("/")
    v1 = next((p for k, p in paths.items() if "cpu" in k.split(",")), "")
    v2_read = lambda d: (d / "cpu.max").read_text().split()[:2]  # "max 100000" or "400000 100000"
    v1_read = lambda d: [(d / f).read_text().strip() for f in ("cpu.cfs_quota_us", "cpu.cfs_period_us")]
    for read, base, rel in ((v2_read, root, paths.get("", "")), (v1_read, root / "cpu", v1)):
        parts = [x for x in rel.split("/") if x]
        found = []
        for d in (base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)):  # own cgroup, its parents, the root
            try:
                quota, period = read(d)
                found.append(None if quota == "max" or int(quota) < 0 else int(quota) / int(period))  # None: unlimited
            except (OSError, ValueError):  # not there, or not two numbers
                continue
        if found:
            limits = [x for x in found if x is not None]
            return round(min(limits), 2) if limits else "none"
    return None


def physical_core_count() -> int | None:
    """Physical cores among this process's CPUs, from sysfs's topology; None where it is hidden (shared.affinity then
    counts each CPU as a core of its own, which would read as a fact)."""
    from shared.affinity import available_cpus, physical_cores

    if not Path(f"/sys/devices/system/cpu/cpu{available_cpus()[0]}/topology/core_id").exists():
        return None
    return len(physical_cores())


def probe(full: bool = True) -> None:
    """Print one JSON line per check: ``{"check", "ok", "detail"}``, then ``{"versions": {...}}``. Without
    ``full``, only torch's versions and the CUDA checks (a rerun that leaves out the imports and envs)."""
    import importlib
    import traceback

    def emit(check: str, ok: bool | None, detail: str = "") -> None:
        print(json.dumps({"check": check, "ok": ok, "detail": detail}), flush=True)

    def attempt(check: str, fn) -> bool:
        try:
            emit(check, True, str(fn() or ""))
            return True
        except BaseException as e:
            last = traceback.format_exception_only(type(e), e)[-1].strip()
            emit(check, False, last[:300])
            return False

    def version(name: str) -> str:
        m = importlib.import_module(name)
        return str(getattr(m, "__version__", ""))

    sys.path[:0] = [str(ROOT), str(ROOT / "algos")]
    for name in REQUIRED if full else []:
        attempt(f"import {name}", lambda name=name: version(name))
    missing = []
    for name in OPTIONAL if full else []:
        try:
            importlib.import_module(name)
        except Exception:
            missing.append(name)
    if full:
        emit("optional modules", None, "missing: " + ", ".join(missing) if missing else "all there")
    for f in sorted((ROOT / "shared").glob("*.py")) if full else []:
        if f.stem != "__init__":
            attempt(f"import shared.{f.stem}", lambda s=f.stem: importlib.import_module(f"shared.{s}") and "")
    for name in SCRIPTS if full else []:
        attempt(f"import algos/{name}.py", lambda name=name: importlib.import_module(name) and "")

    def env(env_id: str) -> str:
        import gymnasium as gym
        import numpy as np

        from shared.atari import make_atari_env, make_atari_vector_env

        if env_id == "ale-py vector env":
            e = make_atari_vector_env(BREAKOUT, 2, num_threads=2)
        elif "NoFrameskip" in env_id:
            e = make_atari_env(env_id)
        else:
            e = gym.make(env_id)
        obs, _ = e.reset(seed=0)
        for _ in range(5):
            obs, *_ = e.step(e.action_space.sample())
        e.close()
        return f"obs {np.asarray(obs).shape}"

    for env_id in ENVS if full else []:
        attempt(f"env {env_id}", lambda env_id=env_id: env(env_id))

    import torch

    from benchmarks.checks.recheck_learning import cpu

    v = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cores": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),  # how many threads ale-py gets in the race's envs item (envs_only)
        "physical_cores": physical_core_count(),
        "cpu_quota": cpu_quota(),
        "cpu_model": cpu(),  # recheck_learning's reading of /proc/cpuinfo
        "cuda": torch.cuda.is_available(),
    }
    if v["cuda"]:
        v.update(
            gpu=torch.cuda.get_device_name(0),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
            gpus=torch.cuda.device_count(),
            cudnn=torch.backends.cudnn.version(),
        )

        def matmul() -> str:
            a, b = torch.randn(1024, 1024, dtype=torch.float64), torch.randn(1024, 1024, dtype=torch.float64)
            got = (a.float().cuda() @ b.float().cuda()).cpu().double()
            err = float((got - a @ b).abs().max() / (a @ b).abs().max())
            assert err < 1e-2, f"relative error {err:.2e}"
            return f"relative error {err:.1e}"

        def conv() -> str:
            x, w = torch.randn(8, 4, 84, 84), torch.randn(32, 4, 8, 8)
            got = torch.nn.functional.conv2d(x.cuda(), w.cuda(), stride=4).cpu()
            err = float((got - torch.nn.functional.conv2d(x, w, stride=4)).abs().max())
            assert err < 0.5, f"max error {err:.2e}"
            return f"max error {err:.1e}"

        attempt("CUDA matmul", matmul)
        attempt("cuDNN conv2d", conv)
    print(json.dumps({"versions": v}), flush=True)
