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
- ``Run(...)`` only checks (before anything starts; a problem exits 2 with one line): resolves ``--device``,
  reads the ``--resume`` checkpoint, probes one env for its spaces and checks the action space (and refuses a
  ``Dict`` observation space unless the script takes one: ``dict_obs=True``), refuses an
  on-policy rollout (``iteration_steps``: ``--num-envs`` x ``--num-steps``) whose observations alone exceed the
  memory left. It creates nothing on disk and changes no global state. With ``RL_CHECK_ONLY`` set in the
  environment, ``begin`` exits 0 before it starts anything, every earlier check made (these, the script's own in
  building its networks, ``allocating``'s sizes): how ``experiments/`` checks the flags it will pass.
- ``run.setup()`` is the one call that changes this process's global state: TF32 on a GPU, SIGINT/SIGTERM
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
  signal any rank got, at the same iteration.
- ``with run:`` ends the run cleanly however it ends: Ctrl-C or SIGTERM writes a last row and the checkpoint,
  exit code 130; a sampler process or env worker that failed or was killed writes the learner's checkpoint,
  then one ``error:`` line and exit code 1 (a sampler killed while holding the shared replay's lock, as a
  SIGTERM to the whole job can do: the checkpoint without the replay, one warning line); a lost torchrun peer,
  a file that cannot be written (disk full) or any other error (with its traceback) gives a last ``error:``
  line and exit code 1. Whatever was ``hold``-en (a sampler process, vector envs) is closed on every path, then
  the run folder, then the process group.
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
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from shared import checkpoint, compiling, distributed, signals, tracking
from shared.affinity import available_cpus, make_affinity
from shared.atari import is_atari
from shared.buffer import NotEnoughMemory, available_memory, check_fits, unchecked
from shared.checkpoint import Start
from shared.cli import bad_args, resolve_device, resume_changes
from shared.envs import close_envs, probe_spaces
from shared.evaluation import check_act, play
from shared.files import WriteError, write_text
from shared.precision import sampler_bf16
from shared.procs import Worker, WorkerError, sampler_entry
from shared.progress import ProgressLog, scalars

__all__ = ["EXIT_INTERRUPTED", "Run"]

EXIT_INTERRUPTED = 130
# A failure of the sampling side the learner survives: its checkpoint is written before the run ends.
SAMPLER_FAILURES = (WorkerError, EOFError, BrokenPipeError, ConnectionResetError)


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


def _refused_allocation(e: BaseException) -> str | None:
    """What a failed allocation needed and what is left, in words; None for an error that is no allocation's."""
    if isinstance(e, NotEnoughMemory):
        return str(e)
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    if "out of memory" in text.lower():  # CUDA's allocator (torch.OutOfMemoryError), any device's
        return first[:300]
    asked = re.search(r"allocate (\d+) bytes", text)  # torch's CPU allocator
    if isinstance(e, MemoryError) or asked:  # numpy's refusal names its size
        what = f"{int(asked.group(1)) / 2**30:.1f} GiB in one tensor" if asked else first[:200]
        return f"the allocation was refused ({what}), and {available_memory() / 2**30:.1f} GiB of memory are available here"
    return None


def _leaves(space: Any) -> list:
    """The Box and Discrete spaces of an observation space (a Dict's entries, by key), the ones a rollout stores."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in _leaves(sub)]
    return [space] if isinstance(space, (gym.spaces.Box, gym.spaces.Discrete)) else []


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
        import gymnasium as gym

        # the script's __file__ (or its name): a copy of a script labels its runs with its own file name
        self.args, self.script, self.make_env, self.stop_window = args, Path(script).stem, make_env, stop_window
        self.device = resolve_device(args.device, getattr(args, "bf16", False))
        self.resumed, ckpt_file = checkpoint.load(args.resume, args.env_id) if args.resume else (None, None)
        # --resume: what differs from the flags the run folder recorded (None: it recorded none, or a new run)
        changes = resume_changes(args)
        self._recorded, self._changes = changes is not None, changes or {}
        self.path = (
            ckpt_file.parent
            if ckpt_file is not None
            else Path(args.out_dir) / (args.run_name or f"{args.env_id}__{self.script}__{args.seed}__{int(time.time())}")
        )
        try:
            self.obs_space, self.act_space = probe_spaces(make_env(args))
        except (ValueError, IndexError) as e:
            bad_args(f"--env-id {args.env_id}: {e}")
        if action_space is not None:
            box = isinstance(self.act_space, gym.spaces.Box)
            if not isinstance(self.act_space, action_space) or (
                bounded and box and not (np.all(np.isfinite(self.act_space.low)) and np.all(np.isfinite(self.act_space.high)))
            ):
                kind = (
                    "discrete (Discrete)"
                    if action_space is gym.spaces.Discrete
                    else f"{'bounded ' if bounded else ''}continuous (Box)"
                )
                bad_args(f"--env-id {args.env_id}: {self.script} needs a {kind} action space, got {self.act_space}")
        if isinstance(self.obs_space, gym.spaces.Dict) and not dict_obs:
            bad_args(
                f"--env-id {args.env_id}: {self.script} needs a Box observation space, got a Dict "
                f"({', '.join(self.obs_space.spaces)}); docs/contract.md (Dict observations) names the scripts that "
                "take one"
            )
        if iteration_steps:  # the rollout's observations alone, before a network or a sampler is made
            copies = 2 if args.sampler == "async" else 1  # the async double buffer's two slots
            obs_bytes = sum(int(np.prod(space.shape)) * np.dtype(space.dtype).itemsize for space in _leaves(self.obs_space))
            try:
                check_fits(copies * iteration_steps * obs_bytes, f"a rollout of {iteration_steps} steps")
            except NotEnoughMemory as e:
                bad_args(f"--num-envs {args.num_envs} x --num-steps {args.num_steps}: {e}")
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
        """This process's global state, set here and nowhere else: TF32 on a GPU, SIGINT/SIGTERM raise
        ``KeyboardInterrupt``, the torchrun job joined, this process pinned to its cores, numpy and torch seeded."""
        import torch

        if self.device.type == "cuda":
            # Chosen, not inherited: torch's defaults let convolutions use TF32 but not matmuls, so an "fp32" run
            # would be half TF32. Both may (tensor cores on Ampere and later); config.json records it.
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
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
            refused = _refused_allocation(e)
            if refused is None:
                raise
            distributed.end()
            named = ", ".join(f"--{f.replace('_', '-')} {getattr(self.args, f)}" for f in flags)
            bad_args(f"{named}: {refused}" if named else refused)

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
        if self.device.type == "cuda":
            # Every script's steps and updates keep their shapes (the PPO family's minibatches are all of one size):
            # cuDNN may pick the fastest convolutions once.
            torch.backends.cudnn.benchmark = True
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
        }
        self._last_checkpoint_t = time.time()
        compiled = f"  compiled ({compiling.backend()})" if compiling.enabled() else ""
        if exporting:
            doing = f"exporting the policy at step {start.global_step} to {args.export}"
        elif evaluating:
            doing = f"evaluating the policy at step {start.global_step}: {args.eval_episodes} episodes, {args.eval_envs} envs"
        else:
            doing = f"steps {start.global_step}..{args.total_timesteps}"
        self._say(f"run folder {self.path}  sampler {args.sampler}  device {self.device}{compiled}  {doing}")
        if self.resumed is not None:
            changed = ", ".join(f"{'--' + k.replace('_', '-')} {was!r} -> {now!r}" for k, (was, now) in self._changes.items())
            recorded = "its recorded flags" if self._recorded else "the flags given (the run records none)"
            self._say(f"resumed with {recorded}; changed here: {changed or 'none'}")
        return start

    def _open_folder(self, start_step: int, evaluating: bool) -> None:
        counters = (self.resumed or {}).get("run", {})
        if not self.writes or getattr(self.args, "export", ""):
            self.progress = ProgressLog(None, self.args.total_timesteps, start_step, counters)
            return
        self.path.mkdir(parents=True, exist_ok=True)
        config = dataclasses.asdict(self.args)
        config_file = self.path / "config.json"
        if start_step and config_file.exists():  # resumed: keep the first config, record the new one beside it
            config_file = self.path / f"config.resume-{start_step}.json"
        self._config = {"args": config, "versions": _versions(), "hardware": _hardware(self.device), "script": self.script}
        if self.resumed is not None:  # which flags came from the run, which were changed
            self._config["resumed"] = {
                "from": str(self.args.resume),
                "recorded_flags": self._recorded,
                "changed": {k: list(v) for k, v in self._changes.items()},
            }
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
        self._check_finite(self.progress.row(global_step, **values), values)

    def _check_finite(self, row: dict[str, Any], values: dict[str, Any]) -> None:
        """A statistic of the loop that is not finite (a loss gone to NaN or infinity) ends the run with
        ``FloatingPointError``, before any further checkpoint: the parameters it came from are lost, the last
        checkpoint is kept. Statistics stay on the device between rows, so this is where they are read."""
        for k in values:
            v = row.get(k)
            if isinstance(v, float) and not math.isfinite(v):
                raise FloatingPointError(
                    f"{k} is {v} at step {self.global_step}: training diverged (the last checkpoint is kept)"
                )

    def _should_stop(self, global_step: int) -> bool:
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
        self._check_finite(scalars(self._values), self._values)
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
        if self._replay is not None:  # first the replay, then the checkpoint that names its cursor
            try:
                checkpoint.save_replay(self.path / "replay.npz", self._replay)
                state["replay_cursor"] = self._replay.cursor
            except WriteError as e:  # the sampler died holding the replay's lock (its rows may be half written):
                # no replay; the checkpoint names none, so a resume starts with an empty one
                if not isinstance(e.__cause__, SAMPLER_FAILURES):
                    raise
                print(
                    f"warning: --save-replay: the replay is not saved, the sampler process that shares it "
                    f"failed ({type(e.__cause__).__name__}); the checkpoint is written without it",
                    file=sys.stderr,
                    flush=True,
                )
        checkpoint.save(self.path / "checkpoint.pt", state)

    def _evaluate(self, global_step: int, video: bool = False) -> None:
        """Play --eval-episodes (the ranks share them while in lockstep; after the loop rank 0 alone), log each
        return as eval/episodic_return, the mean in the next row, eval.json."""
        if not distributed.in_lockstep() and not self.writes:
            return
        args = self.args
        returns, lengths = play(
            partial(self.make_env, args),
            self._policy,
            args.eval_episodes,
            args.seed,
            envs=args.eval_envs,
            video_dir=self.path / "videos" if video and self.writes else None,
            procs=len(available_cpus()) if is_atari(args.env_id) else 1,
        )  # emulation: worth it
        for r in returns:
            self.progress.tb.add_scalar("eval/episodic_return", r, global_step)
        summary = {"global_step": global_step, "returns": returns, "mean": float(np.mean(returns)), "lengths": lengths}
        if self.writes:
            write_text(self.path / "eval.json", lambda f: json.dump(summary, f))
        if video and self.tracker is not None and (self.path / "videos").is_dir():
            newest = max((self.path / "videos").glob("*.mp4"), key=lambda f: f.stat().st_mtime, default=None)
            if newest is not None:
                self.tracker.video(newest, global_step)
        self._eval_return, self._evaluated_at = summary["mean"], global_step
        self._say(f"evaluation over {len(returns)} episodes at step {global_step}: mean return {summary['mean']:.1f}")

    def evaluate_or_export(self, policy: Any, outputs: list[str], rows: int = 8, **inputs: Any) -> int:
        """The two commands that train nothing, ``--eval-only`` and ``--export FILE`` (both with ``--resume``):
        ``evaluate_only()`` or ``export(policy, outputs, rows, **inputs)``; returns the exit code."""
        return self.evaluate_only() if self.args.eval_only else self.export(policy, outputs, rows, **inputs)

    def evaluate_only(self) -> int:
        """``--resume RUN --eval-only``: evaluate the checkpoint's policy into the run folder, train nothing;
        returns the exit code (130 on Ctrl-C)."""
        self.exit_code = 1  # until the evaluation has ended well or was interrupted
        try:
            self._evaluate(self.global_step, video=self.args.capture_video)
            self.exit_code = 0
            return 0
        except KeyboardInterrupt:
            print("interrupted: evaluation stopped", file=sys.stderr, flush=True)
            self.exit_code = EXIT_INTERRUPTED
            return EXIT_INTERRUPTED
        finally:
            self.progress.close()
            if self.tracker is not None:
                self.tracker.finish(self.exit_code)
            distributed.end()  # on every path: the process group is left

    def export(self, policy: Any, outputs: list[str], rows: int = 8, **inputs: Any) -> int:
        """``--resume RUN --export FILE``: write ``policy`` (its ``forward`` takes ``obs``, a tensor or a dict of
        them by a Dict space's keys, and ``inputs`` by name) as ONNX, checked against torch on ``rows``
        observations of the env's space (``shared.export``); train nothing. Returns the exit code."""
        import torch

        from shared.export import ExportError, export

        self.exit_code = 1
        try:
            import gymnasium as gym

            policy = policy.cpu()  # the graph holds no device; the inputs below are made on the CPU

            self.obs_space.seed(self.args.seed)
            samples = [self.obs_space.sample() for _ in range(rows)]
            if isinstance(self.obs_space, gym.spaces.Dict):  # one input per key a network takes
                obs = {
                    k: torch.as_tensor(np.stack([s[k] for s in samples]))
                    for k, sub in self.obs_space.items()
                    if isinstance(sub, (gym.spaces.Box, gym.spaces.Discrete))
                }
                names = [*obs, *inputs]
            else:
                obs = torch.as_tensor(np.stack(samples))
                names = ["obs", *inputs]
            worst = export(policy, {"obs": obs, **inputs}, outputs, self.args.export)
            self._say(
                f"exported the policy of step {self.global_step} to {self.args.export} ({', '.join(names)} in; "
                f"{', '.join(outputs)} out; onnxruntime within {worst:.1g} of torch)"
            )
            self.exit_code = 0
        except ExportError as e:
            print(f"error: --export {self.args.export}: {e}", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            print("interrupted: export stopped, no file written", file=sys.stderr, flush=True)
            self.exit_code = EXIT_INTERRUPTED
        except Exception as e:  # the exporter, onnx's checker or the disk: one line, no traceback
            print(
                f"error: --export {self.args.export}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                file=sys.stderr,
                flush=True,
            )
        finally:
            self.progress.close()
            if self.tracker is not None:
                self.tracker.finish(self.exit_code)
            distributed.end()
        return self.exit_code

    def hold(self, thing: Any) -> Any:
        """Close ``thing`` (a ``procs.Worker`` or a vector env) when the run ends, however it ends."""
        self._held.append(thing)
        return thing

    def start_sampler(self, sampler_main: Callable[..., None], args: Any, *rest: Any) -> Worker:
        """Start ``sampler_main(args, *rest, proc)`` in a sampler process held by this run: pinned to the
        sampler's cores, ``args`` with --bf16 as the sampler's CPU can honour it, ``proc`` a
        ``procs.SamplerProcess`` (its thread count, and the check that ends it with the run)."""
        args = dataclasses.replace(args, bf16=sampler_bf16(args.bf16))
        entry = (sampler_main, (args, *rest), self.affinity, os.getpid())
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
                print(
                    f"error: the sampler process failed ({kind.__name__}); the learner's checkpoint at step "
                    f"{self.global_step} is written",
                    file=sys.stderr,
                    flush=True,
                )
                self.exit_code = 1
            elif kind is not None and distributed.lost_peer(error):
                print(
                    f"error: rank {distributed.rank()} lost contact with another rank, which failed, was killed or "
                    f"hung ({str(error).splitlines()[0][:200]})",
                    file=sys.stderr,
                    flush=True,
                )
                self.exit_code = 1
            elif kind is not None and issubclass(kind, WriteError):
                print(f"error: {error}", file=sys.stderr, flush=True)
                self.exit_code = 1
            elif kind is not None and issubclass(kind, Exception):  # e.g. a loss gone to infinity
                traceback.print_exception(kind, error, tb)
                print(f"error: {kind.__name__}: {error}", file=sys.stderr, flush=True)
                self.exit_code = 1
        except (WriteError, FloatingPointError) as e:  # no checkpoint of an interrupted or failed run: not
            # written (disk full), or not to be written (its statistics were not finite)
            print(
                f"error: {type(e).__name__}: {e}" if isinstance(e, FloatingPointError) else f"error: {e}",
                file=sys.stderr,
                flush=True,
            )
            self.exit_code = 1
        finally:
            for thing in reversed(self._held):
                if hasattr(thing, "stop"):
                    thing.stop()
                else:
                    close_envs(thing)
            if self.progress is not None:
                self.progress.close()
            if self.tracker is not None:
                self.tracker.finish(self.exit_code)
            distributed.end()  # on every path: the process group is left
        return kind is None or self.exit_code != 0
