"""Envs with Dict observations for tests/test_dict_obs.py, used as ``--env-id tests.dict_env:DictCue-v0``
(gymnasium imports this module, in every process that makes the env).

DictCue: the observation is a Dict of ``cue`` (Discrete(3)), ``image`` (a uint8 grid of noise codes 0-2, as
MiniGrid's grids hold codes 0-10), ``vec`` (a Box of 2 floats of noise) and ``mission`` (Text, constant: the
scripts drop it). Of 3 actions, the one equal to the cue pays 1, the others 0; the cue is drawn afresh every
step; 16 steps an episode (best return 16, a policy blind to the cue 16/3 on average). Variants: DictCue-v0
(7x7x3 image: the small CNN), DictCueBig-v0 (36x36x3: the Nature CNN), DictCueImage-v0 (the cue is in the
image, every code raised by 3 + 3 x cue, and the ``cue`` entry is always 0: only the CNN can see it),
DictCueMasked-v0 (4 actions: action 3 would pay 10 but is never valid, ``info["action_mask"]`` says so, and
taking it raises, so a run that ever takes a masked action fails), DictCueContinuous-v0 (a Box action in
[-1, 1]; reward 1 - |action - (cue - 1)|), DictCueBad-v0 (an extra MultiBinary entry, which the scripts
refuse).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

N_CUES, LENGTH = 3, 16


class DictCue(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(
        self,
        side: int = 7,
        cue_in_image: bool = False,
        masked: bool = False,
        continuous: bool = False,
        bad: bool = False,
        render_mode: str | None = None,
    ):
        self.side, self.cue_in_image, self.masked, self.render_mode = side, cue_in_image, masked, render_mode
        self.continuous = continuous
        self.observation_space = gym.spaces.Dict(
            {
                "cue": gym.spaces.Discrete(N_CUES),
                "image": gym.spaces.Box(0, 255, (side, side, 3), np.uint8),
                "vec": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                "mission": gym.spaces.Text(32, charset="abcdefghijklmnopqrstuvwxyz "),
                **({"bits": gym.spaces.MultiBinary(3)} if bad else {}),
            }
        )
        self.action_space = (
            gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
            if continuous
            else gym.spaces.Discrete(N_CUES + 1 if masked else N_CUES)
        )

    def _obs(self) -> tuple[dict, dict]:
        rng = self.np_random
        # codes 0-10 as MiniGrid's grids (the Nature CNN's 36x36 pixels too: small values, still pixels)
        image = rng.integers(0, 3, (self.side, self.side, 3), dtype=np.uint8)
        if self.cue_in_image:
            image += np.uint8(3 + 3 * self.cue)
        obs = {
            "cue": 0 if self.cue_in_image else self.cue,
            "image": image,
            "vec": rng.uniform(-1, 1, 2).astype(np.float32),
            "mission": "pick the cue",
        }
        info = {"action_mask": np.array([True] * N_CUES + [False])} if self.masked else {}
        return obs, info

    def render(self):
        return np.zeros((32, 32, 3), np.uint8)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.integers(N_CUES))
        return self._obs()

    def step(self, action):
        if self.continuous:  # the cue's target: -1, 0 or 1
            reward = float(1.0 - abs(float(np.asarray(action).reshape(-1)[0]) - (self.cue - 1)))
        else:
            action = int(action)
            if action >= N_CUES:
                raise RuntimeError(f"masked action {action} taken")
            reward = float(action == self.cue)
        self.t += 1
        self.cue = int(self.np_random.integers(N_CUES))
        obs, info = self._obs()
        return obs, reward, False, self.t >= LENGTH, info


gym.register("DictCue-v0", entry_point=DictCue)
gym.register("DictCueBig-v0", entry_point=DictCue, kwargs={"side": 36})
gym.register("DictCueImage-v0", entry_point=DictCue, kwargs={"cue_in_image": True})
gym.register("DictCueMasked-v0", entry_point=DictCue, kwargs={"masked": True})
gym.register("DictCueContinuous-v0", entry_point=DictCue, kwargs={"continuous": True})
gym.register("DictCueBad-v0", entry_point=DictCue, kwargs={"bad": True})
