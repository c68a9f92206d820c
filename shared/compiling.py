"""``--compile``: a script's losses through ``torch.compile``, and each update and acting step one CUDA graph on a GPU.

A script marks a loss or a forward pass ``@compiled`` and a whole update or acting step ``@graphed``. Both run as
written (eager: the reference) until ``enable(device)`` is called, which ``Run.setup()`` does under ``--compile``.

``@compiled`` (from ``enable`` on, in this process)
- Each call goes through ``torch.compile(fn, fullgraph=True, dynamic=False)``: a graph break is an error at the
  first call (torch's message names the line), never a silent fallback to eager pieces; a new shape, dtype or
  Python constant is a recompile, never a silently slower symbolic graph (the scripts keep their shapes static:
  the PPO family's minibatches are all of one size, the final rows in them weighted 0).
- The backward is compiled with the forward (AOTAutograd, not lazily at the first ``backward()``), so that
  ``report()`` counts every graph and the seconds spent compiling them: ``{"compiled_graphs": n, "compile_s":
  s}``. A count that grows after the first iterations is a recompile; with ``RL_COMPILE_STRICT=1`` (the tests)
  a recompile is an error. ``RL_COMPILE_BACKEND`` picks torch's backend (default ``inductor``; ``aot_eager``
  traces the same graphs without generating code: how the tests check graph breaks and recompiles cheaply).
  The first call of each function prints one line (rank 0) saying that it compiles: the wait is announced.
- No CUDA graphs of its own (inductor's default mode): on a GPU the ``@graphed`` call around it captures its
  kernels with everything else.

``@graphed`` (from ``enable`` on, in this process): one call is one CUDA graph replay
- The call's tensor arguments (inside dicts, lists, tuples and namedarraytuples too) are its data: each call copies
  them into the graph's static inputs, which were allocated at its first call, one copy per tensor, and none for a
  tensor that is the one copied last time and unchanged since (same object, same version: the PPO family's rollout,
  copied once for all its minibatches). A tensor that requires grad (a parameter, SAC's log alpha) is state, as are
  modules, optimisers and every other argument: used in place, never copied. Python values (bools, ints, floats,
  strings; TD3's ``update_actor``), the identity of every other argument and the attributes of a settings object (a
  dataclass such as ``Args``, or any object with plain attributes that is not a module or an optimiser; read at
  every call) pick the graph: another value is another graph (TD3's delayed actor update has its own;
  ``args.ent_coef = 0.005`` between calls is used by the next). More than ``MAX_GRAPHS`` graphs for one function
  over the run is an error naming what changed, read by the function or not: a value that takes more than a few
  values (a schedule) must be a tensor. A call that writes a setting's attribute or changes a list or dict among
  its arguments (a counter, an append) is refused when it runs the body (every call on the CPU, the first two on
  CUDA): a replay never would. Writes to anything else outside the outputs (globals, a module's attributes) are not
  seen. A data tensor's shape, strides, dtype and device pick the graph too. An argument's part of the key is read
  again only where it is not the object passed in its place at the previous call, or is a settings object (a
  tensor changed in place between two calls is not seen there: its shape by ``resize_`` or ``set_``, or whether it
  is data by ``requires_grad_``).
  A call whose key equals the previous call's, or the one's before it (two graphs in turns: TD3's delayed actor
  update), takes that call's graph without looking it up.
  A call whose arguments are all positional, none a dict, list or tuple, takes no walk over them. Copying data in
  costs the host, per call: one copy where the data tensors are views of one storage at the graph's offsets (one
  ``shared.device.upload``), else one per tensor not seen before.
- On CUDA, each graph is captured at the third call with its key, after two calls run as written on a side
  stream (they are the run's real first updates: optimiser state, cuDNN's choices and compiling happen there,
  no update is repeated), and every later call replays it: forward, loss, backward, clipping, optimiser steps
  and target updates in one launch. Before the first call the optimisers among the arguments are made
  ``capturable`` (Adam's step counts on the device) and their learning rates become device tensors: anneal
  one with ``set_lr``; replacing it by a number in the param group is an error at the next call, never a
  change the graph silently ignores.
- Random draws inside a graph (a policy's sample, SAC's and TD3's noise) differ between replays (torch's CUDA
  generator advances its offset at each replay) and follow the same distributions as eager's.
- The outputs are copied out of the graph (its next replay overwrites them): one stack for the scalar
  statistics, one copy for each other tensor. Gradients stay in the graph's memory, as does anything else the
  function leaves in modules (``.grad``); the parameters and optimiser states are the live ones.
- ``collective(op)``: an operation that must not be captured (torchrun's all-reduce over NCCL) runs at once
  outside a capture; inside one it ends the graph, runs between it and the next at every replay, and the call
  goes on in a new graph of the same memory pool. ``shared.distributed`` sends every all-reduce through it, so
  the gradients are averaged between graphs and equal on every rank (a graph captured under torchrun keeps its
  all-reduces for its life: the scripts run no update after ``distributed.end()``).
- On the CPU (and on CUDA with ``RL_COMPILE_GRAPHS=0``) the same protocol runs without the capture: static
  inputs copied in, the function called on them, outputs copied out; so the CPU tests exercise everything but
  the capture itself. ``report()`` adds ``cuda_graphs``, the graphs captured so far. ``RL_COMPILE_GRAPHS=dry``
  (benchmarks only; wrong results) times a replay's host work on any device: from the third call of a key the
  function is not called, each copy in is one ``copy_`` of one byte between two tensors of the graph's own (a
  launch's host work, no bytes) and its third call's outputs are copied out again (``benchmarks/speed/loop_overhead.py``).
- An async sampler process acting on a GPU (``shared.procs.sampler_entry``) enables this module in its own process
  under ``--compile``: its acting step is one CUDA graph of its own; on the CPU it acts eagerly. What stays outside
  every graph: the env step, host-device copies, the replay's gather and the host's GAE.
Imports only ``shared.namedarraytuple`` (its structure walk), and torch where it is used: ``shared.run`` imports
this module without it.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import time
import types
from collections.abc import Callable
from typing import Any, TypeVar

from shared.namedarraytuple import flatten_structure, unflatten_structure

__all__ = ["MAX_GRAPHS", "backend", "collective", "compiled", "disable", "enable", "enabled", "graphed", "report", "set_lr"]

F = TypeVar("F", bound=Callable[..., Any])
MAX_GRAPHS = 8  # graphs one @graphed function may capture; more means a changing Python value (module docstring)
WARMUP_CALLS = 2  # calls of a key run as written before its capture (optimiser state, cuDNN, compiling)

_state: dict[str, Any] = {"device": None, "graphs": 0, "seconds": 0.0, "cuda_graphs": 0, "capture": None}
_graphed_entries: list[tuple[dict, list]] = []  # each @graphed function's graphs and last calls: dropped by enable, disable
_VALUES = {bool, int, float, str, type(None)}  # Python values that pick a graph by their value
_NOT_SETTINGS = (type, types.FunctionType, types.MethodType, types.ModuleType, functools.partial)
_PLAIN = {bool, int, float, str, bytes, type(None), tuple, frozenset}  # values a settings key holds as they are
_settings_types: dict[type, bool] = {}  # whether a type's objects are settings (_is_settings), by type
_NODES = (dict, tuple, list)  # what flatten_structure walks into
_EVERY_NODES = itertools.repeat(_NODES)  # isinstance's second argument for every leaf, in a map (no Python frame)
_VERSION = operator.attrgetter("_version")
_DATA_PTR = operator.methodcaller("data_ptr")
_flat_specs: dict[int, Any] = {}  # flatten_structure's spec of (args, {}) for n positional leaves


def _flat_spec(n: int) -> Any:
    _flat_specs[n] = flatten_structure((tuple(range(n)), {}), [])
    return _flat_specs[n]


def enable(device: Any) -> None:
    """From now on, in this process, every ``@compiled`` function is compiled for ``device`` and every ``@graphed``
    one runs the graph protocol (captured on CUDA)."""
    import torch
    import torch._dynamo.config
    import torch._functorch.config
    import torch._inductor.config

    torch._functorch.config.force_non_lazy_backward_lowering = True  # the backward compiles with the forward
    torch._dynamo.config.error_on_recompile = os.environ.get("RL_COMPILE_STRICT") == "1"
    # Lets a compiled function read an nn.LSTM's weights: shared.rnn.lstm_rows steps it (the fused kernel
    # fails to compile for some inputs, torch 2.13: shared/rnn.py).
    torch._dynamo.config.allow_rnn = True
    # RL_COMPILE_EAGER_RANDOM=1: inductor draws eager's random numbers (slower), so that a compiled run can be
    # compared with an eager one number for number (the slow tier's numerics test).
    torch._inductor.config.fallback_random = os.environ.get("RL_COMPILE_EAGER_RANDOM") == "1"
    _state.update(device=torch.device(device), graphs=0, seconds=0.0, cuda_graphs=0, capture=None)
    _drop_graphs()


def disable() -> None:
    """Back to eager (tests that run several scripts in one process); every captured graph is dropped."""
    _state["device"] = None
    _drop_graphs()


def _drop_graphs() -> None:
    for entries, recent in _graphed_entries:
        entries.clear()
        recent[:] = [_no_call(), _no_call()]


def _no_call() -> list:
    """A ``@graphed`` function's record of a call, before any (``graphed``'s ``recent``)."""
    return [[], [], [], None, None, None, None]


def backend() -> str:
    return os.environ.get("RL_COMPILE_BACKEND", "inductor")


def enabled() -> bool:
    return _state["device"] is not None


def report() -> dict[str, float]:
    """The graphs compiled so far in this process and the seconds spent compiling them; on CUDA also the CUDA graphs
    captured (``cuda_graphs``)."""
    out = {"compiled_graphs": _state["graphs"], "compile_s": round(_state["seconds"], 3)}
    if _state["device"] is not None and _state["device"].type == "cuda":
        out["cuda_graphs"] = _state["cuda_graphs"]
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
        if device not in cache:
            cache[device] = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend())
            if os.environ.get("RANK", "0") == "0":  # a wait of seconds to minutes is announced, once per function
                print(f"--compile: compiling {fn.__qualname__} ({backend()}, on {device}): its first calls wait", flush=True)
        start = time.perf_counter()
        out = cache[device](*args, **kwargs)
        new = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
        if new:  # this call compiled (the run time of one call is in the figure too: small beside compiling)
            _state["graphs"] += new
            _state["seconds"] += time.perf_counter() - start
        return out

    return call  # type: ignore[return-value]


def set_lr(optimizer: Any, lr: float) -> None:
    """Every param group's learning rate to ``lr``: in place where it is a tensor (a captured graph reads it)."""
    for group in optimizer.param_groups:
        if hasattr(group["lr"], "fill_"):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def collective(op: Callable[[], Any]) -> None:
    """``op()`` now; inside a capture, between this graph and the next at every replay (module docstring)."""
    capture = _state["capture"]
    if capture is None:
        op()
    else:
        capture.cut(op)


def graphed(fn: F) -> F:
    """``fn`` as written; under ``enable`` each call is a replay of one CUDA graph on CUDA, the same protocol without
    the capture elsewhere (module docstring)."""
    import torch

    entries: dict[Any, _Graph] = {}
    # The last call's and the one's before it: each call's leaves, their parts of the key, which of them are settings,
    # its structure, grad modes, graph and graph key (the one a refused new graph is compared with). Two, so that two
    # graphs in turns (TD3's delayed actor update) are found without a lookup too.
    recent: list = [_no_call(), _no_call()]
    _graphed_entries.append((entries, recent))

    def key(x: Any) -> Any:
        """A leaf's part of the graph key: a data tensor's layout, a Python value, a settings object's identity and
        readable state, or the identity of anything else."""
        if isinstance(x, torch.Tensor):
            return id(x) if x.requires_grad else (x.shape, x.stride(), x.dtype, x.device)
        kind = type(x)
        if kind in _VALUES:
            return (kind, x)
        settings = _settings_types.get(kind)
        if settings is None:
            settings = _settings_types[kind] = _is_settings(x)
        if not settings:
            return id(x)
        d = x.__dict__
        # the common case (Args): plain values only, the key is the attributes as they are; else _frozen's walk
        return id(x), (tuple(d.items()) if set(map(type, d.values())) <= _PLAIN else _frozen(d))

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        device = _state["device"]
        if device is None:
            return fn(*args, **kwargs)
        if not kwargs and not any(map(isinstance, args, _EVERY_NODES)):  # the usual call: no walk (flatten_structure's)
            leaves, spec = args, _flat_specs.get(len(args)) or _flat_spec(len(args))
        else:
            leaves = []
            spec = flatten_structure((args, kwargs), leaves)
        # An object passed again (PPO's rollout, a module, a bool) keeps the part of the key it had; a settings object's
        # attributes are read again at every call.
        last, before = recent
        keys = [k if x is p and not s else key(x) for x, p, k, s in zip(leaves, *last[:3])]
        keys += map(key, leaves[len(keys) :])
        modes = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
        if spec == last[3] and modes == last[4] and keys == last[1]:  # the previous call's graph (no key to hash)
            last[0] = leaves
            return last[5](leaves)
        if spec == before[3] and modes == before[4] and keys == before[1]:  # the one's before: two graphs in turns
            recent.reverse()
            before[0] = leaves
            return before[5](leaves)
        graph_key = (spec, *modes, *keys)
        entry = entries.get(graph_key)
        if entry is None:
            if len(entries) >= MAX_GRAPHS:  # what changed since the call before this one (not the last graph made)
                what = _what_changed(last[6], graph_key, leaves, _names(fn, args, kwargs))
                raise RuntimeError(
                    f"@graphed {fn.__qualname__}: a {MAX_GRAPHS + 1}th graph, because {what} changed between calls "
                    "(pass a value that changes between calls as a tensor)"
                )
            mode = os.environ.get("RL_COMPILE_GRAPHS", "1")
            capture = "dry" if mode == "dry" else "cuda" if device.type == "cuda" and mode != "0" else ""
            data = [isinstance(x, torch.Tensor) and not x.requires_grad for x in leaves]
            entry = entries[graph_key] = _Graph(fn, list(leaves), data, spec, capture)
        recent.reverse()  # the last call's record becomes the one before; the older one is written over
        before[:] = leaves, keys, [_settings_types.get(type(x), False) for x in leaves], spec, modes, entry, graph_key
        return entry(leaves)

    return call  # type: ignore[return-value]


class _Graph:
    """One key of a ``@graphed`` function: its static inputs, its capture (CUDA) and how a call runs it."""

    def __init__(self, fn: Callable, leaves: list, data: list[bool], spec: Any, capture: str):
        import torch

        self.fn, self.spec, self.capture = fn, spec, capture
        # the state objects are held (their ids stay theirs while this graph lives); the first call's data is not
        self.leaves = [None if d else x for x, d in zip(leaves, data)]
        self.block = _span([x for x, d in zip(leaves, data) if d])  # (start, bytes, offsets) of one upload, or None
        self.head = None if self.block is None else [at for at, *_ in self.block[2]].index(0)  # the tensor at its start
        with torch.inference_mode(False):  # normal tensors, also for a call in inference mode: copied into every call
            self._allocate(leaves, data)
        self.args = [self.static.get(i, x) for i, x in enumerate(self.leaves)]  # what the body gets: static data, state
        self.statics = list(self.static.values())
        # the data tensors copied in last and their versions (None: copied at every call): held, so that their ids
        # cannot pass to other tensors meanwhile
        self.last_data: list = [None] * len(self.statics)
        self.last_versions: list | None = None
        self.inference = False  # whether a call's data had an inference tensor (_copy_in)
        self.calls, self.graphs, self.between, self.out = 0, [], [], None
        self.launch = [torch.zeros(1, dtype=torch.uint8) for _ in range(2)] if capture == "dry" else []  # _copy's
        self.optimizers = [x for x in leaves if isinstance(x, torch.optim.Optimizer)]
        self.settings = [i for i, x in enumerate(self.leaves) if x is not None and _is_settings(x)]
        if capture == "cuda":
            self.side = torch.cuda.Stream()
            self._prepare_optimizers()
        self.lrs = [group["lr"] for opt in self.optimizers for group in opt.param_groups]

    def _allocate(self, leaves: list, data: list[bool]) -> None:
        import torch

        if self.block is None:
            self.static = {i: torch.empty_like(x) for i, x in enumerate(leaves) if data[i]}
        else:  # views of one static block at the upload's own offsets: a call's batch is one copy
            start, size, _ = self.block
            self.block_static = torch.empty(size, dtype=torch.uint8, device=leaves[data.index(True)].device)
            self.static = {
                i: _view(self.block_static, x, x.storage_offset() * x.element_size() - start)
                for i, x in enumerate(leaves)
                if data[i]
            }

    def _prepare_optimizers(self) -> None:
        """Capturable optimisers: step counts on the parameters' device, learning rates device tensors."""
        import torch

        for opt in self.optimizers:
            for group in opt.param_groups:
                device = group["params"][0].device
                group["capturable"] = True
                if not isinstance(group["lr"], torch.Tensor):
                    group["lr"] = torch.tensor(float(group["lr"]), device=device)
                for p in group["params"]:
                    step = opt.state.get(p, {}).get("step")
                    if isinstance(step, torch.Tensor) and step.device != device:
                        opt.state[p]["step"] = step.to(device)

    def _copy_in(self, leaves: list) -> list:
        """The call's data copied into the static inputs, but for a tensor that is the one copied there last and
        unchanged since (same object, same version; an inference tensor has no version: always copied); the body's
        arguments."""
        data = list(map(leaves.__getitem__, self.static))
        if self.inference:  # this graph has had data made in inference mode (ppo_mujoco's collect): asked one by one
            versions = list(map(_version, data))
        else:
            try:
                versions = list(map(_VERSION, data))
            except RuntimeError:  # an inference tensor has no version: reading it raises a C++ error (~10 µs), once
                self.inference = True
                versions = list(map(_version, data))
        last, seen = self.last_versions, self.last_data
        if versions == last and None not in versions and all(map(operator.is_, data, seen)):
            return self.args
        source = None if self.block is None else self._source(data)
        if source is not None:  # the same layout in one storage: one copy
            self._copy(self.block_static, source)
        else:
            for j, (static, x) in enumerate(zip(self.statics, data)):
                if last is None or x is not seen[j] or versions[j] is None or versions[j] != last[j]:
                    self._copy(static, x)
        self.last_data, self.last_versions = data, versions
        return self.args

    def _copy(self, static: Any, x: Any) -> None:
        """``x`` into ``static`` (on a GPU, a copy the device makes). ``RL_COMPILE_GRAPHS=dry`` after the "capture": a
        copy of one byte between two tensors of this graph's own, the host's part of a launch alone (no bytes, and no
        tensor made for it)."""
        if self.capture == "dry" and self.graphs:
            self.launch[0].copy_(self.launch[1])
        else:
            static.copy_(x, non_blocking=True)

    def _source(self, data: list) -> Any:
        """The bytes of ``data``'s block as one uint8 tensor, when they are views of one storage at this graph's offsets
        (one upload, as a rule), else None: the key already holds their shapes, strides and dtypes, so only the storage
        and the offsets are left to compare with ``_span``'s block of the first call (no overlap, as it checked then).
        The bytes are read through the tensor at the block's start, wherever in its storage that lies: its view as
        bytes (a tensor made where it is not uint8) and one ``as_strided`` of it, which checks the storage's bounds;
        where it cannot be viewed as bytes, through its storage from the block's offset in it (``_bytes``)."""
        import torch

        storage = data[0].untyped_storage().data_ptr()
        for x in data[1:]:
            if x.untyped_storage().data_ptr() != storage:
                return None
        starts = list(map(_DATA_PTR, data))
        first = starts[self.head]
        for start, (offset, *_) in zip(starts, self.block[2]):
            if start - first != offset:
                return None
        x = data[self.head]
        if x.dtype != torch.uint8:
            try:
                x = x.view(torch.uint8)
            except RuntimeError:  # not viewable as bytes (0-d, or its last stride not 1)
                return _bytes(x, first - storage, self.block[1])
        return torch.as_strided(x, (self.block[1],), (1,))

    def __call__(self, leaves: list) -> Any:
        import torch

        lrs = [group["lr"] for opt in self.optimizers for group in opt.param_groups] if self.capture == "cuda" else ()
        if lrs and any(map(operator.is_not, lrs, self.lrs)):
            raise RuntimeError(
                f"@graphed {self.fn.__qualname__}: an optimiser's learning rate was replaced; "
                "anneal it with shared.compiling.set_lr (the graph reads the tensor it captured)"
            )
        args = self._copy_in(leaves)
        self.calls += 1
        if self.capture and self.calls > WARMUP_CALLS:
            if not self.graphs:
                self._capture(args)
            self.graphs[0].replay()
            for op, graph in zip(self.between, self.graphs[1:]):  # a collective between two graphs (collective())
                op()
                graph.replay()
            return self.copy_out()
        a, k = unflatten_structure(self.spec, iter(args))
        versions = {i: s._version for i, s in self.static.items()}
        settings = {i: _frozen(args[i].__dict__) for i in self.settings}
        if self.capture == "cuda":  # a warm-up call, on a side stream as a capture will be
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                out = self.fn(*a, **k)
            torch.cuda.current_stream().wait_stream(self.side)
            out = _copy_out(out)  # as a replay's: an output that is a static input is overwritten by the next call
        else:
            out = _copy_out(self.fn(*a, **k))
        changed = [i for i, s in self.static.items() if s._version != versions[i]]
        if changed:  # a replay would write the static copy, never the caller's tensor
            raise RuntimeError(
                f"@graphed {self.fn.__qualname__} writes its data argument(s) {changed} in place; "
                "return the new values instead (or pass a tensor that requires grad: state)"
            )
        # a replay never runs the body: a write it makes to a setting or a container would happen twice, then never
        written = [_what_changed(before, _frozen(args[i].__dict__), args[i], settings=True) for i, before in settings.items()]
        after: list = []
        if flatten_structure((a, k), after) != self.spec or any(
            y is not x and not isinstance(y, torch.Tensor) for y, x in zip(after, args)
        ):  # a tensor put in a dict (PPO's normalised advantages) is harmless: the caller's dict is not the body's
            written.append("a list, tuple or dict among its arguments (an append, a counter)")
        if any(written):
            raise RuntimeError(
                f"@graphed {self.fn.__qualname__} writes {'; '.join(filter(None, written))} outside its outputs, which "
                "a replay would never do; return the new value instead"
            )
        return out

    def _capture(self, args: list) -> None:
        import torch

        a, k = unflatten_structure(self.spec, iter(args))
        if self.capture == "dry":  # the host's part of a replay, timed on a CPU: the graph's outputs are this call's
            self.out, self.graphs = self.fn(*a, **k), [_DryGraph()]
            self.copy_out = _copier(self.out)
            return
        torch.cuda.synchronize()
        capture = _Capture(self, torch.cuda.graph_pool_handle())
        with torch.cuda.stream(self.side):
            _state["capture"] = capture
            try:
                capture.begin()
                self.out = self.fn(*a, **k)
                capture.end()
            except BaseException:  # no partial graph is ever replayed: the next call captures again
                try:
                    capture.graph.capture_end()
                except RuntimeError:
                    pass
                self.graphs, self.between = [], []
                raise
            finally:
                _state["capture"] = None
        torch.cuda.current_stream().wait_stream(self.side)
        self.copy_out = _copier(self.out)
        _state["cuda_graphs"] += len(self.graphs)


class _DryGraph:
    """``RL_COMPILE_GRAPHS=dry``: a graph whose replay does nothing (module docstring)."""

    def replay(self) -> None:
        pass


class _Capture:
    """The graphs of one capture, cut where ``collective`` is called."""

    def __init__(self, owner: _Graph, pool: Any):
        self.owner, self.pool, self.graph = owner, pool, None

    def begin(self) -> None:
        import torch

        self.graph = torch.cuda.CUDAGraph()
        self.graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")

    def end(self) -> None:
        self.graph.capture_end()
        self.owner.graphs.append(self.graph)

    def cut(self, op: Callable[[], Any]) -> None:
        self.end()
        self.owner.between.append(op)
        self.begin()


def _is_settings(x: Any) -> bool:
    """Whether ``x`` is a settings object, whose readable state picks the graph: a dataclass (the script's ``Args``) or
    another object with plain attributes; not a module, an optimiser, a function or a class (state or code)."""
    import torch

    return hasattr(x, "__dict__") and not isinstance(x, _NOT_SETTINGS + (torch.nn.Module, torch.optim.Optimizer))


def _frozen(d: dict) -> Any:
    """A settings object's attributes as a hashable key part: plain values as they are, lists and dicts as tuples, a
    nested settings object by its own attributes, a tensor (state) and anything else unhashable by its identity."""
    return tuple((name, _hashable(v)) for name, v in d.items())


def _hashable(v: Any) -> Any:
    import torch

    if type(v) in _PLAIN and not isinstance(v, tuple):
        return v
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_hashable(x) for x in v))
    if isinstance(v, dict):
        return (dict, tuple((k, _hashable(x)) for k, x in v.items()))
    if isinstance(v, torch.Tensor):
        return ("id", id(v))
    if _is_settings(v):
        return (type(v), _frozen(v.__dict__))
    try:
        hash(v)
        return v
    except TypeError:
        return ("id", id(v))


def _names(fn: Callable, args: tuple, kwargs: dict) -> list[str]:
    """The name of the argument each leaf of a call's ``(args, kwargs)`` belongs to (for an error message)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    names: list[str] = []
    for i, value in enumerate(args):  # the leaves' order: positional arguments, then keywords as passed
        names += [params[i] if i < len(params) else f"#{i}"] * _count_leaves(value)
    for name, value in kwargs.items():
        names += [name] * _count_leaves(value)
    return names


def _count_leaves(value: Any) -> int:
    leaves: list = []
    flatten_structure(value, leaves)
    return len(leaves)


def _what_changed(before: Any, after: Any, leaves: Any, names: Any = None, settings: bool = False) -> str:
    """What differs between two graph keys (``leaves`` and ``names``: the new call's), or between two states of one
    settings object (``settings``: ``leaves`` is that object), in words naming the field: "" when nothing does."""
    if settings:
        old, new = dict(before), dict(after)
        differ = lambda a, b: not (a is b or a == b)  # the same object is unchanged (a NaN too)
        names = [n for n in {**old, **new} if differ(old.get(n, "(none)"), new.get(n, "(none)"))]
        kind = type(leaves).__name__
        return ", ".join(f"{kind}.{n} ({old.get(n, '(none)')!r}, then {new.get(n, '(none)')!r})" for n in names)
    if before[:3] != after[:3]:
        return "the arguments' structure or the grad mode"
    for i, (a, b) in enumerate(zip(before[3:], after[3:])):
        if a == b:
            continue
        x = leaves[i]
        if _is_settings(x) and isinstance(a, tuple) and a[0] == b[0]:
            return _what_changed(a[1], b[1], x, settings=True)
        if type(x) in _VALUES:
            return f"the argument {names[i]} ({a[1]!r}, then {b[1]!r})"
        return f"the argument {names[i]} ({type(x).__name__}: its shape, dtype, device or identity)"
    return "an argument"


def _version(x: Any) -> Any:
    """``x``'s version counter; None for an inference tensor, which has none (so it is copied at every call)."""
    return None if x.is_inference() else x._version


def _span(tensors: list) -> Any:
    """``(first byte, bytes, offsets)`` of tensors that are all views of one storage (one upload), else None."""
    if len(tensors) < 2 or any(t.untyped_storage().data_ptr() != tensors[0].untyped_storage().data_ptr() for t in tensors):
        return None
    if any(t.numel() == 0 for t in tensors):
        return None
    ends = [
        (t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size() for t in tensors
    ]
    starts = [t.storage_offset() * t.element_size() for t in tensors]
    spans = sorted(zip(starts, ends))
    if any(b < e for (_, e), (b, _) in zip(spans, spans[1:])):  # overlapping views: their copies would clash
        return None
    first = min(starts)
    if any((b - first) % t.element_size() for b, t in zip(starts, tensors)):
        return None
    return first, max(ends) - first, tuple((b - first, tuple(t.shape), t.stride(), t.dtype) for b, t in zip(starts, tensors))


def _bytes(x: Any, start: int, size: int) -> Any:
    """Bytes ``start .. start + size`` of ``x``'s storage, as a uint8 tensor; None where they run past its end
    (``set_`` would grow the storage to hold them, silently)."""
    import torch

    if start < 0 or start + size > x.untyped_storage().nbytes():
        return None
    return torch.empty(0, dtype=torch.uint8, device=x.device).set_(x.untyped_storage(), start, (size,))


def _view(block: Any, like: Any, byte_offset: int) -> Any:
    """A tensor of ``like``'s dtype, shape and strides in ``block``'s storage from ``byte_offset``."""
    import torch

    return torch.empty(0, dtype=like.dtype, device=block.device).set_(
        block.untyped_storage(), byte_offset // like.element_size(), tuple(like.shape), like.stride()
    )


def _copy_out(out: Any) -> Any:
    """``out`` with every tensor copied: the 0-d float32 ones in one stack, the others one by one."""
    return _copier(out)()


def _copier(out: Any) -> Callable[[], Any]:
    """A function returning ``_copy_out(out)``, its walk over ``out`` made once (a graph's outputs, copied out at every
    replay, are always the same tensors)."""
    import torch

    leaves: list = []
    spec = flatten_structure(out, leaves)
    leaves = [x.detach() if isinstance(x, torch.Tensor) else x for x in leaves]
    scalar = [isinstance(x, torch.Tensor) and x.dim() == 0 and x.dtype == torch.float32 for x in leaves]
    scalars = [i for i, x in enumerate(scalar) if x]
    others = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and not scalar[i]]
    if spec is None and len(others) == 1:  # one tensor
        return leaves[0].clone
    if not scalars and len(others) == len(leaves) and spec == (tuple, None, (None,) * len(leaves)):  # a tuple of tensors
        return lambda: tuple([x.clone() for x in leaves])
    if scalars and len(scalars) == len(leaves) and spec is not None and spec[0] is dict and spec[2] == (None,) * len(leaves):
        return lambda: dict(zip(spec[1], torch.stack(leaves).unbind()))  # a dict of statistics: one stack

    def copy() -> Any:
        copies = list(leaves)
        if scalars:
            for i, x in zip(scalars, torch.stack([leaves[i] for i in scalars]).unbind()):
                copies[i] = x
        for i in others:
            copies[i] = leaves[i].clone()
        return unflatten_structure(spec, iter(copies))

    return copy
