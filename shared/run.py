"""The run folder every script writes, per ../shared/CONVENTIONS.md.

Guarantees
- ``bad_args(msg)`` prints one line ``error: <msg>`` to stderr and exits 2; call it before any process or
  environment starts.
- ``RunFolder`` creates ``{out_dir}/{run_name}`` (or reopens the folder of a checkpoint being resumed), writes
  ``config.json`` (every argument plus python/torch/gymnasium/ale-py versions), appends rows to
  ``progress.csv`` (first columns ``global_step,wall_time_s,sps,episodes,return_mean`` then the script's own;
  ``episodes`` counts every episode finished in the run so far, ``return_mean`` covers those finished since
  the previous row and is empty when none did) and mirrors them to TensorBoard under CleanRL's tag names.
- Checkpoints are written atomically (a temporary file renamed over the old one), so an interruption while
  saving leaves the previous checkpoint intact; they hold tensors and plain Python values only and load with
  ``torch.load(path, weights_only=True)``.
- ``stop_on_signals()`` turns SIGTERM into ``KeyboardInterrupt`` like SIGINT (which it re-enables where a
  background shell left it ignored), so one ``except`` path writes the checkpoint, ends the children and exits
  130.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

__all__ = ["parse_args", "bad_args", "resolve_device", "RunFolder", "load_checkpoint", "stop_on_signals", "EXIT_INTERRUPTED"]

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
        lines = [ln.strip().strip("\u2502").strip() for ln in captured.getvalue().splitlines()]
        body = [ln for ln in lines if ln and not ln.startswith(("\u256d", "\u2570", "\u2500"))]
        bad_args(body[0] if body else "could not parse the command line (see --help)")


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


def load_checkpoint(path: str | os.PathLike) -> tuple[dict, Path]:
    """Load ``checkpoint.pt`` (or the one inside a run folder) with ``weights_only=True``; returns (state, file)."""
    import torch

    p = Path(path)
    if p.is_dir():
        p = p / "checkpoint.pt"
    if not p.is_file():
        bad_args(f"--resume {path}: no checkpoint there")
    try:
        return torch.load(p, map_location="cpu", weights_only=True), p
    except Exception as e:  # noqa: BLE001 - any unreadable file is a bad argument
        bad_args(f"--resume {path}: cannot read the checkpoint ({type(e).__name__}: {e})")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "numpy", "gymnasium", "ale_py"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing package is simply not listed
            pass
    return out


class RunFolder:
    """Owns one run folder: config, progress rows, TensorBoard, checkpoints."""

    def __init__(self, args: Any, script: str, extra_columns: list[str], folder: Path | None = None,
                 start_step: int = 0):
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
        self.columns = PROGRESS_COLUMNS + list(extra_columns)
        progress = self.path / "progress.csv"
        new = not progress.exists()
        self._csv_file = open(progress, "a", newline="")
        self._csv = csv.writer(self._csv_file)
        if new:
            self._csv.writerow(self.columns)
            self._csv_file.flush()
        self.tb = SummaryWriter(str(self.path))
        self._t0 = time.time()
        self._last_t, self._last_step = self._t0, start_step
        self._returns: list[float] = []
        self.episodes = 0

    def episode(self, ret: float, length: int, global_step: int) -> None:
        """Record one finished episode (its true, unclipped return)."""
        if not math.isfinite(ret):
            raise FloatingPointError(f"episode return is {ret}")
        self._returns.append(float(ret))
        self.episodes += 1
        self.tb.add_scalar("charts/episodic_return", ret, global_step)
        self.tb.add_scalar("charts/episodic_length", length, global_step)

    def row(self, global_step: int, **values: float) -> dict:
        """Write one progress row and its TensorBoard scalars; returns the row."""
        now = time.time()
        sps = (global_step - self._last_step) / max(now - self._last_t, 1e-9)
        self._last_t, self._last_step = now, global_step
        ret_mean = float(np.mean(self._returns)) if self._returns else None
        row = {"global_step": global_step, "wall_time_s": round(now - self._t0, 3), "sps": round(sps, 1),
               "episodes": self.episodes, "return_mean": ret_mean}
        unknown = set(values) - set(self.columns)
        if unknown:
            raise KeyError(f"progress values {sorted(unknown)} are not columns of this run")
        row.update(values)
        self._csv.writerow(["" if row.get(c) is None else row[c] for c in self.columns])
        self._csv_file.flush()
        self.tb.add_scalar("charts/SPS", sps, global_step)
        for k, v in values.items():
            if v is not None:
                self.tb.add_scalar(k if "/" in k else f"losses/{k}", v, global_step)
        self._returns.clear()
        return row

    def save_checkpoint(self, state: dict) -> Path:
        """Atomically write ``checkpoint.pt`` (tensors and plain values only)."""
        import torch

        final = self.path / "checkpoint.pt"
        tmp = self.path / f".checkpoint.pt.tmp{os.getpid()}"
        torch.save(state, tmp)
        os.replace(tmp, final)
        return final

    def close(self) -> None:
        self.tb.close()
        self._csv_file.close()
