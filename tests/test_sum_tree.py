"""SumTree against a plain array of leaf priorities: totals, window switching, sampling distribution."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.sum_tree import SumTree


class RefTree:
    """Obviously correct: a [T, B] array, a pending array and a window; sums with math.fsum."""

    def __init__(self, T, B, default=1.0):
        self.T, self.B, self.default = T, B, default
        self.leaves = np.zeros((T, B))
        self.pending = np.zeros((T, B))
        self.lo = self.hi = 0

    def in_window(self, r):
        return self.lo <= r < self.hi

    def set_pending(self, start, p):
        for i in range(p.shape[0]):
            r = start + i
            self.pending[r % self.T] = p[i]
            if self.in_window(r):
                self.leaves[r % self.T] = p[i]

    def move_window(self, lo, hi):
        hi = max(hi, lo)
        for r in range(self.lo, self.hi):
            if not (lo <= r < hi):
                self.leaves[r % self.T] = 0.0
        for r in range(max(self.hi, lo), hi):
            self.leaves[r % self.T] = self.pending[r % self.T]
        self.lo, self.hi = lo, hi

    def update(self, rows, bs, ps):
        for r, b, p in zip(rows, bs, ps):
            if self.in_window(r):
                self.leaves[r % self.T, b] = p

    def total(self):
        return math.fsum(self.leaves.ravel())


def _priorities(draw, n, B):
    # Mix of zeros, tiny and large values: the cases that break float32 trees.
    vals = st.one_of(st.just(0.0), st.floats(1e-12, 1e-6), st.floats(0.01, 10.0), st.floats(1e3, 1e6))
    return np.array(draw(st.lists(st.lists(vals, min_size=B, max_size=B), min_size=n, max_size=n)))


@settings(max_examples=80, deadline=None)
@given(T=st.integers(1, 40), B=st.integers(1, 5), fanout=st.sampled_from([2, 4, 8, 32, 64]), data=st.data())
def test_tree_matches_reference_under_random_operations(T, B, fanout, data):
    tree, ref = SumTree(T, B, fanout=fanout), RefTree(T, B)
    cursor = 0  # abs rows written
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["append", "update", "sample"]))
        if op == "append":
            n = data.draw(st.integers(1, T))
            p = _priorities(data.draw, n, B)
            back, fwd = data.draw(st.integers(0, 3)), data.draw(st.integers(0, 2))
            hi = max(cursor + n - back, ref.hi)
            lo = min(max(cursor + n - T + fwd, ref.lo, 0), hi)
            if data.draw(st.booleans()):
                tree.append(cursor, p, lo, hi)  # the one-call form of the two calls below
            else:
                tree.set_pending(cursor, p)
                tree.move_window(lo, hi)
            ref.set_pending(cursor, p)
            ref.move_window(lo, hi)
            cursor += n
        elif op == "update" and ref.hi > 0:
            k = data.draw(st.integers(1, 6))
            rows = rng.integers(max(ref.lo - 3, 0), ref.hi + 3, k)  # some outside the window: must be dropped
            bs = rng.integers(0, B, k)
            ps = rng.random(k) * 5
            tree.update(rows, bs, ps)
            ref.update(rows, bs, ps)
        elif op == "sample" and ref.total() > 0:
            rows, bs, p = tree.sample(16, rng)
            assert np.all(p > 0)
            assert np.all((rows >= ref.lo) & (rows < ref.hi))
            np.testing.assert_array_equal(p, ref.leaves[rows % T, bs])
        np.testing.assert_array_equal(tree.leaves, ref.leaves)
        assert tree.total == pytest.approx(ref.total(), rel=1e-12, abs=1e-300)
        assert tree.window == (ref.lo, ref.hi)


@settings(max_examples=40, deadline=None)
@given(n_leaves=st.integers(1, 300), data=st.data())
def test_zero_priority_leaves_are_never_sampled(n_leaves, data):
    # Extreme spreads: one huge leaf beside tiny ones and many zeros.
    vals = data.draw(st.lists(st.sampled_from([0.0, 0.0, 1e-300, 1e-12, 1.0, 1e12]), min_size=n_leaves, max_size=n_leaves))
    p = np.array(vals)[:, None]
    if not (p > 0).any():
        p[data.draw(st.integers(0, n_leaves - 1))] = 1e-200
    tree = SumTree(n_leaves, 1, fanout=data.draw(st.sampled_from([2, 4, 32])))
    tree.set_pending(0, p)
    tree.move_window(0, n_leaves)
    rng = np.random.default_rng(0)
    for _ in range(20):
        rows, _, pri = tree.sample(257, rng)
        assert (p[rows, 0] > 0).all() and (pri > 0).all()


def _chi2_critical(df, z=4.26):
    """Wilson-Hilferty approximation of the chi-square quantile (z=4.26: p about 1e-5)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("fanout", [2, 32])
def test_sampling_distribution_is_proportional_to_priority(fanout):
    rng = np.random.default_rng(123)
    T, B = 50, 4
    tree = SumTree(T, B, fanout=fanout)
    tree.set_pending(0, rng.random((T, B)) ** 3 * 10)
    tree.move_window(0, T)
    # Random updates after construction, including zeroing some leaves.
    for _ in range(30):
        rows, bs = rng.integers(0, T, 8), rng.integers(0, B, 8)
        tree.update(rows, bs, np.where(rng.random(8) < 0.2, 0.0, rng.random(8) * 5))
    p = tree.leaves.ravel().copy()
    counts = np.zeros_like(p)
    n_draws = 0
    for _ in range(400):
        rows, bs, _ = tree.sample(256, rng)
        np.add.at(counts, rows * B + bs, 1)
        n_draws += 256
    expected = p / p.sum() * n_draws
    assert counts[p == 0].sum() == 0
    nz = expected > 0
    chi2 = ((counts[nz] - expected[nz]) ** 2 / expected[nz]).sum()
    assert chi2 < _chi2_critical(nz.sum() - 1), chi2
    # A wrong distribution must fail the same test: uniform over nonzero leaves.
    uniform = np.where(nz, n_draws / nz.sum(), 0)
    chi2_wrong = ((uniform[nz] - expected[nz]) ** 2 / expected[nz]).sum()
    assert chi2_wrong > _chi2_critical(nz.sum() - 1)


def test_stratified_sampling_covers_every_stratum():
    tree = SumTree(4, 1)
    tree.set_pending(0, np.ones((4, 1)))
    tree.move_window(0, 4)
    rows, _, _ = tree.sample(4, np.random.default_rng(0))
    assert sorted(rows.tolist()) == [0, 1, 2, 3]  # one draw per quarter of the total


def test_late_update_never_switches_on_overwritten_rows():
    tree = SumTree(4, 1)
    tree.set_pending(0, np.ones((4, 1)))
    tree.move_window(0, 4)
    rows, bs, _ = tree.sample(2, np.random.default_rng(0))
    tree.set_pending(4, np.ones((2, 1)))
    tree.move_window(2, 4)  # rows 0, 1 leave; the learner still holds samples from them
    applied = tree.update(np.array([0, 1, 3]), np.zeros(3, int), np.array([9.0, 9.0, 9.0]))
    assert applied == 1
    np.testing.assert_array_equal(tree.leaves[:, 0], [0, 0, 1, 9])


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="T and B"):
        SumTree(0, 1)
    with pytest.raises(ValueError, match="power of two"):
        SumTree(4, 1, fanout=3)
    tree = SumTree(4, 2)
    with pytest.raises(ValueError, match="every priority is zero"):
        tree.sample(1, np.random.default_rng())
    with pytest.raises(ValueError, match="forward"):
        tree.move_window(2, 3)
        tree.move_window(1, 3)
    with pytest.raises(ValueError, match="longer"):
        tree.move_window(3, 8)
    with pytest.raises(ValueError, match="non-negative"):
        tree.set_pending(0, -np.ones((1, 2)))
    with pytest.raises(ValueError, match="shape"):
        tree.set_pending(0, np.ones((1, 3)))
    with pytest.raises(ValueError, match="n_rows"):
        tree.set_pending(0, 1.0)
    with pytest.raises(ValueError, match="cannot set 5 rows"):
        tree.set_pending(0, np.ones((5, 2)))


def test_append_checks_everything_before_writing():
    tree = SumTree(4, 2)
    tree.append(0, np.ones((2, 2)), 0, 2)
    before = tree.leaves.copy(), tree.window
    with pytest.raises(ValueError, match="forward"):
        tree.append(2, np.full((2, 2), 5.0), 0, 1)  # a valid chunk with a window moving back
    with pytest.raises(ValueError, match="longer"):
        tree.append(2, np.full((2, 2), 5.0), 0, 5)
    with pytest.raises(ValueError, match="non-negative"):
        tree.append(2, np.array([[1.0, np.nan]] * 2), 0, 4)
    np.testing.assert_array_equal(tree.leaves, before[0])
    assert tree.window == before[1]
    tree.move_window(1, 4)  # rows 2, 3 enter with no priority given (the refused chunks were not kept): off
    np.testing.assert_array_equal(tree.leaves, [[0, 0], [1, 1], [0, 0], [0, 0]])
    tree.append(4, None, 2, 5, n_rows=1)  # row 4 (slot 0) with the default; row 1 leaves
    np.testing.assert_array_equal(tree.leaves, [[1, 1], [0, 0], [0, 0], [0, 0]])


class _FixedRng:
    """Draws the same uniform every time."""

    def __init__(self, u):
        self.u = u

    def random(self, n):
        return np.full(n, self.u)


def test_draw_past_a_nodes_children_never_picks_a_zero_leaf():
    # Floating-point rounding can leave a draw at or past the sum of the children it descends into (u - acc
    # rounding up to the node's value). Simulate the worst case by inflating a node above its children's sum:
    # draws landing in the excess must still end on a positive leaf (the node's last positive child).
    p = np.zeros((64, 1))
    p[0] = 1.0  # under top node 0
    p[32] = p[33] = 1.0  # under top node 1; its children 34..63 are zero
    tree = SumTree(64, 1, fanout=32)
    tree.set_pending(0, p)
    tree.move_window(0, 64)
    top = tree._top  # a view of the top level
    assert top.tolist() == [1.0, 2.0]
    top[1] = 4.0  # total 5: draws at the top of strata 4 and 5 run past node 1's children
    rows, _, pri = tree.sample(5, _FixedRng(np.nextafter(1.0, 0.0)))  # each draw at the top of its stratum
    assert (p[rows, 0] > 0).all() and (pri > 0).all()
    assert rows.tolist()[3:] == [33, 33]  # past node 1's children: its last positive leaf


def test_rounding_inside_a_group_of_children_never_picks_a_zero_leaf():
    # Children are found in two steps, a group of 8 by the groups' sums, then the child by running sums inside the
    # group; the two can disagree by rounding. Here the draw is exactly 1.0 at node 0: group 1's sum, 2 * 2^-53,
    # lifts the group prefix past 1.0, but added one at a time each 2^-53 rounds away (ties to even), so no child
    # of group 1 passes the draw. The pick must fall back to the node's last positive child, not a zero one.
    tiny = 2.0**-53
    p = np.zeros((64, 1))
    p[0], p[8], p[9] = 1.0, tiny, tiny  # node 0: group 0 holds 1.0, group 1 holds two tiny leaves, then zeros
    tree = SumTree(64, 1, fanout=32)
    tree.set_pending(0, p)
    tree.move_window(0, 64)
    tree._top[:] = [2.0, 0.0]  # total 2.0: one draw at u = 0.5 * 2.0 = 1.0 exactly, inside node 0
    rows, _, pri = tree.sample(1, _FixedRng(0.5))
    assert rows.tolist() == [9] and pri.tolist() == [tiny]


@pytest.mark.parametrize("b", [-1, 2, 3])
def test_update_refuses_env_indices_outside_the_tree_and_writes_nothing(b):
    tree = SumTree(4, 2)
    tree.set_pending(0, np.ones((4, 2)))
    tree.move_window(0, 4)
    before = tree.leaves.copy()
    with pytest.raises(ValueError, match=r"env indices must be in \[0, 2\)"):
        tree.update(np.array([1, 2]), np.array([0, b]), np.array([7.0, 7.0]))
    np.testing.assert_array_equal(tree.leaves, before)
    assert tree.total == pytest.approx(8.0)
