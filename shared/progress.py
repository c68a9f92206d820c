"""Progress rows: ``progress.csv``, TensorBoard and the console line, with the episodes that ended between rows.

Guarantees
- ``progress.csv`` starts with ``global_step,wall_time_s,sps,episodes,return_mean``, then whatever the script
  passes to ``row``; ``episodes`` counts every episode finished in the run so far, ``return_mean`` covers those
  finished since the previous row and is empty when none did. Logging is additive: a key first passed mid-run
  becomes a new column, the file is rewritten once (atomically) with that column empty in the earlier rows.
- Values may be numbers or 0-d tensors (read only here, when the row is written, so an update never waits on
  the device for a statistic); ``None`` leaves the cell empty.
- Each row goes to TensorBoard under CleanRL's tags (``charts/`` for ``CHART_KEYS``, ``losses/`` otherwise, a
  key holding ``/`` as it is) and to the console as one line with the step of the total, percent and ETA.
- Resuming (``start_step``): rows and TensorBoard events past the checkpoint's step, written by a run killed
  after its last checkpoint, are superseded; ``episodes`` and ``wall_time_s`` continue from ``counters``.
- In a torchrun job every rank calls ``row`` at the same step: every rank's episodes since the last row join
  it, each value becomes its mean over ranks (a value equal on every rank stays as is), and the ranks'
  parameters are checked to be identical (``distributed.check_in_sync``). Rank 0 alone writes.
- ``recent_mean(n)``: the mean return of the last ``n`` episodes (of every rank), None before ``n`` ended.
- ``read_rows(path, last_bytes)``: the file read back from outside the run (a launcher's status, a report), each
  row a dict of column -> cell (``""`` where empty), only complete rows: a row the run is still writing is never
  returned. With ``last_bytes`` only the file's end is read, so following a long run stays cheap.
"""

from __future__ import annotations

import collections
import csv
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from shared import distributed
from shared.files import WriteError, reason, write_text

__all__ = ["CHART_KEYS", "COLUMNS", "ProgressLog", "read_rows"]

COLUMNS = ["global_step", "wall_time_s", "sps", "episodes", "return_mean"]
# Scalars that are not losses go under charts/ (CleanRL's tags); everything else under losses/.
CHART_KEYS = {"learning_rate", "epsilon", "updates", "wait_s", "sampler_wait_s", "eval_return"}


def scalar(v: Any) -> Any:
    """A number for the row: 0-d tensors and numpy scalars are read here (a sync each: ``scalars`` reads a row's
    in one); a list of them is their mean (a statistic over an update's minibatches)."""
    if v is None or isinstance(v, (int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return float(np.mean([scalar(x) for x in v])) if v else None
    return v.item() if hasattr(v, "item") else v


def scalars(values: dict[str, Any]) -> dict[str, Any]:
    """``scalar`` of each value, every 0-d tensor among them (alone or in a list) read in one copy per device and
    dtype: the row's one host sync of its statistics, however many minibatches they cover."""
    tensors: dict[Any, list] = {}  # (device, dtype) -> its 0-d tensors, in order
    for v in values.values():
        for x in v if isinstance(v, (list, tuple)) else (v,):
            if hasattr(x, "detach") and x.dim() == 0:
                tensors.setdefault((x.device, x.dtype), []).append(x)
    read = {}  # id(tensor) -> its number, of .item()'s type
    if tensors:
        import torch

        for group in tensors.values():  # as a rule one: float32 statistics on the learner's device
            read.update(zip(map(id, group), torch.stack(group).detach().tolist()))
    number = lambda x: read.get(id(x), x)
    return {k: scalar([number(x) for x in v] if isinstance(v, (list, tuple)) else number(v)) for k, v in values.items()}


def read_rows(path: Path, last_bytes: int | None = None) -> list[dict[str, str]]:
    """The rows of a ``progress.csv`` as dicts of column -> cell, ``""`` where a cell is empty or the row is shorter
    than the header. Only complete rows: those that end in a line break and start with their integer global step,
    so reading the file while its run appends to it never returns a row being written. ``last_bytes``: only the
    rows within the file's last ``last_bytes`` bytes (the first line there may be a row's end: it is left out).
    Raises ``OSError`` when the file cannot be read."""
    with open(path, "rb") as f:
        first = f.readline()
        end = f.seek(0, os.SEEK_END)
        start = len(first) if last_bytes is None else max(end - last_bytes, len(first))
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines(keepends=True)
    header = next(csv.reader([first.decode(errors="replace")]), [])
    if start > len(first):
        lines = lines[1:]
    complete = [ln for ln in lines if ln.endswith(("\n", "\r"))]
    return [
        dict(zip(header, row + [""] * (len(header) - len(row)))) for row in csv.reader(complete) if row and row[0].isdigit()
    ]


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class ProgressLog:
    """``progress.csv`` + TensorBoard + console for one run folder (see the module docstring)."""

    def __init__(
        self,
        path: Path | None,
        total_steps: int,
        start_step: int = 0,
        counters: dict | None = None,
        resumed: bool = False,
        read_only: bool = False,
    ):
        from torch.utils.tensorboard import SummaryWriter

        counters = counters or {}
        self.path, self.total_steps, self.writes = path, total_steps, path is not None
        self._t0 = time.time() - float(counters.get("wall_time_s", 0.0))  # cumulative over resumes
        self._start_t, self._start_step = time.time(), start_step
        self._last_t, self._last_step = time.time(), start_step
        self._returns: list[float] = []  # since the last row
        self._recent: collections.deque[float] = collections.deque(maxlen=100)
        self._pending: list[tuple[float, int, int]] = []  # torchrun job: this rank's episodes since the last row
        self.episodes = int(counters.get("episodes", 0))
        self.columns = list(COLUMNS)
        self.last_step = start_step  # the step of the last row
        if path is None:  # a rank other than 0: counts and merges, writes nothing
            self.tb: Any = _NoWriter()
            return
        self._progress = path / "progress.csv"
        if self._progress.exists():
            with open(self._progress, newline="") as f:
                lines = list(csv.reader(f))
            self.columns = lines[0] if lines else self.columns
            # A run killed after its last checkpoint logged past it: those rows are superseded by the resumed run.
            kept = [r for r in lines[1:] if r and int(r[0]) <= start_step]
            if resumed and not read_only and len(kept) < len(lines) - 1:
                self._rewrite(kept)
        else:
            write_text(self._progress, lambda f: f.write(",".join(self.columns) + "\n"))
        self._csv_file = open(self._progress, "a", newline="")  # open for the run's lifetime
        self._csv = csv.writer(self._csv_file)
        # purge_step: TensorBoard drops the events past the checkpoint that an earlier process wrote. flush_secs: its
        # writer thread sleeps at most this long; a Ctrl-C inside add_scalar can lose the wake-up of its queue, and
        # close() then waits for the thread's next wake-up (it was 2 minutes at the default: a hung Ctrl-C).
        self.tb = SummaryWriter(str(path), purge_step=start_step + 1 if resumed and not read_only else None, flush_secs=5)

    def episode(self, ret: float, length: int, global_step: int) -> None:
        """Record one finished episode (its true, unclipped return)."""
        if not math.isfinite(ret):
            raise FloatingPointError(f"episode return is {ret}")
        if distributed.in_lockstep():  # every rank's episodes are counted together at the next row
            self._pending.append((float(ret), int(length), int(global_step)))
            return
        self._add_episode(float(ret), int(length), int(global_step))

    def _add_episode(self, ret: float, length: int, step: int) -> None:
        self._returns.append(ret)
        self._recent.append(ret)
        self.episodes += 1
        self.tb.add_scalar("charts/episodic_return", ret, step)
        self.tb.add_scalar("charts/episodic_length", length, step)

    def recent_mean(self, n: int) -> float | None:
        """Mean return of the last ``n`` episodes, None before ``n`` have ended."""
        return float(np.mean(list(self._recent)[-n:])) if len(self._recent) >= n else None

    def wall_time(self) -> float:
        return round(time.time() - self._t0, 3)

    def row(self, global_step: int, **values: Any) -> dict:
        """Write one progress row (any keys: new ones become columns), its TensorBoard scalars and a console
        line; returns the row."""
        values = scalars(values)
        if distributed.in_lockstep():
            self._merge_ranks(values)
            distributed.check_in_sync()
        now = time.time()
        sps = (global_step - self._last_step) / max(now - self._last_t, 1e-9)
        self._last_t, self._last_step, self.last_step = now, global_step, global_step
        ret_mean = float(np.mean(self._returns)) if self._returns else None
        row = {
            "global_step": global_step,
            "wall_time_s": round(now - self._t0, 3),
            "sps": round(sps, 1),
            "episodes": self.episodes,
            "return_mean": ret_mean,
            **values,
        }
        new = [k for k in row if k not in self.columns]
        if new and self.writes:
            self._add_columns(new)
        self.columns += [k for k in new if k not in self.columns]
        try:
            if self.writes:
                self._csv.writerow(["" if row.get(c) is None else row[c] for c in self.columns])
                self._csv_file.flush()
        except OSError as e:
            raise WriteError(f"cannot write {self._progress}: {reason(e, self.path)}") from e
        self.tb.add_scalar("charts/SPS", sps, global_step)
        for k, v in values.items():
            if v is not None:
                self.tb.add_scalar(k if "/" in k else f"{'charts' if k in CHART_KEYS else 'losses'}/{k}", v, global_step)
        self._returns.clear()
        if self.writes:
            print(self._console(global_step, sps, ret_mean, values), flush=True)
        return row

    def _console(self, step: int, sps: float, ret_mean: float | None, values: dict) -> str:
        """``step 12288/100000 (12%)  sps 2000  eta 0:00:43  return 21.4  episodes 44  loss ...``"""
        rate = (step - self._start_step) / max(time.time() - self._start_t, 1e-9)  # this process's mean
        eta = _duration(max(self.total_steps - step, 0) / rate) if rate > 0 else "-"
        pct = 100.0 * step / max(self.total_steps, 1)
        rm = f"{ret_mean:.1f}" if ret_mean is not None else "-"
        extra = "  ".join(f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, (int, float)))
        return (
            f"step {step:>9}/{self.total_steps} ({pct:3.0f}%)  sps {sps:>6.0f}  eta {eta}  return {rm:>7}  "
            f"episodes {self.episodes:>5}  {extra}"
        )

    def _merge_ranks(self, values: dict[str, Any]) -> None:
        every = distributed.gather_objects((self._pending, values))
        self._pending = []
        for episodes, _ in every:
            for ret, length, step in episodes:
                self._add_episode(ret, length, step)
        for k, v in values.items():
            theirs = [vals.get(k) for _, vals in every]
            if (
                isinstance(v, (int, float))
                and all(isinstance(t, (int, float)) for t in theirs)
                and any(t != v for t in theirs)
            ):
                values[k] = float(np.mean(theirs))

    def _add_columns(self, new: list[str]) -> None:
        self._csv_file.close()
        with open(self._progress, newline="") as f:
            rows = list(csv.reader(f))[1:]
        self.columns += new
        self._rewrite(rows)
        self._csv_file = open(self._progress, "a", newline="")
        self._csv = csv.writer(self._csv_file)

    def _rewrite(self, rows: list[list[str]]) -> None:
        """Replace progress.csv atomically with the header and ``rows`` (padded to every column)."""

        def write(f) -> None:
            writer = csv.writer(f)
            writer.writerow(self.columns)
            writer.writerows(r + [""] * (len(self.columns) - len(r)) for r in rows)

        write_text(self._progress, write)

    def close(self) -> None:
        self.tb.close()
        if self.writes:
            self._csv_file.close()


class _NoWriter:
    """TensorBoard on ranks that do not write the run folder."""

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass
