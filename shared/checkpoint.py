"""Checkpoints: what a run writes to continue later, and how ``--resume`` reads it back.

Guarantees
- ``load(path, env_id)`` reads ``checkpoint.pt`` (or the one inside a run folder) with ``weights_only=True``; a
  missing or unreadable file, or one written for another env, exits 2 with one line.
- ``save(path, state)`` writes atomically (``shared.files``): an interruption or a full disk leaves the previous
  checkpoint intact. Every tensor is moved to the CPU first, so a plain ``torch.load(path, weights_only=True)``
  reads a checkpoint written on a GPU on a machine without one. The state holds tensors and plain values only.
- ``restore(resumed, objects, args, script)`` loads each named object's state (``load_state_dict``; a
  ``torch.Generator``'s ``set_state``; a tensor's ``copy_``); a checkpoint whose tensors do not fit exits 2
  naming the script that wrote it or the flags that differ (``resume_mismatch``). A generator saved on another
  kind of device (a CUDA run's Philox state resumed on a CPU, or the reverse: states of another size) is reseeded
  from a hash of the saved state, with one warning line: the run goes on, deterministically, with other draws
  than it would have made. ``state_of(objects)`` is the inverse, for ``save``; an optimiser's learning rate is
  saved as a number and not ``capturable`` (``portable``), as a ``--compile`` run on a GPU leaves neither.
- ``save_run(folder, state, replay, lost_sampler)`` is a run's checkpoint: ``replay.npz`` first when a replay is
  given (its cursor then recorded in the state), then ``checkpoint.pt`` (``save``). A replay whose write fails
  because the sampler process sharing it failed (a ``WriteError`` caused by one of ``lost_sampler``: its rows
  may be half written) is left out with one warning line; the checkpoint then names no replay, so a resume
  starts with an empty one.
- ``--save-replay``: ``save_replay`` writes the buffer as plain arrays (``replay.npz``) before the checkpoint
  that records its cursor; ``restore_replay`` restores it only when it is that checkpoint's, ends its episodes
  as a time limit would (the envs start afresh) and says so; a missing or stale replay gives one warning.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from shared.cli import bad_args
from shared.files import WriteError, atomic_write
from shared.namedarraytuple import replace_leaves, walk_structure

__all__ = [
    "RUN_FLAGS",
    "Start",
    "load",
    "portable",
    "restore",
    "restore_replay",
    "resume_mismatch",
    "save",
    "save_replay",
    "save_run",
    "state_of",
]

# Flags that change nothing the checkpoint holds: left out when naming the flags a mismatch may come from.
RUN_FLAGS = {
    "preset",
    "resume",
    "out_dir",
    "run_name",
    "total_timesteps",
    "checkpoint_every",
    "checkpoint_minutes",
    "log_every",
    "eval_episodes",
    "eval_epsilon",
    "capture_video",
    "stop_at_return",
    "sampler",
    "device",
    "seed",
    "max_lag_steps",
    "eval_every",
    "eval_only",
    "save_replay",
}


@dataclass(frozen=True)
class Start:
    """Where a run starts: the checkpoint's counters (0 for a new run) and whether its replay came with it."""

    global_step: int = 0
    updates: int = 0
    replay_restored: bool = False

    @property
    def replay_origin(self) -> tuple[int, int]:
        """(global step, updates) from which the replay refills before learning resumes: where this process
        starts, or (0, 0) when the replay was restored (it holds what it held)."""
        return (0, 0) if self.replay_restored else (self.global_step, self.updates)


def load(path: str | os.PathLike, env_id: str) -> tuple[dict, Path]:
    """The checkpoint's state and its file (see the module docstring)."""
    import torch

    p = Path(path)
    if p.is_dir():
        p = p / "checkpoint.pt"
    if not p.is_file():
        bad_args(f"--resume {path}: no checkpoint there")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # torch's weights_only refusal is a page of advice: its reason is the line that counts
        lines = [ln.strip() for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines() if ln.strip()] or [""]
        reason = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("WeightsUnpickler error:")), lines[0])
        bad_args(f"--resume {path}: not a checkpoint these scripts wrote ({type(e).__name__}: {reason.split('. ')[0][:200]})")
    if not isinstance(state, dict) or not isinstance(state.get("args"), dict) or "global_step" not in state:
        bad_args(f"--resume {path}: not a checkpoint these scripts wrote (no args and global_step in it)")
    if state["args"].get("env_id") != env_id:
        bad_args(f"--resume: checkpoint is for {state['args']['env_id']}, not {env_id}")
    return state, p


def state_of(objects: dict[str, Any]) -> dict[str, Any]:
    """Each object's state by its name: modules and optimizers (``state_dict``), generators, lone tensors."""
    import torch

    out = {}
    for name, obj in objects.items():
        if isinstance(obj, torch.Generator):
            out[name] = obj.get_state()
        elif isinstance(obj, torch.Tensor):
            out[name] = obj.detach()
        elif isinstance(obj, torch.optim.Optimizer):
            out[name] = portable(obj.state_dict())
        else:
            out[name] = obj.state_dict()
    return out


def portable(optimizer_state: dict) -> dict:
    """An optimiser's state as an eager run on any device loads it: a learning rate that a CUDA graph made a device
    tensor (``shared.compiling``) saved as a number, not ``capturable`` (which a CPU optimiser refuses)."""
    groups = [
        {**g, "lr": float(g["lr"]), "capturable": False} if "capturable" in g else {**g, "lr": float(g["lr"])}
        for g in optimizer_state["param_groups"]
    ]
    return {**optimizer_state, "param_groups": groups}


def restore(resumed: dict, objects: dict[str, Any], args: Any, script: str) -> None:
    """Load each object's state from ``resumed``; exit 2 when they do not fit."""
    import torch

    try:
        for name, obj in objects.items():
            if isinstance(obj, torch.Generator):
                restore_generator(name, obj, resumed[name])
            elif isinstance(obj, torch.Tensor):
                with torch.no_grad():
                    obj.copy_(resumed[name])
            else:
                obj.load_state_dict(resumed[name])
    except (RuntimeError, KeyError, ValueError) as e:  # tensors of another shape or another script
        resume_mismatch(resumed, args, script, e)


def restore_generator(name: str, generator: Any, state: Any) -> None:
    """``generator.set_state(state)``, or, for a state saved on another kind of device, a seed from its hash."""
    import hashlib

    if state.numel() == generator.get_state().numel():
        generator.set_state(state)
        return
    seed = int.from_bytes(hashlib.sha256(state.numpy().tobytes()).digest()[:8], "little")
    generator.manual_seed(seed)
    print(
        f"warning: --resume: the generator {name!r} was saved on another kind of device than "
        f"{generator.device.type}; reseeded from its state, the run goes on with other random draws",
        file=sys.stderr,
        flush=True,
    )


def resume_mismatch(resumed: dict, args: Any, script: str, error: Exception) -> NoReturn:
    """Exit 2 with one line when a checkpoint's tensors do not fit the networks built from ``args``: naming the
    script that wrote it when it is another, else the flags that differ from the checkpoint's."""
    theirs = resumed.get("script", "an older version of a script")
    if theirs != script and set(resumed["args"]) != set(vars(args)):
        bad_args(f"--resume: the checkpoint was written by {theirs}, not {script}")
    changed = [
        f"--{k.replace('_', '-')} ({v!r} there, {vars(args)[k]!r} here)"
        for k, v in resumed["args"].items()
        if k in vars(args) and k not in RUN_FLAGS and vars(args)[k] != v
    ]
    reason = str(error).strip().splitlines()[0][:160]
    bad_args(
        f"--resume: the checkpoint (written by {theirs}) does not fit the networks these flags build; flags that "
        f"differ from its: {', '.join(changed) or 'none'} ({type(error).__name__}: {reason})"
    )


def save(path: Path, state: dict) -> None:
    """Write ``state`` atomically, every tensor on the CPU."""
    import torch

    # state dicts nest dicts and lists (an optimizer's param_groups)
    on_cpu = {path: x.detach().cpu() for path, x in walk_structure(state) if isinstance(x, torch.Tensor)}
    state = replace_leaves(state, on_cpu)
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def save_run(folder: Path, state: dict, replay: Any = None, lost_sampler: tuple[type[BaseException], ...] = ()) -> None:
    """A run's checkpoint in ``folder``, after its replay when one is given (see the module docstring)."""
    if replay is not None:  # first the replay, then the checkpoint that names its cursor
        try:
            save_replay(folder / "replay.npz", replay)
            state = {**state, "replay_cursor": replay.cursor}
        except WriteError as e:
            if not isinstance(e.__cause__, lost_sampler):
                raise
            print(
                f"warning: --save-replay: the replay is not saved, the sampler process that shares it "
                f"failed ({type(e.__cause__).__name__}); the checkpoint is written without it",
                file=sys.stderr,
                flush=True,
            )
    save(folder / "checkpoint.pt", state)


def save_replay(path: Path, buffer: Any) -> None:
    atomic_write(path, buffer.save)


def restore_replay(path: Path, buffer: Any, resumed: dict) -> bool:
    """Restore ``buffer`` from ``path`` if it is the checkpoint's (see the module docstring); True if restored."""
    if not path.is_file() or "replay_cursor" not in resumed:
        print(
            f"warning: --save-replay: no replay saved with the checkpoint in {path.parent}: starting with an empty replay",
            file=sys.stderr,
            flush=True,
        )
        return False
    try:
        with np.load(path, allow_pickle=False) as f:
            rows = int(f["state"][0])  # the cursor
        if rows != int(resumed["replay_cursor"]):
            print(
                f"warning: --save-replay: {path} is not the checkpoint's (rows {rows}, the checkpoint's "
                f"{resumed['replay_cursor']}): starting with an empty replay",
                file=sys.stderr,
                flush=True,
            )
            return False
        buffer.load(path)
    except (ValueError, OSError, KeyError) as e:
        bad_args(f"--save-replay: cannot restore {path}: {e}")
    buffer.end_episodes()
    print(f"restored the replay: {len(buffer)} samples", flush=True)
    return True
