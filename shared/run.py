"""The run folder every script writes, evaluation, and the shutdown every script shares (README: "The contract").

Guarantees
- ``bad_args(msg)`` prints one line ``error: <msg>`` to stderr and exits 2; call it before any process or
  environment starts.
- ``RunFolder`` creates ``{out_dir}/{run_name}`` (or reopens the folder of a checkpoint being resumed), writes
  ``config.json`` (every argument plus python/torch/gymnasium/ale-py versions), appends rows to
  ``progress.csv`` (first columns ``global_step,wall_time_s,sps,episodes,return_mean``, then whatever the
  script passes to ``row``; ``episodes`` counts every episode finished in the run so far, ``return_mean``
  covers those finished since the previous row and is empty when none did), prints each row as one line and
  mirrors it to TensorBoard under CleanRL's tag names. Logging is additive: a key first passed mid-run becomes
  a new column, the file is rewritten once (atomically) with that column empty in the earlier rows, so the
  CSV always has one header that names every column.
- ``evaluate`` plays whole episodes with the script's act function, logs ``eval/episodic_return`` and writes
  ``eval.json``.
- ``run.guard(state)`` wraps a script's loop: Ctrl-C or SIGTERM writes the checkpoint ``state()`` returns and
  gives exit code 130; a failed sampler (``WorkerError``) gives one ``error:`` line and exit code 1; whatever
  the loop ``hold``s (a sampler process, vector envs) is closed on every path, and the run folder last.
- Checkpoints are written atomically (a temporary file renamed over the old one), so an interruption while
  saving leaves the previous checkpoint intact; they hold tensors and plain Python values only and load with
  ``torch.load(path, weights_only=True)``.
- ``stop_on_signals()`` turns SIGTERM into ``KeyboardInterrupt`` like SIGINT (which it re-enables where a
  background shell left it ignored), so one ``except`` path writes the checkpoint, ends the children and exits
  130.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
import math
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

__all__ = ["EXIT_INTERRUPTED", "RunFolder", "bad_args", "check_env_args", "evaluate", "load_checkpoint", "parse_args",
           "resolve_device", "stop_on_signals"]

EXIT_INTERRUPTED = 130
PROGRESS_COLUMNS = ["global_step", "wall_time_s", "sps", "episodes", "return_mean"]


def bad_args(message: str) -> NoReturn:
    """One readable line and exit code 2 (bad arguments)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def parse_args(cls: type) -> Any:
    """``tyro.cli(cls)``, with a parse error condensed to one line (``error: ...``, exit 2); ``--help`` as usual."""
    import contextlib
    import io

    import tyro

    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(cls)
    except SystemExit as e:
        if e.code in (0, None):
            raise
        # tyro draws a box: its first paragraph (up to a rule or a blank line) is the message, wrapped.
        first: list[str] = []
        for ln in captured.getvalue().splitlines():
            ln = ln.strip().strip("\u2502").strip()
            if ln.startswith("\u256d"):
                continue
            if not ln or ln.startswith(("\u2500", "\u2570")):
                if first:
                    break
                continue
            first.append(ln)
        bad_args(" ".join(first) if first else "could not parse the command line (see --help)")


def resolve_device(spec: str):
    """``auto`` (cuda if available), ``cpu``, ``cuda`` or ``cuda:N``; bad or unavailable devices exit 2."""
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        bad_args(f"--device {spec!r} is not a device (auto, cpu, cuda, cuda:N)")
    if device.type not in ("cpu", "cuda"):
        bad_args(f"--device {spec!r}: only auto, cpu, cuda and cuda:N are supported")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            bad_args(f"--device {spec}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            bad_args(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def stop_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread. SIGINT is set explicitly: a process started
    in the background by a non-interactive shell (``cmd &`` in a script, some CI runners) inherits SIGINT
    ignored, and Python then leaves it ignored, so Ctrl-C or ``kill -INT`` would be lost."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def load_checkpoint(path: str | os.PathLike, env_id: str) -> tuple[dict, Path]:
    """Load ``checkpoint.pt`` (or the one inside a run folder) with ``weights_only=True``; returns (state, file).
    A missing or unreadable file, or one written for another env, is a bad argument."""
    import torch

    p = Path(path)
    if p.is_dir():
        p = p / "checkpoint.pt"
    if not p.is_file():
        bad_args(f"--resume {path}: no checkpoint there")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:
        bad_args(f"--resume {path}: cannot read the checkpoint ({type(e).__name__}: {e})")
    if state["args"]["env_id"] != env_id:
        bad_args(f"--resume: checkpoint is for {state['args']['env_id']}, not {env_id}")
    return state, p


def check_env_args(args: Any) -> None:
    """The checks every script makes of ``--env-id`` and ``--capture-video`` (exit 2, one line)."""
    import gymnasium as gym

    from shared.atari import is_atari, register_atari

    if args.env_id not in gym.registry and is_atari(args.env_id):
        register_atari()
    if args.env_id not in gym.registry:
        bad_args(f"--env-id {args.env_id!r} is not a registered gymnasium environment (a custom env must be "
                 f"registered when the script is imported)")
    entry = str(gym.spec(args.env_id).entry_point or "")
    if not is_atari(args.env_id) and "ale_py" in entry:
        bad_args(f"--env-id {args.env_id}: use the *NoFrameskip-v4 Atari ids, which get the papers' preprocessing")
    if getattr(args, "capture_video", False):
        try:
            import moviepy  # noqa: F401
        except ImportError:
            bad_args("--capture-video needs moviepy (pip install -r requirements.txt)")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "numpy", "gymnasium", "ale_py"):
        try:
            out[name] = __import__(name).__version__
        except Exception:
            pass
    return out


# Scalars that are not losses go under charts/ (CleanRL's tags); everything else under losses/.
CHART_KEYS = {"learning_rate", "epsilon", "updates", "wait_s", "sampler_wait_s"}


class RunFolder:
    """Owns one run folder: config, progress rows, TensorBoard, checkpoints."""

    def __init__(self, args: Any, script: str, folder: Path | None = None, start_step: int = 0):
        from torch.utils.tensorboard import SummaryWriter

        config = dataclasses.asdict(args) if dataclasses.is_dataclass(args) else dict(vars(args))
        if folder is None:
            run_name = config.get("run_name") or f"{config['env_id']}__{script}__{config['seed']}__{int(time.time())}"
            folder = Path(config["out_dir"]) / run_name
        self.path = Path(folder)
        self.path.mkdir(parents=True, exist_ok=True)
        config_file = self.path / "config.json"
        if start_step and config_file.exists():  # resumed: keep the first config, record the new one beside it
            config_file = self.path / f"config.resume-{start_step}.json"
        config_file.write_text(json.dumps({"args": config, "versions": _versions(), "script": script}, indent=2,
                                          default=str))
        self._progress = self.path / "progress.csv"
        self.columns = list(PROGRESS_COLUMNS)
        if self._progress.exists():
            with open(self._progress, newline="") as f:
                self.columns = next(csv.reader(f), None) or self.columns
        else:
            self._progress.write_text(",".join(self.columns) + "\n")
        self._csv_file = open(self._progress, "a", newline="")
        self._csv = csv.writer(self._csv_file)
        self.tb = SummaryWriter(str(self.path))
        self._t0 = time.time()
        self._last_t, self._last_step = self._t0, start_step
        self._returns: list[float] = []  # since the last row
        self._recent: collections.deque[float] = collections.deque(maxlen=100)
        self._last_values: dict[str, Any] = {}
        self.episodes = 0

    def episode(self, ret: float, length: int, global_step: int) -> None:
        """Record one finished episode (its true, unclipped return)."""
        if not math.isfinite(ret):
            raise FloatingPointError(f"episode return is {ret}")
        self._returns.append(float(ret))
        self._recent.append(float(ret))
        self.episodes += 1
        self.tb.add_scalar("charts/episodic_return", ret, global_step)
        self.tb.add_scalar("charts/episodic_length", length, global_step)

    def reached(self, threshold: float | None, n: int, global_step: int) -> bool:
        """True (and says so) once the last ``n`` episodes average at least ``threshold``; never for None."""
        if threshold is None or len(self._recent) < n:
            return False
        mean = float(np.mean(list(self._recent)[-n:]))
        if mean < threshold:
            return False
        print(f"mean return of the last {n} episodes {mean:.1f} >= {threshold} at step {global_step}: stopping",
              flush=True)
        return True

    def row(self, global_step: int, **values: Any) -> dict:
        """Write one progress row (any keys: new ones become columns), its TensorBoard scalars and a console
        line; returns the row."""
        now = time.time()
        sps = (global_step - self._last_step) / max(now - self._last_t, 1e-9)
        self._last_t, self._last_step = now, global_step
        ret_mean = float(np.mean(self._returns)) if self._returns else None
        row = {"global_step": global_step, "wall_time_s": round(now - self._t0, 3), "sps": round(sps, 1),
               "episodes": self.episodes, "return_mean": ret_mean, **values}
        new = [k for k in row if k not in self.columns]
        if new:
            self._add_columns(new)
        self._csv.writerow(["" if row.get(c) is None else row[c] for c in self.columns])
        self._csv_file.flush()
        self.tb.add_scalar("charts/SPS", sps, global_step)
        for k, v in values.items():
            if v is not None:
                self.tb.add_scalar(k if "/" in k else f"{'charts' if k in CHART_KEYS else 'losses'}/{k}", v,
                                   global_step)
        self._returns.clear()
        self._last_values = values
        rm = f"{ret_mean:.1f}" if ret_mean is not None else "-"
        extra = "  ".join(f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, (int, float)))
        print(f"step {global_step:>9}  sps {sps:>6.0f}  return {rm:>7}  episodes {self.episodes:>5}  {extra}",
              flush=True)
        return row

    def finish(self, global_step: int) -> None:
        """A last row at ``global_step`` (with the latest values) unless the last row is already there."""
        if global_step != self._last_step:
            self.row(global_step, **self._last_values)

    def _add_columns(self, new: list[str]) -> None:
        self._csv_file.close()
        with open(self._progress, newline="") as f:
            rows = list(csv.reader(f))[1:]
        self.columns += new
        tmp = self._progress.with_name(f".progress.csv.tmp{os.getpid()}")
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(self.columns)
            writer.writerows(r + [""] * (len(self.columns) - len(r)) for r in rows)
        os.replace(tmp, self._progress)
        self._csv_file = open(self._progress, "a", newline="")
        self._csv = csv.writer(self._csv_file)

    def save_checkpoint(self, state: dict) -> Path:
        """Atomically write ``checkpoint.pt`` (tensors and plain values only)."""
        import torch

        final = self.path / "checkpoint.pt"
        tmp = self.path / f".checkpoint.pt.tmp{os.getpid()}"
        torch.save(state, tmp)
        os.replace(tmp, final)
        return final

    def guard(self, state: Callable[[], dict]) -> Guard:
        """``with run.guard(state) as guard:`` around the loop; ``state()`` gives the checkpoint to write on
        Ctrl-C/SIGTERM (it must hold ``global_step``); the script returns ``guard.exit_code``."""
        return Guard(self, state)

    def close(self) -> None:
        self.tb.close()
        self._csv_file.close()


class Guard:
    """The end of every run, written once: see ``RunFolder.guard``."""

    def __init__(self, run: RunFolder, state: Callable[[], dict]):
        self.run, self.state, self.exit_code = run, state, 0
        self._held: list[Any] = []

    def hold(self, thing: Any) -> Any:
        """Close ``thing`` (a ``procs.Worker`` or a vector env) when the run ends, however it ends."""
        self._held.append(thing)
        return thing

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, kind, error, tb) -> bool:
        from shared.envs import close_envs
        from shared.procs import WorkerError

        try:
            if kind is not None and issubclass(kind, KeyboardInterrupt):
                state = self.state()
                print(f"interrupted at step {state['global_step']}: writing checkpoint", file=sys.stderr, flush=True)
                self.run.finish(int(state["global_step"]))
                self.run.save_checkpoint(state)
                self.exit_code = EXIT_INTERRUPTED
            elif kind is not None and issubclass(kind, WorkerError):
                print(error, file=sys.stderr)
                print("error: the sampler process failed", file=sys.stderr, flush=True)
                self.exit_code = 1
        finally:
            for thing in reversed(self._held):
                if hasattr(thing, "stop"):
                    thing.stop()
                else:
                    close_envs(thing)
            self.run.close()
        return kind is None or self.exit_code != 0


def evaluate(run: RunFolder, env: Any, act: Callable[[Any, float | None], Any], episodes: int, seed: int,
             global_step: int, video: bool = False) -> list[float]:
    """Play ``episodes`` whole episodes in ``env`` (reset with seeds ``seed + 100_000 + i``), the actions from
    ``act(obs, last_reward)`` (``last_reward`` is None on an episode's first step, so a recurrent policy knows to
    start afresh); log each return as ``eval/episodic_return``, write ``eval.json``, close ``env``. With
    ``video`` (``env`` made with ``render_mode="rgb_array"``) the first episode goes to ``{run}/videos``."""
    import gymnasium as gym
    import torch

    if video:
        env = gym.wrappers.RecordVideo(env, str(run.path / "videos"), episode_trigger=lambda i: i == 0,
                                       disable_logger=True)
    returns = []
    with torch.no_grad():
        for ep in range(episodes):
            obs, _ = env.reset(seed=seed + 100_000 + ep)
            done, total, reward = False, 0.0, None
            while not done:
                obs, reward, term, trunc, _ = env.step(act(obs, reward))
                total += float(reward)
                done = term or trunc
            returns.append(total)
            run.tb.add_scalar("eval/episodic_return", total, global_step)
    env.close()
    (run.path / "eval.json").write_text(json.dumps({"returns": returns, "mean": float(np.mean(returns))}))
    print(f"evaluation over {len(returns)} episodes: mean return {np.mean(returns):.1f}", flush=True)
    return returns
