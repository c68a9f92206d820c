"""The local runner: the runs of the grid on this machine, each in its slot, supervised until they end.

Guarantees
- Runs wait in a queue, in grid order, and each starts as soon as enough slots are free (a torchrun run takes
  N slots; a one-slot run behind it may start first). Each runs pinned to its slots' CPUs with their
  environment (``experiments/slots.py``, ``experiments/process.py``), its attempt recorded in its
  ``launch.json`` before and after (``experiments/records.py``), ``status.json`` rewritten at every start and
  end. A failing run does not stop the others.
- When a run's process ends, whatever it left in its session is SIGKILLed before it is reaped, and its slots
  are freed.
- Ctrl-C or SIGTERM: every running script gets SIGTERM (it writes a checkpoint and exits 130), the runner waits
  up to ``stop_timeout`` seconds, then SIGKILLs what is left of each run's session; a second Ctrl-C stops
  waiting. Queued runs stay queued. However it ends (an error here included), no run's process is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from experiments.display import Display
from experiments.grid import Trial
from experiments.process import kill_session, start_process
from experiments.records import begin_attempt, end_attempt, write_json
from experiments.slots import Slot, child_env
from experiments.status import fmt_duration, write_status


@dataclass
class Child:
    run: Trial
    proc: subprocess.Popen
    slots: list[Slot]
    signalled: bool = False
    started: float = field(default_factory=time.time)


class Launcher:
    def __init__(
        self, runs: list[Trial], records: dict[str, dict], slots: list[Slot], display: Display, stop_timeout: float, meta: dict
    ):
        self.runs, self.records, self.slots, self.display = runs, records, slots, display
        self.stop_timeout, self.meta = stop_timeout, meta
        self.children: dict[int, Child] = {}
        self.free = [s.index for s in slots]
        self.queue: list[Trial] = []
        self.ended: list[tuple[Trial, str]] = []  # (run, state) of each run reaped, for a caller that follows them
        self.stop_signal: int | None = None
        self.signals = 0

    def on_signal(self, signum, frame) -> None:
        self.stop_signal = signum
        self.signals += 1

    def save(self, run: Trial) -> None:
        write_json(run.folder / "launch.json", self.records[run.rel])

    def start(self, run: Trial) -> None:
        take = sorted(self.free)[: run.nproc]
        self.free = [i for i in self.free if i not in take]
        slots = [self.slots[i] for i in take]
        record = self.records[run.rel]
        cmd, attempt = begin_attempt(run, record, slots)
        cpus = tuple(c for s in slots for c in s.cpus)
        proc = start_process(cmd, run.folder, child_env(slots), cpus)
        record["pid"] = proc.pid
        self.save(run)
        self.children[proc.pid] = Child(run, proc, slots)
        how = "resumed" if attempt["resumed"] else "started"
        gpus = f", GPU {','.join(attempt['gpus'])}" if attempt.get("gpus") else ""
        self.display.note(f"{how} {run.rel} (pid {proc.pid}, cpus {','.join(map(str, cpus))}{gpus})")

    def reap(self) -> None:
        for pid, child in list(self.children.items()):
            try:
                done = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                done = True
            if not done:
                continue
            kill_session(pid)  # whatever the script left behind; the leader is a zombie, its id still ours
            rc = child.proc.wait()
            del self.children[pid]
            self.free += [s.index for s in child.slots]
            run = child.run
            state = end_attempt(run, self.records[run.rel], rc, child.signalled)
            self.save(run)
            self.ended.append((run, state))
            took = fmt_duration(time.time() - child.started)
            if state == "failed":
                self.display.note(f"failed {run.rel} (exit {rc}, {took}): {self.records[run.rel]['error']}")
            else:
                self.display.note(f"{state} {run.rel} (exit {rc}, {took})")
            write_status(self.runs, self.records)

    def stop_children(self, runs: list[Trial] | None = None) -> None:
        """SIGTERM every running script (or those of ``runs``): each writes a checkpoint and exits 130; its end is
        recorded as interrupted when reaped."""
        for child in self.children.values():
            if not child.signalled and (runs is None or child.run in runs):
                child.signalled = True
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)  # the script (or torchrun) itself: it checkpoints

    def step(self) -> None:
        """Start what the queue holds as slots free (in queue order; a run needing more slots waits), reap the runs
        that ended, refresh the display."""
        for run in list(self.queue):
            if run.nproc <= len(self.free):
                self.queue.remove(run)
                self.start(run)
                write_status(self.runs, self.records)
        self.reap()
        self.display.tick()

    @contextlib.contextmanager
    def supervising(self):
        """SIGINT and SIGTERM set ``stop_signal`` while inside; however the block ends (an error included), every
        run still running has its session SIGKILLed and is reaped, and the old handlers come back."""
        old = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for child in self.children.values():  # past the deadline, a second signal, or an error here
                child.signalled = True
                kill_session(child.proc.pid)
            deadline = time.time() + 30
            while self.children and time.time() < deadline:
                self.reap()
                time.sleep(0.05)
            for s, h in old.items():
                signal.signal(s, h)

    def stop_all(self) -> None:
        """After a signal: SIGTERM every running run and wait up to ``stop_timeout`` for their checkpoints (a
        second signal stops waiting); what is left is killed when ``supervising`` ends."""
        self.display.note(
            f"{signal.Signals(self.stop_signal).name}: stopping {len(self.children)} running run(s) (they write a checkpoint)"
        )
        self.stop_children()
        deadline, counted = time.time() + self.stop_timeout, self.signals
        while self.children and time.time() < deadline and self.signals == counted:
            self.reap()
            self.display.tick()
            time.sleep(0.1)

    def run_all(self, todo: list[Trial]) -> bool:
        """Start ``todo`` as slots free; returns False when stopped by a signal."""
        self.queue = list(todo)
        with self.supervising():
            while self.queue or self.children:
                if self.stop_signal is not None:
                    break
                self.step()
                time.sleep(0.1)
            if self.stop_signal is None:
                return True
            self.stop_all()
            return False
