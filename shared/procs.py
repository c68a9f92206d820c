"""Process plumbing for asynchronous sampling: a worker process, a shared-memory double buffer, parameters.

Guarantees
- ``Worker`` starts ``target(*args, stop)`` in a ``spawn`` child. The child ignores SIGINT (the parent decides
  how to stop), dies with its parent (``PR_SET_PDEATHSIG`` on Linux, and a parent check in every wait), and
  sends its traceback to the parent if it raises. The parent's waits call ``check()``, which raises
  ``WorkerError`` with the child's traceback as soon as the child has failed or vanished, so a crashed or
  killed sampler never leaves the learner hanging. ``stop()`` asks, then terminates, then kills, and always
  joins: no zombie, no orphan.
- ``DoubleBuffer`` holds two slots of one structure in shared memory. The writer fills slot ``k % 2`` only
  after the reader released it, the reader reads slot ``k % 2`` only after the writer filled it: the writer
  is never more than one slot ahead, and neither side ever sees a half-written slot. Slots can carry the
  learner's parameters back to the writer, which makes the policy lag exactly one update.
- ``SharedParameters`` publishes a module's parameters and buffers into shared memory with a version number;
  a reader copies them out under the same lock, so it never sees a mix of two versions.
- ``locked(lock, check)`` waits for a lock shared with another process without hanging if that process died
  holding it: ``check`` (e.g. ``Worker.check``) raises.
- ``ReplayPacer`` is the replay ratio of every replay script, in every mode: how many updates are due once so
  many env steps are sampled. ``AsyncReplay`` is the link between an async replay sampler process and its
  learner, written once: the learner publishes parameters every ``PUBLISH_EVERY`` updates and whenever it has
  to wait (so a sampler waiting on it always sees its newest update count: no deadlock), sleeps ``WAIT_S`` and
  counts the time when the replay ratio is reached (``wait_s``: the sampler is the bottleneck); the sampler
  waits while it is more than ``max_lag_steps`` ahead of what the learner's updates cover and counts that
  (``sampler_wait_s``: the learner is the bottleneck), pulls each newly published version, and reports finished
  episodes with their global step.
- Shared memory comes from ``shared.buffer`` (anonymous: it cannot leak); semaphores and locks come from the
  ``spawn`` context, whose resource tracker removes them even after a crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from shared import distributed
from shared.buffer import buffer_from_example, shared_zeros

__all__ = ["CTX", "AsyncReplay", "DoubleBuffer", "ReplayPacer", "SharedParameters", "Worker", "WorkerError",
           "sampler_ahead"]

CTX = mp.get_context("spawn")
_POLL_S = 0.2


class WorkerError(RuntimeError):
    """A worker process failed; the message carries its traceback."""


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def _child_main(target: Callable, args: tuple, stop: Any, errors: Any, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before PDEATHSIG was armed
        os._exit(1)
    try:
        target(*args, stop)
    except BaseException:
        errors.put(traceback.format_exc())
        errors.close()
        errors.join_thread()
        sys.exit(1)


class Worker:
    """One child process running ``target(*args, stop)``; ``stop`` is an event the child should poll."""

    def __init__(self, target: Callable, args: tuple, name: str = "worker"):
        self.name = name
        self.stop_event = CTX.Event()
        self._errors = CTX.Queue()
        self._proc = CTX.Process(target=_child_main, name=name,
                                 args=(target, args, self.stop_event, self._errors, os.getpid()))
        self._proc.start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def check(self, allow_finished: bool = False) -> None:
        """Raise ``WorkerError`` if the child failed or is gone; a normal exit counts as gone unless
        ``allow_finished`` (a waiting caller would otherwise wait forever)."""
        if not self._errors.empty():
            raise WorkerError(f"{self.name} failed:\n{self._errors.get()}")
        if not self._proc.is_alive():
            code = self._proc.exitcode
            try:
                tb = self._errors.get(timeout=0.5)
            except Exception:
                tb = None
            if tb is not None:
                raise WorkerError(f"{self.name} failed:\n{tb}")
            if code != 0 or not (allow_finished or self.stop_event.is_set()):
                raise WorkerError(f"{self.name} (pid {self._proc.pid}) exited unexpectedly with code {code}")

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the child to stop, then terminate and kill it if it does not; always reaps it."""
        self.stop_event.set()
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(3.0)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._errors.close()
        self._errors.join_thread()
        self._errors.cancel_join_thread()


def wait_for(acquire: Callable[[float], bool], check: Callable[[], None]) -> None:
    """Block on ``acquire(timeout)`` in short slices, calling ``check()`` (which may raise) between them."""
    while not acquire(_POLL_S):
        check()


@contextlib.contextmanager
def locked(lock: Any, check: Callable[[], None] | None = None):
    """Hold ``lock``. With ``check``, wait for it in short slices calling ``check()`` between them, so a peer
    killed while holding the lock (it is then never released) makes ``check`` raise instead of a hang."""
    if check is None:
        lock.acquire()
    else:
        wait_for(lambda t: lock.acquire(timeout=t), check)
    try:
        yield
    finally:
        lock.release()


def parent_alive_check(stop: Any, parent_pid: int) -> Callable[[], None]:
    """For a child: a check that raises SystemExit when asked to stop or when the parent is gone."""

    def check() -> None:
        if stop.is_set() or os.getppid() != parent_pid:
            raise SystemExit(0)

    return check


class DoubleBuffer:
    """Two shared-memory slots shaped like ``example`` with ``leading_dims``; writer and reader alternate.

    With ``module``, each slot also carries the module's parameters: the reader publishes its latest ones into a
    slot as it releases it, the writer loads them as it acquires the slot. Rollout ``k`` is then written with
    the parameters the reader had when it released rollout ``k - 2`` (the initial ones for ``k < 2``): a lag
    of exactly one update when the reader trains once per rollout, whatever the timing.
    """

    def __init__(self, example: Any, leading_dims: tuple[int, ...], module: Any = None):
        self.slots = [buffer_from_example(example, leading_dims, shared=True) for _ in range(2)]
        self._filled = [CTX.Semaphore(0) for _ in range(2)]
        self._free = [CTX.Semaphore(1) for _ in range(2)]
        self.params = None
        if module is not None:
            self.params = [SharedParameters(module) for _ in range(2)]
            for p in self.params:
                p.publish(module, version=0)

    def writer_acquire(self, k: int, check: Callable[[], None], module: Any = None) -> Any:
        """Wait until slot ``k % 2`` is free and return it for writing rollout ``k`` (loading its parameters
        into ``module`` if given)."""
        wait_for(lambda t: self._free[k % 2].acquire(timeout=t), check)
        if module is not None:
            self.params[k % 2].pull(module)
        return self.slots[k % 2]

    def writer_release(self, k: int) -> None:
        self._filled[k % 2].release()

    def reader_acquire(self, k: int, check: Callable[[], None]) -> Any:
        """Wait until rollout ``k`` is in slot ``k % 2`` and return it (valid until ``reader_release(k)``)."""
        wait_for(lambda t: self._filled[k % 2].acquire(timeout=t), check)
        return self.slots[k % 2]

    def reader_release(self, k: int, module: Any = None, version: int = 0) -> None:
        """Hand slot ``k % 2`` back, with ``module``'s parameters (labelled ``version``) if given."""
        if module is not None:
            self.params[k % 2].publish(module, version)
        self._free[k % 2].release()


class SharedParameters:
    """A module's parameters and buffers in one shared float32 array, with a version number."""

    def __init__(self, module: Any):
        tensors = self._tensors(module)
        self._sizes = [t.numel() for t in tensors]
        self.flat = shared_zeros(sum(self._sizes), np.float32)
        self._version = shared_zeros(1, np.int64)
        self._lock = CTX.Lock()

    @staticmethod
    def _tensors(module: Any) -> list:
        return [t for t in list(module.parameters()) + list(module.buffers()) if t.is_floating_point()]

    @property
    def version(self) -> int:
        return int(self._version[0])

    def publish(self, module: Any, version: int, check: Callable[[], None] | None = None) -> None:
        """Copy ``module``'s tensors in and set the version (learner side); ``check`` as in ``locked``."""
        import torch

        with torch.no_grad():
            flat = torch.cat([t.detach().reshape(-1).float().cpu() for t in self._tensors(module)]).numpy()
        with locked(self._lock, check):
            self.flat[:] = flat
            self._version[0] = version

    def pull(self, module: Any, check: Callable[[], None] | None = None) -> int:
        """Copy the latest published tensors into ``module``; returns their version (sampler side)."""
        import torch

        with locked(self._lock, check):
            flat = torch.from_numpy(np.array(self.flat))
            version = int(self._version[0])
        with torch.no_grad():
            for t, chunk in zip(self._tensors(module), torch.split(flat, self._sizes)):
                t.copy_(chunk.view_as(t))
        return version


def sampler_ahead(step: int, version: int, start_step: int, start_updates: int, min_steps_learn: int,
                  updates_per_step: float, max_lag_steps: int, chunk_steps: int = 0) -> bool:
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

    def sampler_ahead(self, step: int, version: int, max_lag_steps: int, chunk_steps: int = 0) -> bool:
        return sampler_ahead(step, version, self.start_step, self.start_updates, self.min_steps_learn,
                             self.updates_per_step, max_lag_steps, chunk_steps)


class AsyncReplay:
    """The link between an async replay sampler process and its learner; see the module docstring.

    Learner: ``link = AsyncReplay(module, pacer, num_envs, start_step)``, start the sampler with ``link``
    among its arguments, then ``link.attach(worker, buffer)``; in the loop ``global_step = link.poll(run)``,
    at most one update, then ``link.after_updates(module, updates, learned)``; log ``**link.waits()``.
    Sampler: ``if link.sampler_wait(step, max_lag_steps): continue``, ``link.pull(module)``, step and append,
    ``link.report(episodes, step)``.
    """

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
    def attach(self, worker: Worker, buffer: Any) -> None:
        """The sampler ``worker`` appends to ``buffer`` (whose ``storage.cursor`` counts its rows)."""
        self._worker, self._buffer = worker, buffer
        self._rows0 = buffer.storage.cursor  # rows a restored replay (--save-replay) held before this process
        buffer.watch(self.alive)  # a sampler killed while holding the replay's lock raises, never hangs

    def alive(self) -> None:
        self._worker.check(allow_finished=True)

    def poll(self, run: Any) -> int:
        """Raise if the sampler failed; record the episodes it finished in ``run``; return the global env
        steps in the replay (in a torchrun job: the world size times the slowest rank's steps)."""
        self.alive()
        while not self.episodes.empty():
            run.episode(*self.episodes.get())
        # torchrun: counted as global steps (every rank's sampler steps as many), and the slowest rank's count,
        # so that every rank finds the same number of updates due.
        steps = (self._buffer.storage.cursor - self._rows0) * self.num_envs * distributed.world_size()
        return self.start_step + distributed.min_over_ranks(steps)

    def after_updates(self, module: Any, updates: int, learned: bool) -> None:
        """Publish when due (every PUBLISH_EVERY updates, or whenever the learner has nothing to do); wait
        a little when the learner has nothing to do."""
        if updates >= self.params.version + self.PUBLISH_EVERY or (not learned and updates > self.params.version):
            self.params.publish(module, version=updates, check=self.alive)
        if not learned:
            t0 = time.perf_counter()
            time.sleep(self.WAIT_S)
            self.wait_s += time.perf_counter() - t0

    def waits(self) -> dict[str, float]:
        """Seconds the learner waited for the sampler and the sampler for the learner, for the progress row."""
        return {"wait_s": round(self.wait_s, 2), "sampler_wait_s": round(float(self.sampler_waited[0]), 2)}

    # sampler side
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
