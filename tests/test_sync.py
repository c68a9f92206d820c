"""shared/sync.py and shared/signals.py: a Ctrl-C never leaves a shared lock held, and a wait on a busy lock
still ends on one. Each case runs in a child Python that signals itself (pytest's own handlers stay out)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.helpers import ROOT

PRELUDE = f"""
import multiprocessing as mp, os, random, signal, sys, threading, time
sys.path.insert(0, {str(ROOT)!r})
from shared import signals
from shared.sync import locked
signals.raise_on_signals()
lock = mp.get_context("spawn").Lock()
"""


def child(code: str, timeout: float = 120) -> str:
    # every path leaves signals raising again: no defer() left open
    code = PRELUDE + textwrap.dedent(code) + "\nassert signals._deferring['depth'] == 0, signals._deferring\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_signal_at_any_moment_of_a_locked_loop_never_leaves_the_lock_held():
    # SIGINT lands at a random point of a tight loop of ``with locked(...)``. Before the fix, about 2 % of
    # these left the lock held by this very process (the next acquire, the exit checkpoint's, hung): with 600
    # tries, the old code fails this test with certainty for practical purposes (measured: 24 in 1000).
    out = child("""
        leaks = interrupted = 0
        for _ in range(600):
            timer = threading.Timer(0.001 + random.uniform(0, 0.002), os.kill, (os.getpid(), signal.SIGINT))
            try:
                timer.start()
                while True:
                    with locked(lock, lambda: None):
                        pass
            except KeyboardInterrupt:
                interrupted += 1
            timer.join()
            if lock.acquire(timeout=0.05):
                lock.release()
            else:
                leaks += 1
                lock.release()
        print(interrupted, leaks)
    """)
    assert out == "600 0"


def test_a_signal_while_the_lock_is_held_raises_once_it_is_released():
    out = child("""
        try:
            with locked(lock, lambda: None):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.1)  # the signal has come; it must wait for the release
                print("body finished")
        except KeyboardInterrupt:
            print("raised", lock.acquire(timeout=0))
    """)
    assert out.splitlines() == ["body finished", "raised True"]


def test_a_wait_on_a_lock_another_process_holds_ends_on_ctrl_c():
    out = child("""
        def hold(lock, ready):
            lock.acquire()
            ready.set()
            time.sleep(60)
        ctx = mp.get_context("fork")  # a function of ``python -c`` cannot be spawned
        ready = ctx.Event()
        holder = ctx.Process(target=hold, args=(lock, ready), daemon=True)
        holder.start()
        assert ready.wait(30)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        t = time.time()
        try:
            with locked(lock, lambda: None):
                print("acquired")
        except KeyboardInterrupt:
            print("interrupted", time.time() - t < 0.3 + 1.5)  # 0.3 s timer, 0.2 s slices: slack for load
        holder.kill()
    """)
    assert out == "interrupted True"


def test_a_lock_that_fails_to_acquire_or_a_failing_check_leaves_signals_raising():
    out = child("""
        class Broken:
            def acquire(self, timeout):
                raise OSError("semaphore gone")
        try:
            with locked(Broken()):
                pass
        except OSError:
            print("acquire failed")
        def gone():
            raise RuntimeError("peer gone")
        lock.acquire()  # busy: the wait calls check, which raises
        try:
            with locked(lock, gone):
                pass
        except RuntimeError:
            print("check raised")
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
            print("signal lost")
        except KeyboardInterrupt:
            print("signal raised")
    """)
    assert out.splitlines() == ["acquire failed", "check raised", "signal raised"]
