"""The checks a run makes before anything starts (``shared.run.Run``'s construction and ``Run.allocating``).

Guarantees
- ``check_run(args, script, make_env, ...)`` resolves ``--device``, reads the ``--resume`` checkpoint and what its
  flags changed, names the run folder, probes one env for its spaces and checks the action space (a ``Box``
  with ``bounded``: finite bounds), refuses a ``Dict`` observation space unless ``dict_obs``, and refuses an
  on-policy rollout (``iteration_steps``) whose observations alone exceed the memory left (twice over for the
  async sampler's double buffer). Every problem exits 2 with one line (``shared.cli.bad_args``). It creates
  nothing on disk and changes no global state: it returns what it found as a ``Checked``, which also words
  what ``--resume`` found (``resume_line``, ``resume_record``: the line a resumed run says, what its config
  records).
- ``allocation_refusal(error, args, flags)`` says in one line what an allocation this machine refused needed
  and what is left (the replay's own check, numpy's or torch's refusal, CUDA out of memory), naming ``flags``
  with their values: the line ``Run.allocating`` exits 2 with. None for an error that is no allocation's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shared import checkpoint
from shared.buffer import NotEnoughMemory, available_memory, check_fits
from shared.cli import bad_args, resolve_device, resume_changes
from shared.envs import probe_spaces

__all__ = ["Checked", "allocation_refusal", "check_run"]


@dataclass(frozen=True)
class Checked:
    """What ``check_run`` found: the run's device, folder, spaces and, on ``--resume``, the checkpoint."""

    device: Any
    path: Path  # the run folder (the checkpoint's on --resume); not created here
    obs_space: Any
    act_space: Any
    resumed: dict | None = None  # the checkpoint's state on --resume
    resume: str = ""  # --resume as given
    recorded: bool = False  # --resume: the run folder recorded its flags
    changes: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # --resume: flag -> (recorded, given)

    def resume_line(self) -> str:
        """A resumed run's second line: whose flags it runs with, and which were changed."""
        changed = ", ".join(f"{'--' + k.replace('_', '-')} {was!r} -> {now!r}" for k, (was, now) in self.changes.items())
        recorded = "its recorded flags" if self.recorded else "the flags given (the run records none)"
        return f"resumed with {recorded}; changed here: {changed or 'none'}"

    def resume_record(self) -> dict[str, Any]:
        """What a resumed run's config records under ``resumed``: which flags came from the run, which were changed."""
        changed = {k: list(v) for k, v in self.changes.items()}
        return {"from": self.resume, "recorded_flags": self.recorded, "changed": changed}


def check_run(
    args: Any,
    script: str,
    make_env: Callable,
    action_space: type | None = None,
    bounded: bool = False,
    iteration_steps: int | None = None,
    dict_obs: bool = False,
) -> Checked:
    """Every check ``Run(...)`` makes (see the module docstring); ``script`` is the script's name."""
    import gymnasium as gym

    device = resolve_device(args.device, getattr(args, "bf16", False))
    resumed, ckpt_file = checkpoint.load(args.resume, args.env_id) if args.resume else (None, None)
    changes = resume_changes(args)  # None: the run folder recorded no flags, or a new run
    path = (
        ckpt_file.parent
        if ckpt_file is not None
        else Path(args.out_dir) / (args.run_name or f"{args.env_id}__{script}__{args.seed}__{int(time.time())}")
    )
    try:
        obs_space, act_space = probe_spaces(make_env(args))
    except (ValueError, IndexError) as e:
        bad_args(f"--env-id {args.env_id}: {e}")
    if action_space is not None:
        box = isinstance(act_space, gym.spaces.Box)
        if not isinstance(act_space, action_space) or (
            bounded and box and not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high)))
        ):
            kind = (
                "discrete (Discrete)"
                if action_space is gym.spaces.Discrete
                else f"{'bounded ' if bounded else ''}continuous (Box)"
            )
            bad_args(f"--env-id {args.env_id}: {script} needs a {kind} action space, got {act_space}")
    if isinstance(obs_space, gym.spaces.Dict) and not dict_obs:
        bad_args(
            f"--env-id {args.env_id}: {script} needs a Box observation space, got a Dict "
            f"({', '.join(obs_space.spaces)}); docs/contract.md (Dict observations) names the scripts that take one"
        )
    if iteration_steps:  # the rollout's observations alone, before a network or a sampler is made
        copies = 2 if args.sampler == "async" else 1  # the async double buffer's two slots
        obs_bytes = sum(int(np.prod(space.shape)) * np.dtype(space.dtype).itemsize for space in _stored(obs_space))
        try:
            check_fits(copies * iteration_steps * obs_bytes, f"a rollout of {iteration_steps} steps")
        except NotEnoughMemory as e:
            bad_args(f"--num-envs {args.num_envs} x --num-steps {args.num_steps}: {e}")
    return Checked(device, path, obs_space, act_space, resumed, str(args.resume or ""), changes is not None, changes or {})


def _stored(space: Any) -> list:
    """The Box and Discrete spaces of an observation space (a Dict's entries, by key), the ones a rollout stores."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Dict):
        return [leaf for sub in space.spaces.values() for leaf in _stored(sub)]
    return [space] if isinstance(space, (gym.spaces.Box, gym.spaces.Discrete)) else []


def allocation_refusal(error: BaseException, args: Any, flags: tuple[str, ...]) -> str | None:
    """The line for a refused allocation, naming ``flags`` (see the module docstring); None for other errors."""
    refused = _refused_allocation(error)
    if refused is None:
        return None
    named = ", ".join(f"--{f.replace('_', '-')} {getattr(args, f)}" for f in flags)
    return f"{named}: {refused}" if named else refused


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
