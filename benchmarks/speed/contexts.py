"""Whether a learner busy on the same GPU slows a small acting step, and whether it matters that the learner is
another process (a CUDA context of its own, as the async sampler's learner is) or a thread of the acting process
(one context, another stream).

The acting step is ppo_atari's: a Nature-CNN forward pass over 8 Breakout observations ``[8, 4, 84, 84]`` (uint8,
copied up from pinned memory), the greedy actions copied back and waited for; on CUDA its device part is one CUDA
graph. The busy learner is the same network's forward, backward and Adam step over a batch of 256, over and over, each
waited for (one update in flight, as a learner that reads nothing back between its updates keeps about one queued).
Each figure is the median of the acting steps' wall times over ``seconds``, in microseconds:

- ``alone``: nothing else on the device;
- ``process``: the learner in a child process;
- ``thread``: the learner in a thread of this process, on a stream of its own.

Where ``process`` is well above ``thread``, the two contexts take turns on the GPU (time slices; no MPS) and an async
sampler acting in a process of its own pays that at every step: one reading of the first race's async at 0.77x
parallel (docs/gpu.md). A figure of this file, not a training run's.

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

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
MODES = ("alone", "process", "thread")
LEARNER_BATCH = 256  # the busy learner's minibatch: ppo_atari's (8 envs x 128 steps / 4 minibatches)


def network(device: torch.device) -> nn.Module:
    """ppo_atari's Nature CNN torso with 4 logits: what one acting step runs."""
    return nn.Sequential(
        nn.Conv2d(4, 32, 8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(3136, 512),
        nn.ReLU(),
        nn.Linear(512, 4),
    ).to(device)


def learn(device: torch.device, stop: threading.Event | None = None, seconds: float = 3600.0, ready=None) -> int:
    """The busy learner: updates until ``stop`` is set or ``seconds`` pass, each waited for; returns how many ran.
    ``ready`` (an Event, or None for a child process, which prints a line) is set once the first update is done."""
    torch.manual_seed(1)
    net = network(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=2.5e-4)
    x = torch.rand(LEARNER_BATCH, 4, 84, 84, device=device)
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    updates, end = 0, time.monotonic() + seconds
    while time.monotonic() < end and not (stop is not None and stop.is_set()):
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            loss = net(x).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if stream is not None:
            stream.synchronize()
        updates += 1
        if updates == 1:
            if ready is not None:
                ready.set()
            else:
                print("ready", flush=True)
    return updates


def acting_us(mode: str, device: str = "cuda", seconds: float = 5.0) -> float:
    """The median wall time of one acting step, µs, over ``seconds``, with the learner ``mode`` (module docstring)
    busy on the same device meanwhile."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    net = network(dev).eval()
    host_obs = torch.randint(0, 255, (8, 4, 84, 84), dtype=torch.uint8, pin_memory=cuda)
    static = torch.zeros(host_obs.shape, dtype=torch.uint8, device=dev)
    host_actions = torch.zeros(8, dtype=torch.int64, pin_memory=cuda)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return net(static.float() / 255.0).argmax(1)

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

    helper, stop, ready = None, threading.Event(), threading.Event()
    if mode == "process":
        code = f"from benchmarks.speed import contexts as c; import torch; c.learn(torch.device({device!r}))"
        helper = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        if helper.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the learner process ended before its first update (exit code {helper.wait()})")
    elif mode == "thread":
        helper = threading.Thread(target=learn, args=(dev, stop, 3600.0, ready), daemon=True)
        helper.start()
        if not ready.wait(600):
            raise RuntimeError("the learner thread made no update within 600 s")
    try:
        for _ in range(20):  # warm: the first steps beside a fresh learner
            act()
        times, end = [], time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            act()
            times.append(time.perf_counter() - t)
    finally:
        stop.set()
        if isinstance(helper, subprocess.Popen):
            helper.terminate()
            helper.wait(30)
        elif helper is not None:
            helper.join(60)
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seconds", type=float, default=5.0, help="acting steps timed in each mode (default 5)")
    a = p.parse_args()
    print(f"acting step, ppo_atari's network over 8 observations, on {a.device}: median µs")
    for mode in MODES:
        print(f"{mode:<8} {acting_us(mode, a.device, a.seconds):9.1f}", flush=True)


if __name__ == "__main__":
    main()
