"""One prepared command for a fresh GPU node: install, check, run the cuda test set, take the GPU figures, and say
what passed even when cut short (docs/gpu.md, "One command on a GPU node").

    python benchmarks/gpu/check.py OUT                      # about 8 minutes on 16 cores and one GPU
    python benchmarks/gpu/check.py OUT2 --redo OUT          # a second, shorter run: only what failed or was not run
    python benchmarks/gpu/check.py OUT --parts cuda --cuda-s 120 --workers 8
    python benchmarks/gpu/check.py OUT --unit               # adds the unit tier on the node's own torch
    python benchmarks/gpu/check.py OUT --parts checks,race --race ppo-atari td3 --leanrl .peers/leanrl
    python benchmarks/gpu/check.py OUT --parts race --dry   # the race's plumbing on a CPU (no figures)

From the repository root, in this order, each part within its own budget and all within ``--budget``:

1. ``checks``: installs the wheels of ``--wheels`` (default ``.whl/``, if there) that the node lacks or has in an
   older version (``pip install --no-index --no-deps``; never a downgrade), checks every import, a few envs
   (CartPole, Pendulum, InvertedPendulum, HalfCheetah, Breakout, ale-py's vector env) and a CUDA matmul and
   convolution, prints the GPU, driver, torch, CUDA and cuDNN versions, and stops there if a check fails;
2. ``cuda``: ``python -m pytest -m cuda`` on ``--workers`` pytest-xdist workers (serial without xdist), ordered
   so that the first tests run each script once (then each script's sync check, then the other sampling modes),
   no ``--maxfail``; a cut kills the whole process tree it leaves;
3. ``figures``: short GPU figures (``--figure-s`` each), every one a call of the benchmark's own function
   (``benchmarks/speed/ppo_atari_vs_sb3.py``'s ``ours`` and ``sb3``, ...) on ``--device cuda`` beside the same on
   ``--device cpu``: first every script's ``--compile`` figure (each update one CUDA graph; LeanRL's H100 figures
   beside them in docs/gpu.md), then PPO Breakout (serial, parallel, async) and SAC HalfCheetah against
   Stable-Baselines3 on the GPU, DQN and C51 Breakout, R2D1's learner sequences/s;
4. ``race`` (asked for by ``--parts``): ours beside LeanRL's own scripts (``--leanrl``, their packages from
   ``<--wheels>/leanrl/``, installed for their processes only), on the same node, in the same step window, one
   after the other (``benchmarks/gpu/race.py``): each figure the median SPS of the intervals after a burn-in (3
   rollouts, then 30k+ steps for the PPO family; 5k learning steps, then 10k for the replay scripts), beside the
   window's mean, the env-only ceiling and the ratio ours/LeanRL; then DQN, C51, DDPG and R2D1's learner alone
   (``--race`` picks and orders the items, ``--race-run-s`` caps each process);
5. ``long`` (asked for by ``--parts``): PPO Breakout for 10M frames, one seed, for what the budget leaves; its
   ``progress.csv`` is copied to ``OUT/long-progress.csv``, and a later call resumes the run from ``--long-dir``;
6. ``unit`` (``--unit``): ``python -m pytest -m unit`` on the node's torch;
7. ``OUT/summary.txt``, rewritten after every test and figure (one screen: what passed, what failed with its first
   error lines, every figure with its command), ``OUT/results.json`` (what ``--redo`` reads) and every log.

Without a CUDA device (this script's own test on a CPU machine) the GPU parts are skipped; ``--dry`` runs the race
and long parts there anyway, on the CPU with tiny windows, to check their plumbing. Python rather than
bash: the budget cut, the process-tree kill, the test order and the summary are functions a test can call.
Exit 0 when everything asked for ran and passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file: the repository's packages import from it
    sys.path.insert(0, str(ROOT))

from benchmarks.script_speed import intervals_from_rows, progress_sps, window_sps

MARK = "GPU_CHECK_RUN"  # in the environment of every process this check starts (tests/test_gpu_check.py looks)
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
PPO_STEPS, SAC_STEPS, DQN_STEPS = 3072, 1000, 2000  # 3 rollouts (2 timed); 1,000 steps learning; 2,000 learning


def _figures() -> dict[str, tuple[str, str, str]]:
    """name -> (benchmark module, call of its function, unit), in the order they run: the compiled GPU figures first,
    then pairs (cuda, then the same on cpu) of what matters most, so that a budget cut drops the least."""
    figs: dict[str, tuple[str, str, str]] = {}

    def pair(name: str, module: str, call: str, unit: str = "SPS") -> None:
        for dev in ("cuda", "cpu"):
            figs[f"{name}-{dev}"] = (module, call.replace("DEV", dev), unit)

    pair("ppo-serial", "ppo_atari_vs_sb3", f"ours('{BREAKOUT}', {PPO_STEPS}, 'serial', [], 'DEV')")
    # --compile beside eager on the same GPU (issue 42; LeanRL's H100 figures in docs/gpu.md): compiling happens in
    # the first rollout and update, before each benchmark's timed window.
    figs["ppo-serial-compile-cuda"] = (
        "ppo_atari_vs_sb3",
        f"ours('{BREAKOUT}', {PPO_STEPS}, 'serial', ['--compile'], 'cuda')",
        "SPS",
    )
    figs["sb3-ppo-cuda"] = ("ppo_atari_vs_sb3", f"sb3('{BREAKOUT}', {PPO_STEPS}, 'cuda')", "SPS")
    # the envs alone, random actions (no policy, no GPU): what bounds the PPO figures above if the GPU does not
    figs["ppo-envs-serial"] = ("ppo_sampling", f"envs_only('{BREAKOUT}', 8, 'serial', 10.0)", "SPS")
    # SAC's update alone (benchmarks/speed/sac_update.py): eager, --compile (the whole update one CUDA graph), the same
    # without the capture, and the capture of eager kernels
    for mode in ("eager", "compile", "compile-no-graph", "graph-eager"):
        figs[f"sac-update-{mode}-cuda"] = ("sac_update", f"sac_updates_per_second('cuda', '{mode}')", "updates/s")
    figs["sac-update-eager-cpu"] = ("sac_update", "sac_updates_per_second('cpu', 'eager')", "updates/s")
    pair("sac-serial", "sac_td3_ddpg_vs_sb3", f"ours('sac_mujoco.py', 'HalfCheetah-v5', {SAC_STEPS}, 'serial', [], 'DEV')")
    figs["sb3-sac-cuda"] = ("sac_td3_ddpg_vs_sb3", f"sb3('sac', 'HalfCheetah-v5', {SAC_STEPS}, 'cuda')", "SPS")
    figs["sac-serial-compile-cuda"] = (
        "sac_td3_ddpg_vs_sb3",
        f"ours('sac_mujoco.py', 'HalfCheetah-v5', {SAC_STEPS}, 'serial', ['--compile'], 'cuda')",
        "SPS",
    )
    # the same compiled SAC under cProfile: where the host's time per step goes (the figure's log holds the table)
    figs["sac-profile-compile-cuda"] = (
        "sac_td3_ddpg_vs_sb3",
        f"ours('sac_mujoco.py', 'HalfCheetah-v5', {SAC_STEPS}, 'serial', ['--compile'], 'cuda', profile_top=30)",
        "SPS",
    )
    pair("dqn-serial", "dqn_atari_vs_sb3", f"ours('dqn_atari.py', '{BREAKOUT}', {DQN_STEPS}, 'serial', [], 'DEV')")
    figs["dqn-serial-compile-cuda"] = (
        "dqn_atari_vs_sb3",
        f"ours('dqn_atari.py', '{BREAKOUT}', {DQN_STEPS}, 'serial', ['--compile'], 'cuda')",
        "SPS",
    )
    figs["r2d1-learner-cuda"] = ("r2d1_atari", "learner_sequences_per_second(5, torch.device('cuda'), 2500.0)", "sequences/s")
    figs["r2d1-learner-cpu"] = ("r2d1_atari", "learner_sequences_per_second(1, torch.device('cpu'), 2500.0)", "sequences/s")
    pair("ppo-parallel", "ppo_atari_vs_sb3", f"ours('{BREAKOUT}', {PPO_STEPS}, 'parallel', [], 'DEV')")
    pair("ppo-async", "ppo_atari_vs_sb3", f"ours('{BREAKOUT}', {PPO_STEPS}, 'async', [], 'DEV')")
    pair("c51-serial", "dqn_atari_vs_sb3", f"ours('catdqn_atari.py', '{BREAKOUT}', {DQN_STEPS}, 'serial', [], 'DEV')")
    # --compile, each update and acting step one CUDA graph (issue 61), beside LeanRL's H100 figures (docs/gpu.md)
    for sampler in ("parallel", "async"):
        figs[f"ppo-{sampler}-compile-cuda"] = (
            "ppo_atari_vs_sb3",
            f"ours('{BREAKOUT}', {PPO_STEPS}, '{sampler}', ['--compile'], 'cuda')",
            "SPS",
        )
    for script in ("td3", "ddpg"):
        figs[f"{script}-serial-compile-cuda"] = (
            "sac_td3_ddpg_vs_sb3",
            f"ours('{script}_mujoco.py', 'HalfCheetah-v5', {SAC_STEPS}, 'serial', ['--compile'], 'cuda')",
            "SPS",
        )
    figs["ppo-mujoco-compile-cuda"] = (
        "ppo_mujoco_vs_sb3",
        "ours('HalfCheetah-v5', 3 * 2048, 1, 'serial', 'cuda', ('--compile',))",
        "SPS",
    )
    figs["c51-serial-compile-cuda"] = (
        "dqn_atari_vs_sb3",
        f"ours('catdqn_atari.py', '{BREAKOUT}', {DQN_STEPS}, 'serial', ['--compile'], 'cuda')",
        "SPS",
    )
    figs["r2d1-learner-compile-cuda"] = (
        "r2d1_atari",
        "learner_sequences_per_second(5, torch.device('cuda'), 2500.0, compile=True)",
        "sequences/s",
    )
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
MAX_FAILURES = 12  # listed with their first error lines in the summary (all of them in results.json)
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


# --- processes: every one this check starts stays its descendant (a subreaper), and a cut kills them all ---------


def _subreaper() -> None:
    """Orphans of the processes this check starts are re-parented to it (not to init), so a cut finds them all."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def descendants(root: int | None = None) -> list[int]:
    """Live processes below ``root`` (default: this one), from /proc."""
    children: dict[int, list[tuple[int, str]]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append((int(d), fields[0]))
    out, todo = [], [root or os.getpid()]
    while todo:
        for pid, state in children.get(todo.pop(), ()):
            todo.append(pid)
            if state not in ("Z", "X"):
                out.append(pid)
    return out


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_tree(grace: float = 3.0) -> list[int]:
    """SIGTERM every descendant, SIGKILL what is left after ``grace`` seconds, reap them; returns the pids found."""
    found: set[int] = set()
    termed: set[int] = set()
    end = time.monotonic() + grace
    while True:
        _reap()
        live = descendants()
        if not live:
            return sorted(found)
        found.update(live)
        if time.monotonic() > end + 10:
            return sorted(found)
        for pid in live:
            if time.monotonic() < end and pid in termed:
                continue
            termed.add(pid)
            try:
                os.kill(pid, signal.SIGTERM if time.monotonic() < end else signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


class Interrupted(Exception):
    pass


def _interrupt(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def run_cmd(
    cmd: list[str], log: Path, timeout: float, env: dict | None = None, cwd: Path | None = None, grace: float = 3.0
) -> tuple[int | None, bool, float]:
    """Run ``cmd`` from the repository root (or ``cwd``) into ``log``; (exit code, cut by the timeout, seconds). A
    cut (or an interrupt of this check) kills the command's whole tree, SIGKILL ``grace`` seconds after SIGTERM; so
    does a normal end, for whatever it left behind."""
    t0 = time.monotonic()
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=cwd or ROOT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(timeout, 0.1))
            cut = False
        except subprocess.TimeoutExpired:
            rc, cut = None, True
        except BaseException:
            kill_tree()
            proc.wait()
            raise
        left = kill_tree(grace)
        if cut:
            proc.wait()
            f.write(f"\n[gpu_check] cut after {timeout:.0f} s: killed {len(left)} process(es)\n")
        elif left:
            f.write(f"\n[gpu_check] {len(left)} process(es) left behind, killed: {left}\n")
    return rc, cut, time.monotonic() - t0


# --- the probe: imports, envs, CUDA, versions (run in a child, one JSON line per check) -----------------------------


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

    v = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cores": len(os.sched_getaffinity(0)),
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


# --- the pytest plugin (python -m pytest -p gpu_check, benchmarks/ on PYTHONPATH) ----------------------------------

try:
    import pytest

    _last = pytest.hookimpl(trylast=True)  # after pytest's own -m and -k selection and the conftest's marks
except ImportError:  # the check itself runs without pytest, and then says so
    _last = lambda f: f
_worker: str | None = None


def script_and_function(nodeid: str) -> tuple[str, str]:
    """(script, test function) of a test id; script is "" when no script of algos/ is among its parameters."""
    func, _, params = nodeid.partition("[")
    tokens = set(re.split(r"[-\]]", params))
    return next((s for s in SCRIPTS if s in tokens), ""), func


LAST = ("compiles_to_cuda_graphs",)  # slow (inductor compiles each script, minutes for the LSTMs): after the rest


def order_tests(ids: list[str]) -> list[str]:
    """Round-robin over scripts, each script's tests round-robin over test functions: the first round runs every
    script once, so a budget cut after it has still covered them all. The tests of ``LAST`` come after all others."""
    late = [i for i in ids if any(name in i for name in LAST)]
    if late:
        return order_tests([i for i in ids if i not in late]) + late
    groups: dict[str, dict[str, list[str]]] = {}
    for i in ids:
        script, func = script_and_function(i)
        groups.setdefault(script, {}).setdefault(func, []).append(i)
    per_script = []
    for funcs in groups.values():
        lists = list(funcs.values())
        per_script.append([x for k in range(max(map(len, lists))) for li in lists if k < len(li) for x in [li[k]]])
    return [x for k in range(max(map(len, per_script), default=0)) for g in per_script if k < len(g) for x in [g[k]]]


def pytest_configure(config):
    global _worker
    _worker = getattr(config, "workerinput", {}).get("workerid") if hasattr(config, "workerinput") else None


@_last
def pytest_collection_modifyitems(session, config, items):
    if os.environ.get("GPU_CHECK_ORDER"):
        by_id = {i.nodeid: i for i in items}
        items[:] = [by_id[n] for n in order_tests(list(by_id))]
    if _worker in (None, "gw0") and os.environ.get("GPU_CHECK_COLLECTED"):
        Path(os.environ["GPU_CHECK_COLLECTED"]).write_text("".join(i.nodeid + "\n" for i in items))
    skip = os.environ.get("GPU_CHECK_SKIP")
    if skip:
        done = set(Path(skip).read_text().split("\n"))
        keep = [i for i in items if i.nodeid not in done]
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in done])
        items[:] = keep


def pytest_runtest_logreport(report):
    path = os.environ.get("GPU_CHECK_REPORTS")
    if not path or _worker is not None or (report.when != "call" and report.outcome == "passed"):
        return
    error = ""
    if report.failed:
        lines = report.longreprtext.splitlines()
        error = "\n".join([ln for ln in lines if ln.startswith("E ")][:3] or lines[-2:])
    elif report.skipped and isinstance(report.longrepr, tuple):
        error = str(report.longrepr[2])
    outcome = "error" if report.failed and report.when != "call" else report.outcome
    with open(path, "a") as f:
        f.write(json.dumps({"id": report.nodeid, "outcome": outcome, "error": error[:600]}) + "\n")


# --- the check --------------------------------------------------------------------------------------------------


def wheel_name(path: Path) -> tuple[str, str]:
    """(distribution name, normalized as importlib.metadata finds it; version) of a wheel file's name."""
    name, ver = path.name.split("-")[:2]
    return re.sub(r"[-_.]+", "-", name).lower(), ver


def older(have: str, want: str) -> bool:
    """Whether version ``have`` is older than ``want`` (their leading numbers compared: enough for releases)."""

    def nums(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.match(r"[\d.]*", v).group().split(".") if x)

    return nums(have) < nums(want)


def installed_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class Check:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget
        self.env = {
            **os.environ,
            MARK: str(self.out),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.prev = json.loads((Path(args.redo) / "results.json").read_text()) if args.redo else None
        self.r: dict = {
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "argv": sys.argv[1:],
            "budget_s": args.budget,
            "status": "running",
            "node": {},
            "install": {},
            "checks": [],
            "parts_asked": args.parts,
            "parts": {},
            "figures": {},
        }
        # a part the earlier run had and this one does not redo stays as it was, so that this run's results.json
        # holds everything known (the next --redo reads it)
        for name, part in ((self.prev or {}).get("parts") or {}).items():
            if name not in args.parts and name != "figures":
                self.r["parts"][name] = {**part, "note": "earlier run, not redone"}
        for name in ("race", "long"):  # their figures too
            if name not in args.parts and (self.prev or {}).get(name):
                self.r[name] = self.prev[name]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.r["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        (self.out / "results.json").write_text(json.dumps(self.r, indent=1))
        (self.out / "summary.txt").write_text(summary(self.r, self.out) + "\n")

    def say(self, line: str) -> None:
        print(f"[{time.monotonic() - self.t0:5.0f} s] {line}", flush=True)

    # 1. install, imports, envs, CUDA, versions
    def install(self) -> None:
        folder = Path(self.a.wheels) if self.a.wheels else None
        wheels = sorted(folder.glob("*.whl")) if folder and folder.is_dir() else []
        if not wheels:
            self.r["install"] = {"state": f"no wheels in {folder}" if folder else "off"}
            return
        todo, kept = [], []
        for w in wheels:
            dist, ver = wheel_name(w)
            have = installed_version(dist)
            if have and not older(have, ver):
                kept.append(f"{dist} {have}" + ("" if have == ver else f" (wheel {ver})"))
            else:
                todo.append((w, f"{dist} {ver}" + (f" (over {have})" if have else "")))
        self.r["install"] = {"state": "nothing to install", "kept": kept, "installed": []}
        if todo:
            log = self.out / "install.log"
            cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", *(str(w) for w, _ in todo)]
            rc, cut, _ = run_cmd(cmd, log, min(120, self.left()), self.env)
            if rc != 0 and not cut:  # a read-only site-packages: the user's own
                rc, cut, _ = run_cmd([*cmd[:4], "--user", *cmd[4:]], log, min(120, self.left()), self.env)
            self.r["install"].update(
                state="installed" if rc == 0 else f"pip failed (exit {rc}), see install.log",
                installed=[label for _, label in todo],
            )
        self.say(f"install: {self.r['install']['state']}")

    def checks(self) -> bool:
        self.install()
        self.save()
        return self.probe(full=True)

    def probe(self, full: bool) -> bool:
        log = self.out / "checks.log"
        code = f"from benchmarks.gpu import check; check.probe({full})"
        rc, cut, _ = run_cmd([sys.executable, "-c", code], log, min(self.a.checks_s, self.left()), self.env)
        for line in log.read_text().splitlines():
            if line.startswith("{"):
                d = json.loads(line)
                if "versions" in d:
                    self.r["node"].update(d["versions"])
                else:
                    self.r["checks"].append(d)
        self.r["node"].update(driver=self._driver())
        node = self.r["node"]
        failed = [c for c in self.r["checks"] if c["ok"] is False]
        if cut or rc != 0 or "torch" not in node:
            failed.append(
                {
                    "check": "the checks themselves",
                    "ok": False,
                    "detail": f"cut after {self.a.checks_s:.0f} s" if cut else f"exit {rc}, see checks.log",
                }
            )
        if node.get("driver") and node.get("cuda") is False:
            failed.append(
                {
                    "check": "torch sees the GPU",
                    "ok": False,
                    "detail": f"nvidia-smi: {node['driver']}, torch.cuda.is_available() is False",
                }
            )
        self.r["checks"] += [c for c in failed if c not in self.r["checks"]]
        self.say(
            f"checks: {sum(c['ok'] is True for c in self.r['checks'])} passed, {len(failed)} failed; {versions_line(node)}"
        )
        return not failed

    def _driver(self) -> str:
        if not shutil.which("nvidia-smi"):
            return ""
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            return out.stdout.strip().splitlines()[0] if out.stdout.strip() else out.stderr.strip()[:200]
        except (OSError, subprocess.SubprocessError) as e:
            return f"nvidia-smi failed: {e}"

    # 2 and 4: a pytest tier, its outcomes read test by test
    def pytest_part(self, part: str, mark: str, budget: float, workers: int, order: bool) -> None:
        p = self.r["parts"][part] = {"state": "running", "tests": {}, "collected": []}
        if budget < 10:
            p["state"] = "not run: budget spent"
            return
        prev = ((self.prev or {}).get("parts", {}).get(part) or {}).get("tests", {})
        done = {i for i, t in prev.items() if t["outcome"] in ("passed", "skipped")}
        reports, collected, skip = (self.out / f"{part}.jsonl", self.out / f"{part}.collected", self.out / f"{part}.skip")
        for f in (reports, collected):
            f.unlink(missing_ok=True)
        skip.write_text("".join(i + "\n" for i in sorted(done)))
        xdist = workers > 1 and importable("xdist")
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "benchmarks.gpu.check",
            "-m",
            mark,
            "-v",
            "--tb=short",
            "-o",
            "console_output_style=classic",
            *(["-n", str(workers)] if xdist else []),
            *shlex.split(self.a.pytest_args),
        ]
        p["cmd"] = " ".join(["python", *cmd[1:]])
        p["workers"] = workers if xdist else 1
        if workers > 1 and not xdist:
            p["note"] = "pytest-xdist missing: one at a time"
        env = {
            **self.env,
            "GPU_CHECK_REPORTS": str(reports),
            "GPU_CHECK_COLLECTED": str(collected),
            "GPU_CHECK_SKIP": str(skip),
            **({"GPU_CHECK_ORDER": "1"} if order else {}),
        }
        self.say(f"{part}: {p['cmd']} (within {budget:.0f} s)")
        self.save()
        t_end = time.monotonic() + budget
        proc_log = self.out / f"{part}.log"
        # run_cmd blocks; a watcher thread turns the reports into the summary as they come
        import threading

        stop = threading.Event()

        def watch() -> None:
            seen = 0
            while not stop.wait(2.0):
                n = self._read_reports(p, reports, collected, prev)
                if n != seen:
                    seen = n
                    self.save()

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        try:
            rc, cut, wall = run_cmd(cmd, proc_log, max(t_end - time.monotonic(), 0.1), env)
        finally:
            stop.set()
            t.join()
            self._read_reports(p, reports, collected, prev)
        p["wall_s"] = round(wall, 1)
        p["exit"] = rc
        p["state"] = "cut" if cut else "done"
        if not cut and rc not in (0, 1, 5):
            p["state"] = f"pytest exit {rc}, see {proc_log.name}"
        self.say(f"{part}: {counts_line(p)}")
        self.save()

    def _read_reports(self, p: dict, reports: Path, collected: Path, prev: dict) -> int:
        if collected.exists():
            p["collected"] = [ln for ln in collected.read_text().splitlines() if ln]
        tests = {i: dict(t, earlier=True) for i, t in prev.items() if t["outcome"] in ("passed", "skipped")}
        if reports.exists():
            for line in reports.read_text().splitlines():
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line being written
                old = tests.get(d["id"])
                if old is None or old.get("earlier") or rank(d["outcome"]) > rank(old["outcome"]):
                    tests[d["id"]] = {"outcome": d["outcome"], "error": d["error"]}
        p["tests"] = tests
        return len(tests)

    # 3. figures
    def figures(self) -> None:
        names = self.a.figures or list(FIGURES)
        unknown = [n for n in names if n not in FIGURES]
        if unknown:
            raise SystemExit(f"unknown figure(s): {unknown}; known: {list(FIGURES)}")
        if self.prev:
            names = [n for n in names if (self.prev.get("figures", {}).get(n) or {}).get("value") is None]
        figs = self.r["figures"]
        for n in names:
            figs[n] = {"state": "not run", "cmd": f"{FIGURES[n][0]}.{FIGURES[n][1]}", "unit": FIGURES[n][2]}
        if self.prev:
            for n, f in self.prev.get("figures", {}).items():
                if f.get("value") is not None and n not in figs:
                    figs[n] = dict(f, earlier=True)
        (self.out / "figures").mkdir(exist_ok=True)
        for n in names:
            module, call, unit = FIGURES[n]
            if "cuda" in call and not self.r["node"].get("cuda"):
                figs[n]["state"] = "skipped: no CUDA device"
                continue
            # a compiled figure compiles first (inductor: tens of seconds, outside its timed window); a replay
            # script's figure fills its replay first and then learns 1,000-2,000 steps, one update each (on an H200,
            # eager SAC and DQN did not finish within 24 s)
            weight = 3 if "compile" in call else 2 if module in ("sac_td3_ddpg_vs_sb3", "dqn_atari_vs_sb3") else 1
            budget = min(self.a.figure_s * weight, self.left() - 5)
            if budget < min(5, self.a.figure_s):
                figs[n]["state"] = "not run: budget spent"
                continue
            code = FIGURE_CODE.format(module=module, call=call)
            log = self.out / "figures" / f"{n}.log"
            # the benchmark's run folders (tempfile) land here, where a cut leaves them to be read
            tmp = self.out / "figures" / f"{n}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)  # an earlier run's, cut by a signal
            tmp.mkdir()
            # inductor's cache stays where it was (it follows TMPDIR): the compiled figures reuse what the cuda
            # tests compiled
            env = {
                **self.env,
                "TMPDIR": str(tmp),
                "TORCHINDUCTOR_CACHE_DIR": self.env.get("TORCHINDUCTOR_CACHE_DIR") or inductor_cache_dir(),
            }
            try:
                rc, cut, wall = run_cmd([sys.executable, "-c", code], log, budget, env)
                got = progress_at_cut(tmp) if rc is None else None
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            text = log.read_text()
            f = figs[n]
            f["wall_s"] = round(wall, 1)
            value = _last_float(text) if rc == 0 else None
            if value is not None:
                f.update(state="done", value=round(value, 1))
            elif cut:
                f["state"] = f"cut after {budget:.0f} s" + (f" ({got})" if got else "")
                with open(log, "a") as lf:
                    lf.write(f"[gpu_check] at the cut: {got or 'no progress.csv row (none yet, or none kept)'}\n")
            else:
                f.update(state="failed", error=first_error(text))
            self.say(f"figure {n}: {f.get('value', f['state'])} {unit if value is not None else ''}")
            self.save()

    # 5. the race beside LeanRL's own scripts (benchmarks/gpu/race.py), same node, same window, one after another
    def race(self) -> None:
        from benchmarks.gpu import race as R

        a = self.a
        names = a.race or R.ORDER
        folder = self.out / "race"
        folder.mkdir(exist_ok=True)
        leanrl = Path(a.leanrl).resolve() if a.leanrl else None
        prev = (self.prev or {}).get("race", {})
        results, site = self.r["race"], None
        try:
            for name in names:
                if (prev.get(name) or {}).get("state") == "done":
                    results[name] = dict(prev[name], earlier=True)
                    continue
                item = R.plan(name, a.dry)
                entry = results[name] = {"what": item.what, "state": "running", "runs": {}}
                for run in item.runs:
                    r = entry["runs"][run.label] = {"state": "not run", "unit": run.unit, "min_steps": run.min_steps}
                    if run.kind == "leanrl" and not (leanrl and Path(R.leanrl_argv(run, leanrl)[0]).exists()):
                        r["state"] = f"skipped: no {run.argv[0].split('/')[-1]} in --leanrl {a.leanrl or '(none)'}"
                        continue
                    budget = min(a.race_run_s, self.left() - 5)
                    if budget < min(15, a.race_run_s):
                        r["state"] = "not run: budget spent"
                        continue
                    if run.kind == "leanrl" and site is None:
                        site = self._leanrl_site(folder)
                    self._race_run(name, run, r, budget, folder, leanrl, site)
                    self.say(f"race {name}, {run.label}: " + (R.run_line("", r).strip()))
                    self.save()
                has = [
                    x.get("median") is not None or x.get("value") is not None or x["state"].startswith("skipped")
                    for x in entry["runs"].values()
                ]
                entry["state"] = "done" if all(has) else "incomplete"
                self.save()
        finally:
            if site:
                shutil.rmtree(site, ignore_errors=True)

    def _leanrl_site(self, folder: Path) -> str:
        """LeanRL's wheels (``<--wheels>/leanrl/*.whl``: tensordict, torchrl, pyvers, hoptorch) installed into a
        folder of their own that only LeanRL's processes see: ours run on the node's packages as in every figure."""
        import tempfile

        wheels = sorted((Path(self.a.wheels) / "leanrl").glob("*.whl")) if self.a.wheels else []
        if not wheels:
            self.r["race_install"] = "no LeanRL wheels (<--wheels>/leanrl/*.whl): the node's own packages"
            return ""
        site = tempfile.mkdtemp(prefix="leanrl-site-")
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", site]
        rc, _, _ = run_cmd([*cmd, *map(str, wheels)], folder / "install.log", min(120, self.left()), self.env)
        names = ", ".join(" ".join(wheel_name(w)) for w in wheels)
        self.r["race_install"] = (
            f"installed {names} for LeanRL only" if rc == 0 else f"pip failed (exit {rc}) for {names}, see race/install.log"
        )
        return site

    def _race_run(self, name: str, run, r: dict, budget: float, folder: Path, leanrl: Path | None, site: str) -> None:
        """One process of the race, cut after ``budget`` seconds; its figure from what it wrote, also when cut."""
        import tempfile

        from benchmarks.gpu import race as R

        slug = f"{name}-{re.sub(r'[^a-z0-9]+', '-', run.label.lower()).strip('-')}"
        log, env, cwd = folder / f"{slug}.log", dict(self.env), None
        if run.kind == "ours":
            argv = [*run.argv, "--out-dir", str(folder), "--run-name", slug]
        elif run.kind == "leanrl":
            argv = R.leanrl_argv(run, leanrl)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, str(leanrl / "stubs"), env.get("PYTHONPATH")]))
            cwd = Path(tempfile.mkdtemp(prefix=f"{slug}-"))  # whatever LeanRL writes lands there, not in the repo
        else:
            argv = run.argv
        r["cmd"] = "python " + " ".join(shlex.quote(a) for a in argv)
        try:
            rc, cut, wall = run_cmd([sys.executable, *argv], log, budget, env, cwd=cwd)
        finally:
            if cwd:
                shutil.rmtree(cwd, ignore_errors=True)
        r["wall_s"] = round(wall, 1)
        text = log.read_bytes().decode(errors="replace")
        r["state"] = "done" if rc == 0 else f"cut after {budget:.0f} s" if cut else "failed"
        if rc not in (0, None):
            r["error"] = first_error(text)
        try:
            if run.kind == "ours":
                r.update(progress_sps(folder / slug / "progress.csv", run.burn_in, run.min_steps))
                for junk in [*(folder / slug).glob("*.pt"), *(folder / slug).glob("events.out.tfevents*")]:
                    junk.unlink()  # the checkpoint and TensorBoard's copy of the rows: not needed here
            elif run.kind == "leanrl":
                speeds = R.tqdm_speeds(text)
                r["prints"] = len(speeds)
                r.update(window_sps(R.leanrl_intervals(speeds, run.schedule), run.burn_in, run.min_steps, run.every))
            elif rc == 0 and _last_float(text) is not None:
                r["value"] = round(_last_float(text), 1)
        except (OSError, ValueError) as e:  # no progress.csv, or no interval after the burn-in (yet)
            r.setdefault("error", f"no figure: {e}")

    # 6. PPO Breakout, 10M frames, one seed: the curve (progress.csv) comes back
    def long(self) -> None:
        from benchmarks.gpu import race as R

        a = self.a
        run_dir = Path(a.long_dir).resolve()
        r = self.r["long"] = {"state": "not run", "steps": a.long_steps, "run_dir": str(run_dir)}
        budget = min(a.long_s or float("inf"), self.left() - 30)  # SIGTERM: the script writes a row and checkpoint
        if budget < 30:
            r["state"] = "not run: budget spent"
            return
        argv = R.long_argv(run_dir, a.long_steps, a.dry)
        r["cmd"] = "python " + " ".join(argv)
        r["resumed"] = "--resume" in argv
        self.say(f"long: {r['cmd']} (within {budget:.0f} s)")
        self.save()
        rc, cut, wall = run_cmd([sys.executable, *argv], self.out / "long.log", budget, self.env, grace=20)
        r.update(wall_s=round(wall, 1), state="done" if rc == 0 else f"cut after {budget:.0f} s" if cut else "failed")
        if rc not in (0, None):
            r["error"] = first_error((self.out / "long.log").read_text(errors="replace"))
        progress = run_dir / "progress.csv"
        if progress.exists():
            shutil.copy(progress, self.out / "long-progress.csv")
            if str(ROOT) not in sys.path:
                sys.path.insert(0, str(ROOT))
            from shared.progress import read_rows

            rows = read_rows(progress)
            returns = [row["return_mean"] for row in rows if row.get("return_mean")]
            r.update(reached=int(rows[-1]["global_step"]) if rows else 0, rows=len(rows))
            r["return_mean"] = float(returns[-1]) if returns else None
            try:
                r["sps"] = window_sps(intervals_from_rows(rows), int(rows[0]["global_step"]))["median"]
            except (ValueError, IndexError):
                pass
        self.say(f"long: {r['state']}, step {r.get('reached', 0):,} of {a.long_steps:,}")
        self.save()

    def run(self) -> int:
        a = self.a
        try:
            ok = self.checks() if "checks" in a.parts else self.probe(full=False)
            self.save()
            if not ok:
                self.r["status"] = "stopped: a check failed"
                return 1
            gpu = bool(self.r["node"].get("cuda"))
            for part in a.parts:
                if part == "cuda":
                    if not gpu:
                        self.r["parts"]["cuda"] = {"state": "skipped: no CUDA device", "tests": {}}
                        continue
                    self.pytest_part("cuda", "cuda", min(a.cuda_s, self.left() - 10), a.workers, order=True)
                elif part == "figures":
                    if not gpu and not a.figures:
                        self.r["figures"] = {}
                        self.r["parts"]["figures"] = {"state": "skipped: no CUDA device"}
                        continue
                    self.r["parts"]["figures"] = {"state": "running"}
                    self.figures()
                    self.r["parts"]["figures"]["state"] = "done"
                elif part in ("race", "long"):
                    self.r[part] = {}
                    if not gpu and not a.dry:
                        self.r["parts"][part] = {"state": "skipped: no CUDA device (--dry runs it on the CPU)"}
                        continue
                    self.r["parts"][part] = {"state": "running"}
                    self.race() if part == "race" else self.long()
                    self.r["parts"][part]["state"] = "done"
                elif part == "unit":
                    self.pytest_part("unit", "unit", min(a.unit_s, self.left() - 5), a.unit_workers, order=False)
                self.save()
            cut = [n for n, p in self.r["parts"].items() if str(p.get("state", "")).startswith("cut")]
            cut += [n for n, f in self.r["figures"].items() if f["state"].startswith(("cut", "not run"))]
            cut += [f"race {n}" for n, e in self.r.get("race", {}).items() if e.get("state") != "done"]
            cut += ["long"] if self.r.get("long") and self.r["long"].get("state") != "done" else []
            self.r["status"] = ("finished" if self.left() > 0 else "budget spent") + (
                f", cut or not run: {', '.join(cut)}" if cut else ""
            )
        except Interrupted as e:
            self.r["status"] = f"interrupted ({e})"
        finally:
            left = kill_tree()
            if left:
                self.r["leftovers_killed"] = left
            self.save()
        return 0 if all_passed(self.r) else 1


def importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


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


def _last_float(text: str) -> float | None:
    for line in reversed(text.strip().splitlines()):
        try:
            return float(line.strip())
        except ValueError:
            continue
    return None


def first_error(text: str, n: int = 2) -> str:
    """The last ``n`` lines that read as an error (a traceback's end), else the last non-empty lines."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if re.match(r"^([\w.]*(Error|Exception|Interrupt)\b(:|$)|error:)", ln.strip())]
    return "\n".join((errs or lines)[-n:])[:400]


def rank(outcome: str) -> int:
    return {"passed": 0, "skipped": 1, "failed": 2, "error": 3}.get(outcome, 0)


def all_passed(r: dict) -> bool:
    if r["status"] != "finished" or any(c["ok"] is False for c in r["checks"]):
        return False
    for p in r["parts"].values():
        if str(p.get("state", "")).startswith(("cut", "pytest exit")):
            return False
        tests = p.get("tests", {})
        if any(t["outcome"] in ("failed", "error") for t in tests.values()):
            return False
        if p.get("collected") and set(p["collected"]) - set(tests):
            return False
    for item in r.get("race", {}).values():
        for run in item.get("runs", {}).values():
            if not run["state"].startswith(("done", "skipped")) or (
                run["state"] == "done" and run.get("median") is None and run.get("value") is None
            ):
                return False
    if r.get("long") and r["long"].get("state") != "done":
        return False
    return all(f.get("value") is not None or f["state"].startswith("skipped") for f in r["figures"].values())


# --- the summary ------------------------------------------------------------------------------------------------


def versions_line(v: dict) -> str:
    if not v.get("torch"):
        return "versions unknown"
    gpu = (
        f"{v.get('gpu')} (sm {v.get('capability')}, {v.get('gpu_memory_gib')} GiB, {v.get('gpus')} GPU), "
        f"driver {v.get('driver', '').split(',')[-1].strip() or '?'}, "
        if v.get("cuda")
        else "no CUDA device, "
    )
    return (
        f"{gpu}torch {v['torch']}, CUDA {v.get('cuda_build')}, cuDNN {v.get('cudnn', '-')}, "
        f"Python {v.get('python')}, {v.get('cores')} cores"
    )


def counts_line(p: dict) -> str:
    tests = p.get("tests", {})
    by = {o: sum(t["outcome"] == o for t in tests.values()) for o in ("passed", "failed", "error", "skipped")}
    not_run = len(set(p.get("collected", [])) - set(tests))
    earlier = sum(bool(t.get("earlier")) for t in tests.values())
    parts = [f"{by['passed']} passed" + (f" ({earlier} in the earlier run)" if earlier else ""), f"{by['failed']} failed"]
    parts += [f"{by[k]} {k}" for k in ("error", "skipped") if by[k]]
    parts += [f"{not_run} not run"] if not_run else []
    return ", ".join(parts) + f"; {p.get('state')}" + (f", {p['wall_s']} s" if "wall_s" in p else "")


def ratio(name: str, figs: dict) -> str:
    """A cpu figure against the same on cuda ("gpu 2.5x": the GPU's figure is 2.5 times this one); ours on cuda
    against Stable-Baselines3's on cuda ("1.8x sb3")."""
    value = (figs.get(name) or {}).get("value")
    algo = name.split("-")[0]
    other, label = (
        (name[:-4] + "-cuda", "gpu {:.2f}x")
        if name.endswith("-cpu")
        else (f"sb3-{algo}-cuda", "{:.2f}x sb3")
        if name in BESIDE_SB3
        else (None, "")
    )
    base = (figs.get(other) or {}).get("value")
    if not value or not base:
        return ""
    return label.format(base / value if name.endswith("-cpu") else value / base)


def summary(r: dict, out: Path) -> str:
    """One screen: the node, each part's outcome with the first lines of every failure, every figure with its
    command; what was cut or not run says so."""
    lines = [
        f"GPU check {r['started']}: {r['status']}, {r.get('elapsed_s', 0):.0f} of {r['budget_s']:.0f} s "
        f"({' '.join(r['argv'])})",
        "node: " + versions_line(r["node"]),
    ]
    inst = r.get("install", {})
    if inst.get("state") not in (None, "off"):
        lines.append(
            f"install: {inst['state']}"
            + (f" {', '.join(inst['installed'])}" if inst.get("installed") else "")
            + (f"; kept the node's own {', '.join(inst['kept'])}" if inst.get("kept") else "")
        )
    checks = r.get("checks", [])
    bad = [c for c in checks if c["ok"] is False]
    left_out = "checks" not in r.get("parts_asked", ["checks"])
    lines.append(
        ("checks: left out (torch's versions and the CUDA checks only), " if left_out else "checks: ")
        + f"{sum(c['ok'] is True for c in checks)} passed, {len(bad)} failed"
        + "".join(f"\n  FAILED {c['check']}: {c['detail']}" for c in bad)
    )
    opt = [c for c in checks if c["ok"] is None]
    lines += [f"  {c['check']}: {c['detail']}" for c in opt]
    for name, p in r.get("parts", {}).items():
        if name in ("figures", "race", "long"):  # their own lines below
            continue
        extra = p.get("cmd", "").split("console_output_style=classic")[-1].strip()
        head = (
            f"{name} tests (python -m pytest -m {name} {extra}".rstrip() + f", {p.get('workers', 1)} worker(s))"
            if "cmd" in p
            else f"{name} tests"
        )
        lines.append(
            f"{head}: {counts_line(p) if 'tests' in p and 'cmd' in p else p.get('state')}"
            + (f" [{p['note']}]" if p.get("note") else "")
        )
        bad = [(i, t) for i, t in p.get("tests", {}).items() if t["outcome"] in ("failed", "error")]
        for i, t in bad[:MAX_FAILURES]:
            err = t["error"].replace("\n", "\n      ")
            lines.append(f"  {t['outcome'].upper()} {i.split('::')[-1]}\n      {err}")
        if len(bad) > MAX_FAILURES:
            lines.append(f"  ... and {len(bad) - MAX_FAILURES} more: {name}.log, results.json")
        not_run = [i for i in p.get("collected", []) if i not in p.get("tests", {})]
        if not_run and len(not_run) <= 6:
            lines.append("  not run: " + ", ".join(i.split("::")[-1] for i in not_run))
    figs = r.get("figures", {})
    fp = r.get("parts", {}).get("figures")
    if fp and not figs:
        lines.append(f"figures: {fp.get('state')}")
    if figs:
        lines.append(
            "figures (each: python -c \"import torch; from benchmarks.speed import MODULE; print(MODULE.CALL)\" "
            "from the repository root):"
        )
        for n, f in figs.items():
            val = f"{f['value']:9.1f} {f['unit']:<11}" if f.get("value") is not None else f"{f['state'][:21]:<21}"
            lines.append(f"  {n:<18} {val} {ratio(n, figs):<10} {f['cmd']}" + (" [earlier run]" if f.get("earlier") else ""))
            if f.get("value") is None and len(f["state"]) > 21:  # a cut's progress, a skip's reason: in full
                lines.append(f"      {f['state']}")
            if f.get("error"):
                lines.append("      " + f["error"].replace("\n", "\n      "))
    lines += race_lines(r)
    if r.get("leftovers_killed"):
        lines.append(f"left behind and killed at the end: {r['leftovers_killed']}")
    lines.append(f"logs: {out}/ (checks.log, cuda.log, figures/*.log, race/*.log, long.log, unit.log, results.json)")
    return "\n".join(lines)


def race_lines(r: dict) -> list[str]:
    """The race's and the long run's lines of the summary: every run's figure with its window, the ratios."""
    from benchmarks.gpu import race as R

    lines = []
    for part in ("race", "long"):
        p = r.get("parts", {}).get(part)
        if p and not r.get(part):
            lines.append(f"{part}: {p.get('state')}")
    if r.get("race"):
        lines.append(
            "race (benchmarks/gpu/race.py; median SPS of the intervals after the burn-in [window mean; intervals; steps; "
            "slowest-fastest]; same node, one after another):"
        )
        if r.get("race_install"):
            lines.append(f"  LeanRL's packages: {r['race_install']}")
    for name, item in r.get("race", {}).items():
        lines.append(f"  {name}: {item.get('what', '')}" + (" [earlier run]" if item.get("earlier") else ""))
        for label, run in item.get("runs", {}).items():
            lines.append("    " + R.run_line(label, run))
            if run.get("error"):
                lines.append("        " + run["error"].replace("\n", "\n        "))
        if R.ratio_line(item):
            lines.append("    " + R.ratio_line(item))
        if name == "ppo-atari" and R.ceiling_line(item, r["race"].get("envs")):
            lines.append("    " + R.ceiling_line(item, r["race"].get("envs")))
    g = r.get("long")
    if g:
        lines.append(
            f"long: PPO Breakout {g['steps']:,} agent steps ({4 * g['steps']:,} frames), seed 1: {g['state']}"
            + (", resumed" if g.get("resumed") else "")
            + (f"; step {g['reached']:,} ({g['rows']} rows)" if "reached" in g else "")
            + (f", median {g['sps']:.1f} SPS" if g.get("sps") else "")
            + (f", last return_mean {g['return_mean']:.1f}" if g.get("return_mean") is not None else "")
            + ("; long-progress.csv" if "reached" in g else "")
        )
        if g.get("error"):
            lines.append("    " + g["error"].replace("\n", "\n    "))
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="folder for the summary, results.json and every log")
    p.add_argument("--budget", type=float, default=480, help="seconds for everything (default 480)")
    p.add_argument(
        "--parts",
        default="checks,cuda,figures",
        help="comma-separated, in order: checks (install, imports, envs; without it only torch's "
        "versions and the CUDA checks), cuda, figures, race, long, unit (default checks,cuda,figures)",
    )
    p.add_argument("--unit", action="store_true", help="add the unit tier (python -m pytest -m unit), about 3 min")
    p.add_argument("--checks-s", type=float, default=150, help="seconds for the imports, envs and CUDA checks")
    p.add_argument("--cuda-s", type=float, default=220, help="seconds for the cuda test set (default 220)")
    p.add_argument("--workers", type=int, default=4, help="pytest-xdist workers for the cuda tests (default 4)")
    p.add_argument("--figure-s", type=float, default=30, help="seconds for each figure (default 30)")
    p.add_argument("--figures", nargs="*", help=f"which figures, in order (default all: {' '.join(FIGURES)})")
    p.add_argument("--unit-s", type=float, default=240, help="seconds for the unit tier (default 240)")
    p.add_argument("--unit-workers", type=int, default=1, help="pytest-xdist workers for the unit tier (default 1)")
    p.add_argument(
        "--pytest-args", default="", help="more pytest arguments for the cuda and unit parts, e.g. '-k sync' or a test file"
    )
    p.add_argument("--wheels", default=str(ROOT / ".whl"), help="wheel folder to install from ('' for none)")
    p.add_argument(
        "--race", nargs="*", help="race items, in order (default all: envs ppo-atari ppo-mujoco td3 sac dqn c51 ddpg r2d1)"
    )
    p.add_argument(
        "--leanrl",
        default=str(ROOT / ".peers" / "leanrl"),
        help="folder of LeanRL's scripts adapted to ale-py, with stubs/ (default .peers/leanrl); its packages come "
        "from <--wheels>/leanrl/*.whl, installed for LeanRL's processes only",
    )
    p.add_argument("--race-run-s", type=float, default=150, help="seconds for each process of the race (default 150)")
    p.add_argument("--long-steps", type=int, default=2_500_000, help="the long part's agent steps (default 2.5M: 10M frames)")
    p.add_argument(
        "--long-dir",
        default=str(ROOT / "runs" / "gpu-check-ppo-breakout-10m"),
        help="the long part's run folder; resumed when it holds a checkpoint (default runs/gpu-check-ppo-breakout-10m)",
    )
    p.add_argument("--long-s", type=float, default=0, help="seconds for the long part (default: what the budget leaves)")
    p.add_argument(
        "--dry",
        action="store_true",
        help="run the race and long parts on the CPU (no CUDA, no compiling, tiny windows): the plumbing, not figures",
    )
    p.add_argument(
        "--redo", metavar="PREV_OUT", help="an earlier run's folder: run only the tests and figures that did not pass there"
    )
    a = p.parse_args()
    a.parts = [x for x in a.parts.split(",") if x] + (["unit"] if a.unit and "unit" not in a.parts else [])
    bad = set(a.parts) - {"checks", "cuda", "figures", "race", "long", "unit"}
    if bad:
        p.error(f"unknown part(s) {sorted(bad)}")
    from benchmarks.gpu import race

    unknown = [n for n in a.race or [] if n not in race.ORDER]
    if unknown:
        p.error(f"unknown race item(s) {unknown}; known: {' '.join(race.ORDER)}")
    _subreaper()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _interrupt)
    check = Check(a)
    code = check.run()
    print(summary(check.r, check.out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
