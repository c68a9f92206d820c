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
  gives exit code 130; a failed or killed sampler process or env worker writes the learner's checkpoint, then
  one ``error:`` line and exit code 1; a file that cannot be written (``WriteError``: disk full) gives one
  ``error:`` line and exit code 1, any other error its traceback and a last ``error:`` line
  naming it, exit code 1; whatever the loop ``hold``s (a sampler process, vector
  envs) is closed on every path, and the run folder last.
- Every file is written through a temporary file renamed over it: a full disk leaves the previous checkpoint,
  progress.csv or eval.json intact and no temporary file behind.
- Resuming: rows of ``progress.csv`` and TensorBoard events past the checkpoint's step (written by a run killed
  after its last checkpoint) are superseded, and ``episodes`` and ``wall_time_s`` continue from the values the
  checkpoint stored.
- Checkpoints are written atomically (a temporary file renamed over the old one), so an interruption while
  saving leaves the previous checkpoint intact; they hold tensors and plain Python values only and load with
  ``torch.load(path, weights_only=True)``.
- In a torchrun job (``shared/distributed.py``) rank 0 alone writes the run folder; the others keep the same
  counters, so every rank agrees on ``should_stop``; ``row`` gathers every rank's episodes and averages the
  values that differ between ranks (losses), and checks that the ranks' parameters are still identical.
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
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from shared import distributed
from shared.envs import close_envs
from shared.procs import WorkerError
from shared.signals import raise_on_signals

__all__ = ["EXIT_INTERRUPTED", "RunFolder", "WriteError", "bad_args", "check_run_args", "evaluate", "evaluate_only",
           "load_checkpoint",
           "parse_args", "resolve_device", "resume_mismatch", "stop_on_signals"]

EXIT_INTERRUPTED = 130
PROGRESS_COLUMNS = ["global_step", "wall_time_s", "sps", "episodes", "return_mean"]


def bad_args(message: str) -> NoReturn:
    """One readable line and exit code 2 (bad arguments)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def parse_args(cls: type, presets: dict[str, Any] | None = None) -> Any:
    """``tyro.cli(cls)``, with a parse error condensed to one line (``error: ...``, exit 2); ``--help`` as usual.
    ``presets``: named instances of ``cls``; ``--preset NAME`` (a field of ``cls``) makes NAME's values the
    defaults, so every other flag given overrides them and ``--help`` shows them; without it, the first."""
    import contextlib
    import io

    import tyro

    default = None
    if presets:
        argv, name = sys.argv[1:], next(iter(presets))
        for i, a in enumerate(argv):
            if a == "--preset" and i + 1 < len(argv):
                name = argv[i + 1]
            elif a.startswith("--preset="):
                name = a.split("=", 1)[1]
        default = presets.get(name)  # an unknown name: tyro names the choices below
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(cls, default=default)
    except SystemExit as e:
        if e.code in (0, None):
            raise
        # tyro draws a box (a terminal) or a title and dashed rules (no terminal): the message is the first
        # paragraph after the title, up to a rule or a blank line, wrapped.
        lines = [ln.strip().strip("\u2502").strip() for ln in captured.getvalue().splitlines()]
        rule = lambda ln: ln.startswith(("\u256d", "\u2570", "\u2500")) or (len(ln) > 8 and set(ln) == {"-"})
        if any(set(ln) == {"-"} for ln in lines):  # plain text: skip the title, up to the first rule
            lines = lines[next(i for i, ln in enumerate(lines) if rule(ln)):]
        first: list[str] = []
        for ln in lines:
            if not ln or rule(ln):
                if first:
                    break
                continue
            first.append(ln)
        bad_args(" ".join(first) if first else "could not parse the command line (see --help)")


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX); elsewhere torch emulates it, ~10x slower."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(spec: str, bf16: bool = False):
    """``auto`` (cuda if available), ``cpu``, ``cuda`` or ``cuda:N``; bad or unavailable devices exit 2. With
    ``bf16`` on a CPU without native bfloat16, one warning line (the run goes on: the numerics are the same)."""
    import torch

    try:
        device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if spec == "auto" else spec)
        if device.type == "cuda" and device.index is None and distributed.world_size() > 1:
            device = torch.device("cuda", distributed.local_rank())  # torchrun: one GPU per local rank
    except RuntimeError:
        bad_args(f"--device {spec!r} is not a device (auto, cpu, cuda, cuda:N)")
    if device.type not in ("cpu", "cuda"):
        bad_args(f"--device {spec!r}: only auto, cpu, cuda and cuda:N are supported")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            bad_args(f"--device {spec}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            bad_args(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here")
    if bf16 and device.type == "cpu" and not cpu_has_bf16():
        print("warning: --bf16 on a CPU without native bfloat16 (AVX512-BF16 or AMX): expect about 10x slower than "
              "fp32", file=sys.stderr, flush=True)
    return device


def stop_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread (``shared.signals``)."""
    raise_on_signals()


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


def check_run_args(args: Any) -> None:
    """The checks every script makes (exit 2, one line): every number finite, and ``--env-id``, ``--out-dir`` and
    ``--capture-video`` usable."""
    import gymnasium as gym

    from shared.atari import is_atari, register_atari

    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            bad_args(f"--{name.replace('_', '-')} must be a finite number, got {value}")
    if getattr(args, "eval_every", 0) < 0:
        bad_args(f"--eval-every must be non-negative, got {args.eval_every}")
    if getattr(args, "eval_only", False) and not args.resume:
        bad_args("--eval-only evaluates a checkpoint: give the run with --resume runs/<run>")
    if (getattr(args, "eval_only", False) or getattr(args, "eval_every", 0)) and args.eval_episodes <= 0:
        bad_args("--eval-only and --eval-every need --eval-episodes of at least 1")
    if not 0 <= args.seed < 2**31:  # numpy seeds are below 2**32, and the scripts add offsets to this one
        bad_args(f"--seed must be in [0, 2**31), got {args.seed}")

    if not args.resume:
        try:
            Path(args.out_dir).mkdir(parents=True, exist_ok=True)
            probe = Path(args.out_dir) / f".write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as e:
            bad_args(f"--out-dir {args.out_dir}: cannot create a run folder there ({e.strerror or e})")

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


# Flags that change nothing the checkpoint holds: left out when naming the flags a mismatch may come from.
RUN_FLAGS = {"preset", "resume", "out_dir", "run_name", "total_timesteps", "checkpoint_every", "log_every",
             "eval_episodes", "eval_epsilon", "capture_video", "stop_at_return", "sampler", "device", "seed",
             "max_lag_steps", "eval_every", "eval_only", "save_replay"}


def resume_mismatch(resumed: dict, args: Any, script: str, error: Exception) -> NoReturn:
    """Exit 2 with one line when a checkpoint's tensors do not fit the networks built from ``args``: naming the
    script that wrote it when it is another, else the flags that differ from the checkpoint's."""
    theirs = resumed.get("script", "an older version of a script")
    if theirs != script and set(resumed["args"]) != set(vars(args)):
        bad_args(f"--resume: the checkpoint was written by {theirs}, not {script}")
    changed = [f"--{k.replace('_', '-')} ({v!r} there, {vars(args)[k]!r} here)" for k, v in resumed["args"].items()
               if k in vars(args) and k not in RUN_FLAGS and vars(args)[k] != v]
    reason = str(error).strip().splitlines()[0][:160]
    bad_args(f"--resume: the checkpoint (written by {theirs}) does not fit the networks these flags build; flags that "
             f"differ from its: {', '.join(changed) or 'none'} ({type(error).__name__}: {reason})")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "numpy", "gymnasium", "ale_py"):
        try:
            out[name] = __import__(name).__version__
        except Exception:
            pass
    return out


class WriteError(RuntimeError):
    """A file of the run folder could not be written (disk full, permissions); the message names it."""


def _reason(error: Exception, folder: Path) -> str:
    if isinstance(error, OSError) and error.errno is not None:
        return os.strerror(error.errno)
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if free is not None and free < 64 << 20:
        return f"no space left on the device ({free:,} bytes free)"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


# Scalars that are not losses go under charts/ (CleanRL's tags); everything else under losses/.
CHART_KEYS = {"learning_rate", "epsilon", "updates", "wait_s", "sampler_wait_s", "eval_return"}


class RunFolder:
    """Owns one run folder: config, progress rows, TensorBoard, checkpoints."""

    def __init__(self, args: Any, script: str, folder: Path | None = None, resumed: dict | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.script = script
        self.writes = distributed.is_main()  # in a torchrun job rank 0 alone writes the run folder
        start_step = int(resumed["global_step"]) if resumed is not None else 0
        counters = (resumed or {}).get("run", {})

        config = dataclasses.asdict(args) if dataclasses.is_dataclass(args) else dict(vars(args))
        if folder is None:
            run_name = config.get("run_name") or f"{config['env_id']}__{script}__{config['seed']}__{int(time.time())}"
            folder = Path(config["out_dir"]) / run_name
        self.path = Path(folder)
        self._t0 = time.time() - float(counters.get("wall_time_s", 0.0))  # cumulative over resumes
        self._last_t, self._last_step = time.time(), start_step
        self._returns: list[float] = []  # since the last row
        self._recent: collections.deque[float] = collections.deque(maxlen=100)
        self._pending: list[tuple[float, int, int]] = []  # torchrun job: this rank's episodes since the last row
        self._last_values: dict[str, Any] = {}
        self.episodes = int(counters.get("episodes", 0))
        self.eval_return: float | None = None  # the mean of the last evaluation, for the next row
        self._replay: Any = None  # --save-replay: the buffer each checkpoint also writes
        self.columns = list(PROGRESS_COLUMNS)
        if not self.writes:
            self.tb: Any = _NoWriter()
            return
        self.path.mkdir(parents=True, exist_ok=True)
        evaluating = bool(config.get("eval_only"))  # --eval-only: the folder's records stay as they are
        config_file = self.path / "config.json"
        if start_step and config_file.exists():  # resumed: keep the first config, record the new one beside it
            config_file = self.path / f"config.resume-{start_step}.json"
        if not evaluating:
            config_file.write_text(json.dumps({"args": config, "versions": _versions(), "script": script},
                                              indent=2, default=str))
        self._progress = self.path / "progress.csv"
        if self._progress.exists() and evaluating:
            with open(self._progress, newline="") as f:
                self.columns = next(csv.reader(f), self.columns)
        elif self._progress.exists():
            with open(self._progress, newline="") as f:
                lines = list(csv.reader(f))
            self.columns = lines[0] if lines else self.columns
            # A run killed after its last checkpoint logged past it: those rows are superseded by the resumed run.
            kept = [r for r in lines[1:] if r and int(r[0]) <= start_step]
            if resumed is not None and len(kept) < len(lines) - 1:
                self._rewrite(kept)
        else:
            self._write_file(self._progress, lambda f: f.write(",".join(self.columns) + "\n"))
        self._open_csv()
        # purge_step: TensorBoard drops the events past the checkpoint that an earlier process wrote.
        self.tb = SummaryWriter(str(self.path), purge_step=start_step + 1 if resumed is not None and not evaluating
                                else None)

    def episode(self, ret: float, length: int, global_step: int) -> None:
        """Record one finished episode (its true, unclipped return)."""
        if not math.isfinite(ret):
            raise FloatingPointError(f"episode return is {ret}")
        if distributed.in_lockstep():  # every rank's episodes are counted together at the next row
            self._pending.append((float(ret), int(length), int(global_step)))
            return
        self._returns.append(float(ret))
        self._recent.append(float(ret))
        self.episodes += 1
        self.tb.add_scalar("charts/episodic_return", ret, global_step)
        self.tb.add_scalar("charts/episodic_length", length, global_step)

    def should_stop(self, threshold: float | None, n: int, global_step: int) -> bool:
        """True (and says so) once the last ``n`` episodes average at least ``threshold`` (never for None).
        In a torchrun job every rank calls it every iteration: it is where the ranks agree to stop together,
        raising KeyboardInterrupt on every rank when any got Ctrl-C or SIGTERM (episodes of every rank reach
        the mean at each progress row, so every rank decides the same)."""
        reached = threshold is not None and len(self._recent) >= n
        mean = float(np.mean(list(self._recent)[-n:])) if reached else 0.0
        reached = distributed.any_rank(reached and mean >= threshold)
        if distributed.stop_requested():
            distributed.clear_stop()
            raise KeyboardInterrupt("signal")
        if reached:
            print(f"mean return of the last {n} episodes {mean:.1f} >= {threshold} at step {global_step}: "
                  f"stopping", flush=True)
        return reached

    def row(self, global_step: int, **values: Any) -> dict:
        """Write one progress row (any keys: new ones become columns), its TensorBoard scalars and a console
        line; returns the row."""
        if self.eval_return is not None:  # an evaluation since the last row
            values, self.eval_return = {**values, "eval_return": self.eval_return}, None
        if distributed.in_lockstep():
            self._merge_ranks(values)
            distributed.check_in_sync()
        now = time.time()
        sps = (global_step - self._last_step) / max(now - self._last_t, 1e-9)
        self._last_t, self._last_step = now, global_step
        ret_mean = float(np.mean(self._returns)) if self._returns else None
        row = {"global_step": global_step, "wall_time_s": round(now - self._t0, 3), "sps": round(sps, 1),
               "episodes": self.episodes, "return_mean": ret_mean, **values}
        new = [k for k in row if k not in self.columns]
        if new and self.writes:
            self._add_columns(new)
        self.columns += [k for k in new if k not in self.columns]
        try:
            if self.writes:
                self._csv.writerow(["" if row.get(c) is None else row[c] for c in self.columns])
                self._csv_file.flush()
        except OSError as e:
            raise WriteError(f"cannot write {self._progress}: {_reason(e, self.path)}") from e
        self.tb.add_scalar("charts/SPS", sps, global_step)
        for k, v in values.items():
            if v is not None:
                self.tb.add_scalar(k if "/" in k else f"{'charts' if k in CHART_KEYS else 'losses'}/{k}", v,
                                   global_step)
        self._returns.clear()
        self._last_values = {k: v for k, v in values.items() if k != "eval_return"}
        rm = f"{ret_mean:.1f}" if ret_mean is not None else "-"
        extra = "  ".join(f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, (int, float)))
        print(f"step {global_step:>9}  sps {sps:>6.0f}  return {rm:>7}  episodes {self.episodes:>5}  {extra}",
              flush=True)
        return row

    def finish(self, global_step: int) -> None:
        """A last row at ``global_step`` (with the latest values) unless the last row is already there; in a
        torchrun job this ends the collectives (``distributed.end``), so rank 0 alone may go on to evaluate."""
        if global_step != self._last_step:
            self.row(global_step, **self._last_values)
        distributed.end()

    def _merge_ranks(self, values: dict[str, Any]) -> None:
        """torchrun job: every rank's episodes since the last row join the row (rank 0 logs each to
        TensorBoard), and each value becomes its mean over ranks (a value equal on every rank stays as is)."""
        every = distributed.gather_objects((self._pending, values))
        self._pending = []
        for episodes, _ in every:
            for ret, length, step in episodes:
                self._returns.append(ret)
                self._recent.append(ret)
                self.episodes += 1
                self.tb.add_scalar("charts/episodic_return", ret, step)
                self.tb.add_scalar("charts/episodic_length", length, step)
        for k, v in values.items():
            theirs = [vals.get(k) for _, vals in every]
            if isinstance(v, (int, float)) and all(isinstance(t, (int, float)) for t in theirs) and \
                    any(t != v for t in theirs):
                values[k] = float(np.mean(theirs))

    def _add_columns(self, new: list[str]) -> None:
        self._csv_file.close()
        with open(self._progress, newline="") as f:
            rows = list(csv.reader(f))[1:]
        self.columns += new
        self._rewrite(rows)
        self._open_csv()

    def _rewrite(self, rows: list[list[str]]) -> None:
        """Replace progress.csv atomically with the header and ``rows`` (padded to every column)."""

        def write(f) -> None:
            writer = csv.writer(f)
            writer.writerow(self.columns)
            writer.writerows(r + [""] * (len(self.columns) - len(r)) for r in rows)

        self._write_file(self._progress, write)

    def _open_csv(self) -> None:
        self._csv_file = open(self._progress, "a", newline="")  # open for the run's lifetime
        self._csv = csv.writer(self._csv_file)

    def _write_file(self, final: Path, content: Any) -> None:
        """Write ``final`` through a temporary file renamed over it: an interruption or a full disk leaves the
        previous version intact and no temporary file behind; a failure raises ``WriteError`` naming the file.
        ``content`` is a state dict for a ``.pt`` file, a replay buffer for ``.npz``, else a function that
        writes to the open text file.
        Only rank 0 of a torchrun job writes."""
        if not self.writes:
            return
        tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
        try:
            if final.suffix == ".pt":
                import torch

                torch.save(content, tmp)
            elif final.suffix == ".npz":  # a replay buffer
                content.save(tmp)
            else:
                with open(tmp, "w", newline="") as f:
                    content(f)
            os.replace(tmp, final)
        except (OSError, RuntimeError) as e:  # torch reports a full disk as a RuntimeError ("unexpected pos")
            tmp.unlink(missing_ok=True)
            raise WriteError(f"cannot write {final}: {_reason(e, self.path)}") from e

    def save_checkpoint(self, state: dict) -> Path:
        """Atomically write ``checkpoint.pt`` (tensors and plain values only), with the run's counters (episodes,
        wall time) and the script's name, so a resumed run continues them."""
        final = self.path / "checkpoint.pt"
        state = {**state, "script": self.script,
                 "run": {"episodes": self.episodes, "wall_time_s": round(time.time() - self._t0, 3)}}
        if self._replay is not None:  # first the replay, then the checkpoint that names its cursor
            self._write_file(self.path / "replay.npz", self._replay)
            state["replay_cursor"] = self._replay.storage.cursor
        self._write_file(final, state)
        return final

    def keep_replay(self, buffer: Any, save: bool, resumed: dict | None) -> bool:
        """``--save-replay``: every checkpoint also writes ``buffer`` to ``replay.npz`` (plain arrays, atomically,
        before ``checkpoint.pt``). Resuming, the replay saved with the checkpoint is restored, its episodes
        ended as a time limit ends them (the envs start afresh), and True is returned; a missing replay, or one
        that is not the checkpoint's (killed between the two writes), gives one warning and an empty replay."""
        if not save:
            return False
        self._replay = buffer
        if resumed is None:
            return False
        saved = self.path / "replay.npz"
        if not saved.is_file() or "replay_cursor" not in resumed:
            print(f"warning: --save-replay: no replay saved with the checkpoint in {self.path}: starting with an "
                  f"empty replay", file=sys.stderr, flush=True)
            return False
        try:
            with np.load(saved, allow_pickle=False) as f:
                rows = int(f["state"][0])  # the cursor
            if rows != int(resumed["replay_cursor"]):
                print(f"warning: --save-replay: {saved} is not the checkpoint's (rows {rows}, the checkpoint's "
                      f"{resumed['replay_cursor']}): starting with an empty replay", file=sys.stderr, flush=True)
                return False
            buffer.load(saved)
        except (ValueError, OSError, KeyError) as e:
            bad_args(f"--save-replay: cannot restore {saved}: {e}")
        buffer.end_episodes()
        print(f"restored the replay: {len(buffer)} samples", flush=True)
        return True

    def guard(self, state: Callable[[], dict]) -> Guard:
        """``with run.guard(state) as guard:`` around the loop; ``state()`` gives the checkpoint to write on
        Ctrl-C/SIGTERM (it must hold ``global_step``); the script returns ``guard.exit_code``."""
        return Guard(self, state)

    def close(self) -> None:
        self.tb.close()
        if self.writes:
            self._csv_file.close()


class _NoWriter:
    """TensorBoard on ranks that do not write the run folder."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


# A failure of the sampling side that the learner survives (a sampler process, or an env worker of gymnasium's
# AsyncVectorEnv, failed or was killed): the learner's checkpoint is written before the run ends.
SAMPLER_FAILURES = (WorkerError, EOFError, BrokenPipeError, ConnectionResetError)


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
        try:
            if kind is not None and issubclass(kind, KeyboardInterrupt):
                state = self.state()
                if self.run.writes:
                    print(f"interrupted at step {state['global_step']}: writing checkpoint", file=sys.stderr,
                          flush=True)
                try:
                    self.run.finish(int(state["global_step"]))
                except KeyboardInterrupt:  # a second signal while the last row was written: checkpoint anyway
                    pass
                self.run.save_checkpoint(state)
                self.exit_code = EXIT_INTERRUPTED
            elif kind is not None and issubclass(kind, SAMPLER_FAILURES):
                print(error, file=sys.stderr)
                state = self.state()  # the learner is intact: keep what it learned
                self.run.save_checkpoint(state)
                print(f"error: the sampler process failed ({kind.__name__}); the learner's checkpoint at step "
                      f"{state['global_step']} is written", file=sys.stderr, flush=True)
                self.exit_code = 1
            elif kind is not None and distributed.lost_peer(error):
                print(f"error: rank {distributed.rank()} lost contact with another rank, which failed, was killed or "
                      f"hung ({str(error).splitlines()[0][:200]})", file=sys.stderr, flush=True)
                self.exit_code = 1
            elif kind is not None and issubclass(kind, WriteError):
                print(f"error: {error}", file=sys.stderr, flush=True)
                self.exit_code = 1
            elif kind is not None and issubclass(kind, Exception):  # e.g. a loss gone to infinity
                traceback.print_exception(kind, error, tb)
                print(f"error: {kind.__name__}: {error}", file=sys.stderr, flush=True)
                self.exit_code = 1
        except WriteError as e:  # the checkpoint of an interrupted run could not be written
            print(f"error: {e}", file=sys.stderr, flush=True)
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
    start afresh); log each return as ``eval/episodic_return``, the mean as ``eval_return`` in the next progress
    row, write ``eval.json`` (with the step), close ``env``. With ``video`` (``env`` made with
    ``render_mode="rgb_array"``) the first episode goes to ``{run}/videos``.

    Training is not changed by an evaluation: torch's random state is restored afterwards and the env is the
    evaluation's own. In a torchrun job that is still in lockstep, rank r plays episodes r, r + ranks, ...
    and rank 0 logs them all; after the loop (``run.finish``) rank 0 plays them alone."""
    import gymnasium as gym
    import torch

    if not distributed.in_lockstep() and not run.writes:
        env.close()
        return []
    mine = range(distributed.rank(), episodes, distributed.world_size()) if distributed.in_lockstep() else \
        range(episodes)
    if video and run.writes:
        env = gym.wrappers.RecordVideo(env, str(run.path / "videos"), episode_trigger=lambda i: i == 0,
                                       disable_logger=True)
    played = []
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.no_grad(), torch.random.fork_rng(devices=cuda):
        for ep in mine:
            obs, _ = env.reset(seed=seed + 100_000 + ep)
            done, total, reward = False, 0.0, None
            while not done:
                obs, reward, term, trunc, _ = env.step(act(obs, reward))
                total += float(reward)
                done = term or trunc
            played.append((ep, total))
    env.close()
    # The ranks' episodes take different times: gathered with a timeout for slow work, not the collectives' one.
    returns = [r for _, r in sorted(sum(distributed.gather_objects(played, slow=True), []))]
    for r in returns:
        run.tb.add_scalar("eval/episodic_return", r, global_step)
    summary = {"global_step": global_step, "returns": returns, "mean": float(np.mean(returns))}
    run._write_file(run.path / "eval.json", lambda f: json.dump(summary, f))
    run.eval_return = summary["mean"]
    print(f"evaluation over {len(returns)} episodes at step {global_step}: mean return {summary['mean']:.1f}",
          flush=True)
    return returns


def evaluate_only(run: RunFolder, env: Any, act: Callable[[Any, float | None], Any], args: Any,
                  global_step: int) -> int:
    """``--resume RUN --eval-only``: evaluate the checkpoint's policy (``--eval-episodes``, ``--capture-video``)
    into the run folder, train nothing; returns the exit code (130 on Ctrl-C)."""
    try:
        evaluate(run, env, act, args.eval_episodes, args.seed, global_step, video=args.capture_video)
        distributed.end()
        return 0
    except KeyboardInterrupt:
        print("interrupted: evaluation stopped", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        run.close()
