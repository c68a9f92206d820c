"""Dict observations for a script whose network takes them (``Run(..., dict_obs=True)``): the per-key torso and
the rollout's allocation.

Guarantees
- ``obs_keys(space)``: the keys of a gymnasium ``Dict`` observation space that the scripts take, sorted (as
  gymnasium's ``Dict`` sorts them): its ``Box`` and ``Discrete`` entries. ``Text`` entries (MiniGrid's
  ``mission``, and any space whose samples are strings, as MiniGrid's own ``MissionSpace``) are dropped (here, and by
  ``without_text`` in the scripts' ``make_env``); any other entry (a nested ``Dict``, ``Tuple``,
  ``MultiDiscrete``, ``MultiBinary``, ...) raises ``ValueError`` naming the key and its space.
- ``without_text(env)``: ``env`` with the string entries of its Dict observations filtered out
  (``gymnasium.wrappers.FilterObservation``), so that gymnasium's ``AsyncVectorEnv`` (shared memory) can step
  an env whose strings it cannot hold (MiniGrid's ``MissionSpace``); any other env is returned as it is (the
  same object: a Box env's make_env is unchanged).
- ``obs_example(space, leading)``: the zeroed example of one observation (``leading`` prepended) that a rollout
  is allocated from (``shared.buffer.buffer_from_example``): for a ``Box`` exactly ``np.zeros(leading +
  shape, dtype)``, as the scripts made it before; for a ``Dict`` an ``Obs`` namedarraytuple of one such array
  per key of ``obs_keys`` (a ``Discrete`` entry: its integer, int64), which nests inside the rollout's
  namedarraytuple, in private or shared memory (the async double buffer) alike.
- A rollout's ``Obs`` namedarraytuple takes the env's dict observation as it comes (``buf.obs[t] = obs``: its
  fields written by name) and ``shared.device.upload`` takes it nested in a batch: the scripts carry a Dict
  observation through sampling and learning with no helper of this module.
- ``DictTorso(space, layer_init)``: one encoder per key of ``obs_keys``, built in sorted key order (so the
  parameters' initial draws are the same for the same space and seed): a 3-D ``uint8`` ``Box`` (an image,
  ``[C, H, W]`` or ``[H, W, C]``) with both sides at least 36 pixels is taken as pixels: scaled to [0, 1]
  inside, through the Nature CNN and a 512-unit ReLU layer; a smaller one (down to ``MIN_SMALL_SIDE``, below
  which ``ValueError``) is taken as a grid of codes (MiniGrid's object, colour and state indices, 0-10),
  divided by ``GRID_SCALE`` (10) so that they enter in [0, 1] (by 1/255 they are too small for the first layer
  to learn from; unscaled, the features are ~10x the MLP's, so the value head starts at |V| ~ 1-3 on a task
  whose returns are in [0, 1], and each Adam step moves the logits ~10x as far: measured on
  MiniGrid-DoorKey-5x5), through a small CNN (2x2 convolutions of 16, 32 and 64
  channels with a 2x2 max-pool after the first, the MiniGrid/BabyAI convention) and a 64-unit ReLU layer; any
  other ``Box`` (flattened, as
  floats) and a ``Discrete`` (one-hot) through the scripts' 64x64 tanh MLP. ``forward(obs)`` takes a dict (or
  namedarraytuple) of tensors ``[N, ...]`` by key and returns their features concatenated in key order,
  ``[N, width]``: what the scripts' heads (or LSTM) take. A per-key MLP rather than SB3's bare flatten: the
  scripts' heads are single linear layers, with no MLP after the concatenation as SB3's policies have.
Imports torch, numpy, gymnasium and ``shared.namedarraytuple`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

from shared.namedarraytuple import namedarraytuple

__all__ = ["GRID_SCALE", "MIN_SMALL_SIDE", "DictTorso", "is_dict", "is_text", "obs_example", "obs_keys", "without_text"]

MIN_SMALL_SIDE = 7  # the small CNN's 2x2 convolution, 2x2 max-pool, then two 2x2 convolutions
NATURE_SIDE = 36  # shared.envs.MIN_IMAGE_SIDE: the Nature CNN from this size up
GRID_SCALE = 10.0  # MiniGrid's largest code (OBJECT_TO_IDX["agent"]): a grid's codes enter in [0, 1]


def is_dict(space: Any) -> bool:
    return isinstance(space, gym.spaces.Dict)


def is_text(space: gym.Space) -> bool:
    """A space of strings: gymnasium's Text, or one whose samples are str (MiniGrid's MissionSpace)."""
    if isinstance(space, gym.spaces.Text):
        return True
    if isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.Dict, gym.spaces.Tuple)):
        return False
    try:
        return isinstance(space.sample(), str)
    except Exception:  # a space that cannot sample: not one of strings
        return False


def without_text(env: gym.Env) -> gym.Env:
    """``env`` without the string entries of its Dict observations (``FilterObservation``); any other env as it
    is (the same object)."""
    space = env.observation_space
    if not is_dict(space) or not any(is_text(sub) for sub in space.spaces.values()):
        return env
    return gym.wrappers.FilterObservation(env, [k for k, sub in space.spaces.items() if not is_text(sub)])


def obs_keys(space: gym.spaces.Dict) -> list[str]:
    """The Box and Discrete keys of a Dict space, sorted; Text keys dropped; anything else: ValueError."""
    keys = []
    for key in sorted(space.spaces):
        sub = space.spaces[key]
        if isinstance(sub, (gym.spaces.Box, gym.spaces.Discrete)):
            keys.append(key)
        elif not is_text(sub):
            raise ValueError(
                f"Dict observation key {key!r} is a {type(sub).__name__} ({sub}); the network takes "
                f"Box (images, vectors) and Discrete entries (Text entries are dropped)"
            )
    if not keys:
        raise ValueError(f"Dict observation space {space} has no Box or Discrete entry")
    return keys


def _leaf_example(sub: gym.Space, leading: tuple) -> np.ndarray:
    if isinstance(sub, gym.spaces.Discrete):
        return np.zeros(leading, np.int64)
    return np.zeros(leading + tuple(sub.shape), sub.dtype)


def obs_example(space: gym.Space, leading: tuple = ()) -> Any:
    """The zeroed observation a rollout is allocated from (see the module docstring)."""
    if not is_dict(space):
        return np.zeros(tuple(leading) + tuple(space.shape), space.dtype)
    keys = obs_keys(space)
    return namedarraytuple("Obs", keys)(*(_leaf_example(space.spaces[k], tuple(leading)) for k in keys))


def _chw(shape: tuple) -> tuple[bool, int, int, int]:
    """(channels_last, C, H, W) of a 3-D image shape; channels: the smallest axis (as shared.envs.image_shape)."""
    channels_last = shape[2] < shape[0]
    c, h, w = (shape[2], shape[0], shape[1]) if channels_last else shape
    return channels_last, int(c), int(h), int(w)


def is_image(sub: gym.Space) -> bool:
    return isinstance(sub, gym.spaces.Box) and len(sub.shape) == 3 and sub.dtype == np.uint8


class DictTorso(nn.Module):
    """One encoder per key, features concatenated in key order (see the module docstring)."""

    def __init__(self, space: gym.spaces.Dict, layer_init: Callable[..., nn.Module]):
        super().__init__()
        self.keys = obs_keys(space)
        self.kinds: list[str] = []  # per key: "image", "discrete" or "vector"
        self.channels_last: list[bool] = []
        self.n: list[int] = []  # Discrete: its n; others 0
        self.start: list[int] = []  # Discrete: its start
        encoders, self.width = [], 0
        for key in self.keys:
            sub = space.spaces[key]
            if is_image(sub):
                last, c, h, w = _chw(sub.shape)
                encoder, width = self._cnn(key, sub.shape, c, h, w, layer_init)
                # pixels (scaled to [0, 1]) from the Nature CNN's size up; a smaller image is a grid of
                # codes (MiniGrid's object, colour and state indices), scaled by 1 / GRID_SCALE
                self.kinds.append("image" if min(h, w) >= NATURE_SIDE else "grid")
            else:
                discrete = isinstance(sub, gym.spaces.Discrete)
                n_in = int(sub.n) if discrete else int(np.prod(sub.shape))
                encoder = nn.Sequential(layer_init(nn.Linear(n_in, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh())
                width, last = 64, False
                self.kinds.append("discrete" if discrete else "vector")
            self.channels_last.append(last)
            self.n.append(int(sub.n) if isinstance(sub, gym.spaces.Discrete) else 0)
            self.start.append(int(sub.start) if isinstance(sub, gym.spaces.Discrete) else 0)
            encoders.append(encoder)
            self.width += width
        self.encoders = nn.ModuleList(encoders)

    @staticmethod
    def _cnn(key: str, shape: tuple, c: int, h: int, w: int, layer_init) -> tuple[nn.Module, int]:
        if min(h, w) >= NATURE_SIDE:
            conv = nn.Sequential(
                layer_init(nn.Conv2d(c, 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
            )
            width = 512
        elif min(h, w) >= MIN_SMALL_SIDE:
            conv = nn.Sequential(
                layer_init(nn.Conv2d(c, 16, 2)),
                nn.ReLU(),
                nn.MaxPool2d(2),
                layer_init(nn.Conv2d(16, 32, 2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 2)),
                nn.ReLU(),
                nn.Flatten(),
            )
            width = 64
        else:
            raise ValueError(
                f"Dict observation key {key!r}: image of shape {tuple(shape)} ({h}x{w}); the small "
                f"CNN needs at least {MIN_SMALL_SIDE}x{MIN_SMALL_SIDE} pixels"
            )
        n_flat = conv(torch.zeros(1, c, h, w)).shape[1]
        return nn.Sequential(*conv, layer_init(nn.Linear(n_flat, width)), nn.ReLU()), width

    def forward(self, obs: Any) -> torch.Tensor:
        """obs: a dict (or namedarraytuple) of tensors [N, ...] by key -> features [N, width]."""
        get = obs.__getitem__ if isinstance(obs, dict) else lambda k: getattr(obs, k)
        out = []
        for key, kind, last, n, start, encoder in zip(
            self.keys, self.kinds, self.channels_last, self.n, self.start, self.encoders
        ):
            x = get(key)
            if kind == "image":
                x = x.permute(0, 3, 1, 2) if last else x  # [N, C, H, W]
                x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
            elif kind == "grid":
                x = (x.permute(0, 3, 1, 2) if last else x).float() / GRID_SCALE  # [N, C, H, W], codes in [0, 1]
            elif kind == "discrete":
                x = nn.functional.one_hot(x.long().reshape(-1) - start, n).float()
            else:
                x = x.float().flatten(1)
            out.append(encoder(x))
        return torch.cat(out, dim=1)
