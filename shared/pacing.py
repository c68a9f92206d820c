"""The replay ratio, in every sampling mode, and the link between an async replay sampler and its learner.

Guarantees
- ``ReplayPacer`` is the replay ratio of every replay script, in every mode: how many updates are due once so
  many env steps are sampled. In serial and parallel mode the script's own loop steps its envs into the replay;
  only the async link is here.
- ``AsyncReplay`` is the link between an async replay sampler process and its learner, written once.
  ``AsyncReplay.start`` starts the script's sampler process (held by the run) appending to the shared replay.
  The learner's one call per loop iteration, ``global_step, waits = link.exchange(run, module, updates)``, returns
  the global steps in the replay and the wait statistics for the progress row, records the episodes the sampler
  finished, publishes the parameters every ``PUBLISH_EVERY`` updates and whenever it has nothing to do (so a
  sampler waiting on it always sees its newest update count: no deadlock), and then sleeps ``WAIT_S`` and counts
  the time (``wait_s``: the sampler is the bottleneck). The sampler's one call before each env step,
  ``link.ready(proc, step, module, max_lag_steps)``, is False while it is more than ``max_lag_steps`` ahead of what
  the published updates cover (it sleeps and counts that: ``sampler_wait_s``, the learner is the bottleneck), and
  otherwise loads each newly published version into ``module``; the sampler reports finished episodes with their
  global step. (``poll``/``waits`` and ``sampler_wait``/``pull`` are the two calls' halves, kept for callers that
  use them.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from shared import distributed
from shared.buffer import shared_zeros
from shared.procs import CTX, SharedParameters, Worker

__all__ = ["AsyncReplay", "ReplayPacer", "sampler_ahead"]


def sampler_ahead(
    step: int,
    version: int,
    start_step: int,
    start_updates: int,
    min_steps_learn: int,
    updates_per_step: float,
    max_lag_steps: int,
    chunk_steps: int = 0,
) -> bool:
    """Async replay pacing, sampler side: True when the sampler, at global env step ``step``, is more than
    ``max_lag_steps`` ahead of the data the learner needs for its updates so far (``version`` = its update count,
    ``start_updates`` at ``start_step``) *and its next one*, plus ``chunk_steps`` (data the learner only sees
    a chunk at a time). Counting the next update means the sampler can always produce what the learner waits
    for, whatever the replay ratio: otherwise one update covering more than ``max_lag_steps`` deadlocks both.
    ``max_lag_steps == 0`` never waits."""
    covered = start_step + min_steps_learn + (version - start_updates + 1) / updates_per_step + chunk_steps
    return bool(max_lag_steps) and step - covered > max_lag_steps


class ReplayPacer:
    """The replay ratio as a count of updates: ``updates_per_step`` per env step sampled past
    ``min_steps_learn``, counted from where this process started (``start_step``, ``start_updates``: a resumed
    run refills ``min_steps_learn`` steps before it learns again)."""

    def __init__(self, updates_per_step: float, min_steps_learn: int, start_step: int = 0, start_updates: int = 0):
        self.updates_per_step, self.min_steps_learn = updates_per_step, min_steps_learn
        self.start_step, self.start_updates = start_step, start_updates

    def due(self, sampled: int, updates: int) -> int:
        """Updates to do now that ``sampled`` global env steps are in the replay and ``updates`` are done."""
        learned = sampled - self.start_step - self.min_steps_learn
        if learned <= 0:
            return 0
        return max(int(learned * self.updates_per_step) + self.start_updates - updates, 0)

    def warming_up(self, step: int) -> bool:
        """True before this process has sampled ``min_steps_learn`` steps (off-policy control acts at random then)."""
        return step < self.start_step + self.min_steps_learn

    def sampler_ahead(self, step: int, version: int, max_lag_steps: int, chunk_steps: int = 0) -> bool:
        return sampler_ahead(
            step,
            version,
            self.start_step,
            self.start_updates,
            self.min_steps_learn,
            self.updates_per_step,
            max_lag_steps,
            chunk_steps,
        )


class AsyncReplay:
    """The link between an async replay sampler process and its learner (see the module docstring). Learner: ``link =
    AsyncReplay.start(run, buffer, module, pacer, global_step, sampler_main, sampler_args)``, in the loop ``global_step,
    waits = link.exchange(run, module, updates)``. Sampler (``sampler_main(*sampler_args, link, proc)``): ``if not
    link.ready(proc, step, module, max_lag_steps): continue``, step and append, ``link.report(episodes, step)``."""

    PUBLISH_EVERY = 10  # learner updates between parameter copies (each copies the whole network)
    WAIT_S = 0.002  # learner's sleep while the replay ratio is reached
    SAMPLER_WAIT_S = 0.001  # sampler's sleep while it is too far ahead

    def __init__(self, module: Any, pacer: ReplayPacer, num_envs: int, start_step: int | None = None):
        self.pacer, self.num_envs = pacer, num_envs
        # The global step this process starts at (the pacer's origin unless a restored replay moved it to 0).
        self.start_step = pacer.start_step if start_step is None else start_step
        self.params = SharedParameters(module)
        self.params.publish(module, version=pacer.start_updates)
        self.episodes = CTX.Queue()
        self.sampler_waited = shared_zeros(1, np.float64)
        self.wait_s = 0.0
        self._worker: Worker | None = None
        self._buffer: Any = None
        self._version = -1  # sampler side: the version its module holds

    def __getstate__(self) -> dict:  # what the sampler process receives: the shared parts only
        state = self.__dict__.copy()
        state["_worker"] = state["_buffer"] = None
        return state

    # learner side
    @classmethod
    def start(
        cls,
        run: Any,
        buffer: Any,
        module: Any,
        pacer: ReplayPacer,
        global_step: int,
        sampler_main: Callable[..., None],
        sampler_args: tuple,
    ) -> AsyncReplay:
        """Start ``sampler_main(*sampler_args, link, proc)`` (``run.start_sampler``; ``sampler_args[0]`` is the
        script's Args), appending ``args.num_envs`` envs' rows to the shared ``buffer`` with the newest parameters
        of ``module``."""
        link = cls(module, pacer, run.args.num_envs, global_step)
        worker = run.start_sampler(sampler_main, *sampler_args, link)
        link.attach(worker, buffer)
        return link

    def attach(self, worker: Worker, buffer: Any) -> None:
        """The sampler ``worker`` appends to ``buffer`` (whose ``cursor`` counts its rows)."""
        self._worker, self._buffer = worker, buffer
        self._rows0 = buffer.cursor  # rows a restored replay (--save-replay) held before this process
        buffer.watch(self.alive)  # a sampler killed while holding the replay's lock raises, never hangs

    def alive(self) -> None:
        self._worker.check(allow_finished=True)

    def poll(self, run: Any, module: Any, updates: int) -> int:
        """Raise if the sampler failed; record the episodes it finished in ``run``; publish ``module`` when due
        (every PUBLISH_EVERY updates, or when no update is due) and wait a little when no update is due; return
        the global env steps in the replay (in a torchrun job: the world size times the slowest rank's steps)."""
        self.alive()
        while not self.episodes.empty():
            ret, length, step = self.episodes.get()
            run.episodes([(ret, length)], step)
        # torchrun: counted as global steps (every rank's sampler steps as many), and the slowest rank's count,
        # so that every rank finds the same number of updates due.
        steps = (self._buffer.cursor - self._rows0) * self.num_envs * distributed.world_size()
        global_step = self.start_step + distributed.min_over_ranks(steps)
        idle = self.pacer.due(global_step, updates) == 0
        if updates >= self.params.version + self.PUBLISH_EVERY or (idle and updates > self.params.version):
            self.params.publish(module, version=updates, check=self.alive)
        if idle:
            t0 = time.perf_counter()
            time.sleep(self.WAIT_S)
            self.wait_s += time.perf_counter() - t0
        return global_step

    def exchange(self, run: Any, module: Any, updates: int) -> tuple[int, dict[str, float]]:
        """``poll``, then ``waits``: the global env steps in the replay and the wait statistics of the progress row."""
        return self.poll(run, module, updates), self.waits()

    def waits(self) -> dict[str, float]:
        """Seconds the learner waited for the sampler and the sampler for the learner, for the progress row."""
        return {"wait_s": round(self.wait_s, 2), "sampler_wait_s": round(float(self.sampler_waited[0]), 2)}

    # sampler side
    def ready(self, proc: Any, step: int, module: Any, max_lag_steps: int, chunk_steps: int = 0) -> bool:
        """Before each env step: ``proc.check()`` (ends the process once the run stops it); False after a short sleep
        while the sampler at ``step`` is too far ahead of the learner (``sampler_wait``); else True, the newest
        published parameters loaded into ``module`` (``pull``)."""
        proc.check()
        if self.sampler_wait(step, max_lag_steps, chunk_steps):
            return False
        self.pull(module)
        return True

    def sampler_wait(self, step: int, max_lag_steps: int, chunk_steps: int = 0) -> bool:
        """True after a short sleep when the sampler at ``step`` is too far ahead of the learner."""
        if not self.pacer.sampler_ahead(step, self.params.version, max_lag_steps, chunk_steps):
            return False
        t0 = time.perf_counter()
        time.sleep(self.SAMPLER_WAIT_S)
        self.sampler_waited[0] += time.perf_counter() - t0
        return True

    def pull(self, module: Any) -> None:
        """Load the newest published parameters into ``module`` if there are new ones."""
        if self.params.version != self._version:
            self._version = self.params.pull(module)

    def report(self, episodes: list[tuple[float, int]], step: int) -> None:
        for ret, length in episodes:
            self.episodes.put((ret, length, step))
