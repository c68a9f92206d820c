"""Evaluation during training (--eval-every) and of a checkpoint (--resume RUN --eval-only), in every script."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import progress, refusal, run

TIMING = {"wall_time_s", "sps", "eval_return"}
CARTPOLE_PPO = [
    "--env-id",
    "CartPole-v1",
    "--num-envs",
    "4",
    "--num-steps",
    "64",
    "--total-timesteps",
    "1024",
    "--log-every",
    "1",
]
CARTPOLE_DQN = [
    "--env-id",
    "CartPole-v1",
    "--num-envs",
    "4",
    "--total-timesteps",
    "2000",
    "--buffer-size",
    "5000",
    "--min-steps-learn",
    "1000",
    "--log-every",
    "500",
    "--replay-ratio",
    "4",
]
PENDULUM = [
    "--env-id",
    "Pendulum-v1",
    "--total-timesteps",
    "1200",
    "--min-steps-learn",
    "1000",
    "--log-every",
    "100",
    "--replay-ratio",
    "64",
]
R2D1 = [
    "--env-id",
    "CartPole-v1",
    "--observe-indices",
    "0",
    "2",
    "--num-envs",
    "4",
    "--hidden",
    "16",
    "--sequence-length",
    "10",
    "--burn-in-steps",
    "5",
    "--rnn-state-interval",
    "5",
    "--batch-size",
    "8",
    "--min-steps-learn",
    "600",
    "--buffer-size",
    "4000",
    "--total-timesteps",
    "1200",
    "--log-every",
    "200",
]
PPO_PENDULUM = [
    "--env-id",
    "Pendulum-v1",
    "--num-envs",
    "2",
    "--num-steps",
    "64",
    "--num-minibatches",
    "2",
    "--total-timesteps",
    "1024",
]
LSTM_CARTPOLE = [
    "--preset",
    "cartpole",
    "--num-envs",
    "4",
    "--num-steps",
    "64",
    "--num-minibatches",
    "2",
    "--total-timesteps",
    "1024",
]
SCRIPTS = {
    "ppo_atari.py": (CARTPOLE_PPO, 256),
    "ppo_mujoco.py": (PPO_PENDULUM, 256),
    "ppo_lstm.py": (LSTM_CARTPOLE, 256),
    "a2c_atari.py": (CARTPOLE_PPO[:-2] + ["--log-every", "4"], 256),
    "dqn_atari.py": (CARTPOLE_DQN, 500),
    "catdqn_atari.py": (CARTPOLE_DQN + ["--v-max", "100"], 500),
    "r2d1_atari.py": (R2D1, 400),
    "sac_mujoco.py": (PENDULUM, 100),
    "td3_mujoco.py": (PENDULUM, 100),
    "ddpg_mujoco.py": (PENDULUM, 100),
}


@pytest.mark.parametrize(
    "name",
    [
        "ppo_atari.py",
        "dqn_atari.py",
        pytest.param("ppo_mujoco.py", marks=pytest.mark.slow),
        pytest.param("ppo_lstm.py", marks=pytest.mark.slow),
        pytest.param("sac_mujoco.py", marks=pytest.mark.slow),
        pytest.param("r2d1_atari.py", marks=pytest.mark.slow),
    ],
)
def test_evaluating_during_training_changes_nothing_in_the_training_run(name, tmp_path):
    """Serial CPU runs with and without --eval-every: every training column identical, bit for bit."""
    flags, every = SCRIPTS[name]
    common = [*flags, "--eval-episodes", "2", "--out-dir", str(tmp_path)]
    plain = run(name, *common, "--run-name", "plain", timeout=300)
    evald = run(name, *common, "--run-name", "eval", "--eval-every", str(every), timeout=300)
    assert plain.returncode == 0 and evald.returncode == 0, plain.stderr[-2000:] + evald.stderr[-2000:]
    a, b = progress(tmp_path / "plain"), progress(tmp_path / "eval")
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k not in TIMING} == {k: v for k, v in rb.items() if k not in TIMING}
    evaluated = [r for r in b if r["eval_return"]]
    assert evaluated and all(int(r["global_step"]) % every == 0 or r is b[-1] for r in evaluated)
    tb = EventAccumulator(str(tmp_path / "eval"))
    tb.Reload()
    episodes = tb.Scalars("eval/episodic_return")
    assert {int(r["global_step"]) for r in evaluated} <= {e.step for e in episodes}
    # the final evaluation is not played again at the step of a periodic one (2 episodes each)
    assert len(episodes) == 2 * len({e.step for e in episodes}), sorted(e.step for e in episodes)


# PPO in CI; the other nine with the slow tests, DQN's (17 s) since CI neared its 40 minutes. Each main's --eval-only
# branch is the same few lines (DQN's also makes no replay); evaluation itself is shared.evaluation's.
@pytest.mark.parametrize(
    "name", [n if n == "ppo_atari.py" else pytest.param(n, marks=pytest.mark.slow) for n in sorted(SCRIPTS)]
)
def test_eval_only_evaluates_a_checkpoint_and_changes_no_training_record(name, tmp_path):
    flags, _ = SCRIPTS[name]
    first = run(name, *flags, "--eval-episodes", "0", "--out-dir", str(tmp_path), "--run-name", "r", timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    folder = tmp_path / "r"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and "tfevents" not in p.name}
    out = run(name, "--resume", str(folder), "--eval-only", "--eval-episodes", "3", timeout=300)  # the rest recorded
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((folder / "eval.json").read_text())
    assert len(summary["returns"]) == 3 and summary["global_step"] == int(progress(folder)[-1]["global_step"])
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and "tfevents" not in p.name}
    assert {k: v for k, v in after.items() if k != "eval.json"} == before  # checkpoint, config, progress untouched


@pytest.mark.parametrize(
    "bad, words",
    [
        (["--eval-only"], "--eval-only evaluates a checkpoint"),
        (["--eval-every", "-1"], "--eval-every must be non-negative"),
        (["--eval-every", "100", "--eval-episodes", "0"], "need --eval-episodes of at least 1"),
        (["--eval-only", "--resume", "/no/such/run"], "--resume /no/such/run: no checkpoint there"),
        (["--eval-episodes", "100000000000"], "--eval-episodes must be in [0, 10000], got 100000000000"),  # not forever
    ],
)
def test_bad_evaluation_arguments_exit_2_with_one_line(bad, words, tmp_path):
    # In this process, before run.setup(); tests/test_ppo.py runs a refusal of ppo_atari.py end to end.
    lines = refusal("ppo_atari.py", *CARTPOLE_PPO, "--out-dir", str(tmp_path), *bad)
    assert len(lines) == 1 and words in lines[0], lines


def test_an_act_parameter_evaluation_would_never_pass_is_refused_by_name():
    """The keywords go to act by name only, so a renamed one (``masks`` for ``mask``) would silently keep its default:
    check_act (called by Run.begin) refuses it; the names evaluation passes, and partial's bound arguments, are fine."""
    from functools import partial

    from shared.evaluation import check_act

    def ok(policy, obs, draws, starts, rewards, mask=None):
        return obs

    check_act(partial(ok, None))
    check_act(lambda obs: obs)

    def renamed(obs, draws, masks=None):
        return obs

    with pytest.raises(TypeError, match=r"\['masks'\]"):
        check_act(renamed)
