"""shared.envs.EpisodeTally against a per-env loop: the returns and lengths the replay scripts' samplers record."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.envs import EpisodeTally


def reference(rewards, counted, ended):
    """Each env on its own: add the step, and at an episode's end record it and start again."""
    B = len(rewards[0])
    ret, length, out = [0.0] * B, [0] * B, []
    for r, c, e in zip(rewards, counted, ended):
        step = []
        for b in range(B):
            ret[b] += r[b]
            length[b] += int(c[b])
            if e[b]:
                step.append((ret[b], length[b]))
                ret[b], length[b] = 0.0, 0
        out.append(step)
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda B: st.lists(
            st.tuples(
                st.lists(st.floats(-100, 100, width=32), min_size=B, max_size=B),
                st.lists(st.booleans(), min_size=B, max_size=B),
                st.lists(st.booleans(), min_size=B, max_size=B),
            ),
            min_size=1,
            max_size=30,
        )
    )
)
def test_episodes_match_a_per_env_loop(steps):
    rewards, counted, ended = zip(*steps)
    tally = EpisodeTally(len(rewards[0]))
    got = [tally.step(np.array(r), np.array(c), np.array(e)) for r, c, e in zip(rewards, counted, ended)]
    want = reference(rewards, counted, ended)
    assert [[length for _, length in s] for s in got] == [[length for _, length in s] for s in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose([r for r, _ in g], [r for r, _ in w], rtol=1e-12, atol=1e-9)
        assert all(type(r) is float and type(n) is int for r, n in g)  # plain numbers for progress.csv and the queue


def test_a_final_row_adds_its_reward_but_not_a_step():
    tally = EpisodeTally(2)
    assert tally.step(np.array([1.0, 2.0]), np.array([True, True]), np.array([False, True])) == [(2.0, 1)]
    # env 1's next step only resets it (a final row): its reward is 0 and it is not counted
    assert tally.step(np.array([3.0, 0.0]), np.array([True, False]), np.array([True, False])) == [(4.0, 2)]
    assert tally.step(np.array([0.0, 5.0]), np.array([False, True]), np.array([False, True])) == [(5.0, 1)]
