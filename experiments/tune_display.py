"""The live view of a study while it runs: one table refreshed in place on a terminal, plain lines otherwise.

Guarantees
- On a terminal (rich installed, not ``--plain``): one table refreshed in place at most once a second (the
  launcher's ``LiveView``, no refresh thread): the best trial and the latest ``SHOWN`` ones, each with its state,
  value (or latest intermediate value), this process's runs done and their lowest step, and its flags; the
  study's counts and best value in the title. Otherwise plain lines: one per note (a trial started, resumed,
  complete, pruned, failed, interrupted), and ``summary_line()`` every ``status_every`` seconds.
- A storage error while drawing (a database busy for a moment) skips that refresh: the view never stops the runs'
  supervision (``TOLERATE``).
- It only reads: the study through the tune (``counts``, ``study``, ``mine``, ``records``) and the runs' progress.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from experiments.display import LiveView
from experiments.status import progress_of


class TuneDisplay(LiveView):
    """The study while it runs: on a terminal (rich, not ``--plain``) one table refreshed in place at most once a
    second (trial, state, value or latest intermediate value, flags, this process's runs done and their step); plain
    lines otherwise, one per event and a summary every ``status_every`` seconds. No refresh thread."""

    SHOWN = 30  # the table's rows: the best trial and the latest ones
    COLOURS = {"complete": "green", "pruned": "magenta", "fail": "red", "running": "cyan", "waiting": "yellow"}  # by state
    TOLERATE = (Exception,)  # a storage hiccup must not stop the runs' supervision

    def __init__(self, tune: Any, plain: bool, status_every: float):  # an experiments.tune.Tune
        self.tune = tune
        super().__init__(plain, status_every)
        self._last_refresh = time.time()

    def summary_line(self) -> str:
        c, best = self.tune.counts(), self._best()
        return (
            f"{c['complete']} complete, {c['pruned']} pruned, {c['running']} running, {c['waiting']} queued, "
            f"{c['fail']} failed of {self.tune.st.trials}"
            + (f"; best trial {best.number}: {best.value:.4g}" if best is not None else "")
        )

    def _best(self):
        with contextlib.suppress(ValueError):
            return self.tune.study.best_trial
        return None

    def table(self):
        from rich.table import Table

        trials = self.tune.study.get_trials(deepcopy=False)
        best = self._best()
        shown = trials[-self.SHOWN :]
        if best is not None and best not in shown:
            shown = [best, *shown[1:]]
        t = Table(title=f"study {self.tune.st.study_name}: {self.summary_line()}", title_justify="left")
        for col in ("trial", "state", "value", "runs", "flags"):
            t.add_column(
                col,
                justify="right" if col in ("trial", "value") else "left",
                overflow="fold" if col == "flags" else "ellipsis",
            )
        for tr in shown:
            mine = self.tune.mine.get(tr.number)
            value = tr.value if tr.value is not None else (mine.last_report if mine else None)
            runs = ""
            if mine is not None:
                recs = [self.tune.records[r.rel] for r in mine.runs]
                steps = [progress_of(r)["step"] or 0 for r, rec in zip(mine.runs, recs) if rec["state"] == "running"]
                runs = f"{sum(rec['state'] == 'done' for rec in recs)}/{len(recs)} done" + (
                    f", {len(steps)} at {min(steps):,}+" if steps else ""
                )
            state = tr.state.name.lower()
            best_mark = " (best)" if best is not None and tr.number == best.number else ""
            t.add_row(
                str(tr.number),
                f"[{self.COLOURS.get(state, 'white')}]{state}{best_mark}[/]",
                f"{value:.4g}" if value is not None else "-",
                runs,
                tr.user_attrs.get("flags", ""),
            )
        return t
