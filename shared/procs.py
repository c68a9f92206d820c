"""Process plumbing for asynchronous sampling: a worker process, a shared-memory double buffer, parameters.

Guarantees
- ``Worker`` starts ``target(*args, stop)`` in a ``spawn`` child; ``sampler_entry`` is the target that
  ``Run.start_sampler`` gives it: the child pins itself to the sampler's cores; acting on a GPU, it makes that GPU
  current, sets what the learner sets there (``shared.precision.gpu_defaults``) and, under ``--compile``, enables
  ``shared.compiling`` in its own process; then it runs the script's ``sampler_main(*args, proc)`` with a
  ``SamplerProcess`` (its thread count, the device it acts on and its liveness check). The child
  ignores SIGINT (the parent decides how to stop), dies with its parent (``PR_SET_PDEATHSIG`` on Linux, and a parent
  check in every wait), and sends its traceback to the parent if it raises (``parent_alive_check``'s SystemExit(0) is a
  clean exit, exit code 0). The parent's waits call ``check()``,
  which raises ``WorkerError`` with the child's traceback as soon as the child has failed or vanished, so a crashed
  or killed sampler never leaves the learner hanging. ``stop()`` asks, then terminates, then kills, and always
  joins: no zombie, no orphan.
- ``DoubleBuffer`` holds two slots of one structure in shared memory. The writer fills slot ``k % 2`` only
  after the reader released it, the reader reads slot ``k % 2`` only after the writer filled it: the writer
  is never more than one slot ahead, and neither side ever sees a half-written slot. Slots can carry the
  learner's parameters back to the writer, which makes the policy lag exactly one update. Both sides get a slot
  as plain ndarray views of its shared arrays (a row of a SharedArray costs a Python call): they are valid while
  the DoubleBuffer lives, and they pickle by value, so a slot travels to another process as the DoubleBuffer does,
  never as views. A sampler acting on a GPU page-locks both slots (``sampler_entry``), so that each step goes up
  from the rollout's row (``shared.device.upload``), and its ``writer_release`` waits for those copies.
- ``SharedParameters`` publishes a module's parameters and buffers into shared memory with a version number;
  a reader copies them out under the same lock, so it never sees a mix of two versions.
- Replay pacing (``ReplayPacer``, ``AsyncReplay``) is in ``shared.pacing``; waits and locks in ``shared.sync``.
- Processes are read from ``/proc`` by one walk: ``process_table`` (each process's state, parent and session),
  ``descendants`` (a process's tree, parents first), ``session_processes`` (a session's live processes); each a
  snapshot of the moment it reads (see ``descendants``).
- Shared memory comes from ``shared.buffer`` (anonymous: it cannot leak); semaphores and locks come from the
  ``spawn`` context, whose resource tracker removes them even after a crash.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from shared import signals
from shared.buffer import buffer_from_example, shared_zeros
from shared.namedarraytuple import map_structure
from shared.sync import locked, wait_for

__all__ = [
    "CTX",
    "DoubleBuffer",
    "SamplerProcess",
    "SharedParameters",
    "Worker",
    "WorkerError",
    "ProcessStat",
    "descendants",
    "parent_alive_check",
    "process_stat",
    "process_table",
    "sampler_entry",
    "session_processes",
]

CTX = mp.get_context("spawn")


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
    if hasattr(signal, "pthread_sigmask"):  # blocked since its start (Worker): a Ctrl-C kept meanwhile is dropped
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before PDEATHSIG was armed
        os._exit(1)
    try:
        target(*args, stop)
    except BaseException as e:
        if isinstance(e, SystemExit) and e.code in (0, None):  # parent_alive_check: asked to stop, or the parent
            return  # is gone: a clean exit
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
        self._proc = CTX.Process(
            target=_child_main, name=name, args=(target, args, self.stop_event, self._errors, os.getpid())
        )
        # The child imports the script (spawn) before _child_main ignores Ctrl-C: it starts with SIGINT blocked
        # (shared.signals.sigint_blocked), so that a Ctrl-C meanwhile cannot raise in the middle of an import.
        # start() returns once the child has read its arguments (after its import, if they pass a pipe's 64 KiB),
        # so that is as long as this process's Ctrl-C can wait.
        try:
            with signals.sigint_blocked():
                self._proc.start()
        except BaseException:  # interrupted while starting: the caller never gets this worker to stop, so it goes
            if self._proc.pid is not None:  # now (it ignores SIGINT, and exit would wait for it)
                self._proc.kill()
                self._proc.join()
            raise

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def alive(self) -> bool:
        """Whether the child process is still running (not yet exited)."""
        return self._proc.is_alive()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the child to exit (``stop`` ends it for sure)."""
        self._proc.join(timeout)

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


def parent_alive_check(stop: Any, parent_pid: int) -> Callable[[], None]:
    """For a child: a check that raises SystemExit when asked to stop or when the parent is gone."""

    def check() -> None:
        if stop.is_set() or os.getppid() != parent_pid:
            raise SystemExit(0)

    return check


@dataclass(frozen=True)
class SamplerProcess:
    """What a sampler process gets from what started it: it is already pinned to its cores, may use
    ``n_threads`` of them, may act on ``device`` (the learner's GPU, or the CPU: ``Run.start_sampler``), and
    ``check()`` raises SystemExit once it is asked to stop or the learner is gone."""

    n_threads: int
    check: Callable[[], None]
    device: Any

    def place(self, module: Any, bf16: bool) -> Any:
        """``module`` (the sampler's copy of the learner's network) on ``device``, with the learner's channels-last
        rule there (``shared.precision.channels_last``); the learner's parameters reach it through ``pull``."""
        from shared.precision import channels_last

        return channels_last(module.to(self.device), self.device, bf16)


def sampler_entry(
    target: Callable[..., None], args: tuple, affinity: Any, parent_pid: int, device: Any, compile: bool, stop: Any
) -> None:
    """A sampler process's first frame: pin to the sampler's cores, make a GPU ``device`` the current one (as the
    learner's ``--device`` does), with ``compile`` enable the script's ``@compiled`` and ``@graphed`` functions for
    ``device`` in this process (``shared.compiling``), page-lock for ``device`` the slots of any ``DoubleBuffer`` among
    ``args`` (the rollouts it writes), then ``target(*args, SamplerProcess)``."""
    affinity.apply_worker(0)
    if getattr(device, "type", None) == "cuda":  # what names no device (events, streams, pinned memory) means this GPU
        import torch

        from shared.precision import gpu_defaults

        torch.cuda.set_device(device)
        gpu_defaults()  # TF32 and cuDNN's benchmark, as the learner acts in serial mode
    if compile:
        from shared import compiling

        compiling.enable(device)
    for buffers in args:  # the rollouts it writes: each step's copy up to a GPU goes from there (shared.device.upload)
        if isinstance(buffers, DoubleBuffer) and device is not None:
            buffers.pin(device)
    target(*args, SamplerProcess(len(affinity.worker_cpus[0]), parent_alive_check(stop, parent_pid), device))


class DoubleBuffer:
    """Two shared-memory slots shaped like ``example`` with ``leading_dims``; writer and reader alternate.

    With ``module``, each slot also carries the module's parameters: the reader publishes its latest ones into a
    slot as it releases it, the writer loads them as it acquires the slot. Rollout ``k`` is then written with
    the parameters the reader had when it released rollout ``k - 2`` (the initial ones for ``k < 2``): a lag
    of exactly one update when the reader trains once per rollout, whatever the timing.
    """

    def __init__(self, example: Any, leading_dims: tuple[int, ...], module: Any = None):
        self.slots = [buffer_from_example(example, leading_dims, shared=True) for _ in range(2)]
        self._plain: list = [None, None]  # the slots as plain views, made in each process (_views)
        self._pinned_on: Any = None  # the device pin() page-locked the slots for, in this process
        self._filled = [CTX.Semaphore(0) for _ in range(2)]
        self._free = [CTX.Semaphore(1) for _ in range(2)]
        self.params = None
        if module is not None:
            self.params = [SharedParameters(module) for _ in range(2)]
            for p in self.params:
                p.publish(module, version=0)

    def pin(self, device: Any) -> None:
        """Both slots page-locked for ``device``'s copies in this process (``shared.device.pin_host``); on a GPU,
        ``writer_release`` then waits for the copies up from the slot to be done before the reader may take it."""
        from shared.device import pin_host  # here, not at the top: most users of this module never pin

        for slot in self.slots:
            pin_host(slot, device)
        self._pinned_on = device

    def writer_acquire(self, k: int, check: Callable[[], None], module: Any = None) -> Any:
        """Wait until slot ``k % 2`` is free and return it for writing rollout ``k`` (loading its parameters
        into ``module`` if given), as plain views (``_views``)."""
        wait_for(lambda t: self._free[k % 2].acquire(timeout=t), check)
        if module is not None:
            self.params[k % 2].pull(module)
        return self._views(k)

    def _views(self, k: int) -> Any:
        """Slot ``k % 2`` as plain ndarray views of its shared arrays, made once in each process: each row a sampler
        views or writes in a SharedArray costs a Python call (its ``__array_finalize__``), a dozen a step. Plain views
        would pickle by value, a copy of their own: they never travel (``__getstate__``)."""
        if self._plain[k % 2] is None:
            self._plain[k % 2] = map_structure(lambda x: x.view(np.ndarray), self.slots[k % 2])
        return self._plain[k % 2]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_plain": [None, None], "_pinned_on": None}  # neither holds in another process

    def writer_release(self, k: int) -> None:
        device = self._pinned_on
        if device is not None and device.type == "cuda":  # no copy up from the slot is still reading it (one wait
            import torch  # a rollout; the sampler's reads of its actions at every step have waited for them already)

            torch.cuda.current_stream(device).synchronize()
        self._filled[k % 2].release()

    def reader_acquire(self, k: int, check: Callable[[], None]) -> Any:
        """Wait until rollout ``k`` is in slot ``k % 2`` and return it (valid until ``reader_release(k)``), as plain
        views (``_views``)."""
        wait_for(lambda t: self._filled[k % 2].acquire(timeout=t), check)
        return self._views(k)

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
            flat = torch.cat([t.detach().reshape(-1).float() for t in self._tensors(module)]).cpu().numpy()  # one copy
        with locked(self._lock, check):
            self.flat[:] = flat
            self._version[0] = version

    def pull(self, module: Any, check: Callable[[], None] | None = None) -> int:
        """Copy the latest published tensors into ``module``; returns their version (sampler side)."""
        import torch

        with locked(self._lock, check):
            flat = torch.from_numpy(np.array(self.flat))
            version = int(self._version[0])
        tensors = self._tensors(module)
        if [t.numel() for t in tensors] != self._sizes:  # another network than the learner's: never a partial copy
            raise ValueError(f"the module's tensors ({len(tensors)}) do not match the published ones ({len(self._sizes)})")
        # a module on a GPU (a sampler acting there): one copy up, not one per tensor
        flat = flat.to(tensors[0].device) if tensors else flat
        with torch.no_grad():
            for t, chunk in zip(tensors, torch.split(flat, self._sizes), strict=True):
                t.copy_(chunk.view_as(t))
        return version


@dataclass(frozen=True)
class ProcessStat:
    """What ``/proc/<pid>/stat`` says of one process: its state letter (``Z`` a zombie, ``X`` dead), parent and
    session."""

    pid: int
    state: str
    ppid: int
    sid: int

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


def process_stat(pid: int) -> ProcessStat | None:
    """``pid``'s stat, or None when there is no such process (it ended, or was reaped, before the read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces and ")"
    except (OSError, IndexError):
        return None
    return ProcessStat(pid, fields[0], int(fields[1]), int(fields[3]))


def process_table() -> dict[int, ProcessStat]:
    """Every process in ``/proc`` now, by pid: each one's stat read once; one that ends during the walk is left out."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := process_stat(int(entry))) is not None:
            table[stat.pid] = stat
    return table


def descendants(root: int, zombies: bool = False) -> list[int]:
    """The processes below ``root`` (not ``root`` itself), parents before their children, from one walk of
    ``/proc``; zombies only with ``zombies``. A snapshot: a process started after the walk, or re-parented away from
    the tree before it (its parent ended, so init or a subreaper adopted it), is not in it. A caller that ends a tree
    walks again until nothing is left; the child subreaper (``PR_SET_CHILD_SUBREAPER``) keeps orphans below it."""
    table = process_table()
    children: dict[int, list[ProcessStat]] = {}
    for stat in table.values():
        children.setdefault(stat.ppid, []).append(stat)
    out, todo = [], [root]
    while todo:
        for stat in children.get(todo.pop(0), ()):
            todo.append(stat.pid)
            if zombies or stat.alive:
                out.append(stat.pid)
    return out


def session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``: a child started in a session of its own, and everything
    it started, to check that nothing is left or to end what is."""
    return [stat.pid for stat in process_table().values() if stat.sid == sid and stat.alive]
