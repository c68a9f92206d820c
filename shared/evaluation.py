"""Evaluation: whole episodes played by a script's act function, without changing the training run.

Guarantees
- ``play(env, act, episodes, seed, video_dir)`` plays ``episodes`` whole episodes in ``env`` (reset with seeds
  ``seed + 100_000 + i``), the actions from ``act(obs, last_reward)`` (``last_reward`` is None on an episode's
  first step, so a recurrent policy knows to start afresh; an ``act`` with a ``mask`` parameter also gets the
  env's ``info["action_mask"]`` where it gives one), closes ``env`` and returns the returns in episode order.
  With ``video_dir`` (``env`` made with ``render_mode="rgb_array"``) the first episode is recorded there.
- Training is not changed by it: torch's random state (CPU and CUDA) is restored afterwards and the env is the
  evaluation's own.
- In a torchrun job still in lockstep, rank r plays episodes r, r + ranks, ... and every rank returns all of
  them (gathered with a timeout for slow work: the ranks' episodes take different times); after the loop only
  the caller that asks plays, alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared import distributed

__all__ = ["play"]


def play(env: Any, act: Callable[[Any, float | None], Any], episodes: int, seed: int,
         video_dir: Path | None = None) -> list[float]:
    """The returns of ``episodes`` evaluation episodes (see the module docstring)."""
    import gymnasium as gym
    import torch

    lockstep = distributed.in_lockstep()
    mine = range(distributed.rank(), episodes, distributed.world_size()) if lockstep else range(episodes)
    if video_dir is not None:
        env = gym.wrappers.RecordVideo(env, str(video_dir), episode_trigger=lambda i: i == 0, disable_logger=True)
    played = []
    takes_mask = "mask" in inspect.signature(act).parameters
    cuda = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []  # this rank's GPU only
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=cuda):
            for ep in mine:
                obs, info = env.reset(seed=seed + 100_000 + ep)
                done, total, reward = False, 0.0, None
                while not done:
                    # the env's valid actions, to a policy that takes them (the policy-gradient scripts')
                    mask = {"mask": info["action_mask"]} if takes_mask and "action_mask" in info else {}
                    obs, reward, term, trunc, info = env.step(act(obs, reward, **mask))
                    total += float(reward)
                    done = term or trunc
                played.append((ep, total))
    finally:
        env.close()
    return [r for _, r in sorted(sum(distributed.gather_objects(played, slow=True), []))]
