"""A wrapper in an Atari replay script's ``make_env`` never corrupts its replay (issue 68): frames are stored once each
only for the standard Atari env (``shared.envs.replay_frame_stack``); a wrapper that reorders the stack (channels-last,
which the networks take) or transforms the whole stack each step makes the replay store whole observations, and says
so in one line.

Each run is a copy of the script whose ``make_env`` adds the wrapper, and whose loss checks every sampled observation
against what the wrapper gave: the wrapper stamps its step count into two places of each observation, which must agree
in every sampled one. Stored frame-wise, a sampled stack is rebuilt from the frames of several steps (channels-last:
from 84 steps' last image rows), and the stamps disagree: the run fails (it did before the change)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import ROOT, run

WRAPPERS = '''
class ChannelsLast(gym.ObservationWrapper):
    """[C, H, W] stacks as [H, W, C], the step count stamped at two opposite corners."""

    def __init__(self, env):
        super().__init__(env)
        c, h, w = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 255, (h, w, c), np.uint8)
        self.t = 0

    def observation(self, obs):
        self.t += 1
        obs = np.ascontiguousarray(np.moveaxis(obs, 0, -1))
        obs[0, 0, :] = obs[-1, -1, :] = self.t % 251
        return obs


class Stamped(gym.ObservationWrapper):
    """The whole stack transformed each step: the step count stamped into every frame's corner."""

    def __init__(self, env):
        super().__init__(env)
        self.t = 0

    def observation(self, obs):
        self.t += 1
        obs = obs.copy()
        obs[:, 0, 0] = self.t % 251
        return obs


def _check_stamps(obs):
    """Every sampled observation as the wrapper gave it: its stamps agree (zero rows, never written, too)."""
    if obs.shape[-1] < obs.shape[-3]:  # channels-last
        a, b = obs[..., 0, 0, :], obs[..., -1, -1, :]
    else:
        a, b = obs[..., :, 0, 0], obs[..., :1, 0, 0].expand_as(obs[..., :, 0, 0])
    assert bool((a == b).all()), "a sampled observation is not one the wrapper gave"


_script_loss = LOSS


def LOSS(*args, **kwargs):
    batch = args[2]
    stacks = [batch[key] for key in ("observation", "next_observation") if key in batch]
    if "frames" in batch:  # R2D1's frame-wise batch: stacked where its update reads it
        stacks.append(batch["frames"][batch["frame_index"]])
    assert stacks, f"no observations among the batch's {sorted(batch)}"
    for obs in stacks:
        _check_stamps(obs)
    return _script_loss(*args, **kwargs)
'''

SCRIPTS = {
    "dqn_atari": ("dqn_loss", []),
    "catdqn_atari": ("c51_loss", []),
    "r2d1_atari": (
        "r2d1_loss",
        ["--sequence-length", "6", "--burn-in-steps", "2", "--rnn-state-interval", "4", "--n-step-return", "2"],
    ),
}
ATARI = "return make_atari_env(args.env_id, args.noop_max, args.sticky_actions, render)"


def _wrapped_copy(name: str, wrapper: str, folder: Path) -> Path:
    src = (ROOT / "algos" / f"{name}.py").read_text()
    assert src.count(ATARI) == 1
    edited = src.replace(ATARI, ATARI.replace("return ", f"return {wrapper}(") + ")", 1)
    main_block = 'if __name__ == "__main__":'
    extra = WRAPPERS.replace("LOSS", SCRIPTS[name][0])
    copy = folder / f"wrapped_{name}.py"
    copy.write_text(edited.replace(main_block, extra + "\n\n" + main_block, 1))
    return copy


def _params():
    for name in SCRIPTS:
        for wrapper in ("ChannelsLast", "Stamped"):
            for sampler in ("serial", "parallel", "async"):
                fast = name == "dqn_atari" and sampler == "serial"  # CI's default tier; the rest is slow
                yield pytest.param(name, wrapper, sampler, marks=() if fast else pytest.mark.slow)


@pytest.mark.parametrize("name,wrapper,sampler", list(_params()))
def test_a_wrapped_atari_env_is_stored_as_the_wrapper_gave_it(name, wrapper, sampler, tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="tmp_wrapped_", dir=ROOT))
    try:
        out = run(
            str(_wrapped_copy(name, wrapper, folder)),
            *SCRIPTS[name][1],
            "--env-id",
            "BreakoutNoFrameskip-v4",
            "--sampler",
            sampler,
            "--num-envs",
            "2",
            "--total-timesteps",
            "500",
            "--min-steps-learn",
            "300",
            "--buffer-size",
            "1000",
            "--batch-size",
            "8",
            "--log-every",
            "250",
            "--eval-episodes",
            "0",
            "--out-dir",
            str(tmp_path / "runs"),
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.count("the replay stores whole observations") == 1, out.stdout[-2000:]
    finally:
        shutil.rmtree(folder)


def test_the_standard_atari_env_is_stored_frame_wise(monkeypatch, capsys):
    """The unchanged env keeps frame-wise storage (4x less memory), with no line about it."""
    monkeypatch.syspath_prepend(str(ROOT / "algos"))
    import dqn_atari

    from shared.envs import replay_frame_stack

    args = dqn_atari.Args(env_id="BreakoutNoFrameskip-v4")
    space = dqn_atari.make_env(args)().observation_space
    capsys.readouterr()
    assert replay_frame_stack(args, dqn_atari.make_env, space) == 4
    assert capsys.readouterr().out == ""
