"""Envs with invalid-action masks for tests/test_masking.py, used as ``--env-id tests.masked_env:MaskedChoice-v0``
(gymnasium imports this module, in every process that makes the env).

MaskedChoice: the observation is the one-hot state s of 4; of 5 actions, action 4 would pay 10 but is never valid
and action (s + 2) % 4 is invalid in state s; the valid action s pays 1, the others 0; 16 steps an episode
(best return 16). A masked action raises: a run that ever takes one fails. The mask comes in ``info``, at reset
and at every step, for the observation returned with it. MaskedChoiceEmpty-v0 gives a mask that allows nothing
at its 5th step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

N_STATES, JACKPOT = 4, 4


def valid_actions(state: int) -> np.ndarray:
    mask = np.ones(N_STATES + 1, bool)
    mask[JACKPOT] = False
    mask[(state + 2) % N_STATES] = False
    return mask


class MaskedChoice(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (N_STATES,), np.float32)
    action_space = gym.spaces.Discrete(N_STATES + 1)

    def __init__(self, empty_at: int | None = None, render_mode: str | None = None):
        self.empty_at, self.render_mode = empty_at, render_mode

    def mask(self) -> np.ndarray:
        """The valid actions now (what ``info["action_mask"]`` holds; sb3-contrib's ActionMasker reads it here)."""
        mask = valid_actions(self.state)
        if self.empty_at is not None and self.t == self.empty_at:
            mask[:] = False
        return mask

    def _out(self) -> tuple[np.ndarray, dict]:
        return np.eye(N_STATES, dtype=np.float32)[self.state], {"action_mask": self.mask()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t, self.state = 0, int(self.np_random.integers(N_STATES))
        return self._out()

    def step(self, action):
        action = int(action)
        if not valid_actions(self.state)[action]:
            raise RuntimeError(f"masked action {action} taken in state {self.state}")
        reward = 10.0 if action == JACKPOT else float(action == self.state)
        self.t += 1
        self.state = int(self.np_random.integers(N_STATES))
        obs, info = self._out()
        return obs, reward, False, self.t >= 16, info


gym.register("MaskedChoice-v0", entry_point=MaskedChoice)
gym.register("MaskedChoiceEmpty-v0", entry_point=MaskedChoice, kwargs={"empty_at": 5})
