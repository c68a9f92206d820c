"""A transition replay mirrored on the learner's device and sampled there: a CUDA learner's batch is neither gathered
on the host nor copied up at each update (SAC, TD3, DDPG, and DQN and C51 with a uniform replay, whose update is one
CUDA graph that draws it); and ``ReplayBatches``, where each of those scripts gets its update's batch on either path.

Guarantees
- ``DeviceReplay(buffer, skip, device, obs_norm=None)`` mirrors a uniform ``shared.replay.ReplayBuffer`` of flat
  fields: every field of its batch but those in ``skip`` (a script's ``HOST_ONLY``), ``[N, ...]``, as the host path
  uploads it. With ``obs_norm`` (SAC, TD3, DDPG: ``shared.normalize.upload_batch``) every field is float32 and
  ``observation`` and ``next_observation`` are normalised; without it (DQN, C51: ``shared.device.upload``) each field
  keeps its stored dtype. A frame-wise replay (Atari's frames stored once) gives the stacked ``observation`` and
  ``next_observation`` ``[N, C, ...]`` in place of a unique-frames batch's ``frames`` and indices (what
  ``shared.replay.stacked`` makes of them), a frame from before its episode's start zero as the host's.
  ``bootstrap_discount`` is ``discount ** n_taken``; ``is_weights`` (uniform) ones. A field added to the replay's rows
  reaches the update this way with no other change. The mirror holds the fields in one ``[T * B, width]`` tensor per
  dtype it gives them (an int64 action exact, an image in its bytes) and the frames in theirs: about the host
  replay's memory. A prioritized or nested replay is a ``ValueError`` at construction.
- ``mirror_on(buffer, skip, device, obs_norm=None)``: a ``DeviceReplay`` for a CUDA learner (and on the CPU under
  ``RL_HOST_PATH=cuda``, as the tests and ``benchmarks/speed/loop_overhead.py`` run CUDA's host path), announced in
  one line with its size (rank 0), else ``None``: a CPU learner samples on the host as before, draw for draw, and so
  does a prioritized replay (its sum tree), a sequence replay (R2D1), or a replay whose mirror does not fit the GPU
  (one line says so).
- ``ReplayBatches(buffer, skip, device, obs_norm=None)``: where an update's batch comes from, the two paths above
  behind one call. ``next(N, beta=None)`` is ``(batch, index)``: on a CUDA learner with a mirror (``mirror_on``), the
  mirror brought up to date (``sync``; ``N`` only checked against the valid samples, so it is the size the update
  draws) and no index, which the update draws from inside its graph (``sample``); otherwise the buffer's
  ``sample(N, beta, skip=skip)`` and its index (for ``buffer.update_priorities``: ``buffer`` is the one given), every
  field but ``skip`` in one copy to ``device`` (``shared.normalize.upload_batch`` with ``obs_norm``: float32,
  observations normalised; else ``shared.device.upload``, each field its stored dtype). ``ahead(N, beta=None)``: the
  host path's next batch gathered now (the buffer's ``sample_ahead``, with ``prefetch``), while the update just
  launched runs; nothing with a mirror. A ``buffer`` of None (evaluating or exporting) has no mirror and is never
  drawn from.
- ``sync(batch_size)`` brings the mirror up to the buffer: the rows written since the last sync and the ``n - 1``
  before them (whose n-step fields the new rows completed; all the buffer holds when more rows than that were
  written, or when rows were changed in place since: ``load``, ``end_episodes``), the new rows' frames (a frame never
  changes), the valid window and the observation statistics, read under the buffer's lock (an async sampler appends
  to a shared one meanwhile) and sent in runs of at most ``CHUNK`` rows, each storage row once, each field of a run
  from the staging buffer straight into its rows of the mirror (``shared.device.upload_each``: one copy a group, the
  new frames and the window a sync as the loop runs; the groups and frames twice where the rows wrap around, the
  window with the last run). Nothing is read back. A
  ``batch_size`` larger than the valid samples is the host replay's ``ValueError`` (a draw inside a graph cannot
  refuse).
- ``sample(N)`` (called inside the update, so that the draw is in its CUDA graph) draws ``N`` transitions with
  replacement, uniformly among those the host replay would sample: a row of its valid window
  (``ReplayBuffer.valid_window``) and an env, never a final-observation row. Each draw takes the first of
  ``CANDIDATES`` uniform candidates that is not a final row: exactly uniform over the valid transitions unless all of
  them are final rows, which has probability ``f ** 32`` for a share ``f`` of final rows in the window (about 1 / the
  episodes' length; at most about 1/2 where, as in a gymnasium env's rows, a final row only resets the env and so
  follows a row of its episode; 1e-32 at f = 0.1); such a draw keeps its first candidate and ``misses`` (a device
  tensor, never read by the loop) counts it. The draws come from torch's generator on the device, not the buffer's:
  the same distribution as the host path, not the same batches. ``last_index`` holds the flat ``row * B + env``
  indices of the last eager sample (the tests compare them with the host replay's rows; under a captured graph it
  is the capture's).
Imports ``shared.device``, ``shared.normalize`` and ``shared.replay``; none of them imports it.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

import shared.device
from shared.device import upload, upload_each
from shared.normalize import upload_batch
from shared.replay import ReplayBuffer

__all__ = ["DeviceReplay", "ReplayBatches", "mirror_on"]

CANDIDATES = 32  # draws per sample, the first valid one kept (module docstring)
CHUNK = 4096  # rows (of B envs) per copy up in a sync: a restored full replay does not stage 100 MB at once


def mirror_on(buffer: Any, skip: tuple, device: Any, obs_norm: Any = None) -> DeviceReplay | None:
    """The replay's mirror on a CUDA learner, announced in one line (see the module docstring); ``None`` on the CPU,
    without a replay, for a replay whose draws need the host (prioritized: its sum tree; sequences), or where the
    mirror does not fit the GPU (said in one line: the host replay, which fits, samples)."""
    if buffer is None or (device.type != "cuda" and not shared.device.CUDA_PATH):
        return None
    if not isinstance(buffer, ReplayBuffer) or buffer.tree is not None:
        return None
    main = os.environ.get("RANK", "0") == "0"
    try:
        mirror = DeviceReplay(buffer, skip, device, obs_norm)
    except torch.OutOfMemoryError:
        if main:
            print(f"replay: its mirror does not fit on {device}: batches are sampled on the host", flush=True)
        return None
    if main:
        print(f"replay: batches drawn on {device}, from a mirror of {mirror.nbytes / 2**30:.2f} GiB there", flush=True)
    return mirror


class ReplayBatches:
    """An update's batches: sampled on the host and copied up, or drawn on the device from the replay's mirror (see the
    module docstring)."""

    def __init__(self, buffer: Any, skip: tuple, device: Any, obs_norm: Any = None):
        self.buffer, self.skip, self.device, self.obs_norm = buffer, skip, device, obs_norm
        self.mirror = mirror_on(buffer, skip, device, obs_norm)

    def next(self, n: int, beta: float | None = None) -> tuple[Any, Any]:
        """``(batch, index)``: the mirror, up to date, and None; or a host batch of ``n`` on the device and its index."""
        if self.mirror is not None:
            self.mirror.sync(n)  # the rows appended since the last update
            return self.mirror, None
        sample, index = self.buffer.sample(n, beta=beta, skip=self.skip)
        fields = {k: v for k, v in sample.items() if k not in self.skip}
        if self.obs_norm is None:
            return upload(fields, self.device), index  # one copy to a GPU
        return upload_batch(fields, self.obs_norm, self.device), index

    def ahead(self, n: int, beta: float | None = None) -> None:
        """The host path's next batch gathered now (with the buffer's ``prefetch``); nothing with a mirror."""
        if self.mirror is None:
            self.buffer.sample_ahead(n, beta, skip=self.skip)


class DeviceReplay(torch.nn.Module):
    """The device's copy of ``buffer``'s rows, sampled on the device (see the module docstring). A module: a
    ``@graphed`` update takes it as state (used in place, never copied in)."""

    def __init__(self, buffer: ReplayBuffer, skip: tuple, device: Any, obs_norm: Any = None):
        super().__init__()
        if not isinstance(buffer, ReplayBuffer) or buffer.tree is not None:
            raise ValueError("the device replay mirrors a uniform ReplayBuffer (a prioritized one samples on the host)")
        s = buffer.storage
        made = ("next_observation", "bootstrap_discount", "is_weights")  # made at sampling, not stored
        frames = ("frames", "frame_index", "next_frame_index")  # a unique-frames batch's: stacked here instead
        names = [f for f in buffer.batch_fields if f not in skip]
        if any(f in names for f in frames):
            names = [f for f in names if f not in frames] + ["observation", "next_observation"]
        self.outputs = names  # the batch's fields, as the host path's upload gives them
        stored = [f for f in names if f not in made and not (f == "observation" and s.C > 1)]
        needed = ["n_taken", "final_row"] + (["episode_start"] if s.C > 1 else [])  # the draw, bootstrap and stacks read
        # One [T * B, width] tensor per group: all float32 with statistics (upload_batch's); without, a float field in
        # its dtype, a wide integer one (an image) in its own, integer and boolean scalars int64 (an action exact, the
        # flags in the same copy). field -> (its group, first column, width, row shape, the batch's dtype)
        self.columns: dict[str, tuple[str, int, int, tuple, Any]] = {}
        self.sources: dict[str, list] = {}  # group -> its fields' [T * B, width] views of the replay's arrays
        for f in stored + [f for f in needed if f not in stored]:
            x = self._source(s, f)
            if not isinstance(x, np.ndarray):
                raise ValueError(f"the device replay mirrors flat fields; {f!r} is nested (add it to HOST_ONLY)")
            width = int(np.prod(x.shape[2:], dtype=np.int64))
            wide = np.issubdtype(x.dtype, np.floating) or width > 1
            group = "float32" if obs_norm is not None else str(x.dtype) if wide else "int64"
            dtype = torch.float32 if obs_norm is not None else torch.from_numpy(x[:0, :0]).dtype
            first = sum(v.shape[1] for v in self.sources.get(group, []))
            self.columns[f] = (group, first, width, x.shape[2:], dtype)
            self.sources.setdefault(group, []).append(x.reshape(s.T * s.B, width))  # a view: load writes in place
        self.buffer, self.obs_norm = buffer, obs_norm
        self.T, self.B, self.C = s.T, s.B, s.C
        # What the mirror has seen, in a plain namespace: a write to a Module's attribute goes through its __setattr__
        # (microseconds each: it looks for a parameter, a buffer, a module), three writes a sync, one sync an update.
        # synced: abs rows whose every field the mirror holds; rewrites: the buffer's in-place changes seen; valid:
        # (row, env) pairs in the valid window at the last sync.
        self.seen = SimpleNamespace(synced=0, rewrites=buffer.rewrites, valid=0)
        for group, views in self.sources.items():
            width, dtype = sum(v.shape[1] for v in views), torch.from_numpy(np.zeros(0, group)).dtype
            self.register_buffer(f"group_{group}", torch.zeros(s.T * s.B, width, dtype=dtype, device=device))
        frame = s.frames if s.C > 1 else np.zeros((0, 0), np.uint8)  # frame-wise: [T * B, ...] as the replay's
        frame_dtype = torch.from_numpy(frame[:0, :0]).dtype
        self.register_buffer("frames", torch.zeros(len(frame) * s.B, *frame.shape[2:], dtype=frame_dtype, device=device))
        moments = obs_norm.moments() if obs_norm is not None else np.zeros(0, np.float32)
        self.register_buffer("meta", torch.zeros(2 + len(moments), dtype=torch.float64, device=device))  # window, stats
        self.host_meta = np.zeros(2 + len(moments), np.float64)  # what a sync sends to meta, written in place
        self.register_buffer("discounts", torch.as_tensor(s.discounts, device=device))  # by n_taken
        self.register_buffer("misses", torch.zeros((), dtype=torch.int64, device=device))
        self.register_buffer("last_index", torch.zeros(0, dtype=torch.int64, device=device))

    @property
    def nbytes(self) -> int:
        """The device memory the mirror holds."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    @staticmethod
    def _source(storage: Any, field: str) -> Any:
        """The ``[T, B, ...]`` array that holds ``field``: a stored field, or one the buffer derives on append."""
        return getattr(storage.data if field in storage.data._fields else storage, field)

    def sync(self, batch_size: int) -> None:
        """Bring the mirror up to the buffer for an update that draws ``batch_size`` (see the module docstring). No
        tensor here requires grad: its writes record nothing without ``torch.no_grad`` (which costs a sync microseconds)."""
        s, T, B, seen = self.buffer.storage, self.T, self.B, self.seen
        with self.buffer.locked():
            cursor = s.cursor
            if self.buffer.rewrites != seen.rewrites:  # rows changed in place (load, end_episodes): all again
                seen.synced, seen.rewrites, seen.valid = 0, self.buffer.rewrites, 0
            if cursor == seen.synced:
                return self._check(batch_size)
            lo, hi = self.buffer.valid_window(cursor)
            seen.valid = (hi - lo) * B
            moments = self.obs_norm.moments() if self.obs_norm is not None else []
            meta = self.host_meta  # the window, the statistics after (sent below, before a next sync writes it)
            meta[0], meta[1], meta[2:] = lo % T, hi - lo, moments
            new = max(seen.synced, cursor - T, 0)  # rows never sent: their frames too (a frame never changes)
            pieces, start = [], max(seen.synced - (s.n - 1), cursor - T, 0)  # the n - 1 before: n-step fields changed
            while start < cursor:  # runs of storage rows, split where they wrap around
                m = min(CHUNK, cursor - start, T - start % T)
                rows = self._rows(start, m)
                piece = {g: np.concatenate([v[rows] for v in views], axis=1, dtype=g) for g, views in self.sources.items()}
                first = max(start, new)  # the run's rows whose frames are new
                if self.C > 1 and first < start + m:
                    piece["frames"] = s.frames.reshape(T * B, *s.frames.shape[2:])[self._rows(first, start + m - first)]
                pieces.append((start, m, first, piece))
                start += m
            pieces[-1][3]["meta"] = meta
        for start, m, first, piece in pieces:  # each field straight into its rows of the mirror
            rows = self._rows(start, m)
            into = [getattr(self, f"group_{group}")[rows] for group in self.sources]
            if "frames" in piece:
                into.append(self.frames[self._rows(first, start + m - first)])
            if "meta" in piece:
                into.append(self.meta)
            upload_each(piece, into, self.meta.device)
        seen.synced = cursor
        self._check(batch_size)

    def _rows(self, start: int, m: int) -> slice:
        """The flat ``[T * B]`` rows of absolute rows ``start .. start + m`` (within one pass of the ring)."""
        return slice(start % self.T * self.B, (start % self.T + m) * self.B)

    def _check(self, batch_size: int) -> None:
        """The host replay's refusal, which a draw inside a graph cannot make."""
        if batch_size > self.seen.valid:
            raise ValueError(f"batch_size={batch_size} is larger than the {self.seen.valid} valid samples")

    def column(self, rows: torch.Tensor, field: str) -> torch.Tensor:
        """``field`` at the mirror's flat ``rows`` [N], shaped ``[N, ...]`` and typed as the batch carries it."""
        group, first, width, shape, dtype = self.columns[field]
        return getattr(self, f"group_{group}")[rows, first : first + width].view(len(rows), *shape).to(dtype)

    def stack(self, rows: torch.Tensor) -> torch.Tensor:
        """Frame-wise storage: the observations [N, C, ...] at flat ``rows`` [N], oldest frame first, a frame from
        before its episode's start zero (the host replay's rule: a later frame of the stack starts an episode)."""
        n, C = len(rows), self.C
        history = (rows // self.B)[:, None] + torch.arange(-(C - 1), 1, device=rows.device)  # [N, C] storage rows
        flat = history % self.T * self.B + (rows % self.B)[:, None]  # [N, C]
        starts = self.column(flat.reshape(-1), "episode_start").view(n, C)
        before = starts[:, 1:].flip(1).cumsum(1).flip(1) > 0  # [N, C - 1]: a later frame starts an episode
        keep = torch.cat([~before, torch.ones_like(before[:, :1])], 1)  # [N, C]
        frames = self.frames[flat]  # [N, C, ...]
        return frames * keep.view(n, C, *[1] * (frames.dim() - 2)).to(frames.dtype)

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        """``n`` transitions drawn on the device: the update's batch (see the module docstring)."""
        first_row, count = self.meta[0].long(), (self.meta[1].long() * self.B).clamp(min=1)  # valid (row, env) pairs
        draw = torch.randint(0, 2**62, (n, CANDIDATES), device=self.meta.device) % count  # [N, K]
        flat = (first_row + draw // self.B) % self.T * self.B + draw % self.B  # [N, K]: storage row * B + env
        valid = self.column(flat.reshape(-1), "final_row").view(n, CANDIDATES) == 0  # [N, K]: not a final row
        pick = valid.to(torch.uint8).argmax(1, keepdim=True)  # the first valid candidate (the first one if none)
        self.misses += (~valid.any(1)).sum()
        rows = flat.gather(1, pick).squeeze(1)  # [N]
        self.last_index = rows
        n_taken = self.column(rows, "n_taken").long()
        next_rows = (rows // self.B + n_taken) % self.T * self.B + rows % self.B  # the bootstrap row, same env
        stats = self.meta[2:].float()
        out = {}
        for f in self.outputs:
            if f in ("observation", "next_observation"):
                at = rows if f == "observation" else next_rows
                obs = self.stack(at) if self.C > 1 else self.column(at, "observation")
                out[f] = obs if self.obs_norm is None else self.obs_norm.normalize(obs, stats)
            elif f == "bootstrap_discount":
                out[f] = self.discounts[n_taken]
            elif f == "is_weights":  # uniform: every sample weighs 1
                out[f] = torch.ones(n, device=rows.device)
            else:
                out[f] = self.column(rows, f)
        return out
