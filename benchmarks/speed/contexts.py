"""Whether a learner on the same GPU slows a small acting step, and whether it matters that the learner is another
process (a CUDA context of its own, as the async sampler's learner is) or a thread of the acting process (one
context, another stream, and the GIL shared).

The acting step is ppo_atari's network (its own ``Agent``, imported) over 8 Breakout observations ``[8, 4, 84, 84]``
(uint8, copied up from pinned memory), the greedy actions copied back and waited for; on CUDA its device part is one
CUDA graph. The learner is the same network's forward, backward and Adam step over a batch of 256 (ppo_atari's
minibatch), in one of two duties:

- busy: update after update, each launched while the one before runs (the GPU never idle: the worst case);
- ``duty``: 16 updates queued back to back (ppo_atari's 4 epochs of 4 minibatches), waited for, then idle for
  ``REST_S`` (a rollout of 1,024 steps at the first race's async 2,381 SPS): the async learner's own rhythm.

Each figure is the **mean** of the acting steps' wall times over ``seconds``, in microseconds (a throughput is what
the race compares; a line before it gives the median, 90th and 99th percentiles, the steps and the learner's
updates a second):

- ``alone``: nothing else on the device;
- ``process``: the busy learner in a child process;
- ``thread``: the busy learner in a thread of this process, on a stream of its own;
- ``duty``: the learner at its duty in a child process.

Reading them (docs/gpu.md): ``process`` well above ``thread`` says that two contexts take turns on the GPU (time
slices; no MPS), at full load an upper bound on what that costs a step; ``duty`` less ``alone``, times a rollout's
128 acting steps (8 envs), is what it costs an async rollout, to set beside the 99 ms a rollout that async lost to
parallel in the first race (8 / 2,381.4 - 8 / 3,093.7 s a step). A figure of this file, not a training run's.

    python benchmarks/speed/contexts.py --device cuda [--seconds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODES = ("alone", "process", "thread", "duty")
LEARNER_BATCH = 256  # the learner's minibatch: ppo_atari's (8 envs x 128 steps / 4 minibatches)
DUTY_UPDATES = 16  # ppo_atari's updates a rollout: 4 epochs of 4 minibatches
REST_S = 0.43  # a rollout of 8 x 128 steps at the first race's async 2,381 SPS


def network(device) -> Any:
    """ppo_atari's own Agent for Breakout's stacked frames and 4 actions (torch and the script imported here, so that
    the race's planner reads ``MODES`` without them)."""
    if str(ROOT / "algos") not in sys.path:
        sys.path.insert(0, str(ROOT / "algos"))
    import ppo_atari

    return ppo_atari.Agent((4, 84, 84), 4).to(device)


def learn(device, duty: bool = False, batch: int = LEARNER_BATCH, stop=None, ready=None, said=None) -> int:
    """The learner: updates until ``stop`` is set (a child process: until it is ended), busy or at its ``duty``;
    returns how many ran. ``ready`` (an Event) is set once the first update is launched; ``said`` (a child process's
    stdout) gets ``ready``, then about four times a second the updates so far and the seconds since the first."""
    import torch

    torch.manual_seed(1)
    net = network(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=2.5e-4, eps=1e-5)
    x = torch.randint(0, 255, (batch, 4, 84, 84), dtype=torch.uint8, device=device)
    cuda = device.type == "cuda"
    stream = torch.cuda.Stream(device) if cuda else None
    if cuda:
        stream.wait_stream(torch.cuda.current_stream(device))  # x, made on the default stream, before its first read
    events = [torch.cuda.Event(), torch.cuda.Event()] if cuda else []  # busy: in turns, this update's and the last's
    updates, first, told = 0, 0.0, time.monotonic()

    def update() -> None:
        with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
            logits, value = net(x)
            loss = logits.square().mean() + value.square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    while stop is None or not stop.is_set():
        if duty:  # a rollout's updates queued back to back, waited for, then the rollout's time idle
            for _ in range(DUTY_UPDATES):
                update()
            if cuda:
                stream.synchronize()
            updates += DUTY_UPDATES
        else:  # busy: the next update launched while this one runs, so that the GPU never waits for the host
            update()
            if cuda:
                events[updates % 2].record(stream)
                if updates:
                    events[(updates - 1) % 2].synchronize()  # the one before: one update queued behind the running one
            updates += 1
        if updates <= (DUTY_UPDATES if duty else 1):
            first = told = time.monotonic()
            if ready is not None:
                ready.set()
            if said is not None:
                print("ready", file=said, flush=True)
        if said is not None and time.monotonic() - told > 0.25:
            told = time.monotonic()
            print(f"updates {updates} {told - first:.3f}", file=said, flush=True)  # since the first update
        if duty:
            time.sleep(REST_S)
    return updates


def acting_us(mode: str, device: str = "cuda", seconds: float = 5.0, batch: int = LEARNER_BATCH) -> float:
    """The mean wall time of one acting step, µs, over ``seconds``, with the learner of ``mode`` (module docstring) on
    the same device meanwhile; a line of the steps' percentiles and the learner's updates a second goes to stderr
    first. A learner that ends before the figure is done is an error, not a figure."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    import torch

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    net = network(dev).eval()
    host_obs = torch.randint(0, 255, (8, 4, 84, 84), dtype=torch.uint8, pin_memory=cuda)
    static = torch.zeros(host_obs.shape, dtype=torch.uint8, device=dev)
    host_actions = torch.zeros(8, dtype=torch.int64, pin_memory=cuda)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return net(static)[0].argmax(1)  # the logits' greedy actions (the net scales the uint8 frames)

    if cuda:  # the device part as one graph, as --compile's acting step
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(3):
                forward()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            actions = forward()

    def act() -> None:
        static.copy_(host_obs, non_blocking=cuda)
        if cuda:
            graph.replay()
            host_actions.copy_(actions)  # the one wait
        else:
            host_actions.copy_(forward())

    child, thread, stop, ready, failed, done = None, None, threading.Event(), threading.Event(), [], []

    def learner_thread() -> None:
        try:
            done.append(learn(dev, False, batch, stop, ready))
        except BaseException as e:  # said by the acting thread, which then refuses its figure
            failed.append(e)
            ready.set()

    def learner_gone() -> str:
        if child is not None and child.poll() is not None:
            return f"the learner process ended (exit code {child.returncode})"
        if thread is not None and (failed or not thread.is_alive()):
            return f"the learner thread ended: {failed[0]!r}" if failed else "the learner thread ended"
        return ""

    learning_from = time.monotonic()
    try:
        if mode in ("process", "duty"):
            call = f"learn(torch.device({device!r}), {mode == 'duty'}, {batch}, said=sys.stdout)"
            code = f"import sys, torch; from benchmarks.speed import contexts as c; c.{call}"
            child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the learner process made no update: {learner_gone() or 'it said something else'}")
        elif mode == "thread":
            thread = threading.Thread(target=learner_thread, name="contexts-learner", daemon=True)
            thread.start()
            while not ready.wait(1.0):
                if learner_gone():
                    break
            if learner_gone():
                raise RuntimeError(learner_gone())
        learning_from = time.monotonic()
        for _ in range(20):  # warm: the first steps beside a fresh learner
            act()
        times, end = [], time.monotonic() + seconds
        while time.monotonic() < end or len(times) < 5:  # five at least: a loaded machine's steps still give quantiles
            t = time.perf_counter()
            act()
            times.append(time.perf_counter() - t)
        if learner_gone():  # the figure would be the step alone's, under another name
            raise RuntimeError(learner_gone() + " before the figure was done")
    finally:
        stop.set()
        said = ""
        if child is not None:
            child.terminate()
            try:
                said = child.communicate(timeout=30)[0]
            except subprocess.TimeoutExpired:
                child.kill()
                said = child.communicate()[0]
        if thread is not None:
            thread.join(120)
    if child is not None:  # its last count, a quarter of a second or less before the end
        counts = [line.split()[1:] for line in said.splitlines() if line.startswith("updates ")]
        rate = int(counts[-1][0]) / float(counts[-1][1]) if counts and float(counts[-1][1]) > 0 else float("nan")
    else:
        rate = done[0] / (time.monotonic() - learning_from) if done else None
    q = statistics.quantiles([t * 1e6 for t in times], n=100)
    mean = statistics.fmean(times) * 1e6
    print(
        f"{mode}: {len(times)} steps, median {q[49]:.1f} us, p90 {q[89]:.1f}, p99 {q[98]:.1f}, mean {mean:.1f}; "
        f"learner {'none' if rate is None else f'{rate:.1f} updates/s'}",
        file=sys.stderr,
        flush=True,
    )
    return mean


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seconds", type=float, default=5.0, help="acting steps timed in each mode (default 5)")
    a = p.parse_args()
    print(f"acting step, ppo_atari's network over 8 observations, on {a.device}: mean us")
    for mode in MODES:
        print(f"{mode:<8} {acting_us(mode, a.device, a.seconds):9.1f}", flush=True)


if __name__ == "__main__":
    main()
