"""Atari environments with the papers' conventions, in the two pipelines the scripts sample with.

Guarantees
- ``is_atari(env_id)``: the ``*NoFrameskip-v4`` ids get this preprocessing; any other id is left to the script.
- ``make_atari_env`` (one gymnasium env: serial sampling, evaluation, videos) and ``make_atari_vector_env``
  (ale-py's threaded ``AtariVectorEnv``: parallel sampling) agree frame for frame: up to ``noop_max`` random
  no-ops at reset, action repeat 4 with a max over the last two frames, 84x84 grayscale, 4 stacked frames
  zero-padded at reset, a 108,000-frame time limit (30 minutes of play), sticky actions only when asked for,
  raw (unclipped) rewards, whole games (a lost life does not end the episode; ``info["lives"]`` reports it,
  so a script can treat it as terminal for learning), no FIRE at reset. The parity is tested
  (``tests/test_atari.py``).
- ``register_atari()`` makes the ids known to gymnasium (ale-py registers them on request only).
"""

from __future__ import annotations

import re

import gymnasium as gym

__all__ = ["ATARI_MAX_FRAMES", "ale_game", "is_atari", "make_atari_env", "make_atari_vector_env", "register_atari"]

ATARI_MAX_FRAMES = 108_000  # 30 minutes of play: the time limit in both pipelines
FRAME_SKIP, SCREEN, STACK = 4, 84, 4


def is_atari(env_id: str) -> bool:
    return "NoFrameskip" in env_id


def ale_game(env_id: str) -> str:
    """'MsPacmanNoFrameskip-v4' -> 'ms_pacman' (ale-py's ROM name)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", env_id.split("NoFrameskip")[0]).lower()


def register_atari() -> None:
    import ale_py

    gym.register_envs(ale_py)


def make_atari_env(env_id: str, noop_max: int = 30, sticky_actions: float = 0.0, render: bool = False) -> gym.Env:
    """One preprocessed Atari env: observations [4, 84, 84] uint8."""
    register_atari()
    env = gym.make(
        env_id,
        max_episode_steps=ATARI_MAX_FRAMES,
        render_mode="rgb_array" if render else None,
        repeat_action_probability=sticky_actions,
    )
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=noop_max, frame_skip=FRAME_SKIP, screen_size=SCREEN, terminal_on_life_loss=False, grayscale_obs=True
    )
    return gym.wrappers.FrameStackObservation(env, STACK, padding_type="zero")


def make_atari_vector_env(
    env_id: str, num_envs: int, num_threads: int = 1, noop_max: int = 30, sticky_actions: float = 0.0
) -> gym.vector.VectorEnv:
    """``num_envs`` games stepped by ale-py's C++ threads, preprocessed as ``make_atari_env``, next-step
    autoreset (gymnasium's default for vector envs)."""
    from ale_py.vector_env import AtariVectorEnv

    # Raw rewards and whole games: clipping or splitting at life loss here would lose the true score.
    return AtariVectorEnv(
        ale_game(env_id),
        num_envs,
        num_threads=num_threads,
        noop_max=noop_max,
        frameskip=FRAME_SKIP,
        img_height=SCREEN,
        img_width=SCREEN,
        stack_num=STACK,
        grayscale=True,
        repeat_action_probability=sticky_actions,
        max_num_frames_per_episode=ATARI_MAX_FRAMES,
        reward_clipping=False,
        episodic_life=False,
        use_fire_reset=False,
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
