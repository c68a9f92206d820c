"""Run an experiment: a grid of scripts x env ids x seeds x variants, each run pinned to its own cores, resumable.

An experiment is every combination of ``--scripts``, ``--env-ids``, ``--seeds`` and one variant of each level
(rlpyt's ``VariantLevel``: a level lists complete flag sets, each with a name; levels are crossed, so two levels
of 2 and 3 variants make 6). Every run gets its own folder under the experiment root,
``{root}/{script}/{env id}/{variant names joined by +}/seed{N}``, passed to the script as ``--out-dir`` and
``--run-name``, so the script's run folder (config.json, progress.csv, checkpoint.pt, eval.json) is that
folder. Beside the script's files the launcher writes ``launch.json`` (the exact command of every attempt, the
variant, the git commit, the package versions, the cores and GPUs, the state, the exit code and the last
``error:`` line) and the run's ``stdout.log``/``stderr.log``. The root holds ``experiment.json`` (the grid) and
``status.json`` (every run's state: queued, running, done, failed, interrupted).

Usage
-----

    # 2 variants x 2 seeds of PPO on CartPole, one physical core per run (flags after -- go to every run)
    python benchmarks/launch.py experiments/cartpole --scripts ppo_atari --env-ids CartPole-v1 --seeds 1 2 \\
        --level "lr1e-3:--learning-rate 1e-3" "lr3e-4:--learning-rate 3e-4" \\
        --cores-per-run 1 -- --preset cartpole --total-timesteps 50000
    python benchmarks/launch.py experiments/cartpole ... --dry-run      # every run, its command and resources
    python benchmarks/launch.py --config experiments/cartpole.toml     # the same grid from a file
    python benchmarks/launch.py experiments/cartpole --status          # the states, from the files
    # again after Ctrl-C, a crash or a reboot: finished runs are skipped, interrupted ones resumed
    python benchmarks/launch.py --config experiments/cartpole.toml [--retry-failed]
    python benchmarks/launch.py experiments/cartpole                   # the root alone: its last launch's grid
    taskset -c 0-7 python benchmarks/launch.py ... --cores-per-run 2   # 4 slots on the first 8 CPUs
    # a SLURM job array through submitit (each run requeued after a timeout or preemption resumes)
    python benchmarks/launch.py --config exp.toml --slurm --partition gpu --time 240 --gpus-per-run 1
    python benchmarks/report.py experiments/cartpole                   # tables and figures of the results

The file form (TOML, or JSON with the same keys; the command line overrides ``root``, ``scripts``,
``env_ids`` and ``seeds``, and adds its flags and levels after the file's)::

    root = "experiments/cartpole"          # relative to the current directory
    scripts = ["ppo_atari", "a2c_atari"]   # algos/<name>.py, or a path to a script
    env_ids = ["CartPole-v1"]              # left out: the script's (or the preset's) env
    seeds = [1, 2, 3]
    flags = "--preset cartpole --total-timesteps 50000"    # every run (a string, or a list of tokens)

    [[levels]]                             # one table per level: variant name = its flags
    lr1e-3 = "--learning-rate 1e-3"
    lr3e-4 = "--learning-rate 3e-4"

    [[levels]]
    envs4 = "--num-envs 4"
    envs8 = "--num-envs 8"

Resources (rlpyt's affinity). The physical cores this process may use (``shared/affinity.py``:
``physical_cores()``; start the launcher under ``taskset`` to give it fewer) are cut into slots of
``--cores-per-run`` cores (hyperthread siblings stay together). Each run is pinned to its slot's logical CPUs
(``sched_setaffinity`` in the child before it starts the script), with ``OMP_NUM_THREADS`` and
``MKL_NUM_THREADS`` set to the slot's core count. The scripts' ``make_affinity`` splits only the CPUs the
process may run on, so a pinned script stays inside its slot. Where ``torch.cuda.device_count() > 0`` the slots
are spread over the GPUs (``CUDA_VISIBLE_DEVICES``): ``--gpus-per-run G`` gives each run G GPUs of its own,
``--runs-per-gpu K`` puts at most K runs on one GPU, ``--gpus-per-run 0`` hides them. A torchrun run
(``--nproc-per-node N`` among a variant's flags, or the launcher option for every run) takes N slots: the script
runs under ``python -m torch.distributed.run --standalone --nproc-per-node N`` and its local ranks split those
cores. Runs wait in a queue and start as slots free.

Durability. Running the same command again skips the runs that finished (exit 0 and a ``checkpoint.pt``),
resumes the interrupted ones with ``--resume <run folder>`` where a checkpoint exists (a run that never wrote
one starts afresh; the files it left move to ``.stale/``), and reruns failed runs (exit 1 or 2) only with
``--retry-failed``. Ctrl-C or SIGTERM: every running script gets SIGTERM (it writes a checkpoint and exits
130), the launcher waits up to ``--stop-timeout`` seconds, then SIGKILLs what is left of each run's session,
and exits 130 (a second Ctrl-C stops waiting). A failing run does not stop the others: the summary names it
with the last ``error:`` line of its stderr, and the exit status is 1 when any run of the grid failed (0 when
all are done). Bad launcher arguments: one ``error:`` line, exit 2.

Status. On a terminal, one table refreshed in place (rich): each run's state, step of total, latest return,
SPS and ETA (from its progress.csv and config.json), and the experiment's ETA. Otherwise plain lines: one per
state change and a summary every ``--status-every`` seconds.

Clusters. ``--slurm`` submits the runs as job arrays through submitit (one array per resource shape) with
``--partition``, ``--time`` (minutes), ``--gpus-per-run``, ``--cores-per-run``, ``--mem-gb``,
``--array-parallelism`` and ``--slurm-param KEY=VALUE``. A job runs the same attempt as the local launcher
(resuming when a checkpoint exists); on submitit's timeout signal it SIGTERMs the script, waits for its
checkpoint and requeues itself; a preempted job (SLURM's SIGTERM reaches the script, which checkpoints) resumes
when SLURM requeues it. ``--cluster local`` runs the same jobs on this machine with submitit's local executor
(all at once, not pinned; for testing) and waits for them; with SLURM ``--wait`` waits and summarises.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import fcntl
import itertools
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shared.affinity import Affinity, physical_cores
from shared.procs import session_processes

EXIT_INTERRUPTED = 130
RESERVED = ("--seed", "--env-id", "--out-dir", "--run-name", "--resume")  # set by the launcher for every run
NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,-]*$")
STATES = ("queued", "submitted", "running", "done", "failed", "interrupted")
KEEP_ON_FRESH = {"launch.json", "stdout.log", "stderr.log", ".stale"}  # what a fresh start leaves in place


class LaunchError(Exception):
    """A bad argument or an unusable experiment: one ``error:`` line, exit 2."""


# ---------------------------------------------------------------------------------------------- the grid


@dataclass(frozen=True)
class Run:
    """One cell of the grid."""

    root: Path
    script: str  # the script's stem, which names its folder
    script_path: str
    env_id: str | None
    seed: int
    variant: tuple[tuple[str, tuple[str, ...]], ...]  # (name, flags) of one variant per level
    common: tuple[str, ...]  # flags of every run
    nproc: int = 1  # torchrun processes (slots taken)

    @property
    def variant_name(self) -> str:
        return "+".join(name for name, _ in self.variant) or "base"

    @property
    def rel(self) -> str:
        env = (self.env_id or "default").replace("/", "_")
        return f"{self.script}/{env}/{self.variant_name}/seed{self.seed}"

    @property
    def folder(self) -> Path:
        return self.root / self.rel

    def flags(self) -> list[str]:
        """The script's flags (without --resume): common, the variant's, then the launcher's."""
        out = [*self.common, *(f for _, flags in self.variant for f in flags)]
        if self.env_id is not None:
            out += ["--env-id", self.env_id]
        return out + ["--seed", str(self.seed), "--out-dir", str(self.folder.parent), "--run-name", self.folder.name]

    def command(self, resume: bool = False) -> list[str]:
        head = [sys.executable]
        if self.nproc > 1:
            head += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.nproc)]
        return [*head, self.script_path, *self.flags(), *(["--resume", str(self.folder)] if resume else [])]

    def total_from_flags(self) -> int | None:
        flags, total = self.flags(), None
        for i, f in enumerate(flags):
            with contextlib.suppress(ValueError, IndexError):
                if f == "--total-timesteps":
                    total = int(float(flags[i + 1]))
                elif f.startswith("--total-timesteps="):
                    total = int(float(f.split("=", 1)[1]))
        return total


def _tokens(flags: Any, where: str) -> list[str]:
    if flags is None:
        return []
    if isinstance(flags, str):
        try:
            return shlex.split(flags)
        except ValueError as e:
            raise LaunchError(f"{where}: cannot split {flags!r} into flags ({e})") from None
    if isinstance(flags, (list, tuple)) and all(isinstance(f, (str, int, float)) for f in flags):
        return [str(f) for f in flags]
    raise LaunchError(f"{where}: flags must be a string or a list of strings, got {flags!r}")


def _take_nproc(flags: list[str], where: str) -> tuple[list[str], int | None]:
    """Remove ``--nproc-per-node N`` (a torchrun option, not the script's) from ``flags``."""
    out, nproc, i = [], None, 0
    while i < len(flags):
        f = flags[i]
        value = None
        if f == "--nproc-per-node" and i + 1 < len(flags):
            value, i = flags[i + 1], i + 2
        elif f.startswith("--nproc-per-node="):
            value, i = f.split("=", 1)[1], i + 1
        else:
            out.append(f)
            i += 1
            continue
        if not value.isdigit() or int(value) < 1:
            raise LaunchError(f"{where}: --nproc-per-node must be a positive integer, got {value!r}")
        nproc = int(value)
    return out, nproc


def _check_reserved(flags: list[str], where: str) -> None:
    for f in flags:
        name = f.split("=", 1)[0]
        if name in RESERVED:
            raise LaunchError(f"{where}: {name} is set by the launcher for every run (use --seeds, --env-ids or the "
                              f"experiment root)")


def resolve_script(name: str) -> Path:
    candidates = [Path(name), ROOT / name, ROOT / "algos" / name, ROOT / "algos" / f"{name}.py"]
    for c in candidates:
        if c.is_file() and c.suffix == ".py":
            return c.resolve()
    raise LaunchError(f"--scripts: no script {name!r} (give a name in algos/ such as ppo_atari, or a path)")


def parse_level(items: Sequence[str], where: str) -> list[tuple[str, list[str]]]:
    """``NAME:FLAGS`` items of one command-line level."""
    out = []
    for item in items:
        name, sep, flags = item.partition(":")
        if not sep:
            raise LaunchError(f"{where}: {item!r} is not NAME:FLAGS (e.g. 'lr1e-3:--learning-rate 1e-3')")
        out.append((name.strip(), _tokens(flags, where)))
    return out


def load_file(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as e:
        raise LaunchError(f"--config {path}: {e.strerror or e}") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import tomllib

            data = tomllib.loads(text)
    except ValueError as e:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise LaunchError(f"--config {path}: {e}") from None
    if not isinstance(data, dict):
        raise LaunchError(f"--config {path}: expected a table of keys")
    unknown = set(data) - {"root", "scripts", "env_ids", "seeds", "flags", "levels"}
    if unknown:
        raise LaunchError(f"--config {path}: unknown keys {sorted(unknown)} (root, scripts, env_ids, seeds, flags, "
                          f"levels)")
    levels = data.get("levels", [])
    if not isinstance(levels, list) or not all(isinstance(lv, dict) for lv in levels):
        raise LaunchError(f"--config {path}: levels must be a list of tables (name = flags)")
    data["levels"] = [[(str(k), _tokens(v, f"--config {path}: level {i + 1}")) for k, v in lv.items()]
                      for i, lv in enumerate(levels)]
    return data


def build_grid(root: Path, scripts: Sequence[str], env_ids: Sequence[str | None], seeds: Sequence[int],
               common: Sequence[str], levels: Sequence[Sequence[tuple[str, list[str]]]], nproc: int = 1) -> list[Run]:
    """Every run of the grid, in order: scripts, env ids, variants (the last level fastest), seeds."""
    if not scripts:
        raise LaunchError("no scripts: give --scripts (or scripts in the --config file)")
    if not seeds:
        raise LaunchError("no seeds: give --seeds (or seeds in the --config file)")
    if len(set(seeds)) != len(seeds):
        raise LaunchError(f"--seeds: a seed is given twice ({list(seeds)})")
    common, common_nproc = _take_nproc(list(common), "flags")
    _check_reserved(common, "flags")
    checked_levels = []
    for i, level in enumerate(levels):
        if not level:
            raise LaunchError(f"level {i + 1} has no variants")
        names = [n for n, _ in level]
        for n in names:
            if not NAME_OK.match(n):
                raise LaunchError(f"level {i + 1}: variant name {n!r} must be letters, digits and ._=,- (it names "
                                  f"folders)")
        if len(set(names)) != len(names):
            raise LaunchError(f"level {i + 1}: a variant name is given twice ({names})")
        variants = []
        for name, flags in level:
            flags, v_nproc = _take_nproc(list(flags), f"variant {name}")
            _check_reserved(flags, f"variant {name}")
            variants.append((name, tuple(flags), v_nproc))
        checked_levels.append(variants)
    runs = []
    paths = {s: resolve_script(s) for s in scripts}
    for script, env_id in itertools.product(scripts, env_ids or [None]):
        for combo in itertools.product(*checked_levels) if checked_levels else [()]:
            n = next((v[2] for v in reversed(combo) if v[2] is not None), None) or common_nproc or nproc
            for seed in seeds:
                runs.append(Run(root, paths[script].stem, str(paths[script]), env_id, int(seed),
                                tuple((name, flags) for name, flags, _ in combo), tuple(common), n))
    rels = [r.rel for r in runs]
    if len(set(rels)) != len(rels):
        raise LaunchError("two runs would share a folder (the same script name twice in --scripts?)")
    return runs


# ---------------------------------------------------------------------------------------------- resources


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
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                             capture_output=True, text=True, timeout=120)
        return int(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return 0


def make_slots(cores: Sequence[tuple[int, ...]], cores_per_run: int, n_gpus: int = 0,
               gpus_per_run: int | None = None, runs_per_gpu: int | None = None) -> list[Slot]:
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


def child_env(slots: Sequence[Slot], base: dict | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    threads = str(slots[0].cores)  # per process; a torchrun rank gets one slot's share
    env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
    gpus = [g for s in slots for g in s.gpus]
    if gpus or any(s.hide_gpus for s in slots):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    return env


try:
    _LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the forked child only calls into it
except OSError:  # pragma: no cover
    _LIBC = None


def _pdeathsig() -> None:
    """In the child: SIGTERM when the launcher dies (even SIGKILLed), so a script never outlives it."""
    with contextlib.suppress(Exception):
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _child_setup(cpus: tuple[int, ...] | None):
    def setup() -> None:  # runs in the forked child before exec: no locks, no threads, no imports
        _pdeathsig()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return setup


# ---------------------------------------------------------------------------------------------- run records


def write_json(path: Path, obj: Any) -> None:
    """Atomically (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def git_info() -> dict:
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {"commit": git("rev-parse", "HEAD").strip() or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no").strip())}


def package_versions() -> dict[str, str]:
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for d in md.distributions():
        name = d.metadata["Name"]
        if name:
            out[name.lower()] = d.version
    return dict(sorted(out.items()))


def last_error(path: Path, offset: int = 0) -> str | None:
    """The last line starting with ``error:`` in ``path`` from ``offset`` on."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("error:")]
    return lines[-1] if lines else None


def torchrun_signalled(run: Run, attempt: dict) -> bool:
    """torchrun's last line says a signal ended it (``...SignalException: Process N got signal: 15``)."""
    try:
        with open(run.folder / "stderr.log", "rb") as f:
            f.seek(max(attempt.get("stderr_offset", 0), f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return False
    return bool(lines) and re.search(r"SignalException: Process \d+ got signal: \d+$", lines[-1]) is not None


def finished(folder: Path, record: dict) -> bool:
    return record.get("state") == "done" and record.get("exit_code") == 0 and (folder / "checkpoint.pt").is_file()


def set_aside(folder: Path) -> list[str]:
    """A run starting afresh in a folder an earlier attempt wrote without a checkpoint: that attempt's files move
    to ``.stale/N`` (the script would otherwise append to its progress.csv)."""
    leftovers = [p for p in folder.iterdir() if p.name not in KEEP_ON_FRESH] if folder.is_dir() else []
    if not leftovers:
        return []
    stale = folder / ".stale"
    n = 1 + max((int(p.name) for p in stale.iterdir() if p.name.isdigit()), default=0) if stale.is_dir() else 1
    dest = stale / str(n)
    dest.mkdir(parents=True)
    for p in leftovers:
        os.replace(p, dest / p.name)
    return [p.name for p in leftovers]


def kill_session(sid: int) -> None:
    """SIGKILL what is left of a child's process group and session (call while the leader is still unreaped, so
    its id cannot have been reused)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)
    for pid in session_processes(sid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def pid_runs(pid: int | None, folder: Path) -> bool:
    """Whether ``pid`` is alive and is a process of the run in ``folder`` (its command line names the folder)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().decode(errors="replace").split("\0")
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
    except OSError:
        return False
    return str(folder.parent) in cmd and folder.name in cmd


def new_record(run: Run, meta: dict) -> dict:
    return {"run": run.rel, "script": run.script, "script_path": run.script_path, "env_id": run.env_id,
            "seed": run.seed, "variant": {"name": run.variant_name,
                                          "levels": [{"name": n, "flags": list(f)} for n, f in run.variant]},
            "common_flags": list(run.common), "nproc_per_node": run.nproc, "state": "queued", "exit_code": None,
            "error": None, "command": None, "attempts": [], **meta}


def begin_attempt(run: Run, record: dict, slots: Sequence[Slot] | None, host_info: dict | None = None
                  ) -> tuple[list[str], dict]:
    """Decide resume or fresh start, set aside stale files, open the log files; returns (command, attempt)."""
    folder = run.folder
    folder.mkdir(parents=True, exist_ok=True)
    resume = (folder / "checkpoint.pt").is_file()
    moved = [] if resume else set_aside(folder)
    cmd = run.command(resume)
    attempt = {"command": cmd, "command_line": shlex.join(cmd), "resumed": resume, "started": _now(),
               "host": socket.gethostname(), "git": record.get("git"),
               **({"cpus": [c for s in slots for c in s.cpus], "gpus": [g for s in slots for g in s.gpus],
                   "threads": slots[0].cores, "slots": [s.index for s in slots], "affinity": [s.code for s in slots]}
                  if slots else {}),
               **(host_info or {})}
    if moved:
        attempt["set_aside"] = moved
    for name in ("stdout.log", "stderr.log"):
        with open(folder / name, "a") as f:
            f.write(f"=== launch {attempt['started']}: {shlex.join(cmd)}\n")
    attempt["stderr_offset"] = (folder / "stderr.log").stat().st_size
    record.update(state="running", command=cmd, exit_code=None, error=None)
    record["attempts"].append(attempt)
    return cmd, attempt


def end_attempt(run: Run, record: dict, rc: int, signalled: bool) -> str:
    """Record the exit of the attempt; returns the new state. A torchrun job that a signal reached without the
    launcher (SLURM's preemption signals every process of the job) is interrupted too: its ranks checkpointed and
    exited 130, and torchrun exits 1 with its own SignalException (docs/contract.md)."""
    attempt = record["attempts"][-1]
    error = last_error(run.folder / "stderr.log", attempt.get("stderr_offset", 0))
    if rc == 0:
        state, error = "done", None
    elif rc == EXIT_INTERRUPTED or signalled or (run.nproc > 1 and rc == 1 and torchrun_signalled(run, attempt)):
        state = "interrupted"
    else:
        state = "failed"
        if rc < 0 and not error:
            error = f"error: killed by {signal.Signals(-rc).name}"
        elif not error:
            error = f"error: exit {rc} without an error: line (see {run.rel}/stderr.log)"
    attempt.update(ended=_now(), exit_code=rc)
    record.update(state=state, exit_code=rc, error=error, pid=None)
    return state


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------- progress


def progress_of(run: Run) -> dict:
    """step, total, return (latest), sps, wall (s) of a run, from its progress.csv and config.json."""
    out: dict[str, Any] = {"step": None, "total": None, "return": None, "sps": None}
    folder = run.folder
    try:
        cfg = json.loads((folder / "config.json").read_text())
        out["total"] = int(cfg["args"]["total_timesteps"])
    except (OSError, ValueError, KeyError, TypeError):
        out["total"] = run.total_from_flags()
    try:
        with open(folder / "progress.csv", "rb") as f:
            header = f.readline().decode().strip().split(",")
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(size - 16384, len(",".join(header)) + 1))
            text = f.read().decode(errors="replace")
    except OSError:
        return out
    tail = text.splitlines()[1 if size > 16384 else 0 :]
    if tail and not text.endswith("\n"):
        tail = tail[:-1]  # a row being written
    col = {c: i for i, c in enumerate(header)}
    rows = [r.split(",") for r in tail if r and r[0].isdigit()]
    if not rows or "global_step" not in col:
        return out

    def get(r: list[str], name: str) -> float | None:
        i = col.get(name)
        try:
            return float(r[i]) if i is not None and i < len(r) and r[i] != "" else None
        except ValueError:
            return None

    out["step"] = int(get(rows[-1], "global_step") or 0)
    out["sps"] = get(rows[-1], "sps")
    out["return"] = next((v for r in reversed(rows) if (v := get(r, "return_mean")) is not None), None)
    return out


def fmt_duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def fmt_steps(n: float | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{int(n):,}"


# ---------------------------------------------------------------------------------------------- status display


class Display:
    """A rich table refreshed in place on a terminal; plain lines otherwise."""

    def __init__(self, runs: list[Run], records: dict[str, dict], plain: bool, status_every: float):
        self.runs, self.records, self.status_every = runs, records, status_every
        self.live = None
        self._last_summary = time.time()
        self._last_refresh = 0.0
        if not plain:
            try:
                from rich.console import Console
                from rich.live import Live

                self.console = Console()
                if self.console.is_terminal:
                    # auto_refresh=False: no refresh thread, so forking children stays safe
                    self.live = Live(console=self.console, auto_refresh=False, transient=False)
                    self.live.start()
            except ImportError:
                self.live = None

    def note(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        if self.live is not None:
            self.live.console.print(f"{stamp} {line}", markup=False, highlight=False)
        else:
            print(f"{stamp} {line}", flush=True)

    def stats(self) -> tuple[dict[str, dict], str, dict[str, int]]:
        prog = {r.rel: progress_of(r) for r in self.runs if self.records[r.rel]["state"] in
                ("running", "done", "interrupted", "failed", "submitted")}
        totals = {}
        for r in self.runs:  # a queued run's total: its flags, else a sibling's config (same flags but the seed)
            p = prog.get(r.rel) or {}
            totals[r.rel] = p.get("total") or r.total_from_flags()
        by_variant: dict[tuple, int] = {}
        for r in self.runs:
            if totals[r.rel]:
                by_variant.setdefault((r.script, r.env_id, r.variant_name), totals[r.rel])
        remaining, sps, unknown = 0.0, 0.0, False
        for r in self.runs:
            state = self.records[r.rel]["state"]
            if state in ("done", "failed"):
                continue
            total = totals[r.rel] or by_variant.get((r.script, r.env_id, r.variant_name))
            step = (prog.get(r.rel) or {}).get("step") or 0
            if total is None:
                unknown = True
                continue
            remaining += max(total - step, 0)
            if state == "running":
                sps += (prog.get(r.rel) or {}).get("sps") or 0.0
        eta = "-" if unknown or (remaining and not sps) else fmt_duration(remaining / sps if sps else 0)
        counts = {s: sum(self.records[r.rel]["state"] == s for r in self.runs) for s in STATES}
        return prog, eta, counts

    def summary_line(self) -> str:
        _, eta, counts = self.stats()
        return (f"{counts['done']}/{len(self.runs)} done, {counts['running']} running, {counts['queued']} queued, "
                f"{counts['failed']} failed, {counts['interrupted']} interrupted; ETA {eta}")

    def table(self):
        from rich.table import Table

        prog, eta, counts = self.stats()
        t = Table(title=f"{len(self.runs)} runs: {counts['done']} done, {counts['running']} running, "
                        f"{counts['queued']} queued, {counts['failed']} failed   experiment ETA {eta}",
                  title_justify="left")
        for c in ("run", "state", "cpus", "step", "return", "SPS", "ETA"):
            t.add_column(c, justify="left" if c in ("run", "state", "cpus") else "right",
                         overflow="fold" if c == "run" else "ellipsis")
        colour = {"running": "cyan", "done": "green", "failed": "red", "interrupted": "yellow"}
        for r in self.runs:
            rec = self.records[r.rel]
            p = prog.get(r.rel) or {}
            att = rec["attempts"][-1] if rec.get("attempts") else {}
            cpus = ",".join(map(str, att.get("cpus", []))) if rec["state"] == "running" else ""
            ret = f"{p['return']:.1f}" if p.get("return") is not None else "-"
            sps = f"{p['sps']:.0f}" if p.get("sps") else "-"
            run_eta = (fmt_duration((p["total"] - p["step"]) / p["sps"]) if rec["state"] == "running" and p.get("sps")
                       and p.get("total") and p.get("step") is not None else "-")
            state = rec["state"] + (f" ({rec['exit_code']})" if rec["state"] == "failed" else "")
            t.add_row(r.rel, f"[{colour.get(rec['state'], 'white')}]{state}[/]", cpus,
                      f"{fmt_steps(p.get('step'))}/{fmt_steps(p.get('total') or r.total_from_flags())}", ret, sps,
                      run_eta)
        return t

    def tick(self, force: bool = False) -> None:
        now = time.time()
        if self.live is not None:
            if force or now - self._last_refresh >= 1.0:
                self.live.update(self.table(), refresh=True)
                self._last_refresh = now
        elif self.status_every > 0 and now - self._last_summary >= self.status_every:
            self.note(self.summary_line())
            self._last_summary = now

    def close(self) -> None:
        if self.live is not None:
            self.live.update(self.table(), refresh=True)
            self.live.stop()
            self.live = None


# ---------------------------------------------------------------------------------------------- local runs


@dataclass
class Child:
    run: Run
    proc: subprocess.Popen
    slots: list[Slot]
    signalled: bool = False
    started: float = field(default_factory=time.time)


class Launcher:
    def __init__(self, runs: list[Run], records: dict[str, dict], slots: list[Slot], display: Display,
                 stop_timeout: float, meta: dict):
        self.runs, self.records, self.slots, self.display = runs, records, slots, display
        self.stop_timeout, self.meta = stop_timeout, meta
        self.children: dict[int, Child] = {}
        self.free = [s.index for s in slots]
        self.stop_signal: int | None = None
        self.signals = 0

    def on_signal(self, signum, frame) -> None:
        self.stop_signal = signum
        self.signals += 1

    def save(self, run: Run) -> None:
        write_json(run.folder / "launch.json", self.records[run.rel])

    def start(self, run: Run) -> None:
        take = sorted(self.free)[: run.nproc]
        self.free = [i for i in self.free if i not in take]
        slots = [self.slots[i] for i in take]
        record = self.records[run.rel]
        cmd, attempt = begin_attempt(run, record, slots)
        cpus = tuple(c for s in slots for c in s.cpus)
        with open(run.folder / "stdout.log", "ab") as out, open(run.folder / "stderr.log", "ab") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=child_env(slots),
                                    start_new_session=True, preexec_fn=_child_setup(cpus))
        record["pid"] = proc.pid
        self.save(run)
        self.children[proc.pid] = Child(run, proc, slots)
        how = "resumed" if attempt["resumed"] else "started"
        gpus = f", GPU {','.join(attempt['gpus'])}" if attempt.get("gpus") else ""
        self.display.note(f"{how} {run.rel} (pid {proc.pid}, cpus {','.join(map(str, cpus))}{gpus})")

    def reap(self) -> None:
        for pid, child in list(self.children.items()):
            try:
                done = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                done = True
            if not done:
                continue
            kill_session(pid)  # whatever the script left behind; the leader is a zombie, its id still ours
            rc = child.proc.wait()
            del self.children[pid]
            self.free += [s.index for s in child.slots]
            run = child.run
            state = end_attempt(run, self.records[run.rel], rc, child.signalled)
            self.save(run)
            took = fmt_duration(time.time() - child.started)
            if state == "failed":
                self.display.note(f"failed {run.rel} (exit {rc}, {took}): {self.records[run.rel]['error']}")
            else:
                self.display.note(f"{state} {run.rel} (exit {rc}, {took})")
            write_status(self.runs, self.records)

    def stop_children(self) -> None:
        for child in self.children.values():
            if not child.signalled:
                child.signalled = True
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)  # the script (or torchrun) itself: it checkpoints

    def run_all(self, todo: list[Run]) -> bool:
        """Start ``todo`` as slots free; returns False when stopped by a signal."""
        queue = list(todo)
        old = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while queue or self.children:
                if self.stop_signal is not None:
                    break
                for run in list(queue):
                    if run.nproc <= len(self.free):
                        queue.remove(run)
                        self.start(run)
                        write_status(self.runs, self.records)
                self.reap()
                self.display.tick()
                time.sleep(0.1)
            if self.stop_signal is None:
                return True
            self.display.note(f"{signal.Signals(self.stop_signal).name}: stopping {len(self.children)} running "
                              f"run(s) (they write a checkpoint)")
            self.stop_children()
            deadline, counted = time.time() + self.stop_timeout, self.signals
            while self.children and time.time() < deadline and self.signals == counted:
                self.reap()
                self.display.tick()
                time.sleep(0.1)
            return False
        finally:
            for child in self.children.values():  # past the deadline, a second signal, or an error here
                child.signalled = True
                kill_session(child.proc.pid)
            deadline = time.time() + 30
            while self.children and time.time() < deadline:
                self.reap()
                time.sleep(0.05)
            for s, h in old.items():
                signal.signal(s, h)


def write_status(runs: list[Run], records: dict[str, dict]) -> None:
    if not runs:
        return
    root = runs[0].root
    status = {"updated": _now(), "runs": {}}
    for r in runs:
        rec = records[r.rel]
        p = progress_of(r) if rec["state"] != "queued" else {}
        status["runs"][r.rel] = {"state": rec["state"], "exit_code": rec.get("exit_code"), "error": rec.get("error"),
                                 "step": p.get("step"), "total": p.get("total") or r.total_from_flags(),
                                 "return": p.get("return")}
    status["counts"] = {s: sum(v["state"] == s for v in status["runs"].values()) for s in STATES}
    with contextlib.suppress(OSError):
        write_json(root / "status.json", status)


# ---------------------------------------------------------------------------------------------- SLURM (submitit)


try:
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:  # pragma: no cover - only --slurm needs it
    _Checkpointable = object


class SlurmRun(_Checkpointable):
    """The job of one run on a cluster node: the same attempt as the local launcher (resuming when a checkpoint
    exists), recorded in the run's launch.json. submitit calls ``checkpoint`` on its timeout/preemption signal:
    the script gets SIGTERM, writes its checkpoint, and the requeued job resumes it."""

    stop_timeout = 120.0

    def __call__(self, spec: dict) -> str:
        run, record = spec_run(spec), read_json(Path(spec["folder"]) / "launch.json")
        record.setdefault("attempts", [])
        job = {"slurm_job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")}
        cmd, _ = begin_attempt(run, record, None, job)
        threads = str(spec["cores_per_run"])
        env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
        with open(run.folder / "stdout.log", "ab") as out, open(run.folder / "stderr.log", "ab") as err:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                          start_new_session=True, preexec_fn=_child_setup(None))
        self._run, self._record, self._signalled = run, record, False
        record["pid"] = self._proc.pid
        write_json(run.folder / "launch.json", record)
        try:
            while self._proc.poll() is None:  # poll, not wait: the signal handler below polls it too
                time.sleep(0.5)
        except KeyboardInterrupt:  # the local executor's cancel
            self._terminate()
            raise
        finally:
            kill_session(self._proc.pid)
        state = self._finish()
        if state != "done":
            raise RuntimeError(f"{run.rel}: {state}, exit {record['exit_code']}: {record.get('error')}")
        return state

    def _terminate(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is None or proc.poll() is not None:
            return
        self._signalled = True
        proc.send_signal(signal.SIGTERM)
        deadline = time.time() + self.stop_timeout
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        kill_session(proc.pid)
        proc.wait()
        self._finish()

    def _finish(self) -> str:
        if self._record.get("state") != "running":
            return self._record["state"]
        state = end_attempt(self._run, self._record, self._proc.returncode, self._signalled)
        write_json(self._run.folder / "launch.json", self._record)
        return state

    def checkpoint(self, spec: dict):  # submitit: on the timeout (USR2) signal, before requeuing
        import submitit

        self._terminate()
        return submitit.helpers.DelayedSubmission(SlurmRun(), spec)

    def __getstate__(self) -> dict:  # a Popen does not pickle
        return {}


def run_spec(run: Run, cores_per_run: int) -> dict:
    return {"root": str(run.root), "script": run.script, "script_path": run.script_path, "env_id": run.env_id,
            "seed": run.seed, "variant": [[n, list(f)] for n, f in run.variant], "common": list(run.common),
            "nproc": run.nproc, "folder": str(run.folder), "cores_per_run": cores_per_run}


def spec_run(spec: dict) -> Run:
    return Run(Path(spec["root"]), spec["script"], spec["script_path"], spec["env_id"], int(spec["seed"]),
               tuple((n, tuple(f)) for n, f in spec["variant"]), tuple(spec["common"]), int(spec["nproc"]))


def job_fn() -> SlurmRun:
    """A ``SlurmRun`` pickled by reference to ``benchmarks.launch`` (run as a script, this module is ``__main__``,
    which cloudpickle would copy by value with its unpicklable globals); the jobs find it through PYTHONPATH."""
    import importlib

    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in paths if p]])
    return importlib.import_module("benchmarks.launch").SlurmRun()


def slurm_alive(job_id: str | None) -> bool:
    if not job_id:
        return False
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id)], capture_output=True, text=True, timeout=60)
        return bool(out.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        return False


def submit(a: argparse.Namespace, todo: list[Run], runs: list[Run], records: dict[str, dict], display: Display,
           save) -> int:
    try:
        import submitit
    except ImportError:
        raise LaunchError("--slurm needs submitit (pip install -r requirements.txt)") from None
    root = runs[0].root
    cluster = None if a.cluster == "auto" else a.cluster
    executor = submitit.AutoExecutor(folder=root / ".submitit" / "%j", cluster=cluster)
    jobs_file = root / "slurm_jobs.json"
    known = read_json(jobs_file)
    submitted: list[tuple[Run, Any]] = []
    for nproc in sorted({r.nproc for r in todo}):
        group = [r for r in todo if r.nproc == nproc]
        extra = dict(kv.split("=", 1) for kv in a.slurm_param)
        params: dict[str, Any] = dict(timeout_min=a.time, cpus_per_task=a.cores_per_run * nproc, nodes=1,
                                      tasks_per_node=1, name=f"launch-{root.name}",
                                      slurm_array_parallelism=a.array_parallelism,
                                      slurm_additional_parameters={"requeue": True, **extra})
        if a.gpus_per_run:
            params["gpus_per_node"] = a.gpus_per_run * nproc
        if a.partition:
            params["slurm_partition"] = a.partition
        if a.mem_gb:
            params["mem_gb"] = a.mem_gb
        executor.update_parameters(**params)
        for r in group:  # recorded before submitting: a started job then only moves it on
            records[r.rel].update(state="submitted", exit_code=None, error=None)
            save(r)
        jobs = executor.map_array(job_fn(), [run_spec(r, a.cores_per_run) for r in group])
        for r, job in zip(group, jobs):
            known[r.rel] = {"job_id": job.job_id, "cluster": executor.cluster, "submitted": _now()}
            submitted.append((r, job))
            display.note(f"submitted {r.rel} as job {job.job_id} ({executor.cluster})")
    write_json(jobs_file, known)
    write_status(runs, records)
    if not (a.wait or executor.cluster in ("local", "debug")):
        display.note(f"{len(submitted)} job(s) submitted; `launch.py {root} --status` shows their states")
        return 0
    stopped = None

    def on_signal(signum, frame):
        nonlocal stopped
        stopped = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not all(job.done() for _, job in submitted):
            if stopped is not None:
                break
            for r in runs:
                records[r.rel] = read_json(r.folder / "launch.json") or records[r.rel]
            display.tick()
            time.sleep(0.5)
        if stopped is not None and executor.cluster in ("local", "debug"):
            display.note("stopping the local jobs (their scripts write a checkpoint)")
            pids = [read_json(r.folder / "launch.json").get("pid") for r, _ in submitted]
            for _, job in submitted:
                with contextlib.suppress(Exception):
                    job.cancel(check=False)
            deadline = time.time() + a.stop_timeout
            while any(pid_runs(p, r.folder) for p, (r, _) in zip(pids, submitted)) and time.time() < deadline:
                time.sleep(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for r, job in submitted:
        rec = read_json(r.folder / "launch.json") or records[r.rel]
        if rec.get("state") in ("submitted", "running") and not pid_runs(rec.get("pid"), r.folder):
            rec.update(state="interrupted" if stopped else "failed", pid=None,
                       error=rec.get("error") or None if stopped else
                       f"error: job {job.job_id} ended without recording an exit (see {root}/.submitit/)")
            write_json(r.folder / "launch.json", rec)
        records[r.rel] = rec
    write_status(runs, records)
    return EXIT_INTERRUPTED if stopped is not None else -1  # -1: summarise


# ---------------------------------------------------------------------------------------------- main


def summarise(runs: list[Run], records: dict[str, dict], skipped_failed: list[Run]) -> int:
    counts = {s: sum(records[r.rel]["state"] == s for r in runs) for s in STATES}
    print(f"{len(runs)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    for r in runs:
        rec = records[r.rel]
        if rec["state"] == "failed":
            again = " (not rerun: --retry-failed reruns it)" if r in skipped_failed else ""
            code = f"exit {rec['exit_code']}" if rec.get("exit_code") is not None else "no exit code"
            print(f"  failed {r.rel}: {code}: {rec.get('error') or '-'}{again}")
        elif rec["state"] not in ("done",):
            print(f"  {rec['state']} {r.rel}" + (f" (exit {rec['exit_code']})" if rec.get("exit_code") else ""))
    return 1 if counts["done"] < len(runs) else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Flags after `--` go to every run (so do --flags). See the module docstring for the file form.")
    p.add_argument("root", nargs="?", help="experiment root (or `root` in the --config file)")
    p.add_argument("--config", type=Path, help="the grid in a TOML or JSON file")
    p.add_argument("--scripts", nargs="+", help="algos/ names (ppo_atari) or paths")
    p.add_argument("--env-ids", nargs="+", help="gymnasium ids (left out: the script's default)")
    p.add_argument("--seeds", nargs="+", type=int)
    p.add_argument("--flags", default="", help="flags for every run, one string")
    p.add_argument("--level", action="append", nargs="+", default=[], metavar="NAME:FLAGS",
                   help="one level of variants, each NAME:FLAGS; repeat for more levels (they are crossed)")
    p.add_argument("--cores-per-run", type=int, default=1, help="physical cores per slot (default 1)")
    p.add_argument("--gpus-per-run", type=int, default=None, help="GPUs of its own per run (0: hide the GPUs)")
    p.add_argument("--runs-per-gpu", type=int, default=None, help="at most this many runs share one GPU")
    p.add_argument("--nproc-per-node", type=int, default=1, help="torchrun processes per run (slots it takes)")
    p.add_argument("--retry-failed", action="store_true", help="rerun runs that failed (exit 1 or 2) before")
    p.add_argument("--dry-run", action="store_true", help="print every run, its command and resources; change nothing")
    p.add_argument("--status", action="store_true", help="print the runs' states from the files and exit")
    p.add_argument("--stop-timeout", type=float, default=120.0,
                   help="seconds to wait for the runs to checkpoint after Ctrl-C/SIGTERM before SIGKILL")
    p.add_argument("--plain", action="store_true", help="plain lines even on a terminal")
    p.add_argument("--status-every", type=float, default=30.0, help="seconds between summary lines (plain output)")
    s = p.add_argument_group("clusters (submitit)")
    s.add_argument("--slurm", action="store_true", help="submit the runs as SLURM job arrays through submitit")
    s.add_argument("--cluster", choices=["auto", "slurm", "local"], default="auto",
                   help="submitit's executor: auto (SLURM where sbatch exists), slurm, or local (testing)")
    s.add_argument("--partition", default=None)
    s.add_argument("--time", type=int, default=60, help="minutes per job (the script is requeued after)")
    s.add_argument("--mem-gb", type=float, default=None)
    s.add_argument("--array-parallelism", type=int, default=256, help="most jobs of an array running at once")
    s.add_argument("--slurm-param", action="append", default=[], metavar="KEY=VALUE",
                   help="any other sbatch option (e.g. account=abc)")
    s.add_argument("--wait", action="store_true", help="with --slurm: wait for the jobs and summarise")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, tail = argv[:i], argv[i + 1 :]
    a = parser().parse_args(argv)
    try:
        return launch(a, tail)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2


def launch(a: argparse.Namespace, tail: list[str]) -> int:
    data = load_file(a.config) if a.config else {"levels": []}
    root_s = a.root or data.get("root")
    if not root_s:
        raise LaunchError("no experiment root: give it first (or `root` in the --config file)")
    root = Path(root_s).resolve()
    for n, v in (("--nproc-per-node", a.nproc_per_node), ("--stop-timeout", a.stop_timeout)):
        if v is not None and v < (1 if n == "--nproc-per-node" else 0):
            raise LaunchError(f"{n} must be {'at least 1' if n == '--nproc-per-node' else 'non-negative'}, got {v}")
    if any(v is not None and v < 0 for v in (a.gpus_per_run,)) or (a.runs_per_gpu is not None and a.runs_per_gpu < 1):
        raise LaunchError("--gpus-per-run must be non-negative and --runs-per-gpu at least 1")
    if a.gpus_per_run is not None and a.runs_per_gpu is not None:
        raise LaunchError("give --gpus-per-run or --runs-per-gpu, not both")
    for kv in a.slurm_param:
        if "=" not in kv:
            raise LaunchError(f"--slurm-param {kv!r} is not KEY=VALUE")
    if not a.config and not a.scripts and (root / "experiment.json").is_file():
        # Only the root: the grid of the experiment's last launch (its flags and levels are complete flag lists).
        saved = read_json(root / "experiment.json").get("grid", {})
        data = {**saved, "levels": [[(n, list(f)) for n, f in lv] for lv in saved.get("levels", [])]}
        a.nproc_per_node = saved.get("nproc_per_node", a.nproc_per_node)
    levels = list(data.get("levels", [])) + [parse_level(lv, f"--level {i + 1}") for i, lv in enumerate(a.level)]
    common = _tokens(data.get("flags"), "--config flags") + _tokens(a.flags, "--flags") + tail
    seeds = a.seeds if a.seeds is not None else data.get("seeds", [])
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise LaunchError(f"seeds must be integers, got {seeds!r}")
    scripts, env_ids = a.scripts or data.get("scripts", []), a.env_ids or data.get("env_ids", [])
    runs = build_grid(root, scripts, env_ids, seeds, common, levels, a.nproc_per_node)
    grid = {"scripts": [r.script_path for r in {r.script: r for r in runs}.values()], "env_ids": list(env_ids),
            "seeds": list(seeds), "flags": common, "levels": [[[n, list(f)] for n, f in lv] for lv in levels],
            "nproc_per_node": a.nproc_per_node}
    records = {}
    for r in runs:
        rec = read_json(r.folder / "launch.json")
        if rec.get("state") not in STATES:
            rec = {}
        records[r.rel] = rec or {"state": "queued", "attempts": []}
        records[r.rel].setdefault("attempts", [])

    if a.status:
        display = Display(runs, records, plain=True, status_every=0)
        for r in runs:
            rec, p = records[r.rel], progress_of(r)
            ret = f"{p['return']:.1f}" if p.get("return") is not None else "-"
            print(f"{rec['state']:<11} {r.rel}  step {fmt_steps(p.get('step'))}/{fmt_steps(p.get('total'))}  return "
                  f"{ret}" + (f"  {rec.get('error')}" if rec["state"] == "failed" else ""))
        print(display.summary_line())
        return 0

    # What each run needs now.
    todo, skipped_failed, actions = [], [], {}
    for r in runs:
        rec = records[r.rel]
        if finished(r.folder, rec):
            actions[r.rel] = "skip (done)"
            continue
        if rec.get("state") == "failed" and not a.retry_failed:
            actions[r.rel] = f"skip (failed, exit {rec.get('exit_code')}; --retry-failed reruns it)"
            skipped_failed.append(r)
            continue
        if rec.get("state") == "running" and pid_runs(rec.get("pid"), r.folder):
            raise LaunchError(f"{r.rel} is still running (pid {rec['pid']}), from an earlier launcher: end it first")
        if a.slurm and rec.get("state") in ("submitted", "running"):
            job = read_json(root / "slurm_jobs.json").get(r.rel, {})
            if job.get("cluster") == "slurm" and slurm_alive(job.get("job_id")):
                actions[r.rel] = f"skip (job {job['job_id']} is queued or running)"
                continue
        actions[r.rel] = "resume" if (r.folder / "checkpoint.pt").is_file() else "start"
        todo.append(r)

    slots: list[Slot] = []
    if not a.slurm:
        n_gpus = gpu_count() if a.gpus_per_run != 0 else 0
        slots = make_slots(physical_cores(), a.cores_per_run, n_gpus, a.gpus_per_run, a.runs_per_gpu)
        too_big = [r for r in runs if r.nproc > len(slots)]
        if too_big:
            raise LaunchError(f"{too_big[0].rel} needs {too_big[0].nproc} slots (--nproc-per-node); this machine has "
                              f"{len(slots)} of {a.cores_per_run} core(s)")

    if a.dry_run:
        if slots:
            print(f"{len(slots)} slot(s) of {a.cores_per_run} physical core(s):")
            for s in slots:
                gpu = f"  CUDA_VISIBLE_DEVICES={','.join(s.gpus)}" if s.gpus or s.hide_gpus else ""
                print(f"  slot {s.index}: cpus {','.join(map(str, s.cpus))}  OMP_NUM_THREADS={s.cores}  affinity "
                      f"{s.code}{gpu}")
        else:
            print(f"SLURM ({a.cluster}): {a.cores_per_run} core(s) and {a.gpus_per_run or 0} GPU(s) per process, "
                  f"{a.time} min per job, partition {a.partition or '(default)'}")
        for r in runs:
            res = f"{r.nproc} slot(s)" + (f" (torchrun, {r.nproc} processes)" if r.nproc > 1 else "")
            print(f"{actions[r.rel]:<8} {r.rel}  [{res}]\n    {shlex.join(r.command(actions[r.rel] == 'resume'))}")
        print(f"{len(runs)} runs: {len(todo)} to run, {len(runs) - len(todo)} skipped")
        return 0

    root.mkdir(parents=True, exist_ok=True)
    lock = open(root / ".launch.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise LaunchError(f"another launcher is running the experiment in {root}") from None
    meta = {"git": git_info(), "versions": package_versions()}
    experiment = read_json(root / "experiment.json")
    experiment.update(root=str(root), grid=grid, runs=[r.rel for r in runs])
    experiment.setdefault("launches", []).append({"time": _now(), "argv": sys.argv, "cwd": os.getcwd(), **meta})
    write_json(root / "experiment.json", experiment)
    for r in runs:
        base = new_record(r, meta)
        rec = records[r.rel]
        if rec.get("command") is None and not rec.get("attempts"):
            records[r.rel] = base
        else:
            records[r.rel] = {**rec, **{k: v for k, v in base.items() if k not in
                                        ("state", "exit_code", "error", "command", "attempts")}}
        if r in todo:
            records[r.rel]["state"] = "queued"
        r.folder.mkdir(parents=True, exist_ok=True)
        write_json(r.folder / "launch.json", records[r.rel])
    write_status(runs, records)

    display = Display(runs, records, plain=a.plain or not sys.stdout.isatty(), status_every=a.status_every)
    skipped = len(runs) - len(todo)
    display.note(f"{len(runs)} runs: {len(todo)} to run" + (f", {skipped} skipped" if skipped else "") +
                 (f" on {len(slots)} slot(s) of {a.cores_per_run} core(s)" if slots else ""))
    try:
        if a.slurm:
            code = submit(a, todo, runs, records, display, lambda r: write_json(r.folder / "launch.json",
                                                                                 records[r.rel]))
            display.close()
            if code >= 0:
                if code == EXIT_INTERRUPTED:
                    summarise(runs, records, skipped_failed)
                return code
            return summarise(runs, records, skipped_failed)
        launcher = Launcher(runs, records, slots, display, a.stop_timeout, meta)
        completed = launcher.run_all(todo)
    finally:
        display.close()
        write_status(runs, records)
    code = summarise(runs, records, skipped_failed)
    return code if completed else EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
