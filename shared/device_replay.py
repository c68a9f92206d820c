"""A transition replay mirrored on the learner's device and sampled there: a CUDA learner's batch is neither gathered
on the host nor copied up at each update (SAC, TD3 and DDPG, whose update is one CUDA graph that draws it).

Guarantees
- ``DeviceReplay(buffer, obs_norm, skip, device)`` mirrors a uniform ``shared.replay.ReplayBuffer`` of flat fields
  without frame stacking: every field of its batch but those in ``skip`` (a script's ``HOST_ONLY``), as the host path
  ``shared.normalize.upload_batch(batch minus skip)`` gives it: float32 tensors ``[N, ...]``, ``observation`` and
  ``next_observation`` normalised by ``obs_norm``, ``bootstrap_discount`` = ``discount ** n_taken``. A field added to
  the replay's rows reaches the update this way with no other change. A buffer it cannot mirror (prioritized,
  frame-wise, sequences, a nested field) is a ``ValueError`` at construction.
- ``mirror_on(buffer, obs_norm, skip, device)``: a ``DeviceReplay`` for a CUDA learner (and on the CPU under
  ``RL_HOST_PATH=cuda``, as the tests and ``benchmarks/speed/loop_overhead.py`` run CUDA's host path), else ``None``:
  a CPU learner samples on the host as before, draw for draw.
- ``sync()`` brings the mirror up to the buffer: the rows written since the last sync and the ``n - 1`` before them
  (whose n-step fields the new rows completed; every row where more than the buffer holds was written), the valid
  window and the observation statistics, read under the buffer's lock (an async sampler appends to a shared one
  meanwhile) and sent in packed copies (``shared.device.upload``) of at most ``CHUNK`` rows, each storage row once:
  one copy a sync as the loop runs. Nothing is read back.
- ``sample(N)`` (called inside the update, so that the draw is in its CUDA graph) draws ``N`` transitions with
  replacement, uniformly among those the host replay would sample: a row of its valid window
  (``ReplayBuffer.valid_window``) and an env, never a final-observation row. Each draw takes the first of
  ``CANDIDATES`` uniform candidates that is not a final row: exactly uniform over the valid transitions unless all of
  them are final rows, which has probability ``f ** 32`` for a share ``f`` of final rows (at most 1/2, each
  following a row of its episode; 1e-32 at f = 0.1); such a draw keeps its first candidate and ``misses`` (a device
  tensor, never read by the loop) counts it. The draws come from torch's generator on the device, not the buffer's:
  the same distribution as the host path, not the same batches. ``last_index`` holds the flat ``row * B + env``
  indices of the last sample (tests compare them with the host replay's rows).
Imports ``shared.device`` and ``shared.replay``; neither imports it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import shared.device
from shared.device import upload
from shared.replay import ReplayBuffer

__all__ = ["DeviceReplay", "mirror_on"]

CANDIDATES = 32  # draws per sample, the first valid one kept (module docstring)
CHUNK = 4096  # rows (of B envs) per copy up in a sync: a restored full replay does not stage 100 MB at once


def mirror_on(buffer: ReplayBuffer | None, obs_norm: Any, skip: tuple, device: Any) -> DeviceReplay | None:
    """The replay's mirror on a CUDA learner (see the module docstring); ``None`` on the CPU or without a replay."""
    if buffer is None or (device.type != "cuda" and not shared.device.CUDA_PATH):
        return None
    return DeviceReplay(buffer, obs_norm, skip, device)


class DeviceReplay(torch.nn.Module):
    """The device's copy of ``buffer``'s rows, sampled on the device (see the module docstring). A module: a
    ``@graphed`` update takes it as state (used in place, never copied in)."""

    def __init__(self, buffer: ReplayBuffer, obs_norm: Any, skip: tuple, device: Any):
        super().__init__()
        if not isinstance(buffer, ReplayBuffer) or buffer.tree is not None or buffer.storage.C > 1:
            raise ValueError("the device replay mirrors a uniform ReplayBuffer without frame stacking")
        if buffer.storage.T >= 2**24:
            raise ValueError(f"the device replay holds at most {2**24 - 1} rows of envs")
        s = buffer.storage
        derived = ("next_observation", "bootstrap_discount", "is_weights")  # made at sampling, not stored
        self.fields = [f for f in buffer._batch_cls._fields if f not in skip and f not in derived]
        self.fields += [f for f in ("n_taken", "final_row") if f not in self.fields]  # the draw and the bootstrap read
        self.outputs = [f for f in buffer._batch_cls._fields if f not in skip]
        self.columns: dict[str, tuple[int, int, tuple]] = {}  # field -> (first column, width, shape of one row)
        width = 0
        for f in self.fields:
            x = self._source(s, f)
            if not isinstance(x, np.ndarray):
                raise ValueError(f"the device replay mirrors flat fields; {f!r} is nested (add it to HOST_ONLY)")
            shape = x.shape[2:]
            self.columns[f] = (width, int(np.prod(shape, dtype=np.int64)), shape)
            width += self.columns[f][1]
        self.buffer, self.obs_norm = buffer, obs_norm
        self.T, self.B = s.T, s.B
        self.synced = 0  # abs rows whose every field the mirror holds
        self.register_buffer("data", torch.zeros(s.T * s.B, width, device=device))  # [T * B, F] float32
        self.register_buffer("meta", torch.zeros(2 + len(obs_norm.moments()), device=device))  # sync's (window, stats)
        self.register_buffer("discounts", torch.as_tensor(s.discounts, device=device))  # by n_taken
        self.register_buffer("misses", torch.zeros((), dtype=torch.int64, device=device))
        self.register_buffer("last_index", torch.zeros(0, dtype=torch.int64, device=device))

    @staticmethod
    def _source(storage: Any, field: str) -> Any:
        """The ``[T, B, ...]`` array that holds ``field``: a stored field, or one the buffer derives on append."""
        return getattr(storage.data if field in storage.data._fields else storage, field)

    @torch.no_grad()
    def sync(self) -> None:
        """Bring the mirror up to the buffer (see the module docstring)."""
        s, T, B = self.buffer.storage, self.T, self.B
        with self.buffer._locked():
            cursor = s.cursor
            if cursor == self.synced:
                return
            lo, hi = self.buffer.valid_window(cursor)
            # the window as (first storage row, rows): float32 holds them exactly (T < 2 ** 24), the statistics after
            meta = np.concatenate([[lo % T, hi - lo], self.obs_norm.moments()], dtype=np.float32)
            pieces, start = [], max(self.synced - (s.n - 1), cursor - T, 0)  # the n - 1 before: n-step fields changed
            while start < cursor:  # runs of storage rows, split where they wrap around
                m = min(CHUNK, cursor - start, T - start % T)
                flat = slice(start % T * B, (start % T + m) * B)
                columns = [self._source(s, f).reshape(T * B, -1)[flat] for f in self.fields]
                pieces.append((flat, np.concatenate(columns, axis=1, dtype=np.float32)))
                start += m
        for flat, block in pieces[:-1]:
            self.data[flat] = upload(block, self.data.device)  # one copy each
        up = upload({"block": pieces[-1][1], "meta": meta}, self.data.device)  # one copy
        self.data[pieces[-1][0]] = up["block"]
        self.meta.copy_(up["meta"])
        self.synced = cursor

    def column(self, rows: torch.Tensor, field: str) -> torch.Tensor:
        """``field`` at the mirror's flat ``rows`` [N], shaped ``[N, ...]`` as the replay stores it (float32)."""
        first, width, shape = self.columns[field]
        return self.data[rows, first : first + width].view(len(rows), *shape)

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        """``n`` transitions drawn on the device: the update's batch (see the module docstring)."""
        first_row, count = self.meta[0].long(), (self.meta[1].long() * self.B).clamp(min=1)  # valid (row, env) pairs
        draw = torch.randint(0, 2**62, (n, CANDIDATES), device=self.data.device) % count  # [N, K]
        flat = (first_row + draw // self.B) % self.T * self.B + draw % self.B  # [N, K]: storage row * B + env
        valid = self.data[flat, self.columns["final_row"][0]] == 0  # [N, K]: not a final-observation row
        pick = valid.to(torch.uint8).argmax(1, keepdim=True)  # the first valid candidate (the first one if none)
        self.misses += (~valid.any(1)).sum()
        rows = flat.gather(1, pick).squeeze(1)  # [N]
        self.last_index = rows
        n_taken = self.column(rows, "n_taken").long()
        next_rows = (rows // self.B + n_taken) % self.T * self.B + rows % self.B  # the bootstrap row, same env
        stats = self.meta[2:]
        out = {}
        for f in self.outputs:
            if f == "next_observation":
                out[f] = self.obs_norm.normalize(self.column(next_rows, "observation"), stats)
            elif f == "bootstrap_discount":
                out[f] = self.discounts[n_taken]
            elif f == "observation":
                out[f] = self.obs_norm.normalize(self.column(rows, f), stats)
            else:
                out[f] = self.column(rows, f)
        return out
