"""Vector environments for the sampling modes, and the checks a network needs of an observation space.

Guarantees
- ``make_envs(args, make_env, mode)``: ``args.num_envs`` envs of the script's ``make_env(args)`` in a
  ``vector_env``, in every mode: a wrapper added there reaches serial, parallel and async sampling. One shortcut,
  taken only when it steps the same games: an Atari id in ``parallel`` mode whose ``make_env`` gives exactly
  ``shared.atari.make_atari_env(args.env_id, args.noop_max, args.sticky_actions)`` (same wrappers, same
  ``EnvSpec``: ids, arguments, wrapper arguments) is stepped in ale-py's own threads (``n_threads``); any other
  ``make_env`` is stepped as written, in worker processes, and a line says so.
- ``vector_env(thunks, mode)``: ``serial`` steps the envs in this process (``SyncVectorEnv``); ``parallel``
  steps each in a ``spawn``ed worker process (``AsyncVectorEnv``). Both use next-step autoreset: the step after
  an episode ends only resets that env and returns the first observation of the next episode. ``parallel``'s
  workers keep SIGINT blocked from their start: a Ctrl-C is their parent's to act on (``close_envs``); one that
  comes while they start ends them before it reaches the caller.
  A custom env id must be registered when its module is imported (``gym.register`` at the top of the script or
  of a module it imports): spawned workers and the async sampler import the script again and nothing else.
- ``close_envs(envs)`` never hangs: an ``AsyncVectorEnv`` interrupted inside ``step`` gets a timeout, then its
  workers are terminated; gymnasium's warning that it was closed mid-step (what a Ctrl-C does) is not shown.
- ``probe_spaces(thunk)`` returns one env's (observation space, action space) and closes it.
- ``image_shape(obs_shape)`` returns ``(C, H, W)`` for an image observation given channel-first ``[C, H, W]``
  or channel-last ``[H, W, C]`` (the scripts' CNNs take both), and raises ``ValueError`` with a readable
  reason when the Nature CNN cannot take it (smaller than 36x36 pixels).
- ``action_mask(info, final_row, n_actions)``: the valid actions ``[n_envs, n_actions]`` (bool) for the envs'
  next step, from ``info["action_mask"]`` as the envs' ``reset`` and ``step`` give it (a bool per action:
  MaskablePPO's and PettingZoo's masks, passed through ``info``); every action where an env gives none and on a
  final row (its action is ignored: it only resets the env). A mask that allows no action raises ValueError
  naming the env. Without any mask in ``info`` it is one read-only array of True, the same at every call.
- ``EpisodeTally(n_envs).step(reward, counted, ended)``: each env's running return (float64) and length; returns
  ``[(return, length)]`` of the envs whose episode ended at this step, in env order, and starts their tallies again.
  A step with ``counted`` False (a final row that only resets the env) adds its reward but not to the length.
- ``observe_only(env, indices)``: ``env`` whose observations are only the given entries of its ``Box`` (the memory
  tasks: CartPole without velocities); ``ValueError`` with a readable reason when they do not fit (``env`` is
  closed then).
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.async_vector_env import AsyncState

from shared import distributed, signals
from shared.atari import is_atari, make_atari_env, make_atari_vector_env

__all__ = [
    "MIN_IMAGE_SIDE",
    "EpisodeTally",
    "action_mask",
    "close_envs",
    "image_shape",
    "make_envs",
    "observe_only",
    "probe_spaces",
    "replay_frame_stack",
    "standard_atari",
    "vector_env",
]

MIN_IMAGE_SIDE = 36  # the Nature CNN's three convolutions (8/4, 4/2, 3/1) need at least this many pixels a side


def make_envs(
    args: Any, make_env: Callable[..., Callable[[], gym.Env]], mode: str, n_threads: int = 1
) -> gym.vector.VectorEnv:
    """[B] envs of ``make_env(args)``: serial in this process; parallel in worker processes, or in ale-py's
    threads for the unchanged Atari env (see the module docstring)."""
    if mode == "parallel" and is_atari(args.env_id):
        if standard_atari(args, make_env):
            return make_atari_vector_env(args.env_id, args.num_envs, n_threads, args.noop_max, args.sticky_actions)
        print(
            f"make_env changes the Atari env of shared/atari.py: its {args.num_envs} envs step in worker "
            "processes, not in ale-py's threads",
            flush=True,
        )
    return vector_env([make_env(args) for _ in range(args.num_envs)], mode)


def replay_frame_stack(args: Any, make_env: Callable[..., Callable[[], gym.Env]], obs_space: gym.Space) -> int:
    """The ``frame_stack`` a replay of ``args.buffer_size`` rows stores ``make_env``'s observations with: the stack's
    depth (each frame stored once) only for the standard Atari env, whose stacks are exactly its frames shifted one a
    step; else 1, whole observations, with one printed line for a changed Atari env (a wrapper that reorders or
    transforms the stack would otherwise be stored as frames it never gave)."""
    if not is_atari(args.env_id):
        return 1
    if standard_atari(args, make_env):
        return obs_space.shape[0]
    whole = args.buffer_size * int(np.prod(obs_space.shape)) * np.dtype(obs_space.dtype).itemsize
    if distributed.rank() == 0:
        print(
            f"make_env changes the Atari env of shared/atari.py: the replay stores whole observations "
            f"{list(obs_space.shape)}, not frames: {whole / 1e9:.2f} GB for --buffer-size {args.buffer_size} (frames: "
            f"{whole / obs_space.shape[0] / 1e9:.2f} GB), on each rank",
            flush=True,
        )
    return 1


def standard_atari(args: Any, make_env: Callable[..., Callable[[], gym.Env]]) -> bool:
    """True when ``make_env(args)`` makes exactly the Atari env that ale-py's vector env reproduces: the same
    wrapper chain and the same ``EnvSpec`` (a wrapper that records no spec counts as a change)."""
    mine, standard = make_env(args)(), make_atari_env(args.env_id, args.noop_max, args.sticky_actions)
    try:
        return str(mine) == str(standard) and mine.spec == standard.spec
    except Exception:  # a wrapper whose spec cannot be read: not the standard env
        return False
    finally:
        mine.close()
        standard.close()


def vector_env(thunks: list[Callable[[], gym.Env]], mode: str) -> gym.vector.VectorEnv:
    next_step = gym.vector.AutoresetMode.NEXT_STEP
    if mode != "parallel":
        return gym.vector.SyncVectorEnv(thunks, autoreset_mode=next_step)
    # gymnasium's workers import the script (spawn) before a line of gymnasium runs there: a Ctrl-C meanwhile
    # printed a traceback from inside that import, one per worker. They start with SIGINT blocked and keep it: on
    # Ctrl-C this process closes them (close_envs), as it stops the project's own workers. The constructor waits
    # for their import and first env (seconds): an interrupt raised in it never hands the env to anyone who could
    # close it, so its workers (this process's newest children, with nothing to save yet) are killed here: SIGKILL,
    # so that the join is bounded whatever an env does with SIGTERM.
    before = set(mp.active_children())
    try:
        with signals.sigint_blocked():
            return gym.vector.AsyncVectorEnv(thunks, context="spawn", autoreset_mode=next_step)
    except BaseException:
        for proc in set(mp.active_children()) - before:
            proc.kill()
            proc.join()
        raise


def close_envs(envs: Any, timeout: float = 5.0) -> None:
    """Close a gymnasium vector env. An ``AsyncVectorEnv`` interrupted inside ``step`` (Ctrl-C) may have read
    some workers' replies already; its ``close`` would then wait forever for the rest, so it gets ``timeout``
    seconds before its worker processes are terminated. A reply the signal cut in half (its header read, its body
    not) or a worker that died leaves a pipe that no longer parses: the workers are then terminated and joined, and
    the error that brought the run here is the one the user sees, not the pipe's."""
    if isinstance(envs, gym.vector.AsyncVectorEnv):
        with warnings.catch_warnings():  # after a Ctrl-C mid-step it warns of exactly that: the expected case
            warnings.filterwarnings("ignore", message=".*Calling `close` while waiting for a pending call")
            try:
                envs.close(timeout=timeout)
            except (EOFError, OSError, pickle.UnpicklingError):  # OSError: a dead worker's pipe (reset, broken)
                envs._state = AsyncState.DEFAULT  # no reply is awaited any more: close without reading one
                envs.close(terminate=True)
    else:
        envs.close()


def probe_spaces(thunk: Callable[[], gym.Env]) -> tuple[gym.Space, gym.Space]:
    env = thunk()
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def image_shape(obs_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(C, H, W) of an image observation, channel-first or channel-last (channels: the smallest axis)."""
    if len(obs_shape) != 3:
        raise ValueError(f"an image observation has 3 axes ([C, H, W] or [H, W, C]), got shape {obs_shape}")
    channels_last = obs_shape[2] < obs_shape[0]
    c, h, w = (obs_shape[2], obs_shape[0], obs_shape[1]) if channels_last else obs_shape
    if min(h, w) < MIN_IMAGE_SIDE:
        raise ValueError(
            f"observation shape {obs_shape}: the Nature CNN needs images of at least "
            f"{MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE} pixels, got {h}x{w}; resize them "
            f"(gymnasium.wrappers.ResizeObservation) or give the network a smaller torso"
        )
    return int(c), int(h), int(w)


@functools.lru_cache(maxsize=8)
def _every_action(n_envs: int, n_actions: int) -> np.ndarray:
    mask = np.ones((n_envs, n_actions), bool)
    mask.flags.writeable = False  # shared by every step: a write to it would be an error, never every step's mask
    return mask


def action_mask(info: dict, final_row: Any, n_actions: int) -> np.ndarray:
    """Valid actions ``[n_envs, n_actions]`` for the next step (see the module docstring)."""
    if "action_mask" not in info:  # every action, every step: one array (a step's bookkeeping is host work)
        return _every_action(len(final_row), n_actions)
    final_row = np.asarray(final_row, bool)
    mask = np.ones((len(final_row), n_actions), bool)
    given = np.asarray(info.get("_action_mask", np.ones(len(final_row), bool)), bool) & ~final_row
    mask[given] = np.asarray(info["action_mask"], bool)[given]
    empty = np.flatnonzero(~mask.any(1))
    if len(empty):
        raise ValueError(f"env {int(empty[0])}: its action mask allows no action")
    return mask


class EpisodeTally:
    """Each env's return and length so far, and the episodes that end: the bookkeeping every sampler keeps."""

    def __init__(self, n_envs: int):
        self.ret, self.length = np.zeros(n_envs), np.zeros(n_envs, np.int64)

    def step(self, reward: np.ndarray, counted: np.ndarray, ended: np.ndarray) -> list[tuple[float, int]]:
        """Add one step of every env (``reward``, ``counted``, ``ended``: [B]); [(return, length)] of those that ended."""
        self.ret += reward
        self.length += counted
        if not ended.any():  # most steps: no episode ends (four boolean indexings saved, a step's host work)
            return []
        episodes = list(zip(self.ret[ended].tolist(), self.length[ended].tolist()))
        self.ret[ended], self.length[ended] = 0.0, 0
        return episodes


def observe_only(env: gym.Env, indices: tuple[int, ...]) -> gym.Env:
    """``env`` observing only ``indices`` of its Box observations (see the module docstring)."""
    keep, space = np.array(indices), env.observation_space
    try:
        kept = gym.spaces.Box(space.low[keep], space.high[keep], dtype=space.dtype)
    except (AttributeError, IndexError):  # not a Box, or an index past its first axis
        env.close()
        flag = "--observe-indices " + " ".join(map(str, indices))
        raise ValueError(f"{flag} does not fit observations of shape {space.shape} ({type(space).__name__})") from None
    return gym.wrappers.TransformObservation(env, lambda o: o[keep], kept)
