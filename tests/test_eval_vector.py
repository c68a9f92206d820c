"""Evaluation on a vector of envs (shared/evaluation.py) against the one-env loop it replaced: episode i is the
episode of seed + 100,000 + i whichever env plays it, with its own random draws, its own recurrent start, its own
mask; no episode is started beyond the count."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import numpy as np
import pytest

from shared.atari import make_atari_env, make_atari_vector_env
from shared.evaluation import Draws, play

SEED, EPISODES = 5, 7
W = np.array([0.0, 0.0, 1.0, 0.0])  # push towards the pole's lean: deterministic, episodes of 24 to 47 steps


def cartpole(render: bool = False):
    return lambda: gym.make("CartPole-v1", render_mode="rgb_array" if render else None)


def masked_choice(render: bool = False):
    return lambda: gym.make("tests.masked_env:MaskedChoice-v0")


def one_env_loop(make_env, policy_of_one, episodes: int, seed: int) -> list[float]:
    """The reference: one env, one episode after another, ``policy_of_one(obs, t, rng, info)`` for each step t."""
    env, returns = make_env()(), []
    for i in range(episodes):
        obs, info = env.reset(seed=seed + 100_000 + i)
        rng, t, total, done = np.random.default_rng(seed + 100_000 + i), 0, 0.0, False
        while not done:
            obs, reward, term, trunc, info = env.step(policy_of_one(obs, t, rng, info))
            total, t, done = total + float(reward), t + 1, term or trunc
        returns.append(total)
    env.close()
    return returns


@pytest.mark.parametrize("envs", [1, 3, 8])
def test_a_deterministic_policy_plays_the_one_env_loops_episodes(envs):
    expected = one_env_loop(cartpole, lambda obs, t, rng, info: int(obs @ W > 0), EPISODES, SEED)
    assert len(set(expected)) > 1  # episodes of different lengths: an env takes its next one at other steps
    assert play(cartpole, lambda obs: (obs @ W > 0).astype(np.int64), EPISODES, SEED, envs) == expected


def epsilon_greedy(obs, draws: Draws):
    return np.where(draws.random() < 0.3, draws.integers(2), (obs @ W > 0).astype(np.int64))


@pytest.mark.parametrize("envs", [1, 4, 7])
def test_a_stochastic_policy_draws_from_its_episodes_own_generator(envs):
    def one(obs, t, rng, info):
        explore, random = rng.random() < 0.3, rng.integers(2)
        return int(random) if explore else int(obs @ W > 0)

    assert play(cartpole, epsilon_greedy, EPISODES, SEED, envs) == one_env_loop(cartpole, one, EPISODES, SEED)


def test_one_generator_shared_by_the_envs_would_change_the_episodes():
    """The test above can fail: the same policy drawing from one generator for all envs plays other episodes."""
    def shared_rng(seed):
        rng = np.random.default_rng(seed)
        return lambda obs: np.where(rng.random(len(obs)) < 0.3, rng.integers(2, size=len(obs)),
                                    (obs @ W > 0).astype(np.int64))

    assert play(cartpole, shared_rng(0), EPISODES, SEED, 1) != play(cartpole, shared_rng(0), EPISODES, SEED, 4)


def test_a_recurrent_policy_starts_afresh_per_env_and_sees_its_last_reward():
    """A policy with a step counter per env (zeroed at ``starts``) plays the reference's step-indexed episodes;
    ``rewards`` is 0 at a start and the previous step's reward (CartPole: 1) after it."""
    def timed(t):  # deterministic in the step index of the episode only
        return (t // 7) % 2

    class Counter:
        def __init__(self):
            self.t = np.zeros(0, int)

        def __call__(self, obs, starts, rewards):
            if len(self.t) != len(starts):
                self.t = np.zeros(len(starts), int)
            self.t = np.where(starts, 0, self.t + 1)
            assert np.all(rewards[starts] == 0) and np.all(rewards[~starts] == 1)
            return timed(self.t)

    expected = one_env_loop(cartpole, lambda obs, t, rng, info: timed(t), EPISODES, SEED)
    assert play(cartpole, Counter(), EPISODES, SEED, 3) == expected


def test_each_env_gets_its_own_mask():
    """MaskedChoice raises on an invalid action: the first valid action of each env's own mask is always valid."""
    expected = one_env_loop(masked_choice, lambda obs, t, rng, info: int(np.argmax(info["action_mask"])), 5, SEED)
    assert play(masked_choice, lambda obs, mask: mask.argmax(1), 5, SEED, 3) == expected


def test_no_episode_starts_beyond_the_count_and_every_env_is_closed():
    made, resets = [], []

    class Counted(gym.Wrapper):
        def reset(self, **kw):
            resets.append(kw["seed"])
            return self.env.reset(**kw)

        def close(self):
            made.remove(self)
            super().close()

    def make_env(render=False):
        def thunk():
            env = Counted(gym.make("CartPole-v1"))
            made.append(env)
            return env
        return thunk

    returns = play(make_env, lambda obs: np.zeros(len(obs), np.int64), 5, SEED, 16)
    assert len(returns) == 5 and sorted(resets) == [SEED + 100_000 + i for i in range(5)]  # 5 envs, not 16
    assert made == []


class Lengths:
    """One game of ale-py's vector env, recording each episode's seed and length (the games themselves, not only
    their returns: a policy that loses every Pong game 0-21 scores -21 whatever the seed) and every step sent."""

    def __init__(self, env, lengths: dict, sent: list):
        self.env, self.lengths, self.sent = env, lengths, sent
        self.single_action_space = env.single_action_space
        self.seed, self.t = None, 0

    def reset(self, seed):
        self.seed, self.t = seed, 0
        return self.env.reset(seed=seed)

    def send(self, actions):
        self.sent.append(self.seed)
        self.t += 1
        self.env.send(actions)

    def recv(self):
        out = self.env.recv()
        if out[2][0] or out[3][0]:
            self.lengths[self.seed] = self.t
        return out

    def close(self):
        self.env.close()


def test_atari_episodes_on_ale_py_threads_do_not_depend_on_the_number_of_envs():
    """ale-py's games: each reset alone with its episode's seed, whichever env plays it and whatever the others
    are doing: the same games (seed by seed, their lengths) and returns with 1, 2 or 3 envs; and an env with no
    episode left never steps (the steps sent are exactly the episodes' steps)."""
    def pixels(obs, mask):  # deterministic; a policy that takes masks gets all-valid ones from Atari games
        assert mask.shape == (len(obs), 6) and mask.all()
        return (obs[:, -1, 30:50].astype(np.int64).sum(axis=(1, 2)) % 6).astype(np.int64)

    def pong(lengths: dict, sent: list) -> Lengths:
        return Lengths(make_atari_vector_env("PongNoFrameskip-v4", 1, num_threads=1), lengths, sent)

    games = {}
    for n in (1, 2, 3):
        lengths, sent = {}, []
        games[n] = (play(None, pixels, 3, SEED, n, atari=partial(pong, lengths, sent)), lengths)
        assert len(sent) == sum(lengths.values())  # no step of an env without an episode
    assert games[1] == games[2] == games[3]
    returns, lengths = games[1]
    assert sorted(lengths) == [SEED + 100_000 + i for i in range(3)]
    assert len(set(lengths.values())) > 1  # the seeds make different games: a wrong seed would show


def test_a_policy_that_takes_masks_gets_none_for_continuous_actions():
    seen = []

    def act(obs, mask):
        seen.append(mask)
        return np.zeros((len(obs), 1), np.float32)

    assert len(play(lambda render=False: lambda: gym.make("Pendulum-v1"), act, 2, SEED, 2)) == 2
    assert seen and all(m is None for m in seen)


@pytest.mark.slow  # a whole Pong game rendered and encoded: about a minute
def test_a_video_on_ale_py_s_envs_is_episode_0_played_again_on_the_gymnasium_env(tmp_path):
    """ale-py's vector env renders nothing: the video is one more episode with episode 0's seed on the rendering
    gymnasium env, written when that env closes; the returns are the vector env's alone."""
    def atari():
        return make_atari_vector_env("PongNoFrameskip-v4", 1, num_threads=1)

    def render_env(render=False):
        return lambda: make_atari_env("PongNoFrameskip-v4", render=render)

    def pixels(obs):
        return (obs[:, -1, 30:50].astype(np.int64).sum(axis=(1, 2)) % 6).astype(np.int64)

    returns = play(render_env, pixels, 2, SEED, 2, video_dir=tmp_path / "videos", atari=atari)
    assert returns == play(None, pixels, 2, SEED, 2, atari=atari)
    assert len(list((tmp_path / "videos").glob("*.mp4"))) == 1
