"""Replay buffers: preallocated ``[T, B]`` ring storage, n-step returns, frame-wise observations, sequences.

Row convention (gymnasium's next-step autoreset). Each appended row ``t`` of env ``b`` holds the observation the
agent saw, the action it took, and what followed: ``reward``, ``terminated`` and, optionally, ``truncated`` (a
time limit). After a row whose episode ended, the env's next step only resets it: that next row holds the
episode's *final observation* (its action and reward are ignored). Such a row is never sampled as a transition,
but it is the bootstrap observation of windows that end in a truncation, so truncations bootstrap from the right
state. The row after it starts the next episode. An optional field ``episode_end`` says which rows end with the
env resetting; it defaults to ``terminated | truncated`` and is needed when ``terminated`` also marks ends the env
goes on from, such as a lost life treated as terminal for learning (n-step windows stop there, but no row is skipped).

Guarantees
- n-step quantities are computed on append, across the wrap-around: ``n_step_return`` (discounted reward sum up
  to ``n`` steps or the episode's end), ``terminated_n`` (terminated inside the window), ``truncated_n`` (truncated
  inside the window), ``n_taken`` (steps in the window ``k``); the bootstrap observation is the one ``k`` rows
  later and ``bootstrap_discount`` is ``discount ** k``. Target: ``n_step_return + (1 - terminated_n) *
  bootstrap_discount * V(next_observation)``.
- Frame-wise storage (``frame_stack = C > 1``): observations ``[C, H, W]`` (oldest frame first) are stored as
  one new frame per row and reassembled on sampling; frames from before an episode's start are zero, so
  acting-time observations must pad with zeros too.
- Sampling never returns an invalid index: rows whose n-step window or bootstrap row is not yet written, rows
  whose frame history is overwritten, final-observation rows, and (sequences) sequences that cross the cursor.
- Prioritized sampling stores ``(|priority| + eps) ** alpha`` in a sum tree; importance weights are
  ``(P(i) N) ** -beta`` normalised by their maximum over the batch. New samples get the largest priority seen
  so far unless priorities come with them.
- With ``shared=True`` every array and counter lives in shared memory and one lock serialises ``append``,
  ``sample`` and ``update_priorities``; sampled batches are copies taken under the lock, so they are consistent.
  Pass the buffer to the child as a ``Process`` argument (the lock travels only that way); ``watch(check)``
  keeps the other side from hanging if the child is killed while holding the lock.
- ``save(path)`` / ``load(path)`` write and restore the whole state (stored rows, n-step quantities, cursor,
  priorities and sum tree, recurrent states, the sampling random state) as an ``.npz`` of plain arrays: no
  pickled object, loaded with ``allow_pickle=False``. A loaded buffer samples exactly as the saved one would.
  ``end_episodes()`` then truncates every env's episode at its newest rows, as a time limit would, so rows
  from freshly reset envs can follow.
- With ``prefetch=True`` (``prefetch_on``: a GPU learner fed by an async sampler), ``sample_ahead`` draws the
  next batch at once and the next ``sample`` returns it (one of another size drops it): called between an
  update's last kernel and its first read on the host, the host gathers the next batch while the device trains
  on the current one. That batch sees the priorities from before the current update's (stale by one update, in
  a replay that the sampler changes meanwhile anyway) and the importance exponent ``beta`` of its draw. Without
  ``prefetch`` ``sample_ahead`` does nothing, so serial and parallel runs draw exactly as before.
- Bad input raises ``ValueError`` naming the argument; a size the machine cannot hold raises
  ``shared.buffer.NotEnoughMemory`` before any of its memory is taken (each array checked before it is made,
  then all of them together while their pages are still untouched).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import sync
from shared.buffer import buffer_from_example, check_fits, shared_zeros, zeros
from shared.namedarraytuple import dotted, is_namedarraytuple, map_structure, namedarraytuple, walk_structure

if TYPE_CHECKING:
    from shared.sum_tree import SumTree

__all__ = ["ReplayBuffer", "SequenceReplayBuffer", "SampleIndex", "prefetch_on", "stacked"]

SampleIndex = namedarraytuple("SampleIndex", ["abs_row", "b"])
_REQUIRED = ("observation", "action", "reward", "terminated")
_DERIVED = ("n_step_return", "terminated_n", "truncated_n", "n_taken", "final_row", "episode_start")
_CURSOR, _MAX_PRIORITY = 0, 1  # slots in the shared float64 state


def prefetch_on(device: Any, sampler: str) -> bool:
    """Whether a learner's replay should draw each next batch during the current update (``sample_ahead``): on a
    GPU fed by an async sampler, where the host would otherwise gather while the device idles. Serial and
    parallel runs keep the exact order of draws and updates; on the CPU there is nothing to overlap."""
    return str(device).startswith("cuda") and sampler == "async"


class _Storage:
    """The ``[T, B]`` arrays and the append logic shared by both buffers."""

    def __init__(
        self,
        example: Any,
        T: int,
        B: int,
        discount: float,
        n_step_return: int,
        frame_stack: int,
        shared: bool,
        skip_fields: tuple[str, ...] = (),
    ):
        if not is_namedarraytuple(example):
            raise ValueError("example must be a namedarraytuple of one time step (no leading dims)")
        for f in _REQUIRED:
            if f not in example or getattr(example, f) is None:
                raise ValueError(f"example must have field {f!r}")
        for f in _DERIVED:
            if f in example:
                raise ValueError(f"example field {f!r} clashes with a field the buffer computes")
        obs = np.asarray(example.observation)
        if frame_stack > 1 and (obs.ndim < 2 or obs.shape[0] != frame_stack):
            raise ValueError(f"frame_stack={frame_stack} needs observations shaped [{frame_stack}, ...], got {obs.shape}")
        self.T, self.B, self.n, self.C = T, B, n_step_return, frame_stack
        self.discount = float(discount)
        self.example = map_structure(np.asarray, example)
        self.skip_fields = skip_fields
        stored = self.example._replace(**{f: None for f in skip_fields})
        if frame_stack > 1:
            stored = stored._replace(observation=None)
        alloc = partial(zeros, shared=shared)  # each array checked against the memory left first
        self.data = buffer_from_example(stored, (T, B), shared=shared)
        self.frames = alloc((T, B) + obs.shape[1:], obs.dtype) if frame_stack > 1 else None
        self.n_step_return = alloc((T, B), np.float32)
        self.terminated_n = alloc((T, B), np.bool_)
        self.truncated_n = alloc((T, B), np.bool_)
        self.n_taken = alloc((T, B), np.uint8)
        self.final_row = alloc((T, B), np.bool_)
        self.episode_start = alloc((T, B), np.bool_)
        self.last_flags = alloc((2, B), np.bool_)  # [episode_end, final_row] of the newest row
        self.state = alloc(2, np.float64)  # [cursor (abs rows written), max priority seen]
        self.state[_MAX_PRIORITY] = 1.0
        self.checked: tuple = (None, 0)  # (signature, Tc) of the last chunk that passed check
        # bootstrap_discount by n_taken: the same float64 powers, looked up rather than computed per sample
        self.discounts = (self.discount ** np.arange(n_step_return + 1, dtype=np.float64)).astype(np.float32)

    @property
    def cursor(self) -> int:
        return int(self.state[_CURSOR])

    def check(self, samples: Any) -> int:
        """Validate a ``[Tc, B, ...]`` chunk against the example; returns ``Tc``. A chunk of plain arrays with the
        shapes and dtypes of the last one that passed passes at once (the checks depend on nothing else)."""
        signature = _signature(samples)
        if signature is not None and signature == self.checked[0]:
            return self.checked[1]
        if not is_namedarraytuple(samples) or samples._fields != self.example._fields:
            raise ValueError(f"samples must be a {type(self.example).__name__} with fields {self.example._fields}")
        Tc = None
        for name, ex, x in zip(self.example._fields, self.example, samples):
            if ex is None:
                continue
            if x is None:
                raise ValueError(f"samples.{name} is None but the example has it")
            for path, exa, xa in _leaves(name, ex, x):
                xa = np.asarray(xa)
                if xa.ndim != exa.ndim + 2 or xa.shape[1] != self.B or xa.shape[2:] != exa.shape:
                    raise ValueError(f"samples.{path} must have shape [T, {self.B}, *{exa.shape}], got {xa.shape}")
                if Tc is None:
                    Tc = xa.shape[0]
                elif xa.shape[0] != Tc:
                    raise ValueError(f"samples.{path} has {xa.shape[0]} time steps, other fields {Tc}")
                if not np.can_cast(xa.dtype, exa.dtype, casting="same_kind"):
                    raise ValueError(f"samples.{path} has dtype {xa.dtype}, cannot store as {exa.dtype}")
        if not Tc:
            raise ValueError("samples must hold at least one time step")
        if Tc > self.T:
            raise ValueError(f"samples hold {Tc} time steps, more than the buffer's {self.T} rows")
        self.checked = (signature, Tc)
        return Tc

    def rows(self, abs_lo: int, m: int) -> Any:
        """Storage rows of abs rows ``[abs_lo, abs_lo + m)``: a slice where they do not wrap around (basic indexing,
        a fraction of the cost of an index array for each field written), else an index array."""
        lo = abs_lo % self.T
        return slice(lo, lo + m) if lo + m <= self.T else (abs_lo + np.arange(m)) % self.T

    def append(self, samples: Any, Tc: int) -> tuple[int, int]:
        """Write ``[Tc, B]`` rows at the cursor, update flags and n-step returns; returns abs ``(start, end)``."""
        s = self.cursor
        rows = self.rows(s, Tc)
        stored = samples._replace(**{f: None for f in self.skip_fields}) if self.skip_fields else samples
        if self.frames is not None:
            self.frames[rows] = np.asarray(samples.observation)[:, :, -1]
            stored = stored._replace(observation=None)
        self.data[rows] = stored
        episode_end = np.asarray(samples.terminated, dtype=bool)
        if "truncated" in samples and samples.truncated is not None:
            episode_end = episode_end | np.asarray(samples.truncated, dtype=bool)
        if "episode_end" in samples and samples.episode_end is not None:
            episode_end = np.asarray(samples.episode_end, dtype=bool)
        final_row = np.concatenate([self.last_flags[0][None], episode_end[:-1]])
        episode_start = np.concatenate([self.last_flags[1][None], final_row[:-1]])
        if s == 0:
            episode_start[0] = True
        self.final_row[rows] = final_row
        self.episode_start[rows] = episode_start
        self.last_flags[0], self.last_flags[1] = episode_end[-1], final_row[-1]
        self._compute_returns(max(s - self.n + 1, 0), s + Tc - self.n + 1)
        self.state[_CURSOR] = s + Tc
        return s, s + Tc

    def _compute_returns(self, abs_lo: int, abs_hi: int) -> None:
        """n-step quantities for abs rows ``[abs_lo, abs_hi)``, whose windows are now fully written."""
        m = abs_hi - abs_lo
        if m <= 0:
            return
        reward, terminated = self.data.reward, self.data.terminated
        truncated = self.data.truncated if "truncated" in self.data and self.data.truncated is not None else None
        if self.n == 1:  # each window is its own row: the loop below reduces to this (the same values, bit for bit)
            rows = self.rows(abs_lo, m)
            term = terminated[rows].astype(bool)
            self.n_step_return[rows] = 0.0 + reward[rows].astype(np.float64)  # 0.0 +: -0.0 sums to 0.0 as below
            self.terminated_n[rows] = term
            self.truncated_n[rows] = truncated[rows].astype(bool) & ~term if truncated is not None else False
            self.n_taken[rows] = 1
            return
        t = abs_lo + np.arange(m)
        ret = np.zeros((m, self.B), np.float64)
        alive = np.ones((m, self.B), bool)
        terminated_n = np.zeros((m, self.B), bool)
        truncated_n = np.zeros((m, self.B), bool)
        k = np.zeros((m, self.B), np.uint8)
        for j in range(self.n):
            idx = (t + j) % self.T
            ret += np.where(alive, self.discount**j * reward[idx], 0.0)
            k += alive
            term = terminated[idx].astype(bool)
            trunc = truncated[idx].astype(bool) if truncated is not None else np.zeros_like(term)
            terminated_n |= alive & term
            truncated_n |= alive & trunc & ~term
            alive &= ~(term | trunc)
        rows = t % self.T
        self.n_step_return[rows] = ret
        self.terminated_n[rows] = terminated_n
        self.truncated_n[rows] = truncated_n
        self.n_taken[rows] = k

    def take(self, x: Any, rows: np.ndarray, b: np.ndarray) -> Any:
        """``x[rows, b]`` of a ``[T, B, ...]`` field (any structure of arrays): one take along the flattened
        ``[T * B]`` rows, a fraction of the cost of indexing with two arrays."""
        return self.take_flat(x, rows * self.B + b)

    @staticmethod
    def take_flat(x: Any, flat: np.ndarray) -> Any:
        """``take`` at ``flat = rows * B + b``, for a caller that gathers several fields at one index."""
        if type(x) is np.ndarray:  # the common case, without the structure walk
            return x.reshape(-1, *x.shape[2:]).take(flat, axis=0)
        return map_structure(lambda a: a.reshape(-1, *a.shape[2:]).take(flat, axis=0), x)

    def observation(self, rows: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Observations at storage ``rows`` (any shape, broadcast with ``b``), frames reassembled if frame-wise."""
        if self.frames is None:
            return self.take(self.data.observation, rows, b)
        C = self.C
        rows, b = np.broadcast_arrays(rows, b)
        r = (rows[..., None] + np.arange(-(C - 1), 1)) % self.T  # [..., C], oldest frame first
        bb = b[..., None]
        obs = self.frames[r, bb]  # [..., C, H, W]
        start = self.episode_start[r, bb]
        # Frame c predates the episode when a later frame's row (c+1 .. C-1) starts an episode.
        before_start = np.cumsum(start[..., :0:-1], axis=-1)[..., ::-1] > 0  # [..., C-1]
        obs[np.concatenate([before_start, np.zeros_like(before_start[..., :1])], axis=-1)] = 0
        return obs

    def unique_frames(self, rows: np.ndarray, b: np.ndarray, span: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Frame-wise storage: ``(frames, index)`` with ``frames[index] == observation(rows, b)`` for ``rows`` [L, N]
        (``b`` [1, N] or [L, N], one env a column) whose column ``i`` lies within the ``span`` rows from ``rows[0, i]``
        (default L: sequences of consecutive rows). Each column's window of ``span + C - 1`` frames travels once, in
        order, after an all-zero frame 0 that stands for the frames predating an episode: ``frames`` is ``[1 + N (span
        + C - 1), ...]``, one shape for a batch size (a captured update's input), L + C - 1 frames a sequence where
        its stacked observations hold L * C. ``index`` [L, N, C] (int64) is where each observation's frames are."""
        C = self.C
        rows, b = np.broadcast_arrays(rows, b)
        L, N = rows.shape
        W = (span or L) + C - 1
        offset = (rows - rows[0]) % self.T  # [L, N]: each row's place after its column's first
        if offset.max() >= W - C + 1:
            raise ValueError(f"rows {list(rows.shape)} span more than {W - C + 1} rows")
        window = (rows[0][:, None] + np.arange(-(C - 1), W - C + 1)) % self.T * self.B + b[0][:, None]  # [N, W], flat
        starts = np.cumsum(self.episode_start.reshape(-1).take(window), axis=1)  # [N, W]: episode starts up to each
        pos = offset[..., None] + np.arange(C)  # [L, N, C]: each observation's frames in its column's window
        col = np.arange(N)[:, None]
        # frame c predates the episode when a later frame of its stack starts one (as in observation())
        zero = starts[col, pos[..., -1:]] - starts[col, pos] > 0
        index = np.where(zero, 0, 1 + col * W + pos)
        frames = np.empty((1 + N * W, *self.frames.shape[2:]), self.frames.dtype)
        frames[0] = 0
        # one take along the flat [T * B] frames, straight into place (mode "clip": numpy buffers "raise"; all valid)
        self.frames.reshape(-1, *self.frames.shape[2:]).take(window.reshape(-1), axis=0, out=frames[1:], mode="clip")
        return frames, index

    def gather(
        self, rows: np.ndarray, b: np.ndarray, unique_frames: bool = False, fields: Any = None
    ) -> dict[str, np.ndarray]:
        """Every stored field plus the derived flags at ``(rows, b)`` (copies), or only those in ``fields`` (and
        ``n_taken``, which the bootstrap needs; the others None); with ``unique_frames`` (frame-wise storage)
        ``frames`` and ``frame_index`` (see ``unique_frames``) in place of ``observation``."""
        wanted = (lambda name: True) if fields is None else {*fields, "n_taken"}.__contains__
        take = partial(self.take_flat, flat=rows * self.B + b)  # one index for every field
        out = {
            name: (take(x) if x is not None and wanted(name) else None)
            for name, x in self.data.items()
            if name != "observation"
        }
        if unique_frames and self.frames is not None:
            out["frames"], out["frame_index"] = self.unique_frames(rows, b) if wanted("frames") else (None, None)
        elif not wanted("observation"):
            out["observation"] = None
        else:  # one gather (or a frame reassembly), not two
            out["observation"] = take(self.data.observation) if self.frames is None else self.observation(rows, b)
        for f in _DERIVED:
            out[f] = take(getattr(self, f)) if wanted(f) else None
        return out


def stacked(batch: dict) -> dict:
    """A ``unique_frames`` batch (a dict or namedarraytuple, numpy or tensors) as a dict with its observations stacked
    from the frames: ``observation`` and ``next_observation`` (a transition batch) or ``observation`` (sequences); any
    other batch as it is."""
    if "frames" not in batch:
        return batch
    b = dict(batch.items())  # a dict, or a namedarraytuple (which indexes by position)
    out = {k: v for k, v in b.items() if k not in ("frames", "frame_index", "next_frame_index")}
    out["observation"] = b["frames"][b["frame_index"]]
    if b.get("next_frame_index") is not None:
        out["next_observation"] = b["frames"][b["next_frame_index"]]
    return out


def _signature(samples: Any) -> tuple | None:
    """A chunk's class, and each field's shape and dtype, when every field is a plain array or None (what ``check``
    depends on); None for any other chunk, which is checked in full."""
    if not is_namedarraytuple(samples):
        return None
    signature: list = [type(samples)]
    for x in samples:
        if x is None:
            signature.append(None)
        elif type(x) is np.ndarray:
            signature.append((x.shape, x.dtype))
        else:
            return None
    return tuple(signature)


def _set_leaves(dst: Any, idx: Any, src: Any) -> None:
    """``dst[idx] = src`` leaf by leaf, for any structure ``walk_structure`` walks (plain tuples and dicts cannot be
    assigned into as a whole); ``None`` leaves of ``dst`` are skipped."""
    for _, d, v in walk_structure(dst, src):
        if d is not None:
            d[idx] = v


def _leaves(name: str, ex: Any, x: Any):
    """(path, example leaf, sample leaf) of possibly nested fields: namedarraytuples, (named)tuples, lists, dicts;
    the example's ``None`` leaves are left out. A sample shaped otherwise raises ValueError naming the field."""
    for path, e, v in walk_structure(ex, x, path=(name,)):
        if e is not None:
            yield dotted(path), e, v


def _sum_tree(T: int, B: int, shared: bool) -> SumTree:
    from shared.sum_tree import SumTree  # here, not at the top: it loads numba (0.4 s a process)

    return SumTree(T, B, shared=shared)


def _check_common(
    size: int, B: int, discount: float, n_step_return: int, frame_stack: int, alpha: float, beta: float, priority_eps: float
) -> None:
    if B < 1:
        raise ValueError(f"B must be positive, got {B}")
    if size < B:
        raise ValueError(f"size must be at least B={B}, got {size}")
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    if n_step_return < 1 or n_step_return > 255:
        raise ValueError(f"n_step_return must be in [1, 255], got {n_step_return}")
    if frame_stack < 1:
        raise ValueError(f"frame_stack must be at least 1, got {frame_stack}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if not priority_eps >= 0:
        raise ValueError(f"priority_eps must be non-negative, got {priority_eps}")


class _Base:
    """Locking, priorities and importance weights common to both buffers."""

    storage: _Storage
    tree: SumTree | None

    def _setup(
        self,
        shared: bool,
        mp_context: str,
        prioritized: bool,
        alpha: float,
        beta: float,
        default_priority: float | None,
        priority_eps: float,
        seed: int | None,
        prefetch: bool,
    ) -> None:
        self.shared, self.prioritized, self.prefetch = shared, prioritized, prefetch
        self._ahead: tuple | None = None  # (batch_size, (batch, index)) drawn by sample_ahead
        self.alpha, self.beta, self.priority_eps = float(alpha), float(beta), float(priority_eps)
        self.default_priority = default_priority
        self._lock = mp.get_context(mp_context).Lock() if shared else contextlib.nullcontext()
        self._window = (shared_zeros if shared else np.zeros)(2, np.int64)  # valid indices [lo, hi), absolute
        self._rewrites = (shared_zeros if shared else np.zeros)(1, np.int64)  # load and end_episodes, counted
        self._check = None
        self.rng = np.random.default_rng(seed)
        # Each array was checked before it was made; all of them together, untouched yet, must fit too.
        check_fits(self.nbytes, "the replay")

    def watch(self, check) -> None:
        """In this process, wait for the shared lock in slices calling ``check()`` (e.g. ``Worker.check``): if the
        other process was killed while holding the lock, ``check`` raises instead of this process hanging."""
        self._check = check

    def locked(self):
        """A context holding the buffer's lock (shared: against the other process's appends; else nothing), for a
        reader that must see one state of it (this buffer's sampling, ``shared.device_replay``'s sync)."""
        return sync.locked(self._lock, self._check) if self.shared else contextlib.nullcontext()

    @property
    def rewrites(self) -> int:
        """How many times rows already written were changed in place (``load``, ``end_episodes``): a copy of the rows
        (``shared.device_replay``) made before a change must be made again."""
        return int(self._rewrites[0])

    @property
    def batch_fields(self) -> tuple[str, ...]:
        """The fields of a batch ``sample`` returns."""
        return self._batch_cls._fields

    def _to_tree(self, priorities: Any) -> np.ndarray:
        p = np.abs(np.asarray(priorities, dtype=np.float64))
        if not np.all(np.isfinite(p)):
            raise ValueError("priorities must be finite")
        state = self.storage.state
        if p.size:
            state[_MAX_PRIORITY] = max(float(state[_MAX_PRIORITY]), float(p.max()))
        return (p + self.priority_eps) ** self.alpha

    def _default_tree_priority(self) -> float:
        raw = self.default_priority if self.default_priority is not None else float(self.storage.state[_MAX_PRIORITY])
        return (abs(raw) + self.priority_eps) ** self.alpha

    def _is_weights(self, p: np.ndarray, beta: float) -> np.ndarray:
        # (N P(i))^-beta / max_j (N P(j))^-beta == (p_i / min_j p_j)^-beta: N and the total cancel.
        w = (p / p.min()) ** (-beta)
        return w.astype(np.float32)

    def _beta(self, beta: float | None) -> float:
        beta = self.beta if beta is None else float(beta)
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        return beta

    _unit = "samples"  # what one index is, for error messages

    @property
    def cursor(self) -> int:
        """Rows appended over the buffer's life (a restored replay counts the rows it was saved with)."""
        return self.storage.cursor

    @property
    def nbytes(self) -> int:
        """Bytes the buffer holds once every row is written (its arrays are allocated untouched, so the memory is
        taken as rows arrive: compare this with the memory available before filling it)."""
        return sum(a.nbytes for a in self.arrays().values())

    def __len__(self) -> int:
        """Valid indices (transitions or sequence starts) that sampling may return."""
        return (int(self._window[1]) - int(self._window[0])) * self.B

    def sample(self, batch_size: int, beta: float | None = None, fields: Any = None, skip: Any = ()) -> tuple[Any, Any]:
        """Draw ``batch_size`` indices (with replacement) and return ``(batch, index)``; see the class docstring.
        ``fields`` (names of the batch's fields): only those are gathered, the others are None (the same draws);
        ``skip``: every field but those. The batch ``sample_ahead`` drew is returned instead if it has this size and
        these fields (see the module docstring)."""
        if skip:
            if fields is not None:
                raise ValueError("sample takes fields or skip, not both")
            fields = self._fields_without(skip)
        elif fields is not None:
            self._check_fields(fields)
        drawn, self._ahead = self._ahead, None
        if drawn is not None and drawn[0] == (batch_size, fields):
            return drawn[1]
        beta = self._beta(beta)
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        with self.locked():  # the indices and the copies taken from them belong to one state of the buffer
            if batch_size > len(self):
                raise ValueError(f"batch_size={batch_size} is larger than the {len(self)} valid {self._unit}")
            if self.tree is not None:
                abs_idx, b, p = self.tree.sample(batch_size, self.rng)
                weights = self._is_weights(p, beta)
            else:
                abs_idx, b = self._uniform(batch_size)
                weights = np.ones(batch_size, np.float32)
            out = self._extract(abs_idx, b, fields)
        out["bootstrap_discount"] = self.storage.discounts[out["n_taken"]]  # discount ** n_taken
        out["is_weights"] = weights
        return self._batch_cls(**out), SampleIndex(abs_idx, b)

    def sample_ahead(self, batch_size: int, beta: float | None = None, fields: Any = None, skip: Any = ()) -> None:
        """With ``prefetch``: draw the next batch now, for the next ``sample``; otherwise nothing (see the module
        docstring)."""
        if self.prefetch:  # sample() takes any batch drawn before: this one replaces it
            if skip:
                fields = self._fields_without(skip)
            self._ahead = ((batch_size, fields), self.sample(batch_size, beta, fields))

    def _check_fields(self, fields: Any) -> None:
        """``ValueError`` naming a field the batch does not have (a unique-frames batch has ``frames``, not
        ``observation``): asking for it would give nothing, silently. Each tuple of fields is checked once."""
        checked = self.__dict__.setdefault("_checked", set())
        key = tuple(fields)
        if key not in checked:
            unknown = [f for f in key if f not in self._batch_cls._fields]
            if unknown:
                raise ValueError(f"the batch has no field {unknown[0]!r}; its fields: {', '.join(self._batch_cls._fields)}")
            checked.add(key)

    def _fields_without(self, skip: Any) -> tuple:
        """The batch's field names but those in ``skip``, found once for each ``skip`` (asked at every update)."""
        cache = self.__dict__.setdefault("_without", {})
        if skip not in cache:
            cache[skip] = tuple(f for f in self._batch_cls._fields if f not in skip)
        return cache[skip]

    def _uniform(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self._window[0]), int(self._window[1])
        return self.rng.integers(lo, hi, n), self.rng.integers(0, self.B, n)

    def _extract(self, abs_idx: np.ndarray, b: np.ndarray, fields: Any = None) -> dict:
        raise NotImplementedError

    def update_priorities(self, index: Any, priorities: Any) -> int:
        """New priorities (e.g. |TD error|) for a sampled batch; entries since overwritten are skipped.

        Returns how many were applied.
        """
        if self.tree is None:
            raise ValueError("update_priorities needs a prioritized buffer (prioritized=True)")
        p = np.asarray(priorities, dtype=np.float64).ravel()
        if p.shape != np.shape(index.abs_row):
            raise ValueError(f"priorities must have shape {np.shape(index.abs_row)}, got {np.shape(priorities)}")
        with self.locked():
            return self.tree.update(index.abs_row, index.b, self._to_tree(p))

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array that holds the buffer's state, by a stable name: the stored fields, the derived n-step
        quantities, the cursor and largest priority, the valid window, the sum tree (prioritized) and the stored
        recurrent states (sequences). Views of the live arrays: copy before changing them."""
        out: dict[str, np.ndarray] = {}

        def walk(name: str, x: Any) -> None:
            out.update((dotted(path), a) for path, a in walk_structure(x, path=(name,)) if isinstance(a, np.ndarray))

        st = self.storage
        walk("data", st.data)
        for name in ("frames", *_DERIVED, "last_flags", "state"):
            walk(name, getattr(st, name))
        walk("window", self._window)
        if self.tree is not None:
            for name in ("_flat", "_pending", "_meta"):
                walk(f"tree.{name.strip('_')}", getattr(self.tree, name))
        if isinstance(self, SequenceReplayBuffer):
            walk("rnn_state", self.rnn_state)
        return out

    def end_episodes(self) -> None:
        """The rows appended next start fresh episodes (a resumed run's envs were reset): in every env whose
        newest row is not already a final-observation row, the episode is truncated one row earlier, exactly
        as if the env had reported a time limit there: the row before the newest gets ``truncated`` (and
        ``episode_end``), the newest becomes the episode's final observation (never sampled, but the bootstrap
        of the windows that now end at the truncation), and those windows' n-step quantities are recomputed."""
        st = self.storage
        with self.locked():
            c = st.cursor
            if c < 2:
                return
            if "truncated" not in st.data or st.data.truncated is None:
                raise ValueError("end_episodes needs a replay that stores the truncated field")
            last, prev = (c - 1) % self.T, (c - 2) % self.T
            cut = ~st.last_flags[1].astype(bool)  # envs whose newest row is not a final row
            if not cut.any():
                return
            has_reset = "episode_end" in st.data and st.data.episode_end is not None
            st.data.truncated[prev, cut] = True
            # A final row carries no flags of its own (in an env, it is the step that only resets).
            st.data.terminated[last, cut] = st.data.truncated[last, cut] = False
            if has_reset:
                st.data.episode_end[prev, cut], st.data.episode_end[last, cut] = True, False
            st.final_row[last, cut] = True
            st.last_flags[0, cut], st.last_flags[1, cut] = False, True
            st._compute_returns(max(c - 1 - self.n_step_return, 0), max(c - self.n_step_return + 1, 0))
            self._rewrites[0] += 1
            if self.tree is not None and isinstance(self, ReplayBuffer):  # a final row has priority 0
                p = np.array(self.tree.pending_row(c - 1))
                p[cut] = 0.0
                self.tree.set_pending(c - 1, p[None])

    def save(self, path: Any) -> None:
        """Write the whole replay to ``path`` (an ``.npz`` of plain arrays, no pickled object), the sampling
        random state included, under the lock. Not atomic by itself: write to a temporary name and rename."""
        import json

        with self.locked():
            arrays = {k: np.asarray(v) for k, v in self.arrays().items()}
            rng = np.array(json.dumps(self.rng.bit_generator.state))
            with open(path, "wb") as f:  # a file object: numpy adds no ".npz" to the name
                np.savez(f, **arrays, rng_state=rng)

    def load(self, path: Any) -> None:
        """Restore a replay written by ``save`` into this (identically built) buffer; ``ValueError`` naming the
        first array that is missing or of another shape or dtype."""
        import json

        self._ahead = None  # drawn from the state being replaced
        with np.load(path, allow_pickle=False) as saved, self.locked():
            for name, dst in self.arrays().items():
                if name not in saved.files:
                    raise ValueError(f"the saved replay has no {name!r}: it was written by another buffer")
                src = saved[name]
                if src.shape != dst.shape or src.dtype != dst.dtype:
                    raise ValueError(
                        f"the saved replay's {name!r} is {src.dtype}{list(src.shape)}, this buffer's "
                        f"{dst.dtype}{list(dst.shape)}: other flags built it"
                    )
                dst[...] = src
            self.rng.bit_generator.state = json.loads(str(saved["rng_state"]))
            self._rewrites[0] += 1

    def __getstate__(self):
        d = self.__dict__.copy()
        d["_check"] = None  # a liveness check belongs to the process that set it
        d["_ahead"] = None  # a batch drawn ahead belongs to the learner
        if not self.shared:
            d["_lock"] = None
        return d

    def __setstate__(self, d):
        self.__dict__.update(d)
        if self._lock is None:
            self._lock = contextlib.nullcontext()


class ReplayBuffer(_Base):
    """Transition replay with n-step returns; uniform, or prioritized with ``prioritized=True``.

    ``size`` transitions are stored as ``T = ceil(size / B)`` rows of ``B`` envs; each ``append`` takes a
    ``[Tc, B]`` chunk. ``sample`` returns ``(batch, index)``: ``batch`` holds every example field at the
    sampled rows, ``next_observation``, the n-step fields, ``final_row``/``episode_start`` and ``is_weights``
    (ones when uniform), each ``[batch_size, ...]``; ``index`` goes back to ``update_priorities``. With
    ``unique_frames`` (frame-wise storage) a batch carries ``frames``, ``frame_index`` and ``next_frame_index`` in
    place of the two observations (``stacked(batch)`` gives them back): each frame once, at most ``C + n`` frames a
    sample where the two stacks hold ``2 C``, stacked where the update runs.
    """

    def __init__(
        self,
        example: Any,
        size: int,
        B: int,
        discount: float = 0.99,
        n_step_return: int = 1,
        frame_stack: int = 1,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        default_priority: float | None = None,
        priority_eps: float = 1e-6,
        shared: bool = False,
        mp_context: str = "spawn",
        seed: int | None = None,
        prefetch: bool = False,
        unique_frames: bool = False,
    ):
        _check_common(size, B, discount, n_step_return, frame_stack, alpha, beta, priority_eps)
        T = math.ceil(size / B)
        self.history = frame_stack - 1  # rows before a sample that must still hold its data
        if T <= n_step_return + self.history + 1:
            raise ValueError(f"size={size} gives {T} rows per env; need more than n_step_return + frame_stack")
        self.storage = _Storage(example, T, B, discount, n_step_return, frame_stack, shared)
        self.T, self.B, self.n_step_return = T, B, n_step_return
        self.tree = _sum_tree(T, B, shared) if prioritized else None
        self._setup(shared, mp_context, prioritized, alpha, beta, default_priority, priority_eps, seed, prefetch)
        self.unique_frames = unique_frames and frame_stack > 1
        fields = list(self.storage.example._fields) + ["next_observation"]
        if self.unique_frames:
            fields = [f for f in fields if f not in ("observation", "next_observation")]
            fields += ["frames", "frame_index", "next_frame_index"]
        self._batch_cls = namedarraytuple("ReplayBatch", [*fields, *_DERIVED, "bootstrap_discount", "is_weights"])

    def valid_window(self, cursor: int) -> tuple[int, int]:
        """Absolute rows that may start a transition once ``cursor`` rows are written."""
        hi = max(cursor - self.n_step_return, 0)  # rows t..t+n (bootstrap row) written
        lo = min(max(cursor - self.T + self.history, 0), hi)  # frame history not yet overwritten
        return lo, hi

    def append(self, samples: Any, priorities: Any = None) -> None:
        """Append a ``[Tc, B]`` chunk; optional ``priorities`` ``[Tc, B]`` for the new rows."""
        Tc = self.storage.check(samples)
        if priorities is not None and self.tree is None:
            raise ValueError("priorities given to a buffer that is not prioritized")
        if priorities is not None and np.shape(priorities) != (Tc, self.B):
            raise ValueError(f"priorities must have shape [{Tc}, {self.B}], got {np.shape(priorities)}")
        with self.locked():
            s, end = self.storage.append(samples, Tc)
            lo, hi = self.valid_window(end)
            if self.tree is not None:
                default = np.full((Tc, self.B), self._default_tree_priority())
                p = self._to_tree(priorities) if priorities is not None else default
                rows = (s + np.arange(Tc)) % self.T
                p = np.where(self.storage.final_row[rows], 0.0, p)  # final-observation rows are never sampled
                self.tree.append(s, p, lo, hi)
            self._window[0], self._window[1] = lo, hi

    def _extract(self, abs_row: np.ndarray, b: np.ndarray, fields: Any = None) -> dict:
        rows = abs_row % self.T
        if not self.unique_frames:
            out = self.storage.gather(rows, b, fields=fields)
            wanted = fields is None or "next_observation" in fields
            out["next_observation"] = self.storage.observation((rows + out["n_taken"]) % self.T, b) if wanted else None
            return out
        asked = self._batch_cls._fields if fields is None else fields
        out = self.storage.gather(rows, b, fields=[f for f in asked if f != "frames"])
        del out["observation"]  # not asked for: None
        out["frames"] = out["frame_index"] = out["next_frame_index"] = None
        if fields is None or "frames" in fields:  # both stacks from one gather: C + n frames a sample at most, not 2C
            both = np.stack([rows, (rows + out["n_taken"]) % self.T])  # [2, N]
            out["frames"], (out["frame_index"], out["next_frame_index"]) = self.storage.unique_frames(
                both, b[None], span=self.n_step_return + 1
            )
        return out

    def _uniform(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self._window[0]), int(self._window[1])
        abs_row, b = super()._uniform(n)
        for _ in range(100):  # redraw the rare final-observation rows
            bad = self.storage.take(self.storage.final_row, abs_row % self.T, b)
            if not bad.any():
                return abs_row, b
            k = int(bad.sum())
            abs_row[bad] = self.rng.integers(lo, hi, k)
            b[bad] = self.rng.integers(0, self.B, k)
        raise ValueError("could not draw valid transitions: almost every row holds a final observation")


class SequenceReplayBuffer(_Base):
    """Sequence replay for recurrent agents (R2D1).

    A sequence is ``sequence_length`` rows (burn-in included) and may start only at rows where the recurrent
    state was stored, every ``rnn_state_interval`` rows; ``example.rnn_state`` (an array, or namedarraytuples,
    tuples and dicts of arrays, nested) is the state *before* the row's observation and is kept only at those
    rows. ``sample`` returns ``(batch,
    index)``: per-step fields ``[sequence_length + n_step_return, batch_size, ...]`` (the extra rows are for
    bootstrap targets; the n-step fields are meaningful on the first ``sequence_length`` rows),
    ``init_rnn_state`` ``[batch_size, ...]`` and ``is_weights`` ``[batch_size]``. ``final_row`` marks rows to
    leave out of the loss and ``episode_start`` rows where the recurrent state should be reset. With
    ``unique_frames`` (frame-wise storage) a batch carries ``frames`` and ``frame_index`` instead of
    ``observation`` (``frames[frame_index]`` is it): a quarter of the bytes to send to a GPU, stacked there.
    Priorities are per sequence; ``append`` may bring them for the sequences starting at the chunk's stored
    states, shifted back by ``input_priority_shift`` state slots (rlpyt's ``input_priority_shift``).
    """

    def __init__(
        self,
        example: Any,
        size: int,
        B: int,
        sequence_length: int,
        rnn_state_interval: int,
        discount: float = 0.997,
        n_step_return: int = 1,
        frame_stack: int = 1,
        prioritized: bool = False,
        alpha: float = 0.6,
        beta: float = 0.4,
        default_priority: float | None = None,
        priority_eps: float = 1e-6,
        input_priority_shift: int = 0,
        shared: bool = False,
        mp_context: str = "spawn",
        seed: int | None = None,
        unique_frames: bool = False,
        prefetch: bool = False,
    ):
        _check_common(size, B, discount, n_step_return, frame_stack, alpha, beta, priority_eps)
        if sequence_length < 1:
            raise ValueError(f"sequence_length must be positive, got {sequence_length}")
        if rnn_state_interval < 1:
            raise ValueError(f"rnn_state_interval must be positive, got {rnn_state_interval}")
        if input_priority_shift < 0:
            raise ValueError(f"input_priority_shift must be non-negative, got {input_priority_shift}")
        if not is_namedarraytuple(example) or "rnn_state" not in example or example.rnn_state is None:
            raise ValueError("example must have field 'rnn_state' (the recurrent state before each row)")
        I = rnn_state_interval
        T = math.ceil(size / B / I) * I  # whole state slots
        self.history = frame_stack - 1
        if T < sequence_length + n_step_return + self.history + I:
            raise ValueError(
                f"size={size} gives {T} rows per env; too few for sequences of {sequence_length} "
                f"+ n_step_return {n_step_return} + frame history {self.history} + interval {I}"
            )
        self.storage = _Storage(example, T, B, discount, n_step_return, frame_stack, shared, skip_fields=("rnn_state",))
        self.T, self.B, self.n_step_return = T, B, n_step_return
        self.sequence_length, self.interval, self.input_priority_shift = sequence_length, I, input_priority_shift
        self.n_slots = T // I
        self.rnn_state = buffer_from_example(self.storage.example.rnn_state, (self.n_slots, B), shared=shared)
        self.tree = _sum_tree(self.n_slots, B, shared) if prioritized else None
        self._setup(shared, mp_context, prioritized, alpha, beta, default_priority, priority_eps, seed, prefetch)
        self.unique_frames = unique_frames and frame_stack > 1
        fields = [f for f in self.storage.example._fields if f != "rnn_state"]
        if self.unique_frames:
            fields = [f for f in fields if f != "observation"] + ["frames", "frame_index"]
        fields += [*_DERIVED, "bootstrap_discount", "init_rnn_state", "is_weights"]
        self._batch_cls = namedarraytuple("SequenceBatch", fields)

    def valid_window(self, cursor: int) -> tuple[int, int]:
        """Absolute state slots that may start a sequence once ``cursor`` rows are written."""
        I = self.interval
        last_start = cursor - self.sequence_length - self.n_step_return  # rows t .. t+L+n-1 written
        hi = last_start // I + 1 if last_start >= 0 else 0
        lo = min(max(-(-(cursor - self.T + self.history) // I), 0), hi)
        return lo, hi

    def append(self, samples: Any, priorities: Any = None) -> None:
        """Append a ``[Tc, B]`` chunk; optional ``priorities`` ``[S, B]`` for the ``S`` slots it starts."""
        Tc = self.storage.check(samples)
        I = self.interval
        with self.locked():
            s = self.storage.cursor
            first_slot = -(-s // I)
            new_slots = np.arange(first_slot, -(-(s + Tc) // I))  # abs slots whose row is in [s, s + Tc)
            if priorities is not None:
                if self.tree is None:
                    raise ValueError("priorities given to a buffer that is not prioritized")
                if np.shape(priorities) != (len(new_slots), self.B):
                    raise ValueError(
                        f"priorities must have shape [{len(new_slots)}, {self.B}] (one row per "
                        f"stored state in this chunk), got {np.shape(priorities)}"
                    )
            s, end = self.storage.append(samples, Tc)
            if len(new_slots):
                src = new_slots * I - s
                _set_leaves(
                    self.rnn_state, new_slots % self.n_slots, map_structure(lambda x: np.asarray(x)[src], samples.rnn_state)
                )
            lo, hi = self.valid_window(end)
            if self.tree is not None and len(new_slots):
                # New slots get the default; input priorities land input_priority_shift slots back.
                self.tree.set_pending(int(new_slots[0]), self._default_tree_priority(), n_rows=len(new_slots))
                if priorities is not None:
                    target = int(new_slots[0]) - self.input_priority_shift
                    p = self._to_tree(priorities)
                    if target < 0:
                        p, target = p[-target:], 0
                    self.tree.set_pending(target, p)
            if self.tree is not None:
                self.tree.move_window(lo, hi)
            self._window[0], self._window[1] = lo, hi

    _unit = "sequences"

    def _extract(self, abs_slot: np.ndarray, b: np.ndarray, fields: Any = None) -> dict:
        L = self.sequence_length + self.n_step_return
        rows = (abs_slot[None, :] * self.interval + np.arange(L)[:, None]) % self.T  # [L+n, batch]
        out = self.storage.gather(rows, b[None, :], self.unique_frames, fields)
        out.pop("rnn_state", None)
        out["init_rnn_state"] = map_structure(lambda x: x[abs_slot % self.n_slots, b], self.rnn_state)
        return out
