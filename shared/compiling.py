"""``--compile``: a script's acting step and update loss through ``torch.compile``; eager otherwise.

A script marks what it compiles with ``@compiled``. Such a function runs as written (eager: the reference)
until ``enable(device)`` is called, which ``Run.setup()`` does under ``--compile``; from then on, in this
process, each call goes through ``torch.compile(fn, fullgraph=True, dynamic=False)``.

Guarantees
- ``fullgraph``: a graph break is an error at the first call (torch's message names the line), never a silent
  fallback to eager pieces. ``dynamic=False``: a new shape, dtype or Python constant is a recompile, never a
  silently slower symbolic graph; the scripts keep their shapes static (the PPO family's minibatches are all of
  one size, the final rows in them weighted 0).
- The backward is compiled with the forward (AOTAutograd, not lazily at the first ``backward()``), so that
  ``report()`` counts every graph and the seconds spent compiling them: ``{"compiled_graphs": n, "compile_s":
  s}``. A count that grows after the first iterations is a recompile; with ``RL_COMPILE_STRICT=1`` (the tests)
  a recompile is an error.
- On CUDA the graphs are replayed as CUDA graphs (``mode="reduce-overhead"``: torch's own, no extra
  dependency). A CUDA graph's outputs live in memory its next replay overwrites, so every tensor a compiled
  function returns is cloned (a few tiny copies), and each call begins a new CUDA-graph step. The gradients the
  backward graph writes are not cloned: every script clears them (``zero_grad(set_to_none=True)``) before each
  backward and steps before the next compiled call; accumulating gradients over several calls would need a copy.
- ``RL_COMPILE_BACKEND`` picks torch's backend (default ``inductor``; ``aot_eager`` traces the same graphs,
  forward and backward, without generating code: how the tests check graph breaks and recompiles cheaply).
- Random draws inside a compiled function (a policy's sample, SAC's noise) come from inductor's own generator,
  seeded by torch's: a compiled run samples from the same distributions as an eager one, not the same numbers
  (``aot_eager`` draws eager's, and so does inductor with ``RL_COMPILE_EAGER_RANDOM=1``). Updates without random
  draws agree with eager within float rounding.
- A ``--sampler async`` sampler process never calls ``enable``: it acts eagerly, on the CPU.
- What stays outside a graph by design: the env step, host-device copies, the replay's gather, the call of
  ``loss.backward()`` (it runs the compiled backward graph), the gradient all-reduce under torchrun, gradient
  clipping and the optimiser step (a fused Adam is already one kernel; torch's optimisers break graphs on
  purpose, pytorch issue 104053), and the target networks' update (one in-place lerp per parameter tensor).
(torch is imported where it is used: ``shared.run`` imports this module without it.)
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["backend", "compiled", "disable", "enable", "enabled", "report"]

F = TypeVar("F", bound=Callable[..., Any])

_state: dict[str, Any] = {"device": None, "graphs": 0, "seconds": 0.0, "skips": 0}


def enable(device: Any) -> None:
    """From now on, in this process, every ``@compiled`` function is compiled for ``device``."""
    import torch
    import torch._dynamo.config
    import torch._dynamo.utils
    import torch._functorch.config
    import torch._inductor.config

    torch._functorch.config.force_non_lazy_backward_lowering = True  # the backward compiles with the forward
    strict = os.environ.get("RL_COMPILE_STRICT") == "1"
    torch._dynamo.config.error_on_recompile = strict
    # A CUDA graph inductor cannot capture (a mutated input, a CPU tensor, an unsafe op) is skipped with a log line
    # nobody sees by default and the kernels then run one launch at a time: counted in report(), an error if strict.
    torch._inductor.config.triton.cudagraph_or_error = strict
    # Lets a compiled function read an nn.LSTM's weights: shared.rnn.lstm_rows steps it (the fused kernel
    # fails to compile for some inputs, torch 2.13: shared/rnn.py).
    torch._dynamo.config.allow_rnn = True
    # RL_COMPILE_EAGER_RANDOM=1: inductor draws eager's random numbers (slower), so that a compiled run can be
    # compared with an eager one number for number (the slow tier's numerics test).
    torch._inductor.config.fallback_random = os.environ.get("RL_COMPILE_EAGER_RANDOM") == "1"
    skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]  # process-wide: counted from here on
    _state.update(device=torch.device(device), graphs=0, seconds=0.0, skips=skips)


def disable() -> None:
    """Back to eager (tests that run several scripts in one process)."""
    _state["device"] = None


def backend() -> str:
    return os.environ.get("RL_COMPILE_BACKEND", "inductor")


def enabled() -> bool:
    return _state["device"] is not None


def report() -> dict[str, float]:
    """The graphs compiled so far in this process and the seconds spent compiling them; on CUDA with inductor also
    the graphs it ran without a CUDA graph since ``enable`` (``cudagraph_skips``: 0 unless something keeps a graph
    from capture)."""
    out = {"compiled_graphs": _state["graphs"], "compile_s": round(_state["seconds"], 3)}
    if _state["device"] is not None and _state["device"].type == "cuda" and backend() == "inductor":
        import torch._dynamo.utils

        out["cudagraph_skips"] = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] - _state["skips"]
    return out


def compiled(fn: F) -> F:
    """``fn`` as written; under ``enable`` the same function through ``torch.compile`` (module docstring)."""
    import torch  # here, once: a script that marks a function has torch (the acting step calls it every step)

    cache: dict[Any, Callable] = {}

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        device = _state["device"]
        if device is None:
            return fn(*args, **kwargs)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        cuda_graphs = device.type == "cuda"
        if device not in cache:
            mode = "reduce-overhead" if cuda_graphs and backend() == "inductor" else None
            cache[device] = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend(), mode=mode)
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        start = time.perf_counter()
        out = cache[device](*args, **kwargs)
        new = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
        if new:  # this call compiled (the run time of one call is in the figure too: small beside compiling)
            _state["graphs"] += new
            _state["seconds"] += time.perf_counter() - start
        if cuda_graphs:
            out = torch.utils._pytree.tree_map_only(torch.Tensor, torch.clone, out)
        return out

    return call  # type: ignore[return-value]
