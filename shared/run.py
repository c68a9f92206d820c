"""One training run from start to end: everything a script does that is not its algorithm.

A script's ``main`` makes these calls, in this order (``docs/contract.md`` has the whole contract)::

    args = parse_args(Args, PRESETS, check_args)              # shared.cli: flags, presets, checks (exit 2)
    run = Run(args, __file__, make_env, action_space=Discrete)  # checks: device, --resume, spaces (exit 2)
    run.setup()                                               # TF32, signals, torchrun, cores, seeds
    with run.allocating("buffer_size", "hidden"):             # what this machine cannot hold: exit 2
        ...networks, optimizers and the replay, built as the algorithm needs...
    start = run.begin(policy, model=net, optimizer=opt)       # restore or start, the run folder
    if args.eval_only or args.export:                         # with --resume: train nothing
        return run.evaluate_or_export(policy_module, ["action", ...])
    with run:                                                 # Ctrl-C, SIGTERM, failures: see below
        envs = run.hold(make_envs(...))
        for ...:                                              # the algorithm's loop
            ...sample, learn...
            if run.periodic(global_step, loss=loss):         # rows, evaluation, checkpoints; True: stop
                break
        run.finish(global_step)                               # last row, checkpoint, final evaluation
    return run.exit_code

Guarantees
- ``Run(...)`` only checks (``shared.run_checks``; before anything starts, a problem exits 2 with one line):
  resolves ``--device``, reads the ``--resume`` checkpoint, probes one env for its spaces and checks the action
  space (and refuses a ``Dict`` observation space unless the script takes one: ``dict_obs=True``), refuses an
  on-policy rollout (``iteration_steps``: ``--num-envs`` x ``--num-steps``) whose observations alone exceed the
  memory left. It creates nothing on disk and changes no global state. With ``RL_CHECK_ONLY`` set in the
  environment, ``begin`` exits 0 before it starts anything, every earlier check made (these, the script's own in
  building its networks, ``allocating``'s sizes): how ``experiments/`` checks the flags it will pass.
- ``run.setup()`` is the one call that changes this process's global state: TF32 and cuDNN's benchmark on a GPU
  (``shared.precision.gpu_defaults``, which an async sampler acting there sets too), SIGINT/SIGTERM
  raise ``KeyboardInterrupt``, the torchrun job joined (``shared.distributed``), this process pinned to its
  cores (``shared.affinity``: ``run.affinity`` has the sampler's), numpy and torch seeded with ``--seed``.
  ``allocating`` and ``begin`` refuse to run before it.
- ``with run.allocating(*flags):`` around the networks and the replay: a size this machine cannot hold (a
  replay larger than the memory left, checked before it is allocated: ``shared.buffer``; a tensor numpy or
  torch refuses; CUDA out of memory) exits 2 with one line naming ``flags`` with their values and the figures,
  and any exit 2 in the block (observations a network cannot take) first leaves the torchrun job.
- ``begin(policy, replay=None, **objects)``: starts W&B (``--track``; one that cannot start exits 2); on
  ``--resume`` each named object (modules, optimizers, generators, tensors, anything with
  ``state_dict``; one given as None is left out: a part only some flags build) is loaded from the checkpoint
  (exit 2 if it does not fit), and with ``--save-replay`` the replay too; every rank gets rank 0's parameters
  and then a random stream of its own; the run folder is created (``config.json``, ``progress.csv``,
  TensorBoard: ``shared.progress``; a resumed run's ``config.resume-N.json`` says under ``resumed`` whether its
  flags came from the run folder and which were changed). One line says what the command does (the steps it
  trains, or the checkpoint it evaluates or exports), and for a resumed run one more the changed flags. Returns
  the ``Start``.
- ``periodic(global_step, **values)``, once per loop iteration: an evaluation every ``--eval-every`` steps (its
  mean goes into the next row as ``eval_return``), a progress row every ``--log-every`` steps (rollouts for an
  on-policy script, which gives ``iteration_steps``), a checkpoint every ``--checkpoint-every`` steps and every
  ``--checkpoint-minutes`` of wall time; it returns True when the loop should stop: the mean return of the last
  ``stop_window`` episodes reached ``--stop-at-return``, or the job's ranks agreed to stop for a signal (then
  ``finish`` writes the last row and the checkpoint and sets exit code 130, as Ctrl-C does). It never raises for
  a signal. ``values`` are the row's columns (numbers, 0-d tensors or lists of
  them, averaged; read only when a row or a checkpoint is written, so a GPU never waits for them in the loop;
  one that is not finite there ends the run with ``FloatingPointError`` and no checkpoint is written over the
  last good one); ``updates``, when given, is also the count the checkpoint keeps. In a torchrun job
  every rank calls it every iteration: it is where the ranks agree to stop together, for a threshold or for a
  signal any rank got, at the same iteration: the first whose ``global_step`` is ``AGREE_EVERY_STEPS`` (256) or more
  past the last agreement, or the ``AGREE_EVERY_ITERATIONS``-th (64) since (every iteration of the PPO family, whose
  rollouts are longer; every 256 job env steps or 64 iterations of an off-policy loop, which iterates once per env
  step, or waits for its async samplers).
- ``with run:`` ends the run cleanly however it ends: Ctrl-C or SIGTERM writes a last row and the checkpoint,
  exit code 130; a sampler process or env worker that failed or was killed writes the learner's checkpoint,
  then one ``error:`` line and exit code 1 (a sampler killed while holding the shared replay's lock, as a
  SIGTERM to the whole job can do: the checkpoint without the replay, one warning line); a lost torchrun peer,
  a file that cannot be written (disk full) or any other error (with its traceback) gives a last ``error:``
  line and exit code 1. Whatever was ``hold``-en (a sampler process, vector envs) is closed on every path, then
  the run folder, then the process group.
- ``evaluate_or_export(policy, outputs, rows, **inputs)``, the commands that train nothing: ``--eval-only`` plays
  the evaluation into the run folder (``shared.evaluation.evaluate_run``), ``--export FILE`` writes the policy
  as ONNX (``shared.export.export_run``). Exit code 0, 1 (an export that failed: one ``error:`` line) or 130 on
  Ctrl-C; the run folder, W&B and the process group are closed on every path.
- The checkpoint (``checkpoint.pt``, ``shared.checkpoint``) holds every object given to ``begin`` by its name,
  ``global_step``, ``updates``, the arguments, the script's name and the run's counters; it is written
  atomically, tensors on the CPU, and with ``--save-replay`` after the replay it names. One once started is
  finished: a Ctrl-C or SIGTERM during it (the replay's write can take minutes) raises after it, and the way
  out does not write the same state (step and updates) again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shared import checkpoint, compiling, distributed, signals, tracking
from shared.affinity import make_affinity
from shared.buffer import unchecked
from shared.checkpoint import Start
from shared.cli import bad_args
from shared.envs import close_envs
from shared.evaluation import check_act, evaluate_run
from shared.export import ExportError, export_run
from shared.files import WriteError, write_text
from shared.precision import gpu_defaults, sampler_bf16
from shared.procs import Worker, WorkerError, sampler_entry
from shared.progress import ProgressLog, scalars
from shared.run_checks import allocation_refusal, check_run

__all__ = ["EXIT_INTERRUPTED", "Run"]

EXIT_INTERRUPTED = 130
# In a torchrun job the ranks agree on stopping (a threshold, a signal) once this many of the job's env steps, or
# of iterations, have passed since they last did, not at every iteration: an off-policy loop's iteration is one env
# step per env, and an all-reduce at each one cost it about 0.5 ms on gloo (2 cores) and held every rank to the
# slowest at every step. The iterations bound the wait where steps stall (an async sampler still starting).
AGREE_EVERY_STEPS = 256
AGREE_EVERY_ITERATIONS = 64
# A failure of the sampling side the learner survives: its checkpoint is written before the run ends.
SAMPLER_FAILURES = (WorkerError, EOFError, BrokenPipeError, ConnectionResetError)


def sampler_device(learner: Any) -> Any:
    """Where an async sampler process acts: on the learner's GPU where it has one (as serial mode acts), else on the
    CPU."""
    import torch

    return learner if learner.type == "cuda" else torch.device("cpu")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "numpy", "gymnasium", "ale_py"):
        try:
            out[name] = __import__(name).__version__
        except Exception:
            pass
    return out


def _hardware(device: Any) -> dict[str, Any]:
    """What the numbers of a run depend on beyond the versions: the resolved device and, on a GPU, its name, CUDA
    and cuDNN versions and whether float32 matmuls and convolutions may use TF32."""
    import torch

    out: dict[str, Any] = {"device": str(device), "cpu": platform.processor() or platform.machine()}
    if device.type == "cuda":
        out.update(
            gpu=torch.cuda.get_device_name(device),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            tf32_conv=torch.backends.cudnn.allow_tf32,
            cudnn_benchmark=torch.backends.cudnn.benchmark,
        )
    return out


def _config(args: Any, device: Any, script: str) -> dict[str, Any]:
    """What config.json records of a run: its flags, the versions and hardware its numbers depend on, its script."""
    return {"args": dataclasses.asdict(args), "versions": _versions(), "hardware": _hardware(device), "script": script}


def _check_finite(row: dict[str, Any], values: dict[str, Any], step: int) -> None:
    """A statistic of the loop that is not finite (a loss gone to NaN or infinity) ends the run with
    ``FloatingPointError``, before any further checkpoint: the parameters it came from are lost, the last
    checkpoint is kept. Statistics stay on the device between rows, so this is where they are read."""
    for k in values:
        v = row.get(k)
        if isinstance(v, float) and not math.isfinite(v):
            raise FloatingPointError(f"{k} is {v} at step {step}: training diverged (the last checkpoint is kept)")


def _error(line: str) -> None:
    print(f"error: {line}", file=sys.stderr, flush=True)


def _report_failure(kind: type[BaseException], error: BaseException, tb: Any) -> None:
    """The last ``error:`` line of a run that a failure ended: a lost torchrun peer, a file that cannot be written
    (disk full: its reason is the line) or any other error, after its traceback."""
    if distributed.lost_peer(error):
        first = str(error).splitlines()[0][:200]
        _error(f"rank {distributed.rank()} lost contact with another rank, which failed, was killed or hung ({first})")
    elif issubclass(kind, WriteError):
        _error(str(error))
    else:  # e.g. a loss gone to infinity
        traceback.print_exception(kind, error, tb)
        _error(f"{kind.__name__}: {error}")


def _doing(args: Any, step: int) -> str:
    """What the command does, for the line ``begin`` says: the steps it trains, or what it evaluates or exports."""
    if getattr(args, "export", ""):
        return f"exporting the policy at step {step} to {args.export}"
    if getattr(args, "eval_only", False):
        return f"evaluating the policy at step {step}: {args.eval_episodes} episodes, {args.eval_envs} envs"
    return f"steps {step}..{args.total_timesteps}"


# Set (to anything but the empty string) in a script's environment: ``Run.begin`` exits 0 before it starts anything,
# every check before it made; experiments/ checks a launch's or a study's flags with each script's own code this way.
CHECK_ONLY = "RL_CHECK_ONLY"


class Run:
    """One run; see the module docstring."""

    def __init__(
        self,
        args: Any,
        script: str,
        make_env: Callable,
        action_space: type | None = None,
        bounded: bool = False,
        stop_window: int = 20,
        iteration_steps: int | None = None,
        dict_obs: bool = False,
    ):
        # the script's __file__ (or its name): a copy of a script labels its runs with its own file name
        self.args, self.script, self.make_env, self.stop_window = args, Path(script).stem, make_env, stop_window
        checked = check_run(args, self.script, make_env, action_space, bounded, iteration_steps, dict_obs)
        self.device, self.path, self.resumed = checked.device, checked.path, checked.resumed
        self.obs_space, self.act_space, self._checked = checked.obs_space, checked.act_space, checked
        self.tracker = None  # W&B, rank 0 alone, started by begin once the networks and the replay are made
        self.world = 1  # ranks in the job, known once setup() has joined it
        self.affinity: Any = None  # this process's cores and its sampler's, set by setup()
        self.writes = True  # rank 0 alone writes the run folder
        self.exit_code = 0
        self.global_step, self.updates = 0, 0
        self._iterations = iteration_steps is not None
        self._row_every = args.log_every * (iteration_steps * self.world if iteration_steps else 1)
        self._objects: dict[str, Any] = {}
        self._replay: Any = None
        self._held: list[Any] = []
        self._values: dict[str, Any] = {}
        self._eval_return: float | None = None
        self._evaluated_at: int | None = None  # the global step of the last evaluation
        self._saved: tuple | None = None  # (global_step, updates) of the last checkpoint written
        self._interrupted = False  # the ranks agreed to stop for a signal (periodic), or one came at the end
        self._config_file: Path | None = None  # config.json as written by begin (rank 0, training)
        self._config: dict[str, Any] = {}  # what config.json holds
        self.progress: ProgressLog | None = None

    # ------------------------------------------------------------------------------------------ start

    def setup(self) -> Run:
        """This process's global state, set here and nowhere else: TF32 and cuDNN's benchmark on a GPU, SIGINT/SIGTERM
        raise ``KeyboardInterrupt``, the torchrun job joined, this process pinned to its cores, numpy and torch seeded."""
        import torch

        if self.device.type == "cuda":
            gpu_defaults()  # TF32 and cuDNN's benchmark, as the sampler process acting on this GPU sets them
        signals.clear()  # a flag left by an earlier run in this process is not this run's signal
        signals.raise_on_signals()
        distributed.start(self.device)  # under torchrun: join the other ranks (a no-op in one process)
        self.world = distributed.world_size()
        self.affinity = make_affinity(self.args.sampler, gpu_learner=self.device.type == "cuda")
        self.affinity.apply_learner()
        np.random.seed(self.args.seed)
        torch.manual_seed(self.args.seed)
        if getattr(self.args, "compile", False):  # the script's @compiled functions, in this process
            compiling.enable(self.device)
        self.writes = distributed.is_main()
        return self

    def _check_setup(self) -> None:
        if self.affinity is None:
            raise RuntimeError("call run.setup() after Run(...): the process is not set up (seeds, signals, cores)")

    @contextlib.contextmanager
    def allocating(self, *flags: str) -> Iterator[None]:
        """Around the networks and the replay (see the module docstring); ``flags``: the fields that size them.
        Under --eval-only the replay is made but never written, so it is not checked."""
        self._check_setup()
        try:
            with unchecked() if getattr(self.args, "eval_only", False) else contextlib.nullcontext():
                yield
        except SystemExit:  # a bad argument found while building (observations a network cannot take)
            distributed.end()
            raise
        except (MemoryError, RuntimeError) as e:
            refusal = allocation_refusal(e, self.args, flags)
            if refusal is None:
                raise
            distributed.end()
            bad_args(refusal)

    def begin(self, policy: Callable, replay: Any = None, **objects: Any) -> Start:
        """Restore or start (see the module docstring); ``policy`` plays evaluations: ``shared.evaluation`` calls it with
        the observations and, by name, only the keywords among ``draws``, ``starts``, ``rewards``, ``mask`` that its
        signature has; any other parameter is a ``TypeError`` here (``shared.evaluation.check_act``)."""
        self._check_setup()
        try:
            check_act(policy)
            if os.environ.get(CHECK_ONLY):  # experiments/ asked whether these flags start: every check made, nothing written
                sys.exit(0)
            return self._begin(policy, replay, **objects)
        except BaseException as e:  # an exit 2, or a peer lost while sharing: leave the process group here too,
            distributed.end()  # as ``with run:`` does on every later path (NCCL may hang at exit otherwise)
            if self.tracker is not None:
                self.tracker.finish(e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 1)
            raise

    def _begin(self, policy: Callable, replay: Any, **objects: Any) -> Start:
        import torch

        args = self.args
        objects = {name: obj for name, obj in objects.items() if obj is not None}  # a part these flags do not build
        self._policy, self._objects = policy, objects
        exporting = bool(getattr(args, "export", ""))  # writes one file, nothing in the run folder, no W&B run
        evaluating = bool(getattr(args, "eval_only", False)) or exporting  # no training
        # W&B: one that cannot start is an exit 2
        if getattr(args, "track", False) and distributed.is_main() and not exporting:
            try:
                self.tracker = tracking.start(args, self.path, self.script)
            except RuntimeError as e:
                bad_args(str(e))
        start = Start()
        if self.resumed is not None:
            checkpoint.restore(self.resumed, objects, args, self.script)
            start = Start(int(self.resumed["global_step"]), int(self.resumed.get("updates", 0)))
        distributed.share(*[o for o in objects.values() if isinstance(o, (torch.nn.Module, torch.Tensor))])
        if distributed.rank() > 0:  # after rank 0's parameters: every rank samples actions of its own
            torch.manual_seed(distributed.rank_seed(args.seed))
            np.random.seed(distributed.rank_seed(args.seed) % 2**32)
        if replay is not None and getattr(args, "save_replay", False) and not evaluating:
            self._replay = replay
            if self.resumed is not None and checkpoint.restore_replay(self.path / "replay.npz", replay, self.resumed):
                start = dataclasses.replace(start, replay_restored=True)
        self.global_step, self.updates = start.global_step, start.updates
        self._open_folder(start.global_step, evaluating)
        t = args.checkpoint_every
        # On-policy rows fall on multiples of --log-every iterations, also after a resume between two of them.
        first_row = (
            (start.global_step // self._row_every + 1) * self._row_every
            if self._iterations
            else start.global_step + self._row_every
        )
        self._next = {
            "row": first_row,
            "eval": start.global_step + args.eval_every if args.eval_every else None,
            "checkpoint": start.global_step + t if t else None,
            "agree": start.global_step,  # torchrun: where the ranks next agree on stopping (_should_stop)
        }
        self._since_agreed = 0  # iterations since they last did
        self._last_checkpoint_t = time.time()
        compiled = f"  compiled ({compiling.backend()})" if compiling.enabled() else ""
        where = f"run folder {self.path}  sampler {args.sampler}  device {self.device}{compiled}"
        self._say(f"{where}  {_doing(args, start.global_step)}")
        if self.resumed is not None:
            self._say(self._checked.resume_line())
        return start

    def _open_folder(self, start_step: int, evaluating: bool) -> None:
        counters = (self.resumed or {}).get("run", {})
        if not self.writes or getattr(self.args, "export", ""):
            self.progress = ProgressLog(None, self.args.total_timesteps, start_step, counters)
            return
        self.path.mkdir(parents=True, exist_ok=True)
        config_file = self.path / "config.json"
        if start_step and config_file.exists():  # resumed: keep the first config, record the new one beside it
            config_file = self.path / f"config.resume-{start_step}.json"
        self._config = _config(self.args, self.device, self.script)
        if self.resumed is not None:  # which flags came from the run, which were changed
            self._config["resumed"] = self._checked.resume_record()
        if not evaluating:
            self._config_file = config_file
            write_text(config_file, lambda f: json.dump(self._config, f, indent=2, default=str))
        self.progress = ProgressLog(
            self.path, self.args.total_timesteps, start_step, counters, resumed=self.resumed is not None, read_only=evaluating
        )
        if self.tracker is not None:  # every TensorBoard scalar to W&B as well
            self.progress.tb = self.tracker.tee(self.progress.tb)

    def _say(self, line: str) -> None:
        if self.writes:
            print(line, flush=True)

    # ------------------------------------------------------------------------------------------ the loop

    def episodes(self, episodes: Iterable[tuple[float, int]], global_step: int) -> None:
        """Record the episodes [(return, length)] that ended by ``global_step`` (true, unclipped returns)."""
        for ret, length in episodes:
            self.progress.episode(ret, length, global_step)

    def periodic(self, global_step: int, **values: Any) -> bool:
        """Rows, evaluation and checkpoints when due; True when ``--stop-at-return`` is reached."""
        self.global_step, self._values = global_step, values
        self.updates = int(values.get("updates", self.updates))
        nxt = self._next
        if nxt["eval"] is not None and global_step >= nxt["eval"]:  # whole episodes in an env of its own
            self._evaluate(global_step)
            nxt["eval"] += self.args.eval_every
        if global_step >= nxt["row"]:
            self._row(global_step, values)
            while nxt["row"] <= global_step:
                nxt["row"] += self._row_every
        by_steps = nxt["checkpoint"] is not None and global_step >= nxt["checkpoint"]
        minutes = getattr(self.args, "checkpoint_minutes", 0)
        if by_steps or (minutes and time.time() - self._last_checkpoint_t >= 60 * minutes):
            self.save()
            while nxt["checkpoint"] is not None and nxt["checkpoint"] <= global_step:
                nxt["checkpoint"] += self.args.checkpoint_every
        return self._should_stop(global_step)

    def _row(self, global_step: int, values: dict[str, Any]) -> None:
        if self._eval_return is not None:  # an evaluation since the last row
            values, self._eval_return = {**values, "eval_return": self._eval_return}, None
        if compiling.enabled():  # graphs compiled so far and the seconds it took: a count that grows recompiled
            values = {**values, **compiling.report()}
        _check_finite(self.progress.row(global_step, **values), values, global_step)

    def _should_stop(self, global_step: int) -> bool:
        if distributed.in_lockstep():  # the ranks' global_step and iteration counts are the same: they agree together
            self._since_agreed += 1
            if global_step < self._next["agree"] and self._since_agreed < AGREE_EVERY_ITERATIONS:
                return False
            self._next["agree"], self._since_agreed = global_step + AGREE_EVERY_STEPS, 0
        threshold = getattr(self.args, "stop_at_return", None)
        mean = self.progress.recent_mean(self.stop_window) if threshold is not None else None
        # One agreement for both: the ranks leave the loop at the same iteration, for a threshold or a signal.
        reached, interrupted = distributed.any_rank(mean is not None and mean >= threshold, signals.signalled())
        if interrupted:  # every rank stops here; ``finish`` ends the run as Ctrl-C does
            signals.clear()
            self._interrupted = True
            return True
        if reached:
            self._say(
                f"mean return of the last {self.stop_window} episodes {mean:.1f} >= {threshold} at step "
                f"{global_step}: stopping"
            )
        return reached

    # ------------------------------------------------------------------------------------------ the end

    def finish(self, global_step: int) -> None:
        """After the loop: the last row (unless it is there), the checkpoint, and the final evaluation; a run
        that stopped for a signal (``periodic``, or one during the last iteration) ends as Ctrl-C does."""
        self.global_step = global_step
        if self._interrupted:
            self._say(f"interrupted at step {global_step}: writing checkpoint")
        self._last_row()
        if self._interrupted:
            self.exit_code = EXIT_INTERRUPTED
        elif self.args.eval_episodes and (self._evaluated_at != global_step or self.args.capture_video):
            self._evaluate(global_step, video=self.args.capture_video)  # not the same episodes again, unless filmed

    def _last_row(self) -> None:
        """The last row with the latest values, then the collectives end (rank 0 may go on alone); a signal that
        came during the last iteration still stops the run as an interruption. Then the checkpoint."""
        if self.global_step != self.progress.last_step:
            self._row(self.global_step, self._values)
        distributed.end()
        if signals.signalled():
            signals.clear()
            self._interrupted = True
        self.save()
        if compiling.enabled() and self._config_file is not None:  # known only now: how long compiling took
            self._config["compile"] = {"backend": compiling.backend(), **compiling.report()}
            write_text(self._config_file, lambda f: json.dump(self._config, f, indent=2, default=str))

    def save(self) -> None:
        """Write the checkpoint (and first the replay, with --save-replay); rank 0 only, once per state."""
        _check_finite(scalars(self._values), self._values, self.global_step)
        if not self.writes or self._saved == (self.global_step, self.updates):  # this state is on disk already
            return  # (a signal that came during the last checkpoint raised once it was written)
        # A checkpoint once started is finished, the replay's long write included: a signal raises after it.
        signals.defer()
        try:
            self._write_checkpoint()
            self._saved = (self.global_step, self.updates)
        finally:
            signals.undefer()
        self._last_checkpoint_t = time.time()

    def _write_checkpoint(self) -> None:
        state = {
            **checkpoint.state_of(self._objects),
            "global_step": self.global_step,
            "updates": self.updates,
            "args": vars(self.args).copy(),
            "script": self.script,
            "run": {"episodes": self.progress.episodes, "wall_time_s": self.progress.wall_time()},
        }
        checkpoint.save_run(self.path, state, self._replay, lost_sampler=SAMPLER_FAILURES)

    def _evaluate(self, global_step: int, video: bool = False) -> None:
        """Play --eval-episodes (the ranks share them while in lockstep; after the loop rank 0 alone): each return
        logged as eval/episodic_return, the mean in the next row, eval.json (``shared.evaluation.evaluate_run``)."""
        if not distributed.in_lockstep() and not self.writes:
            return
        tb, tracker = self.progress.tb, self.tracker
        played = evaluate_run(self.make_env, self._policy, self.args, global_step, self.path, self.writes, tb, tracker, video)
        self._eval_return, self._evaluated_at = float(np.mean(played.returns)), global_step
        self._say(f"evaluation over {len(played.returns)} episodes at step {global_step}: mean return {self._eval_return:.1f}")

    def evaluate_or_export(self, policy: Any, outputs: list[str], rows: int = 8, **inputs: Any) -> int:
        """The two commands that train nothing, ``--eval-only`` and ``--export FILE`` (both with ``--resume``):
        ``evaluate_only()`` or ``export(policy, outputs, rows, **inputs)``; returns the exit code."""
        return self.evaluate_only() if self.args.eval_only else self.export(policy, outputs, rows, **inputs)

    def evaluate_only(self) -> int:
        """``--resume RUN --eval-only``: evaluate the checkpoint's policy into the run folder, train nothing;
        returns the exit code (130 on Ctrl-C; an error raises, exit code 1)."""

        def evaluate() -> bool:
            self._evaluate(self.global_step, video=self.args.capture_video)
            return True

        return self._train_nothing(evaluate, "evaluation stopped")

    def export(self, policy: Any, outputs: list[str], rows: int = 8, **inputs: Any) -> int:
        """``--resume RUN --export FILE``: write ``policy`` (its ``forward`` takes ``obs``, a tensor or a dict of
        them by a Dict space's keys, and ``inputs`` by name) as ONNX, checked against torch on ``rows``
        observations of the env's space (``shared.export.export_run``); train nothing. Returns the exit code: 1
        after one ``error:`` line, 130 on Ctrl-C (no file written)."""

        def write() -> bool:
            try:
                done = export_run(policy, self.obs_space, self.args.seed, outputs, self.args.export, rows, inputs)
            except ExportError as e:
                print(f"error: --export {self.args.export}: {e}", file=sys.stderr, flush=True)
                return False
            self._say(f"exported the policy of step {self.global_step} to {self.args.export} ({done})")
            return True

        return self._train_nothing(write, "export stopped, no file written")

    def _train_nothing(self, command: Callable[[], bool], stopped: str) -> int:
        """Run ``command`` (True: it succeeded) for --eval-only or --export: the exit code 0, 1 or 130 on Ctrl-C
        (``stopped`` said); the run folder, W&B and the process group closed on every path."""
        self.exit_code = 1  # until the command has ended well or was interrupted
        try:
            self.exit_code = 0 if command() else 1
        except KeyboardInterrupt:
            print(f"interrupted: {stopped}", file=sys.stderr, flush=True)
            self.exit_code = EXIT_INTERRUPTED
        finally:
            self._close()
        return self.exit_code

    def hold(self, thing: Any) -> Any:
        """Close ``thing`` (a ``procs.Worker`` or a vector env) when the run ends, however it ends."""
        self._held.append(thing)
        return thing

    def start_sampler(self, sampler_main: Callable[..., None], args: Any, *rest: Any) -> Worker:
        """Start ``sampler_main(args, *rest, proc)`` in a sampler process held by this run: pinned to the
        sampler's cores, ``proc`` a ``procs.SamplerProcess`` (its thread count, the device it may act on, and the
        check that ends it with the run). ``proc.device`` is the learner's GPU where the learner is on one (a
        network acts there as in serial mode, sharing the GPU with the learner; with --compile its acting step is
        one CUDA graph of the sampler's), else the CPU (eager), where ``args`` has --bf16 only as that CPU can
        honour it."""
        device = sampler_device(self.device)
        gpu = device.type == "cuda"
        args = dataclasses.replace(args, bf16=args.bf16 if gpu else sampler_bf16(args.bf16))
        entry = (sampler_main, (args, *rest), self.affinity, os.getpid(), device, gpu and getattr(args, "compile", False))
        return self.hold(Worker(sampler_entry, entry, name="sampler"))

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, error, tb) -> bool:
        try:
            if kind is not None and issubclass(kind, KeyboardInterrupt):
                self._say(f"interrupted at step {self.global_step}: writing checkpoint")
                try:
                    self._last_row()
                except KeyboardInterrupt:  # a second signal while the last row was written: checkpoint anyway
                    self.save()
                self.exit_code = EXIT_INTERRUPTED
            elif kind is not None and issubclass(kind, SAMPLER_FAILURES):
                print(error, file=sys.stderr)
                self.save()  # the learner is intact: keep what it learned
                step = self.global_step
                _error(f"the sampler process failed ({kind.__name__}); the learner's checkpoint at step {step} is written")
                self.exit_code = 1
            elif kind is not None and issubclass(kind, Exception):
                _report_failure(kind, error, tb)
                self.exit_code = 1
        except (WriteError, FloatingPointError) as e:  # no checkpoint of an interrupted or failed run: not
            # written (disk full), or not to be written (its statistics were not finite)
            _error(f"{type(e).__name__}: {e}" if isinstance(e, FloatingPointError) else str(e))
            self.exit_code = 1
        finally:
            for thing in reversed(self._held):
                thing.stop() if hasattr(thing, "stop") else close_envs(thing)
            self._close()
        return kind is None or self.exit_code != 0

    def _close(self) -> None:
        """The run folder, W&B (with the exit code) and the process group, left on every way out."""
        if self.progress is not None:
            self.progress.close()
        if self.tracker is not None:
            self.tracker.finish(self.exit_code)
        distributed.end()
