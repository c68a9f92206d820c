"""Sum tree over the ``[T, B]`` leaves of a replay buffer, with a sliding window of valid rows.

Guarantees
- Leaves are float64; every inner node is recomputed from its children on each write (no running deltas), so
  totals do not drift however many updates are made.
- ``sample(n, rng)`` draws ``n`` leaves stratified over the total (one draw in each of ``n`` equal slices of
  the cumulative sum), with probability proportional to priority, and never returns a zero-priority leaf: the
  descent only enters a child whose value lifts the running prefix sum past the draw, which a zero cannot, and
  a draw that rounding leaves past all of a node's children takes its last positive child.
- Validity is a window ``[lo, hi)`` of *absolute* rows (rows counted since the buffer began, never wrapped)
  that only moves forward and spans at most ``T`` rows. Rows leaving the window are switched off (priority 0);
  rows entering it are switched on with the priority they were given when written (``set_pending``), or the
  default. Priority updates for rows that have left the window since they were sampled are dropped, so a late
  update can never switch on overwritten data.
- The tree is ``fanout``-ary (a power of two, 32 by default: a million leaves are 4 levels of 32-wide nodes of
  4 cache lines each). Each operation is one call of a numba-compiled kernel: per draw, the work is a chain of
  dependent reads that numpy could only batch at a microsecond per call and level.
- With ``shared=True`` all state lives in shared memory (see ``shared.buffer``); callers serialise access.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from numba import njit

from shared.buffer import zeros

__all__ = ["SumTree"]

_FLOAT64 = np.dtype(np.float64)

# Layout of the int64 `meta` array the kernels read (one array: each array argument costs a numba call time):
# fanout and its log2, rows, envs, the window [lo, hi) of valid absolute rows, then where each level starts in `flat`.
_F, _SHIFT, _T, _B, _LO, _HI, _STARTS = 0, 1, 2, 3, 4, 5, 6


# --------------------------------------------------------------------------------------- compiled kernels
# Levels are stored top first in one flat array; starts[d] is where level d begins, starts[-1] the end. The top
# level has at most `fanout` nodes and is scanned like any node's children.


@njit(cache=True, nogil=True)
def _node_sum(flat, start, F):
    """Sum of F nodes from start, in four interleaved partial sums: four short dependency chains instead of
    one long one (the node's value need not equal the descent's running prefix; see the fallback in _sample)."""
    s0 = s1 = s2 = s3 = 0.0
    c = 0
    while c + 4 <= F:
        s0 += flat[start + c]
        s1 += flat[start + c + 1]
        s2 += flat[start + c + 2]
        s3 += flat[start + c + 3]
        c += 4
    s = (s0 + s1) + (s2 + s3)
    while c < F:
        s += flat[start + c]
        c += 1
    return s


@njit(cache=True, nogil=True)
def _propagate_leaves(flat, meta, leaves):
    """Recompute the ancestors of `leaves` (indices into the leaf level; overwritten), one level at a time:
    the sums of different leaves are independent, so the CPU overlaps their memory reads."""
    starts, F, shift = meta[_STARTS:], meta[_F], meta[_SHIFT]
    depth = len(starts) - 1
    for d in range(depth - 1, 0, -1):
        for k in range(len(leaves)):
            node = leaves[k] >> shift  # // F, without a division per node
            flat[starts[d - 1] + node] = _node_sum(flat, starts[d] + node * F, F)
            leaves[k] = node


@njit(cache=True, nogil=True)
def _propagate_range(flat, meta, a, b):
    """Recompute the ancestors of leaves [a, b)."""
    starts, F = meta[_STARTS:], meta[_F]
    depth = len(starts) - 1
    for d in range(depth - 1, 0, -1):
        a, b = a // F, (b - 1) // F + 1
        for node in range(a, b):
            flat[starts[d - 1] + node] = _node_sum(flat, starts[d] + node * F, F)


@njit(cache=True, nogil=True)
def _valid_priorities(p):
    for x in p.ravel():
        if not (x >= 0.0 and x < np.inf):  # NaN fails both
            return False
    return True


@njit(cache=True, nogil=True)
def _update(flat, meta, abs_rows, b_idx, p):
    """Write leaves (abs_rows, b_idx) in the window [lo, hi); returns how many (-1: invalid priority, -2: an env
    index outside [0, B)). Nothing is written unless every entry is valid."""
    starts, T, B, lo, hi = meta[_STARTS:], meta[_T], meta[_B], meta[_LO], meta[_HI]
    if not _valid_priorities(p):
        return -1
    for b in b_idx:
        if b < 0 or b >= B:
            return -2
    leaf0 = starts[len(starts) - 2]
    written = np.empty(len(p), np.int64)
    n = 0
    for k in range(len(p)):
        r = abs_rows[k]
        if r >= lo and r < hi:
            leaf = (r % T) * B + b_idx[k]
            flat[leaf0 + leaf] = p[k]  # duplicates: the last write wins, as in sequential updates
            written[n] = leaf
            n += 1
    _propagate_leaves(flat, meta, written[:n])
    return n


@njit(cache=True, nogil=True, inline="always")
def _pick_child(flat, base, width, u):
    """The first of `width` children from `base` whose running prefix sum passes u, and the prefix before it.
    A zero child is never picked: the prefix before the pick is <= u and the prefix after it > u, so the child
    itself is positive. When rounding leaves u past every running sum (in the parent's u - acc, or a group's sum
    against the running sums inside it), the last positive child is taken."""
    if width & 7 == 0:
        # Groups of 8 children are summed independently; the group is found by counting the group prefix sums
        # <= u, then the child the same way inside it. No branch depends on u (a scan's exit mispredicts about
        # once a node) and the dependency chains are short.
        prefix = acc = 0.0
        group = 0
        for g in range(0, width, 8):
            s = 0.0
            for c in range(8):
                s += flat[base + g + c]
            prefix += s
            below = prefix <= u
            group += below
            acc = prefix if below else acc
        if group * 8 < width:
            j = group * 8
            prefix = acc
            for c in range(8):
                prefix += flat[base + group * 8 + c]
                below = prefix <= u
                j += below
                acc = prefix if below else acc
            if j < group * 8 + 8:
                return j, acc
    else:  # fanout below 8, or a top level whose width is no multiple of 8: a plain scan
        acc = 0.0
        for c in range(width):
            v = flat[base + c]
            if acc + v > u:
                return c, acc
            acc += v
    last = -1
    for c in range(width):
        if flat[base + c] > 0.0:
            last = c
    acc = 0.0
    for c in range(last):
        acc += flat[base + c]
    return last, acc


@njit(cache=True, nogil=True)
def _sample(flat, meta, uniforms, abs_rows, b_idx, priorities, sink):
    """Stratified descent: draw k lands in [k, k + 1) * total / n. Writes the absolute rows, env indices and
    priorities of the drawn leaves; returns the total (0: nothing to sample, nothing written)."""
    starts, F, T, B, lo = meta[_STARTS:], meta[_F], meta[_T], meta[_B], meta[_LO]
    n = len(uniforms)
    depth = len(starts) - 1
    top = starts[1] - starts[0]  # the top level is one node of <= F children
    total = 0.0
    for c in range(top):  # summed in the order the descent adds, so a draw below it always finds a top node
        total += flat[c]
    if not total > 0.0:
        return total
    u_max = np.nextafter(total, 0.0)
    u = np.empty(n)
    node = np.zeros(n, np.int64)
    for k in range(n):
        u[k] = min((k + uniforms[k]) * (total / n), u_max)
    for d in range(depth):  # level by level for all draws
        width = top if d == 0 else F
        # Read every draw's children first, one load per cache line: the loads are independent, so the CPU has
        # them all in flight at once instead of one cache miss at a time in the scan below.
        touched = 0.0
        for k in range(n):
            base = starts[d] + node[k] * F
            for c in range(0, width, 8):
                touched += flat[base + c]
        sink[0] = touched  # keeps the reads from being optimised away
        for k in range(n):
            base = starts[d] + node[k] * F
            j, acc = _pick_child(flat, base, width, u[k])
            u[k] = max(u[k] - acc, 0.0)
            node[k] = node[k] * F + j
    for k in range(n):
        row = node[k] // B
        abs_rows[k] = lo + (row - lo) % T
        b_idx[k] = node[k] - row * B
        priorities[k] = flat[starts[depth - 1] + node[k]]
    return total


@njit(cache=True, nogil=True)
def _fill_rows(flat, meta, source, abs_lo, abs_hi, zero):
    """Write absolute rows [abs_lo, abs_hi) (at most T) from source [T, B], or zeros, and their ancestors."""
    starts, T, B = meta[_STARTS:], meta[_T], meta[_B]
    if abs_hi <= abs_lo:
        return
    leaf0 = starts[len(starts) - 2]
    start = abs_lo % T
    end = start + (abs_hi - abs_lo)
    for a, b in ((start, min(end, T)), (0, max(end - T, 0))):  # up to the wrap, then from row 0
        if b <= a:
            continue
        for r in range(a, b):
            for j in range(B):
                flat[leaf0 + r * B + j] = 0.0 if zero else source[r, j]
        _propagate_range(flat, meta, a * B, b * B)


# Error codes of _write; SumTree._apply turns them into ValueErrors.
_OK, _BAD_WIDTH, _TOO_MANY_ROWS, _BAD_PRIORITY, _BACKWARD, _TOO_LONG = range(6)


@njit(cache=True, nogil=True)
def _write(flat, meta, pending, abs_start, p, lo, hi, move):
    """Pending priorities p [n, B] for absolute rows [abs_start, abs_start + n) (rows inside the window are written
    to the tree now), then, if `move`, the window moves to [lo, max(lo, hi)): rows leaving it are switched off,
    rows entering it switched on. Everything is checked before anything is written; returns an error code."""
    T, B = meta[_T], meta[_B]
    if p.shape[1] != B:
        return _BAD_WIDTH
    if p.shape[0] > T:
        return _TOO_MANY_ROWS
    if not _valid_priorities(p):
        return _BAD_PRIORITY
    hi = max(hi, lo)
    if move and (lo < meta[_LO] or hi < meta[_HI]):
        return _BACKWARD
    if move and hi - lo > T:
        return _TOO_LONG
    n = p.shape[0]
    for i in range(n):
        r = (abs_start + i) % T
        for j in range(B):
            pending[r, j] = p[i, j]
    _fill_rows(flat, meta, pending, max(abs_start, meta[_LO]), min(abs_start + n, meta[_HI]), False)
    if move:
        _fill_rows(flat, meta, pending, meta[_LO], min(lo, meta[_HI]), True)
        _fill_rows(flat, meta, pending, max(meta[_HI], lo), hi, False)
        meta[_LO], meta[_HI] = lo, hi
    return _OK


def _flat(x, dtype) -> np.ndarray:
    """x as a 1-D array of dtype, without numpy calls when it already is one (this is per learner step)."""
    if type(x) is np.ndarray and x.dtype == dtype and x.ndim == 1:
        return x
    return np.asarray(x, dtype=dtype).ravel()


class SumTree:
    """Priorities for ``T`` rows of ``B`` leaves (leaf ``t * B + b``); ``T`` rows wrap: abs row ``r`` is row
    ``r % T``."""

    def __init__(self, T: int, B: int, default_priority: float = 1.0, fanout: int = 32, shared: bool = False):
        if T < 1 or B < 1:
            raise ValueError(f"T and B must be positive, got T={T}, B={B}")
        if fanout < 2 or fanout & (fanout - 1):
            raise ValueError(f"fanout must be a power of two of at least 2, got {fanout}")
        if not default_priority > 0:
            raise ValueError(f"default_priority must be positive, got {default_priority}")
        self.T, self.B, self.fanout = int(T), int(B), int(fanout)
        self.default_priority = float(default_priority)
        F = self.fanout
        # Levels from the leaves up, each padded to a multiple of F and summed F nodes at a time, until one has at
        # most F nodes: the top, a single node's children.
        sizes = [self.T * self.B]
        while sizes[-1] > F:
            sizes[-1] = -(-sizes[-1] // F) * F
            sizes.append(sizes[-1] // F)
        sizes.reverse()  # sizes[0]: the top ... sizes[-1]: the (padded) leaves
        alloc = partial(zeros, shared=shared)  # each array checked against the memory left first
        self._flat = alloc(sum(sizes), np.float64)
        self._pending = alloc((self.T, self.B), np.float64)
        self._meta = alloc(_STARTS + len(sizes) + 1, np.int64)  # holds the window: shared when the tree is
        self._meta[[_F, _SHIFT, _T, _B]] = F, F.bit_length() - 1, self.T, self.B
        self._meta[_STARTS:] = np.cumsum([0] + sizes)
        self._make_views()

    def _make_views(self) -> None:
        self._plain = self._flat.view(np.ndarray)  # plain views in the hot paths; _flat keeps the shared handle
        self._meta_plain = self._meta.view(np.ndarray)
        starts = self._meta_plain[_STARTS:]
        self._top = self._plain[starts[0] : starts[1]]
        self._leaves = self._plain[starts[-2] : starts[-1]]
        self._pending_plain = self._pending.view(np.ndarray)
        self._sink = np.zeros(1)  # per-process scratch of the sampling kernel
        self._no_rows = np.zeros((0, self.B))  # move_window is _write with no pending rows

    def __getstate__(self):
        d = self.__dict__.copy()
        for name in ("_plain", "_top", "_leaves", "_meta_plain", "_pending_plain", "_sink", "_no_rows"):
            del d[name]
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._make_views()

    # ------------------------------------------------------------------ reading
    @property
    def total(self) -> float:
        return sum(self._top.tolist())  # in the order sampling adds

    @property
    def window(self) -> tuple[int, int]:
        """Absolute rows ``[lo, hi)`` whose leaves are switched on."""
        return int(self._meta[_LO]), int(self._meta[_HI])

    @property
    def leaves(self) -> np.ndarray:
        """Current priorities as a ``[T, B]`` view (zeros outside the window)."""
        return self._leaves[: self.T * self.B].reshape(self.T, self.B)

    # ------------------------------------------------------------------ writing
    def set_pending(self, abs_start: int, priorities: np.ndarray | float | None = None, n_rows: int | None = None):
        """Give absolute rows ``[abs_start, abs_start + n)`` the priority they get when switched on.

        ``priorities`` is ``[n, B]``, ``[B]`` or a scalar (broadcast; then ``n_rows`` says n), or ``None`` for
        the default. Rows already inside the window are updated in the tree at once.
        """
        self._apply(abs_start, self._rows(priorities, n_rows), 0, 0, move=False)

    def pending_row(self, abs_row: int) -> np.ndarray:
        """The priorities ``[B]`` absolute row ``abs_row`` gets (or got) when switched on."""
        return self._pending_plain[abs_row % self.T].copy()

    def move_window(self, lo: int, hi: int) -> None:
        """Make absolute rows ``[lo, hi)`` the valid ones (both ends only move forward; ``hi - lo <= T``)."""
        self._apply(0, self._no_rows, lo, hi, move=True)

    def append(self, abs_start: int, priorities: np.ndarray | float | None, lo: int, hi: int, n_rows: int | None = None):
        """``set_pending(abs_start, priorities, n_rows)`` then ``move_window(lo, hi)``, in one compiled call (what a
        replay does per appended chunk); nothing is written if either would raise."""
        self._apply(abs_start, self._rows(priorities, n_rows), lo, hi, move=True)

    def _rows(self, priorities, n_rows) -> np.ndarray:
        """priorities as a float64 [n, B] array (any layout: the kernel indexes it)."""
        p = self.default_priority if priorities is None else priorities
        if type(p) is np.ndarray and p.ndim == 2 and p.dtype is _FLOAT64:  # the per-step case: no numpy calls
            return p
        p = np.asarray(p, dtype=np.float64)
        if p.ndim != 2:
            if n_rows is None:
                raise ValueError("n_rows is needed when priorities are not [n, B]")
            p = np.broadcast_to(p, (int(n_rows), self.B))
        return p

    def _apply(self, abs_start: int, p: np.ndarray, lo: int, hi: int, move: bool) -> None:
        lo, hi = int(lo), int(hi)
        code = _write(self._plain, self._meta_plain, self._pending_plain, int(abs_start), p, lo, hi, move)
        if code == _OK:
            return
        if code == _BAD_WIDTH:
            raise ValueError(f"priorities must have shape [n, {self.B}], got {p.shape}")
        if code == _TOO_MANY_ROWS:
            raise ValueError(f"cannot set {p.shape[0]} rows in a tree of {self.T} rows")
        if code == _BAD_PRIORITY:
            raise ValueError("priorities must be finite and non-negative")
        old_lo, old_hi = self.window
        if code == _BACKWARD:
            raise ValueError(f"window can only move forward: [{old_lo}, {old_hi}) -> [{lo}, {max(lo, hi)})")
        raise ValueError(f"window [{lo}, {max(lo, hi)}) is longer than the {self.T} rows of the tree")

    def update(self, abs_rows: np.ndarray, b_idx: np.ndarray, priorities: np.ndarray) -> int:
        """Set leaves ``(abs_rows, b_idx)`` to ``priorities``; rows no longer in the window are skipped.

        Returns how many leaves were written.
        """
        abs_rows, b_idx, p = _flat(abs_rows, np.int64), _flat(b_idx, np.int64), _flat(priorities, np.float64)
        if not (abs_rows.shape == b_idx.shape == p.shape):
            raise ValueError(f"abs_rows, b_idx and priorities differ in length: {abs_rows.shape}, {b_idx.shape}, {p.shape}")
        written = _update(self._plain, self._meta_plain, abs_rows, b_idx, p)
        if written == -1:
            raise ValueError("priorities must be finite and non-negative")
        if written == -2:
            raise ValueError(f"env indices must be in [0, {self.B}), got {b_idx.min()}..{b_idx.max()}")
        return written

    # ------------------------------------------------------------------ sampling
    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``n`` leaves stratified over the total; returns ``(abs_rows, b_idx, priorities)``."""
        abs_rows, b_idx, priorities = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.float64)
        total = _sample(self._plain, self._meta_plain, rng.random(n), abs_rows, b_idx, priorities, self._sink)
        if not total > 0:
            raise ValueError("cannot sample: every priority is zero (no valid rows)")
        return abs_rows, b_idx, priorities
