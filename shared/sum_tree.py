"""Sum tree over the ``[T, B]`` leaves of a replay buffer, with a sliding window of valid rows.

Guarantees
- Leaves are float64; every inner node is recomputed from its children on each write (no running deltas), so
  totals do not drift however many updates are made.
- ``sample(n, rng)`` draws ``n`` leaves stratified over the total (one draw in each of ``n`` equal slices of
  the cumulative sum), with probability proportional to priority, and never returns a zero-priority leaf: the
  descent only enters children whose sum is positive, which is exact in floating point.
- Validity is a window ``[lo, hi)`` of *absolute* rows (rows counted since the buffer began, never wrapped)
  that only moves forward and spans at most ``T`` rows. Rows leaving the window are switched off (priority 0);
  rows entering it are switched on with the priority they were given when written (``set_pending``), or the
  default. Priority updates for rows that have left the window since they were sampled are dropped, so a late
  update can never switch on overwritten data.
- Batch operations are vectorised: no Python loop over samples. The tree is ``fanout``-ary (32 by default) and
  its top level (at most ``max_top`` nodes) is searched at once through its prefix sums, so a million leaves
  take one search and 2 vectorised descent steps rather than 20 binary ones.
- With ``shared=True`` all state lives in shared memory (see ``shared.buffer``); callers serialise access.
"""

from __future__ import annotations

import numpy as np

from shared.buffer import shared_zeros

__all__ = ["SumTree"]

_LO, _HI = 0, 1  # slots of the window in the shared state array


class SumTree:
    """Priorities for ``T`` rows of ``B`` leaves (leaf ``t * B + b``); ``T`` rows wrap: abs row ``r`` is row ``r % T``."""

    def __init__(self, T: int, B: int, default_priority: float = 1.0, fanout: int = 32, max_top: int = 2048,
                 shared: bool = False):
        if T < 1 or B < 1:
            raise ValueError(f"T and B must be positive, got T={T}, B={B}")
        if fanout < 2:
            raise ValueError(f"fanout must be at least 2, got {fanout}")
        if max_top < 1:
            raise ValueError(f"max_top must be positive, got {max_top}")
        if not default_priority > 0:
            raise ValueError(f"default_priority must be positive, got {default_priority}")
        self.T, self.B, self.fanout = int(T), int(B), int(fanout)
        self.default_priority = float(default_priority)
        F = self.fanout
        # Levels from the leaves up, each a sum of F nodes below, until one has at most max_top nodes: that top
        # level is searched in one go (prefix sums + binary search), the levels below by a descent of F-wide steps.
        sizes = [self.T * self.B]
        while sizes[-1] > max_top:
            sizes[-1] = -(-sizes[-1] // F) * F
            sizes.append(sizes[-1] // F)
        sizes.reverse()  # sizes[0]: the top ... sizes[-1]: the (padded) leaves
        alloc = shared_zeros if shared else (lambda shape, dtype: np.zeros(shape, dtype))
        self._flat = alloc(sum(sizes), np.float64)
        self._sizes = sizes
        self._pending = alloc((self.T, self.B), np.float64)
        self._window = alloc(2, np.int64)
        self._make_views()

    def _make_views(self) -> None:
        flat = self._flat.view(np.ndarray)  # plain views in the hot paths; _flat keeps the shared handle
        offsets = np.cumsum([0] + self._sizes)
        self._levels = [flat[offsets[d] : offsets[d + 1]] for d in range(len(self._sizes))]

    def __getstate__(self):
        d = self.__dict__.copy()
        del d["_levels"]
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._make_views()

    # ------------------------------------------------------------------ reading
    @property
    def total(self) -> float:
        return float(self._levels[0].sum())

    @property
    def window(self) -> tuple[int, int]:
        """Absolute rows ``[lo, hi)`` whose leaves are switched on."""
        return int(self._window[_LO]), int(self._window[_HI])

    @property
    def leaves(self) -> np.ndarray:
        """Current priorities as a ``[T, B]`` view (zeros outside the window)."""
        return self._levels[-1][: self.T * self.B].reshape(self.T, self.B)

    def abs_row(self, rows: np.ndarray) -> np.ndarray:
        """Absolute row of in-window storage rows ``rows`` (each storage row holds at most one in-window abs row)."""
        lo = self._window[_LO]
        return lo + (np.asarray(rows, dtype=np.int64) - lo) % self.T

    # ------------------------------------------------------------------ writing
    def set_pending(self, abs_start: int, priorities: np.ndarray | float | None = None, n_rows: int | None = None):
        """Give absolute rows ``[abs_start, abs_start + n)`` the priority they get when switched on.

        ``priorities`` is ``[n, B]``, ``[B]`` or a scalar (broadcast; then ``n_rows`` says n), or ``None`` for
        the default. Rows already inside the window are updated in the tree at once.
        """
        if priorities is None:
            priorities = self.default_priority
        p = np.asarray(priorities, dtype=np.float64)
        if p.ndim == 2:
            n = p.shape[0]
            if p.shape[1] != self.B:
                raise ValueError(f"priorities must have shape [n, {self.B}], got {p.shape}")
        else:
            if n_rows is None:
                raise ValueError("n_rows is needed when priorities are not [n, B]")
            n = int(n_rows)
            p = np.broadcast_to(p, (n, self.B))
        if n > self.T:
            raise ValueError(f"cannot set {n} rows in a tree of {self.T} rows")
        if n == 0:
            return
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            raise ValueError("priorities must be finite and non-negative")
        rows = np.arange(abs_start, abs_start + n, dtype=np.int64)
        self._pending[rows % self.T] = p
        lo, hi = self.window
        inside = (rows >= lo) & (rows < hi)
        if inside.any():
            r = rows[inside] % self.T
            self._write_leaves((r[:, None] * self.B + np.arange(self.B)).ravel(), p[inside].ravel())

    def move_window(self, lo: int, hi: int) -> None:
        """Make absolute rows ``[lo, hi)`` the valid ones (both ends only move forward; ``hi - lo <= T``)."""
        old_lo, old_hi = self.window
        lo, hi = int(lo), int(hi)
        hi = max(hi, lo)
        if lo < old_lo or hi < old_hi:
            raise ValueError(f"window can only move forward: [{old_lo}, {old_hi}) -> [{lo}, {hi})")
        if hi - lo > self.T:
            raise ValueError(f"window [{lo}, {hi}) is longer than the {self.T} rows of the tree")
        self._fill_rows(old_lo, min(lo, old_hi), None)  # leaving: switched off
        self._fill_rows(max(old_hi, lo), hi, self._pending)  # entering: switched on
        self._window[_LO], self._window[_HI] = lo, hi

    def update(self, abs_rows: np.ndarray, b_idx: np.ndarray, priorities: np.ndarray) -> int:
        """Set leaves ``(abs_rows, b_idx)`` to ``priorities``; rows no longer in the window are skipped.

        Returns how many leaves were written.
        """
        abs_rows = np.asarray(abs_rows, dtype=np.int64).ravel()
        b_idx = np.asarray(b_idx, dtype=np.int64).ravel()
        p = np.asarray(priorities, dtype=np.float64).ravel()
        if not (abs_rows.shape == b_idx.shape == p.shape):
            raise ValueError(f"abs_rows, b_idx and priorities differ in length: {abs_rows.shape}, {b_idx.shape}, {p.shape}")
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            raise ValueError("priorities must be finite and non-negative")
        lo, hi = self.window
        keep = (abs_rows >= lo) & (abs_rows < hi)
        if not keep.all():
            abs_rows, b_idx, p = abs_rows[keep], b_idx[keep], p[keep]
        self._write_leaves((abs_rows % self.T) * self.B + b_idx, p)
        return int(keep.sum())

    # ------------------------------------------------------------------ sampling
    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``n`` leaves stratified over the total; returns ``(abs_rows, b_idx, priorities)``."""
        top_csum = np.cumsum(self._levels[0])
        total = top_csum[-1]
        if not total > 0:
            raise ValueError("cannot sample: every priority is zero (no valid rows)")
        u = (np.arange(n) + rng.random(n)) * (total / n)
        np.minimum(u, np.nextafter(total, 0.0), out=u)
        # First top node whose prefix sum exceeds u: its own sum is positive (equal prefix sums mean a zero node).
        node = np.searchsorted(top_csum, u, side="right")
        u -= np.where(node > 0, top_csum[np.maximum(node - 1, 0)], 0.0)
        np.maximum(u, 0.0, out=u)
        F = self.fanout
        arange = np.arange(n)
        for level in self._levels[1:]:
            children = level.reshape(-1, F)[node]  # [n, F]
            csum = np.cumsum(children, axis=1)
            j = (csum <= u[:, None]).sum(axis=1)
            over = j >= F
            if over.any():  # u beyond the children's own sum (rounding): take the last positive child
                j[over] = F - 1 - np.argmax(children[over, ::-1] > 0, axis=1)
            u -= np.where(j > 0, csum[arange, np.maximum(j - 1, 0)], 0.0)
            np.maximum(u, 0.0, out=u)
            node = node * F + j
        rows, b_idx = np.divmod(node, self.B)
        return self.abs_row(rows), b_idx, self._levels[-1][node]

    # ------------------------------------------------------------------ internals
    def _fill_rows(self, abs_lo: int, abs_hi: int, source: np.ndarray | None) -> None:
        """Write rows ``[abs_lo, abs_hi)`` from ``source[T, B]`` (or zeros), as at most two contiguous ranges."""
        if abs_hi <= abs_lo:
            return
        leaves = self._levels[-1]
        start = abs_lo % self.T
        n = abs_hi - abs_lo
        for a, b in ((start, min(start + n, self.T)), (0, max(start + n - self.T, 0))):
            if b <= a:
                continue
            leaves[a * self.B : b * self.B] = 0.0 if source is None else source[a:b].ravel()
            self._propagate_range(a * self.B, b * self.B)

    def _propagate_range(self, a: int, b: int) -> None:
        F = self.fanout
        for d in range(len(self._levels) - 1, 0, -1):
            pa, pb = a // F, (b - 1) // F + 1
            self._levels[d - 1][pa:pb] = self._levels[d][pa * F : pb * F].reshape(-1, F).sum(axis=1)
            a, b = pa, pb

    def _write_leaves(self, leaf_idx: np.ndarray, values: np.ndarray) -> None:
        if leaf_idx.size == 0:
            return
        self._levels[-1][leaf_idx] = values  # duplicates: the last write wins, as in sequential updates
        F = self.fanout
        node = leaf_idx // F  # duplicates left in: each recomputes the same sum, cheaper than np.unique
        for d in range(len(self._levels) - 1, 0, -1):
            self._levels[d - 1][node] = self._levels[d].reshape(-1, F)[node].sum(axis=1)
            node = node // F
