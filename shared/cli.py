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
- ``--resume RUN`` starts from the flags RUN last trained with (``args`` of its newest ``config.json`` or
  ``config.resume-N.json``; ``recorded_flags``): they are the defaults, a flag given overrides one. A flag in
  ``RESUME_MAY_CHANGE`` (how long, where and how the run runs, logs, checkpoints and evaluates) may differ from the
  recorded value; any other that differs (the env, the network, the algorithm's settings, the seed, the preset)
  exits 2 naming the flag, the recorded and the given value, before anything is written. ``resume_changes(args)``
  lists the flags that differ, for the banner and the resumed run's config. A run folder with no recorded flags
  (made before they were recorded) resumes with the flags given, as before, after one line saying so.
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
import json
import math
import os
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

from shared import distributed
from shared.argtypes import NonNegFloat, NonNegInt, Range
from shared.files import nearest_existing, probe_creatable
from shared.precision import cpu_has_bf16

__all__ = [
    "RESUME_MAY_CHANGE",
    "RunArgs",
    "bad_args",
    "check_common",
    "check_replay_sizes",
    "parse_args",
    "recorded_flags",
    "resolve_device",
    "resume_changes",
]

EXIT_BAD_ARGS = 2

# The flags a resumed run (training, --eval-only or --export) may change: how long it trains, where and on what it
# runs, how it samples (the same algorithm in every mode), logs, checkpoints and evaluates. Every other flag is the
# run's own: the env, the networks, the replay, the algorithm's settings, the seed and the preset.
RESUME_MAY_CHANGE = frozenset(
    {
        "resume",
        "out_dir",
        "run_name",
        "total_timesteps",
        "log_every",
        "checkpoint_every",
        "checkpoint_minutes",
        "eval_episodes",
        "eval_envs",
        "eval_every",
        "eval_epsilon",
        "eval_only",
        "export",
        "capture_video",
        "stop_at_return",
        "device",
        "sampler",
        "max_lag_steps",
        "compile",
        "bf16",
        "save_replay",
        "track",
        "wandb_project_name",
        "wandb_entity",
    }
)


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
    in one worker process per usable CPU, only the envs with an episode left stepping); every M plays the same
    episodes (seeds, random draws), but a batch of another size may round the network's output differently in the
    last bits: continuous-action returns then differ by about 1e-5, a greedy action only where two values tie"""
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
    """torch.compile the acting step and the losses (fullgraph, static shapes), and on a GPU each whole update and acting
    step one CUDA graph (shared.compiling): the first iterations compile (a minute or more on a CPU), the rows then
    carry compiled_graphs and compile_s (cuda_graphs on a GPU). Eager stays the reference; checkpoints load either way"""
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


def parse_args(cls: type, presets: dict[str, Any] | None = None, check: typing.Callable[[Any], None] | None = None) -> Any:
    """``tyro.cli(cls)`` with presets, a resumed run's recorded flags, one-line errors and every check (see the
    module docstring)."""
    import tyro

    argv = sys.argv[1:]
    presets = presets or {}
    resume = _given(argv, "--resume")
    config = _recorded_config(resume) if resume else None
    recorded = None if config is None else config["args"]
    if recorded is not None:  # the run's own flags are the defaults; the preset is among them
        script = Path(getattr(sys.modules.get(cls.__module__), "__file__", None) or "?").stem
        theirs = config.get("script", script)
        if theirs != script and set(recorded) != {f.name for f in dataclasses.fields(cls)}:  # not a copy of this one
            bad_args(f"--resume {resume}: the checkpoint was written by {theirs}, not {script}")
        if "--eval-only" in argv and not recorded.get("eval_episodes"):  # trained without a final evaluation
            recorded = {**recorded, "eval_episodes": RunArgs.eval_episodes}
        default = _defaults_from(cls, presets, recorded)
    else:
        if resume and Path(resume).exists():
            print(
                f"note: --resume {resume}: the run folder records no flags (it was made before they were): the "
                f"flags given here are used, so give the ones it was started with",
                file=sys.stderr,
                flush=True,
            )
        default = presets.get(_given(argv, "--preset") or next(iter(presets), ""))  # an unknown name: tyro says
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = tyro.cli(cls, default=default)
    except SystemExit as e:
        if e.code in (0, None):
            raise
        bad_args(_first_paragraph(captured.getvalue()))
    if recorded is not None:
        for name, (was, now) in resume_changes(args).items():
            if name not in RESUME_MAY_CHANGE:
                bad_args(
                    f"--resume {resume}: {_flag(name)} is the run's own setting ({was!r} there, {now!r} given); "
                    f"a resumed run may change only how long, where and how it runs, logs and evaluates "
                    f"(docs/contract.md)"
                )
    check_declared(args)
    check_common(args)
    if check is not None:
        check(args)
    return args


# What a command does with the run, not a setting of it: never reported as a change (the run folder is --resume's).
_WHAT_TO_DO = {"resume", "out_dir", "run_name", "eval_only", "export"}


def _given(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` on the command line (``--flag V`` or ``--flag=V``; the last one), else None."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def recorded_flags(resume: str) -> dict[str, Any] | None:
    """The flags the run at ``resume`` (its folder or checkpoint file) last trained with, as its newest config file
    records them (``config.resume-N.json`` of the latest resume, else ``config.json``); None when it records none
    (a folder made before they were recorded, or no folder there: ``--resume`` then says what is missing)."""
    config = _recorded_config(resume)
    return None if config is None else config["args"]


def _recorded_config(resume: str) -> dict[str, Any] | None:
    folder = Path(resume) if Path(resume).is_dir() else Path(resume).parent
    step = lambda p: int(p.stem.rsplit("-", 1)[1]) if p.stem.rsplit("-", 1)[1].isdigit() else -1
    for file in [*sorted(folder.glob("config.resume-*.json"), key=step, reverse=True), folder / "config.json"]:
        try:
            config = json.loads(file.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and isinstance(config.get("args"), dict):
            return config
    return None


def _defaults_from(cls: type, presets: dict[str, Any], recorded: dict[str, Any]) -> Any:
    """An instance of ``cls`` holding the recorded flags, on top of the recorded preset (or the defaults) for a
    flag the run did not record (one added since); a recorded flag this script does not have is named and left."""
    base = presets.get(recorded.get("preset")) or next(iter(presets.values()), None) or cls()
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(recorded) - names)
    if unknown:
        print(
            f"warning: --resume: the run records flags this script does not have, left out: {', '.join(map(_flag, unknown))}",
            file=sys.stderr,
            flush=True,
        )
    values = {}
    for name in names & set(recorded):
        value = recorded[name]  # JSON: a tuple was written as a list
        values[name] = tuple(value) if isinstance(getattr(base, name), tuple) and isinstance(value, list) else value
    return dataclasses.replace(base, **values)


def resume_changes(args: Any) -> dict[str, tuple[Any, Any]] | None:
    """The settings of ``args`` whose value differs from the run ``args.resume`` recorded: name -> (recorded, now);
    ``--resume``, ``--eval-only``, ``--export`` and the run folder's flags are what the command does, not settings.
    None for a new run and for a run that records no flags. Compared as JSON holds them (a tuple as a list)."""
    recorded = recorded_flags(args.resume) if getattr(args, "resume", "") else None
    if recorded is None:
        return None
    now = json.loads(json.dumps(dataclasses.asdict(args), default=str))
    return {k: (recorded[k], v) for k, v in now.items() if k in recorded and recorded[k] != v and k not in _WHAT_TO_DO}


def _first_paragraph(text: str) -> str:
    """tyro's error, in one line. tyro draws a box (a terminal) or a title and dashed rules (no terminal): the
    message is the first paragraph after the title, up to a rule or a blank line."""
    lines = [ln.strip().strip("\u2502").strip() for ln in text.splitlines()]
    rule = lambda ln: ln.startswith(("\u256d", "\u2570", "\u2500")) or (len(ln) > 8 and set(ln) == {"-"})
    if any(set(ln) == {"-"} for ln in lines):  # plain text: skip the title, up to the first rule
        lines = lines[next(i for i, ln in enumerate(lines) if rule(ln)) :]
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
        bad_args(
            f"--min-steps-learn {args.min_steps_learn} leaves fewer valid transitions than --batch-size {args.batch_size}"
        )


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
        if distributed.world_size() > 1:
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
    if getattr(args, "save_replay", False) and distributed.world_size() > 1:
        bad_args("--save-replay is not supported under torchrun yet (each rank keeps its own replay)")
    if not args.resume:
        try:  # the run folder goes there: find out now rather than after the envs started, leaving nothing behind
            probe_creatable(nearest_existing(Path(args.out_dir)))
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
        bad_args(
            f"--env-id {args.env_id!r} is not a registered gymnasium environment (a custom env must be "
            f"registered when the script is imported, or named as module:EnvId)"
        )
    entry = str(gym.spec(env_name).entry_point or "")
    if not is_atari(args.env_id) and "ale_py" in entry:
        bad_args(f"--env-id {args.env_id}: use the *NoFrameskip-v4 Atari ids, which get the papers' preprocessing")
    if getattr(args, "capture_video", False):
        try:
            import moviepy  # noqa: F401
        except ImportError:
            bad_args("--capture-video needs moviepy (pip install -r requirements.txt)")


def resolve_device(spec: str, bf16: bool = False):
    """``auto`` (cuda if available), ``cpu``, ``cuda`` or ``cuda:N``; bad or unavailable devices exit 2. Under
    torchrun ``auto``/``cuda`` is ``cuda:LOCAL_RANK``. With ``bf16`` where it is not native (a CPU without
    AVX512-BF16 or AMX, a GPU older than compute capability 8.0), one warning line: the run goes on, slower."""
    import torch

    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", distributed.world_size()))
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
            bad_args(
                f"--device {spec}: {local_ranks} ranks on this machine would share one GPU; give --device cuda "
                f"(each rank takes the GPU of its local rank)"
            )
        if device.index is None and distributed.world_size() > 1:
            if local_ranks > torch.cuda.device_count():
                bad_args(f"--nproc-per-node {local_ranks} is more than the {torch.cuda.device_count()} GPU(s) here")
            device = torch.device("cuda", distributed.local_rank())
        if device.index is not None and device.index >= torch.cuda.device_count():
            bad_args(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) here")
    if device.type == "cuda":
        # A plain "cuda" names the current GPU; with its index it can be made current (set_device refuses it bare).
        device = torch.device("cuda", torch.cuda.current_device()) if device.index is None else device
        # Every CUDA call that names no device (autocast's bf16 check, events, pinned memory) means this one.
        torch.cuda.set_device(device)
    if bf16 and (
        (device.type == "cpu" and not cpu_has_bf16())
        or (device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0))
    ):
        what = "a CPU without AVX512-BF16 or AMX" if device.type == "cpu" else "a GPU older than Ampere (sm_80)"
        print(
            f"warning: --bf16 on {what}: bfloat16 is emulated there, expect it slower than fp32", file=sys.stderr, flush=True
        )
    return device
