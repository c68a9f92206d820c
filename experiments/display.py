"""The live view of an experiment while it runs: one table refreshed in place on a terminal, plain lines otherwise.

Guarantees
- On a terminal (and rich installed, not ``--plain``): one table (rich) refreshed in place at most once a
  second, each run's state, CPUs while running, step of total, latest return, SPS and ETA (from its progress.csv
  and config.json: ``experiments/status.py``), and the experiment's ETA in its title. No refresh thread: forking
  the runs' children stays safe.
- Otherwise plain lines: one per note (state changes, timestamped) and a summary every ``status_every`` seconds.
- The experiment's ETA is ``experiments/status.py``'s (``overview``).
"""

from __future__ import annotations

import contextlib
import time

from experiments.grid import Trial
from experiments.status import fmt_duration, fmt_steps, overview, summary_line


class LiveView:
    """What the launcher's and the tuner's views share: on a terminal (rich installed, not ``plain``) a table
    (``table()``) refreshed in place at most once a second, with no refresh thread (forking the runs' children
    stays safe); otherwise timestamped lines (``note``) and ``summary_line()`` every ``status_every`` seconds.
    Rendering errors of the types in ``TOLERATE`` are skipped, not raised (a view must not stop the runs)."""

    TOLERATE: tuple[type[BaseException], ...] = ()

    def __init__(self, plain: bool, status_every: float):
        self.status_every = status_every
        self.live = None
        self._last_summary = time.time()
        self._last_refresh = 0.0
        if not plain:
            try:
                from rich.console import Console
                from rich.live import Live

                self.console = Console()
                if self.console.is_terminal:
                    self.live = Live(console=self.console, auto_refresh=False, transient=False)
                    self.live.start()
            except ImportError:
                self.live = None

    def table(self):
        raise NotImplementedError

    def summary_line(self) -> str:
        raise NotImplementedError

    def note(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        if self.live is not None:
            self.live.console.print(f"{stamp} {line}", markup=False, highlight=False)
        else:
            print(f"{stamp} {line}", flush=True)

    def tick(self, force: bool = False) -> None:
        now = time.time()
        if self.live is not None:
            if force or now - self._last_refresh >= 1.0:
                with contextlib.suppress(*self.TOLERATE):
                    self.live.update(self.table(), refresh=True)
                self._last_refresh = now
        elif self.status_every > 0 and now - self._last_summary >= self.status_every:
            with contextlib.suppress(*self.TOLERATE):
                self.note(self.summary_line())
            self._last_summary = now

    def close(self) -> None:
        if self.live is not None:
            with contextlib.suppress(*self.TOLERATE):
                self.live.update(self.table(), refresh=True)
            self.live.stop()
            self.live = None


class Display(LiveView):
    """The launcher's runs: a rich table refreshed in place on a terminal; plain lines otherwise."""

    def __init__(self, runs: list[Trial], records: dict[str, dict], plain: bool, status_every: float):
        self.runs, self.records = runs, records
        super().__init__(plain, status_every)

    def stats(self) -> tuple[dict[str, dict], str, dict[str, int]]:
        return overview(self.runs, self.records)

    def summary_line(self) -> str:
        return summary_line(self.runs, self.records)

    def table(self):
        from rich.table import Table

        prog, eta, counts = self.stats()
        t = Table(
            title=f"{len(self.runs)} runs: {counts['done']} done, {counts['running']} running, "
            f"{counts['queued']} queued, {counts['failed']} failed   experiment ETA {eta}",
            title_justify="left",
        )
        for c in ("run", "state", "cpus", "step", "return", "SPS", "ETA"):
            t.add_column(
                c, justify="left" if c in ("run", "state", "cpus") else "right", overflow="fold" if c == "run" else "ellipsis"
            )
        colour = {"running": "cyan", "done": "green", "failed": "red", "interrupted": "yellow", "pruned": "magenta"}
        for r in self.runs:
            rec = self.records[r.rel]
            p = prog.get(r.rel) or {}
            att = rec["attempts"][-1] if rec.get("attempts") else {}
            cpus = ",".join(map(str, att.get("cpus", []))) if rec["state"] == "running" else ""
            ret = f"{p['return']:.1f}" if p.get("return") is not None else "-"
            sps = f"{p['sps']:.0f}" if p.get("sps") else "-"
            run_eta = (
                fmt_duration((p["total"] - p["step"]) / p["sps"])
                if rec["state"] == "running" and p.get("sps") and p.get("total") and p.get("step") is not None
                else "-"
            )
            state = rec["state"] + (f" ({rec['exit_code']})" if rec["state"] == "failed" else "")
            t.add_row(
                r.rel,
                f"[{colour.get(rec['state'], 'white')}]{state}[/]",
                cpus,
                f"{fmt_steps(p.get('step'))}/{fmt_steps(p.get('total') or r.total_from_flags())}",
                ret,
                sps,
                run_eta,
            )
        return t
