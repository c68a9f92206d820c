"""The command line every script shares: parsing with presets, checks declared on the fields, the device.

Guarantees
- ``bad_args(msg)`` prints one line ``error: <msg>`` to stderr and exits 2; every check here uses it, before any
  process, environment or file of the run is created.
- ``parse_args(Args, PRESETS, check)`` is ``tyro.cli(Args)`` with a parse error condensed to one line (exit 2) and
  ``--help`` as usual. ``--preset NAME`` makes the preset's values the defaults (flags given override them, in
  any order, and ``--help`` shows them). Then, in order: the range of every field declared with ``Range``
  (``shared.argtypes``: ``PositiveInt``, ``Fraction``, ...), every float finite, the checks every run needs
  (``check_common``), and the script's own ``check(args)`` for what relates fields to each other
  (``check_replay_sizes`` for a transition replay's sizes).
- ``resolve_device`` turns ``auto|cpu|cuda|cuda:N`` into a device (under torchrun, ``cuda`` is the local rank's
  GPU); a device that does not exist, or one explicit GPU index for several ranks on one machine, exits 2.
- Memory: what a run allocates is checked against the memory left where it is allocated (``shared.buffer``),
  and a size the machine cannot hold ends the run in one line from ``Run.allocating`` (``shared.run``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import math
import os
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

from shared.argtypes import NonNegFloat, NonNegInt, Range
from shared.precision import cpu_has_bf16

__all__ = ["RunArgs", "bad_args", "check_common", "check_replay_sizes", "parse_args", "resolve_device"]

EXIT_BAD_ARGS = 2


def bad_args(message: str) -> NoReturn:
    """One readable line and exit code 2 (bad arguments)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_ARGS)




@dataclass
class RunArgs:
    """The flags of a run's lifecycle, the same in every script: ``class Args(RunArgs)`` adds the algorithm's own.
    ``shared.run.Run`` reads them all (seeding, the run folder, resume, checkpoints, evaluation, early stop,
    device, precision); ``tyro`` shows them first in ``--help``, the script's own fields after them."""

    seed: int = 1
    """seeds every env, worker and network"""
    out_dir: str = "runs"
    """parent folder of the run folder"""
    run_name: str = ""
    """run folder name; default {env_id}__{script file name}__{seed}__{unix time}"""
    resume: str = ""
    """checkpoint file or run folder to continue from; its progress.csv goes on (a replay starts empty and refills
    min_steps_learn, unless --save-replay kept it)"""
    checkpoint_every: NonNegInt = 0
    """global env steps between checkpoints (0: by --checkpoint-minutes only)"""
    checkpoint_minutes: NonNegFloat = 15.0
    """minutes of wall time between checkpoints, so a killed run loses at most this much (0: off)"""
    eval_episodes: Annotated[int, Range(ge=0, le=10_000)] = 10
    """episodes played by the evaluation policy (the script's ``act``: greedy or the mean action, or the
    evaluation epsilon) after training, and at each --eval-every (0: none; at most 10,000). Each one is a whole
    game, episode i seeded with seed + 100,000 + i: on Atari up to 27k agent steps, on MuJoCo 1,000 steps"""
    eval_envs: Annotated[int, Range(ge=1, le=256)] = 16
    """envs that play the evaluation episodes at once, one batched forward pass per step (Atari: the games step
    in one worker process per usable CPU, only the envs with an episode left stepping); an episode's return does
    not depend on it"""
    eval_every: NonNegInt = 0
    """global env steps between evaluations during training, in envs of their own (0: none)"""
    eval_only: bool = False
    """with --resume: evaluate the checkpoint's policy (eval.json, TensorBoard) and train nothing"""
    export: str = ""
    """with --resume: write the checkpoint's acting policy to this ONNX file (raw observations in; the
    deterministic action and the network's logits, Q-values or mean out; a recurrent state in and out) and train
    nothing"""
    capture_video: bool = False
    """record the first evaluation episode to {run}/videos"""
    stop_at_return: float | None = None
    """stop early once the mean return of the last episodes (20 on Atari scripts, 10 on MuJoCo ones) reaches this"""
    device: str = "auto"
    """auto (cuda if available), cpu, cuda or cuda:N"""
    compile: bool = False
    """torch.compile the acting step and the update's loss and backward (fullgraph, static shapes; CUDA graphs on a
    GPU; shared.compiling): the first iterations compile (a minute or more on a CPU), the rows then carry
    compiled_graphs and compile_s. Eager stays the reference; checkpoints load either way"""
    bf16: bool = False
    """run the networks under bfloat16 autocast: fast on recent GPUs and on CPUs with AMX or AVX512-BF16; about 10x
    slower on other CPUs (a warning says so at start)"""
    track: bool = False
    """log the run to Weights & Biases (rank 0): the config, every TensorBoard scalar, evaluation videos; --resume
    continues the same W&B run; WANDB_MODE=offline works without network (upload later with `wandb sync`)"""
    wandb_project_name: str = "rl-reference"
    """W&B project of --track"""
    wandb_entity: str = ""
    """W&B entity (team or user) of --track; empty: the logged-in user's"""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_declared(args: Any) -> None:
    """Exit 2 on the first field outside its declared ``Range``, or any float that is not finite."""
    hints = typing.get_type_hints(type(args), include_extras=True)
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            bad_args(f"{_flag(f.name)} must be a finite number, got {value}")
        for meta in getattr(hints.get(f.name), "__metadata__", ()):
            if isinstance(meta, Range) and value is not None and not meta.allows(value):
                bad_args(f"{_flag(f.name)} must be {meta}, got {value}")


def parse_args(cls: type, presets: dict[str, Any] | None = None, check: typing.Callable[[Any], None] | None = None,
               ) -> Any:
    """``tyro.cli(cls)`` with presets, one-line errors and every check (see the module docstring)."""
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
            args = tyro.cli(cls, default=default)
    except SystemExit as e:
        if e.code in (0, None):
            raise
        bad_args(_first_paragraph(captured.getvalue()))
    check_declared(args)
    check_common(args)
    if check is not None:
        check(args)
    return args


def _first_paragraph(text: str) -> str:
    """tyro's error, in one line. tyro draws a box (a terminal) or a title and dashed rules (no terminal): the
    message is the first paragraph after the title, up to a rule or a blank line."""
    lines = [ln.strip().strip("\u2502").strip() for ln in text.splitlines()]
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
    return " ".join(first) if first else "could not parse the command line (see --help)"


def check_replay_sizes(args: Any) -> None:
    """A transition replay's sizes that cannot work, exit 2: ``--buffer-size`` below the batch, the learning start
    or a few n-step windows of every env, or ``--min-steps-learn`` too small to hold a batch of valid transitions
    (an n-step window and frame history of every env are not yet sampleable). Reads ``buffer_size``,
    ``batch_size``, ``min_steps_learn``, ``num_envs`` and ``n_step_return``."""
    window = args.num_envs * (args.n_step_return + 4)
    if args.buffer_size < max(args.batch_size, args.min_steps_learn, window + args.num_envs):
        bad_args(f"--buffer-size {args.buffer_size} is smaller than --min-steps-learn or --batch-size")
    if args.min_steps_learn < args.batch_size + window:
        bad_args(f"--min-steps-learn {args.min_steps_learn} leaves fewer valid transitions than --batch-size "
                 f"{args.batch_size}")


def check_common(args: Any) -> None:
    """The checks every run needs: evaluation flags that go together, a usable seed, a writable ``--out-dir``, an
    ``--env-id`` gymnasium knows (ale-py's ids are registered first when it names an Atari game), moviepy for
    ``--capture-video``."""
    import gymnasium as gym

    from shared.atari import is_atari, register_atari

    if getattr(args, "eval_only", False) and not args.resume:
        bad_args("--eval-only evaluates a checkpoint: give the run with --resume runs/<run>")
    if getattr(args, "export", ""):
        if not args.resume:
            bad_args("--export writes a checkpoint's policy: give the run with --resume runs/<run>")
        if getattr(args, "eval_only", False):
            bad_args("--export and --eval-only: give one of them")
        if _world_size() > 1:
            bad_args("--export runs in one process, not under torchrun")
        target = Path(args.export)
        if target.is_dir() or not target.parent.is_dir():
            bad_args(f"--export {args.export}: not a file in an existing folder")
        read = Path(args.resume) / "checkpoint.pt" if Path(args.resume).is_dir() else Path(args.resume)
        if target.resolve() == read.resolve():
            bad_args(f"--export {args.export}: that is the checkpoint it exports from")
    if (getattr(args, "eval_only", False) or getattr(args, "eval_every", 0)) and args.eval_episodes <= 0:
        bad_args("--eval-only and --eval-every need --eval-episodes of at least 1")
    if not 0 <= args.seed < 2**31:  # numpy seeds are below 2**32, and the scripts add offsets to this one
        bad_args(f"--seed must be in [0, 2**31), got {args.seed}")
    if getattr(args, "save_replay", False) and _world_size() > 1:
        bad_args("--save-replay is not supported under torchrun yet (each rank keeps its own replay)")
    if not args.resume:
        try:  # the run folder goes there: find out now rather than after the envs started
            Path(args.out_dir).mkdir(parents=True, exist_ok=True)
            probe = Path(args.out_dir) / f".write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as e:
            bad_args(f"--out-dir {args.out_dir}: cannot create a run folder there ({e.strerror or e})")
    if args.env_id not in gym.registry and is_atari(args.env_id):
        register_atari()
    module, _, env_name = args.env_id.rpartition(":")  # gymnasium's "module:EnvId": the module registers it
    if module:
        try:
            importlib.import_module(module)
        except ImportError as e:
            bad_args(f"--env-id {args.env_id}: cannot import {module} ({e})")
    if env_name not in gym.registry:
        bad_args(f"--env-id {args.env_id!r} is not a registered gymnasium environment (a custom env must be "
                 f"registered when the script is imported, or named as module:EnvId)")
    entry = str(gym.spec(env_name).entry_point or "")
    if not is_atari(args.env_id) and "ale_py" in entry:
        bad_args(f"--env-id {args.env_id}: use the *NoFrameskip-v4 Atari ids, which get the papers' preprocessing")
    if getattr(args, "capture_video", False):
        try:
            import moviepy  # noqa: F401
        except ImportError:
            bad_args("--capture-video needs moviepy (pip install -r requirements.txt)")


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))  # torchrun's, read before the process group exists


def resolve_device(spec: str, bf16: bool = False):
    """``auto`` (cuda if available), ``cpu``, ``cuda`` or ``cuda:N``; bad or unavailable devices exit 2. Under
    torchrun ``auto``/``cuda`` is ``cuda:LOCAL_RANK``. With ``bf16`` where it is not native (a CPU without
    AVX512-BF16 or AMX, a GPU older than compute capability 8.0), one warning line: the run goes on, slower."""
    import torch

    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", _world_size()))
    try:
        device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if spec == "auto" else spec)
    except RuntimeError:
        bad_args(f"--device {spec!r} is not a device (auto, cpu, cuda, cuda:N)")
    if device.type not in ("cpu", "cuda"):
        bad_args(f"--device {spec!r}: only auto, cpu, cuda and cuda:N are supported")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            bad_args(f"--device {spec}: CUDA is not available on this machine")
        if device.index is not None and local_ranks > 1:
            bad_args(f"--device {spec}: {local_ranks} ranks on this machine would share one GPU; give --device cuda "
                     f"(each rank takes the GPU of its local rank)")
        if device.index is None and _world_size() > 1:
            if local_ranks > torch.cuda.device_count():
                bad_args(f"--nproc-per-node {local_ranks} is more than the {torch.cuda.device_count()} GPU(s) here")
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if device.index is not None and device.index >= torch.cuda.device_count():
            bad_args(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here")
    if device.type == "cuda":
        # A plain "cuda" names the current GPU; with its index it can be made current (set_device refuses it bare).
        device = torch.device("cuda", torch.cuda.current_device()) if device.index is None else device
        # Every CUDA call that names no device (autocast's bf16 check, events, pinned memory) means this one.
        torch.cuda.set_device(device)
    if bf16 and ((device.type == "cpu" and not cpu_has_bf16())
                 or (device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0))):
        what = "a CPU without AVX512-BF16 or AMX" if device.type == "cpu" else "a GPU older than Ampere (sm_80)"
        print(f"warning: --bf16 on {what}: bfloat16 is emulated there, expect it slower than fp32", file=sys.stderr,
              flush=True)
    return device
