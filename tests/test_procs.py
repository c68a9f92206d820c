"""shared/procs.py: the double buffer's alternation and its per-slot parameters, shared parameters, worker
errors reaching the parent, and shutdown."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.namedarraytuple import namedarraytuple
from shared.procs import DoubleBuffer, SharedParameters, Worker, WorkerError, parent_alive_check
from tests.helpers import ROOT

Item = namedarraytuple("Item", ["k", "weight"])


def _writer(buffers, n, parent_pid, stop):
    check = parent_alive_check(stop, parent_pid)
    module = torch.nn.Linear(2, 1, bias=False)
    for k in range(n):
        slot = buffers.writer_acquire(k, check, module=module)
        slot.k[:] = k
        slot.weight[:] = module.weight.detach().numpy().ravel()[0]  # the parameters this slot came with
        buffers.writer_release(k)


def test_double_buffer_alternates_and_hands_each_rollout_the_previous_update():
    module = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(0.0)
    buffers = DoubleBuffer(Item(np.int64(0), np.float32(0)), (3,), module=module)
    views = buffers._views(0), buffers._views(1)  # made before the writer starts: they must not travel (by value)
    n = 12
    worker = Worker(_writer, (buffers, n, os.getpid()), name="writer")
    try:
        for k in range(n):
            slot = buffers.reader_acquire(k, worker.check)
            assert slot is views[k % 2] and type(slot.k) is np.ndarray  # plain views: rows cost no Python call
            assert (slot.k == k).all()  # in order, never a half-written or skipped slot
            # Rollouts 0 and 1 used the initial parameters; rollout k >= 2 those of update k - 1, left in the
            # slot when the reader released rollout k - 2.
            assert slot.weight[0] == float(max(k - 1, 0))
            time.sleep(0.01)
            with torch.no_grad():
                module.weight.fill_(float(k + 1))  # "update k + 1"
            buffers.reader_release(k, module=module, version=k + 1)
    finally:
        worker.stop()


def _puller(params, q, stop):
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    version = params.pull(module)
    q.put((version, module[0].weight.detach().numpy().copy(), module[1].running_mean.numpy().copy()))


def test_shared_parameters_cross_processes_with_their_version():
    from shared.procs import CTX

    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    with torch.no_grad():
        module[1].running_mean.fill_(2.5)
    params = SharedParameters(module)
    params.publish(module, version=7)
    q = CTX.Queue()
    worker = Worker(_puller, (params, q), name="puller")
    try:
        version, w, rm = q.get(timeout=60)
    finally:
        worker.stop()
    assert version == 7 and params.version == 7
    np.testing.assert_array_equal(w, module[0].weight.detach().numpy())
    np.testing.assert_array_equal(rm, np.full(4, 2.5, np.float32))


def _fails(stop):
    raise ValueError("boom in the child")


def _hangs(stop):
    while True:
        time.sleep(0.05)


def test_worker_error_reaches_the_parent_with_its_traceback():
    worker = Worker(_fails, (), name="sampler")
    try:
        deadline = time.time() + 30
        with pytest.raises(WorkerError, match="boom in the child"):
            while time.time() < deadline:
                worker.check()
                time.sleep(0.05)
    finally:
        worker.stop()


def test_stop_ends_a_worker_that_ignores_the_stop_event():
    worker = Worker(_hangs, (), name="stubborn")
    pid = worker.pid
    worker.stop(timeout=0.5)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_waiting_reader_notices_a_killed_writer():
    buffers = DoubleBuffer(Item(np.int64(0), np.float32(0)), (2,))
    worker = Worker(_hangs, (), name="writer")
    os.kill(worker.pid, 9)
    try:
        with pytest.raises(WorkerError, match="exited unexpectedly"):
            buffers.reader_acquire(0, worker.check)
    finally:
        worker.stop()


def _holds_the_lock(buffer, ready, stop):
    buffer._lock.acquire()  # as if killed in the middle of an append
    ready.set()
    while True:
        time.sleep(0.05)


def test_a_peer_killed_while_holding_the_replay_lock_raises_instead_of_hanging():
    from shared.procs import CTX
    from shared.replay import ReplayBuffer

    Row = namedarraytuple("Row", ["observation", "action", "reward", "terminated"])
    buffer = ReplayBuffer(Row(np.zeros(2, np.float32), np.int64(0), np.float32(0), False), 64, 2, shared=True)
    buffer.append(
        Row(np.zeros((8, 2, 2), np.float32), np.zeros((8, 2), np.int64), np.zeros((8, 2), np.float32), np.zeros((8, 2), bool))
    )
    ready = CTX.Event()
    worker = Worker(_holds_the_lock, (buffer, ready), name="sampler")
    try:
        assert ready.wait(60)
        os.kill(worker.pid, 9)
        buffer.watch(worker.check)
        with pytest.raises(WorkerError, match="exited unexpectedly"):
            buffer.sample(4)
    finally:
        worker.stop()


def test_sampler_ahead_always_lets_the_sampler_produce_the_next_updates_data():
    from shared.pacing import sampler_ahead

    # One update per 5,120 env steps (R2D1's defaults), lag bound 2,000, learning from step 10,000, no update yet:
    # the learner needs step 15,120 for its first update, so the sampler may go to 17,120 before it waits.
    kw = dict(start_step=0, start_updates=0, min_steps_learn=10_000, updates_per_step=1 / 5120, max_lag_steps=2000)
    assert not sampler_ahead(17_120, version=0, **kw) and sampler_ahead(17_121, version=0, **kw)
    assert not sampler_ahead(17_120 + 5120, version=1, **kw)  # one more update covers 5,120 more steps
    assert not sampler_ahead(17_120 + 640, version=0, chunk_steps=640, **kw)
    assert not sampler_ahead(10**9, version=0, **{**kw, "max_lag_steps": 0})  # 0: never waits


@settings(max_examples=200, deadline=None)
@given(
    ups=st.floats(0.001, 8.0),
    min_steps=st.integers(0, 500),
    start=st.integers(0, 10_000),
    start_updates=st.integers(0, 1000),
    envs=st.integers(1, 16),
    chunk=st.integers(0, 64),
    lag=st.integers(1, 5000),
    steps=st.lists(st.integers(1, 40), min_size=1, max_size=60),
)
def test_pacer_keeps_the_replay_ratio_and_never_deadlocks_the_sampler(
    ups, min_steps, start, start_updates, envs, chunk, lag, steps
):
    from shared.pacing import ReplayPacer

    pacer = ReplayPacer(ups, min_steps, start, start_updates)
    sampled, updates = start, start_updates
    for k in steps:
        sampled += k * envs
        updates += pacer.due(sampled, updates)
        # The simple reference: updates_per_step for every env step past min_steps_learn, since the start.
        learned = sampled - start - min_steps
        assert updates == start_updates + (int(learned * ups) if learned > 0 else 0)
        assert pacer.due(sampled, updates) == 0
        # The learner has done all it may: the sampler must be allowed to produce the next update's data.
        assert not pacer.sampler_ahead(sampled, updates, lag, chunk * envs)


def test_async_replay_poll_publishes_every_n_updates_and_whenever_no_update_is_due():
    import torch

    from shared.pacing import AsyncReplay, ReplayPacer

    class Alive:
        def check(self, allow_finished=False):
            pass

    module = torch.nn.Linear(2, 2)
    link = AsyncReplay(module, ReplayPacer(1.0, 0, 0, 5), num_envs=1)  # one update per step, from 5 updates
    buffer = _Buffer()
    buffer.watch = lambda check: None
    link.attach(Alive(), buffer)
    assert link.params.version == 5
    buffer.cursor = 20  # the sampler appended 20 rows: 20 updates due in all
    for updates in range(6, 15):  # learning, fewer than PUBLISH_EVERY updates since the last publish
        assert link.poll(_FakeRun(), module, updates) == 20
    assert link.params.version == 5 and link.wait_s == 0.0
    link.poll(_FakeRun(), module, 15)
    assert link.params.version == 15
    with torch.no_grad():
        module.weight.fill_(3.0)
    link.poll(_FakeRun(), module, 25)  # all 20 done, none due: publish what it has, then sleep
    assert link.params.version == 25 and link.wait_s > 0
    copy = torch.nn.Linear(2, 2)
    link.pull(copy)
    assert torch.equal(copy.weight, module.weight)
    waited = link.wait_s
    link.poll(_FakeRun(), module, 25)  # nothing new: no publish, one more wait
    assert link.params.version == 25 and link.wait_s > waited
    assert set(link.waits()) == {"wait_s", "sampler_wait_s"}


class _FakeRun:
    world = 2

    def __init__(self):
        self.recorded = []

    def episodes(self, episodes, step):
        self.recorded += [(ret, length, step) for ret, length in episodes]


class _Buffer:
    def __init__(self, cursor=0):
        self.cursor, self.appended = cursor, []

    def append(self, samples, priorities=None):
        self.appended.append((samples, priorities))
        self.cursor += len(priorities) if priorities is not None else 1


def _report_sampler(q, proc):
    from shared import compiling

    q.put((sorted(os.sched_getaffinity(0)), proc.n_threads, proc.device, compiling.enabled()))
    while True:  # until the parent stops it: check() ends the process
        proc.check()
        time.sleep(0.01)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs os.sched_getaffinity")
@pytest.mark.parametrize("compile", [False, True])
def test_sampler_entry_pins_the_process_then_hands_it_its_threads_and_its_stop_check(compile):
    from shared.affinity import make_affinity
    from shared.procs import CTX, sampler_entry

    cpus = tuple(sorted(os.sched_getaffinity(0)))
    affinity = make_affinity("async", cpus=cpus, pin=True)
    q = CTX.Queue()
    worker = Worker(sampler_entry, (_report_sampler, (q,), affinity, os.getpid(), "cpu", compile), name="sampler")
    try:
        pinned, n_threads, device, compiling = q.get(timeout=60)
        assert pinned == list(affinity.worker_cpus[0])  # pinned before the script's code ran
        assert n_threads == len(affinity.worker_cpus[0]) and device == "cpu"
        assert compiling is compile  # --compile on a GPU: the sampler's acting step graphed in its own process
    finally:
        t0 = time.monotonic()
        worker.stop(timeout=10)
        assert time.monotonic() - t0 < 5  # proc.check() ended it when asked, not the kill after the timeout


SLOW_MAIN = """import os, sys, time
sys.path.insert(0, {root!r})
if __name__ != "__main__":  # the spawned child, importing this script as its main module: a slow import
    open({mark!r}, "w").write(str(os.getpid()))
    time.sleep(2)

from shared.procs import Worker


def work(path, stop):
    open(path, "w").write("done")


if __name__ == "__main__":
    worker = Worker(work, ({done!r},), name="slow starter")
    worker.join(30)
    worker.check(allow_finished=True)
    worker.stop()
"""


def test_a_ctrl_c_while_a_worker_imports_the_script_is_ignored_there_without_a_traceback(tmp_path):
    """A spawned worker imports the script before it runs a line of ours (seconds for torch): Ctrl-C reaches the
    whole process group meanwhile. The worker must ignore it as it does later (its parent stops it), not print a
    KeyboardInterrupt traceback from the middle of an import and die."""
    mark, done = tmp_path / "importing", tmp_path / "done"
    script = tmp_path / "slow_main.py"
    script.write_text(SLOW_MAIN.format(root=str(ROOT), mark=str(mark), done=str(done)))
    proc = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not mark.exists() or not mark.read_text():
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() else "no start"
            time.sleep(0.02)
        os.kill(int(mark.read_text()), signal.SIGINT)  # the worker's share of a Ctrl-C, mid-import
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert done.read_text() == "done"


INTERRUPTED_START = """import os, signal, sys, threading, time
sys.path.insert(0, {root!r})
from shared import procs, signals


def wait(stop):
    stop.wait()


start = procs.CTX.Process.start


def start_then_ctrl_c(self):  # a Ctrl-C that comes while the child starts (kept by the mask until start returns)
    start(self)
    open({pid_file!r}, "w").write(str(self.pid))
    # To this thread: one sent to the process may go to another thread (torch's), and Python would then raise
    # it at some later check, after Worker(...) has returned or inside a finalizer (test_run covers that case).
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


if __name__ == "__main__":
    signals.raise_on_signals()
    procs.CTX.Process.start = start_then_ctrl_c
    try:
        procs.Worker(wait, (), name="never handed over")
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    time.sleep(3)  # the script goes on (a run writes its checkpoint): a child left over would be running by now
"""


def test_a_ctrl_c_while_a_worker_starts_ends_that_worker_too(tmp_path):
    """The interrupted ``Worker(...)`` never reaches its caller, who could not stop it: it must not outlive the
    call. Left alone it either fails to start once its stop event is collected (a traceback of its own) or, if it
    got that far, ignores SIGINT and waits for a stop that never comes (and Python's exit waits for it)."""
    pid_file, script = tmp_path / "child", tmp_path / "interrupted_start.py"
    script.write_text(INTERRUPTED_START.format(root=str(ROOT), pid_file=str(pid_file)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=30)  # a worker left running: Python's exit waits for it
    finally:
        proc.kill()
        if pid_file.exists():
            with contextlib.suppress(OSError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert proc.returncode == 0 and out.strip() == "interrupted" and "Traceback" not in err, err[-3000:]
    assert not os.path.exists(f"/proc/{pid_file.read_text()}")


SLOW_GYM_MAIN = """import multiprocessing, os, sys, time
sys.path.insert(0, {root!r})
if __name__ != "__main__":  # a spawned gymnasium worker, importing this script as its main module: a slow import
    open(os.path.join({marks!r}, str(os.getpid())), "w").write("importing")
    time.sleep(2)

import gymnasium as gym

from shared import envs, signals


def cartpole():
    return gym.make("CartPole-v1")


if __name__ == "__main__":
    signals.raise_on_signals()
    try:
        envs.vector_env([cartpole, cartpole], "parallel")
    except KeyboardInterrupt:
        print("interrupted", len(multiprocessing.active_children()), flush=True)
"""


def test_a_ctrl_c_while_gymnasiums_workers_import_the_script_closes_them_without_a_traceback(tmp_path):
    """``--sampler parallel``'s gymnasium workers import the script too, before any line of gymnasium runs there.
    A Ctrl-C to the process group meanwhile must not print their tracebacks from inside that import, and the
    half-started vector env must be closed before the interrupt reaches the caller, who never gets it to close."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "slow_gym_main.py"
    script.write_text(SLOW_GYM_MAIN.format(root=str(ROOT), marks=str(marks)))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.time() + 60
        while len(list(marks.iterdir())) < 2:
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() else "no start"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: every process of the group, both workers mid-import
        out, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert out.split() == ["interrupted", "0"]  # raised once its workers were closed and joined


def test_closing_a_parallel_env_interrupted_mid_step_says_nothing_and_ends_its_workers(recwarn):
    """Ctrl-C during ``--sampler parallel``'s step leaves the vector env waiting for replies: closing it then is
    the expected way out, not a warning for the user (gymnasium's is "Calling `close` while waiting ...")."""
    import functools

    import gymnasium as gym
    import numpy as np

    from shared.envs import close_envs, vector_env

    envs = vector_env([functools.partial(gym.make, "CartPole-v1")] * 2, "parallel")
    envs.reset(seed=0)
    envs.step_async(np.zeros(2, np.int64))  # as if interrupted before step_wait
    close_envs(envs)
    assert [str(w.message) for w in recwarn] == []
    assert not any(p.is_alive() for p in envs.processes)


def test_a_sampler_acting_on_a_gpu_makes_it_its_current_device(monkeypatch):
    """A sampler process handed the learner's GPU makes it current before the script runs: events, streams and pinned
    memory that name no device then mean that GPU (under torchrun, rank r's GPU r, not GPU 0); and it sets what the
    learner sets there (TF32, cuDNN's benchmark: shared.precision.gpu_defaults)."""
    from shared import precision
    from shared.procs import sampler_entry

    made_current, seen = [], []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    monkeypatch.setattr(precision, "gpu_defaults", lambda: made_current.append("defaults"))
    affinity = type("Affinity", (), {"apply_worker": lambda self, i: None, "worker_cpus": ((0,),)})()
    gpu = torch.device("cuda", 3)
    sampler_entry(lambda proc: seen.append((list(made_current), proc.device)), (), affinity, os.getpid(), gpu, False, None)
    assert seen == [([gpu, "defaults"], gpu)]
    made_current.clear()
    sampler_entry(lambda proc: seen.append(proc.device), (), affinity, os.getpid(), torch.device("cpu"), False, None)
    assert made_current == [] and seen[-1] == torch.device("cpu")


def test_a_sampler_page_locks_the_rollouts_it_writes_for_its_device(monkeypatch):
    """A sampler process page-locks both slots of the double buffer it is handed, for the device it acts on (on a
    GPU each step's copy up then goes from the rollout's row: shared.device.upload), before the script runs; other
    arguments are left alone."""
    from shared import device as device_mod
    from shared import precision
    from shared.procs import DoubleBuffer, sampler_entry

    locked = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(precision, "gpu_defaults", lambda: None)
    monkeypatch.setattr(device_mod, "pin_host", lambda structure, device: locked.append((structure, device)))
    affinity = type("Affinity", (), {"apply_worker": lambda self, i: None, "worker_cpus": ((0,),)})()
    buffers = DoubleBuffer({"obs": np.zeros(3, np.uint8)}, (4, 2))
    gpu, seen = torch.device("cuda", 0), []
    target = lambda *a: seen.append(list(locked))
    sampler_entry(target, ("args", buffers, [np.zeros(2)]), affinity, os.getpid(), gpu, False, None)
    assert seen == [[(buffers.slots[0], gpu), (buffers.slots[1], gpu)]]
    # a slot goes to the reader only once the copies up from it are done: one wait on the stream a rollout
    waited = []
    stream = type("Stream", (), {"synchronize": lambda self: waited.append("synchronize")})()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: waited.append(device) or stream)
    buffers.writer_release(0)
    assert waited == [gpu, "synchronize"]
    unpinned = DoubleBuffer({"obs": np.zeros(3, np.uint8)}, (4, 2))
    unpinned.writer_release(0)
    assert waited == [gpu, "synchronize"]


@pytest.mark.parametrize("cut", ["a worker killed", "a reply read in half"])
def test_closing_a_parallel_env_whose_pipe_no_longer_parses_ends_its_workers_without_raising(cut):
    """Ctrl-C can land inside the read of a worker's reply (its 4-byte header read, its body not: CI saw it in
    td3_mujoco), and a worker can die mid-step. Closing must still end every worker and raise nothing of its own, so
    the run exits with the KeyboardInterrupt's 130, not the pipe's EOFError."""
    import functools

    import gymnasium as gym
    import numpy as np

    from shared.envs import close_envs, vector_env

    envs = vector_env([functools.partial(gym.make, "CartPole-v1")] * 2, "parallel")
    envs.reset(seed=0)
    envs.step_async(np.zeros(2, np.int64))
    if cut == "a worker killed":
        os.kill(envs.processes[0].pid, signal.SIGKILL)
        envs.processes[0].join()
    else:
        envs.parent_pipes[0]._recv(4)  # the header of worker 0's reply, as the interrupted recv left it
    close_envs(envs, timeout=2)
    assert envs.closed and not any(p.is_alive() for p in envs.processes)
