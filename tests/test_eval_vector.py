"""Evaluation on a vector of envs (shared/evaluation.py) against the one-env loop it replaced: episode i is the
episode of seed + 100,000 + i whichever env plays it, with its own random draws, its own recurrent start, its own
mask; no episode is started beyond the count."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from shared.atari import make_atari_env
from shared.evaluation import Draws, EvaluationError, play
from shared.procs import session_processes
from tests.helpers import children

SEED, EPISODES = 5, 7
W = np.array([0.0, 0.0, 1.0, 0.0])  # push towards the pole's lean: deterministic, episodes of 24 to 47 steps


def cartpole(render: bool = False):
    return lambda: gym.make("CartPole-v1", render_mode="rgb_array" if render else None)


def masked_choice(render: bool = False):
    return lambda: gym.make("tests.masked_env:MaskedChoice-v0")


def one_env_loop(make_env, policy_of_one, episodes: int, seed: int) -> tuple[list[float], list[int]]:
    """The reference: one env, one episode after another, ``policy_of_one(obs, t, rng, info)`` for each step t;
    the returns and lengths."""
    env, returns, lengths = make_env()(), [], []
    for i in range(episodes):
        obs, info = env.reset(seed=seed + 100_000 + i)
        rng, t, total, done = np.random.default_rng(seed + 100_000 + i), 0, 0.0, False
        while not done:
            obs, reward, term, trunc, info = env.step(policy_of_one(obs, t, rng, info))
            total, t, done = total + float(reward), t + 1, term or trunc
        returns.append(total)
        lengths.append(t)
    env.close()
    return returns, lengths


@pytest.mark.parametrize("envs", [1, 3, 8])
def test_a_deterministic_policy_plays_the_one_env_loops_episodes(envs):
    expected = one_env_loop(cartpole, lambda obs, t, rng, info: int(obs @ W > 0), EPISODES, SEED)
    assert len(set(expected[1])) > 1  # episodes of different lengths: an env takes its next one at other steps
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
        return lambda obs: np.where(rng.random(len(obs)) < 0.3, rng.integers(2, size=len(obs)), (obs @ W > 0).astype(np.int64))

    assert play(cartpole, shared_rng(0), EPISODES, SEED, 1).returns != play(cartpole, shared_rng(0), EPISODES, SEED, 4).returns


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

    returns, _ = play(make_env, lambda obs: np.zeros(len(obs), np.int64), 5, SEED, 16)
    assert len(returns) == 5 and sorted(resets) == [SEED + 100_000 + i for i in range(5)]  # 5 envs, not 16
    assert made == []


class StepLog(gym.Wrapper):
    """Appends the id of the process of every step to a file (the envs may step in worker processes)."""

    def __init__(self, env, path):
        super().__init__(env)
        self.path = path

    def step(self, action):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")
        return self.env.step(action)


def pixels(obs, mask):  # deterministic; a policy that takes masks gets all-valid ones from Atari games
    assert mask.shape == (len(obs), 6) and mask.all()
    return (obs[:, -1, 30:50].astype(np.int64).sum(axis=(1, 2)) % 6).astype(np.int64)


def pong(log, render: bool = False):
    return lambda: StepLog(make_atari_env("PongNoFrameskip-v4", render=render), log)


def test_atari_episodes_in_worker_processes_are_the_one_env_loops_games(tmp_path):
    """The training env's games (gymnasium's Atari env), in worker processes: the one-env loop's games seed by seed
    (their lengths) and returns with 1, 2 or 3 envs in 1 or 2 processes; both workers step envs; and an env with
    no episode left never steps (the steps sent are exactly the episodes' steps)."""
    one = np.ones((1, 6), bool)
    greedy = lambda obs, t, rng, info: int(pixels(obs[None], one)[0])
    expected = one_env_loop(partial(pong, tmp_path / "ref"), greedy, 3, SEED)
    assert len(set(expected[1])) > 1  # the seeds make different games (a policy that loses every Pong game 0-21
    # scores -21 whatever the seed: the lengths show a wrong seed)
    for envs, procs in [(1, 1), (2, 2), (3, 2)]:
        log = tmp_path / f"{envs}-{procs}"
        assert play(partial(pong, log), pixels, 3, SEED, envs, procs=procs) == expected
        steppers = log.read_text().split()
        assert len(steppers) == sum(expected[1])  # no step of an env without an episode
        assert len(set(steppers) - {str(os.getpid())}) == (procs if procs > 1 else 0)  # each worker stepped envs
    assert workers_left() == []  # every worker reaped


class Faulty(gym.Env):
    """Steps slowly, or at step ``at`` raises (``how="raise"``), kills its process (``"kill"``) or replies and
    then exits (``"exit"``: the next request meets a closed pipe); observations of ``size`` floats."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, how: str = "", at: int = 3, pause: float = 0.0, size: int = 1):
        self.how, self.at, self.pause, self.t = how, at, pause, 0
        self.observation_space = gym.spaces.Box(-1, 1, (size,))

    def reset(self, *, seed=None, options=None):
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action):
        self.t += 1
        time.sleep(self.pause)
        if self.t == self.at and self.how == "raise":
            raise RuntimeError("the env broke")
        if self.t == self.at and self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.t == self.at and self.how == "exit":
            threading.Timer(0.1, os._exit, (3,)).start()
        return np.zeros(self.observation_space.shape, np.float32), 0.0, False, self.t >= 50, {}


def faulty(how: str):
    return lambda render=False: lambda: Faulty(how)


def zeros(obs):
    return np.zeros(len(obs), np.int64)


def slow_zeros(obs):  # a worker that exits after its reply is gone before the next request
    time.sleep(0.5)
    return zeros(obs)


def workers_left() -> list[int]:
    """This process's children, zombies included, but multiprocessing's resource tracker (one per process)."""
    return [pid for pid, cmd in children(os.getpid()).items() if "resource_tracker" not in cmd]


@pytest.mark.parametrize(
    ("how", "says"),
    [("raise", "the env broke"), ("kill", "exited unexpectedly with code -9"), ("exit", "exited unexpectedly with code 3")],
)
def test_a_failed_killed_or_vanished_worker_ends_the_evaluation_with_its_error(how, says):
    t0 = time.monotonic()
    with pytest.raises(EvaluationError, match=says):
        play(faulty(how), slow_zeros if how == "exit" else zeros, 4, SEED, 4, procs=2)
    assert time.monotonic() - t0 < 30  # the spawns take most of it
    assert workers_left() == []  # every worker reaped


CTRL_C = """
import sys, time
sys.path.insert(0, {root!r})
from tests.test_eval_vector import Faulty, zeros
from shared import signals
from shared.evaluation import play
if __name__ == "__main__":
    signals.raise_on_signals()  # as the scripts do
    play(lambda render=False: lambda: Faulty(pause=0.5, size={size}), zeros, 4, 0, 4, procs=2)
"""


@pytest.mark.parametrize("size", [1, 1_000_000])  # 4 MB replies: a worker blocks sending one until it is read
def test_ctrl_c_during_an_evaluation_in_worker_processes_leaves_nothing_running(tmp_path, size):
    """Ctrl-C to the whole process group (as a terminal sends it) while the workers step: the evaluation ends
    with KeyboardInterrupt within seconds (a worker sending a reply nobody reads is drained, not waited for), and
    no worker is left."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(CTRL_C.format(root=str(Path(__file__).resolve().parents[1]), size=size))
    proc = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(session_processes(proc.pid)) < 4 and time.monotonic() < deadline:  # it, the resource tracker,
            time.sleep(0.2)  # two workers
        time.sleep(2.0)  # the workers have made their envs and step
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 8  # the interrupted close waits QUICK_CLOSE_S (10 s) for a blocked worker
        assert err.splitlines()[-1] == "interrupted (signal 2) outside the training loop", err  # shared.signals
        while session_processes(proc.pid) and time.monotonic() < t0 + 15:  # the resource tracker ends on its own
            time.sleep(0.1)  # once the process is gone
        assert session_processes(proc.pid) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_policy_that_takes_masks_gets_none_for_continuous_actions():
    seen = []

    def act(obs, mask):
        seen.append(mask)
        return np.zeros((len(obs), 1), np.float32)

    assert play(lambda render=False: lambda: gym.make("Pendulum-v1"), act, 2, SEED, 2).lengths == [200, 200]
    assert seen and all(m is None for m in seen)


@pytest.mark.slow  # a whole Pong game rendered and encoded: about a minute
def test_a_video_of_the_first_atari_episode_from_a_worker_process(tmp_path):
    """The env that plays episode 0 records it (in its worker: written when that env closes); the returns are the
    same without video."""
    returns = play(partial(pong, tmp_path / "a"), pixels, 2, SEED, 2, video_dir=tmp_path / "videos", procs=2)
    assert returns == play(partial(pong, tmp_path / "b"), pixels, 2, SEED, 2, procs=2)
    assert len(list((tmp_path / "videos").glob("*.mp4"))) == 1
