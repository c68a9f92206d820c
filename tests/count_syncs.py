"""Counts, on the CPU, the operations of a script's run that would make the host wait for a GPU.

Usage: ``python tests/count_syncs.py SCRIPT [FLAGS...]`` runs ``algos/SCRIPT.py``'s ``main()`` in this process
and prints one JSON object: ``{"exit": code, "sites": {"where": count}}``. With ``--device cuda`` among the flags
(a machine with a GPU), CUDA's own sync debugging (``torch.cuda.set_sync_debug_mode("warn")``) reports every
synchronizing CUDA call as well, filed the same way under ``cuda:<where>``: only those inside the loop (``with
run:``), the window the copies up below are counted in, so that the plain ``.to(device)`` copies that build a
learner before the loop (``Agent(...).to(run.device)``) are not reported.

On CUDA, an op that returns a value to Python (``.item()``, ``float(t)``, ``bool(t)``, ``if tensor:``: all
``aten._local_scalar_dense``), a data-dependent shape (``nonzero``, a boolean-mask index, ``masked_select``),
``torch.equal``, and every copy to the host (``.cpu()``, ``.tolist()``) waits for the device's queue to drain.
On the CPU nothing waits, but the same ops run: a ``TorchDispatchMode`` sees the aten ones and ``Tensor.cpu``
and ``Tensor.tolist`` are wrapped. So are ``torch.as_tensor`` and ``torch.tensor`` given host data (an array, a
list, a number) and a ``device`` inside the loop (``with run:``), and ``Tensor.to``/``Tensor.cuda`` with a device
there on a tensor that a factory made on the host (no ``device`` given: ``zeros``, ``randperm``, ``from_numpy``,
...): on CUDA each is a pageable copy up, which waits too. Each is filed under the place that caused it:

- ``row``: inside what ``shared.run.Run`` does when a row, an evaluation or a checkpoint is due (the statistics
  are read there, once per row), or before the loop starts;
- ``to_host``: inside ``shared.device.to_host``, the one declared copy a hot loop may make (the actions an env
  needs, the priorities a prioritized replay needs);
- ``upload``: inside ``shared.device.upload``, the one pinned, non-blocking copy up of a step's or an update's
  host arrays (on the CPU the same call makes tensors of the arrays);
- ``optim``: inside ``torch.optim``, which reads its step counters, kept on the host (a CPU tensor also when the
  parameters are on a GPU, unless ``capturable``), so nothing waits there;
- otherwise ``<function>:<line>`` of the script (or ``shared/<module>:<function>``): a sync in the hot loop.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import sys
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
ROW_TIME = {  # shared/ functions whose syncs happen once per row, evaluation or checkpoint, or before the loop
    "run.py": {
        "_row",
        "_evaluate",
        "save",
        "finish",
        "begin",
        "evaluate_only",
        "_last_row",
        "__exit__",
        "__init__",
        "__enter__",
    },
    "progress.py": None,
    "evaluation.py": None,
    "checkpoint.py": None,  # None: the whole module
}
SYNC_OPS = {
    "aten._local_scalar_dense.default",
    "aten.nonzero.default",
    "aten.equal.default",
    "aten.masked_select.default",
    "aten.unique.default",
    "aten._unique2.default",
}

sites: collections.Counter = collections.Counter()


def where() -> str:
    """The category of the current sync, from the Python stack (innermost frame first)."""
    frame = sys._getframe(2)
    script_site = shared_site = None
    while frame is not None:
        path, name = Path(frame.f_code.co_filename), frame.f_code.co_name
        if "torch/optim" in path.as_posix():
            return "optim"
        if path.parent == ROOT / "shared":
            if name == "to_host":
                return "to_host"
            if path.name == "device.py" and name in ("upload", "upload_each", "__call__", "packed", "each", "_stage"):
                return "upload"
            row = ROW_TIME.get(path.name, ())
            if row is None or name in row:
                return "row"
            shared_site = shared_site or f"shared/{path.name}:{name}"
        elif path.parent == ROOT / "algos" and script_site is None:
            script_site = f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return script_site or shared_site or "elsewhere"


def reads_device(func, args: tuple) -> bool:
    """Whether the aten operator ``func`` on ``args`` reads a device value on the host (a wait on a GPU): one of
    ``SYNC_OPS``, or an index by a boolean mask (a data-dependent shape). benchmarks/speed/loop_overhead.py counts by it
    too."""
    name = str(func)
    if name in SYNC_OPS:
        return True
    return name == "aten.index.Tensor" and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))


class CountSyncs(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if reads_device(func, args):
            sites[where()] += 1
        return func(*args, **(kwargs or {}))


def _counted(method):
    def wrapper(self, *args, **kwargs):
        sites[where()] += 1
        return method(self, *args, **kwargs)

    return wrapper


in_loop = False  # inside ``with run:``, where the script's loop runs
host_made: dict = {}  # id -> weak reference of each tensor a factory made on the host (tensors compare by value)
HOST_FACTORIES = (
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "rand",
    "randn",
    "randint",
    "randperm",
    "from_numpy",
    "as_tensor",
    "tensor",
    "zeros_like",
    "ones_like",
    "empty_like",
)


def _counted_factory(make, copies_up: bool):
    """A torch factory whose results made on the host (no ``device``) are remembered in ``host_made``; with
    ``copies_up`` (as_tensor, tensor), counted when it brings host data to a device in the loop."""

    def wrapper(*args, **kwargs):
        if kwargs.get("device") is None:
            out = make(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                key = id(out)  # the entry leaves with the tensor (its id may then be reused)
                host_made[key] = weakref.ref(out, lambda _, key=key: host_made.pop(key, None))
            return out
        if copies_up and in_loop and args and not isinstance(args[0], torch.Tensor):
            sites[where()] += 1
        return make(*args, **kwargs)

    return wrapper


def _counted_move(method):
    """``Tensor.to``/``Tensor.cuda``, counted when a tensor made on the host goes to a device in the loop."""

    def wrapper(self, *args, **kwargs):
        to_device = method.__name__ == "cuda" or "device" in kwargs or any(isinstance(a, (str, torch.device)) for a in args)
        made = host_made.get(id(self))
        if in_loop and to_device and made is not None and made() is self:
            sites[where()] += 1
        return method(self, *args, **kwargs)

    return wrapper


def _loop_flag(method, value: bool):
    def wrapper(self, *args, **kwargs):
        global in_loop
        in_loop = value
        return method(self, *args, **kwargs)

    return wrapper


def _cuda_warnings() -> None:
    """File every warning of CUDA's sync debug mode raised inside the loop (``in_loop``, as the copies up are
    counted) under where it happened; those of the setup before it and of the end after it are dropped."""
    import warnings

    shown = warnings.showwarning

    def show(message, category, *args, **kwargs):
        if "synchroniz" not in str(message):
            shown(message, category, *args, **kwargs)
        elif in_loop:
            sites["cuda:" + where()] += 1

    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")


def main() -> None:
    script, flags = sys.argv[1], sys.argv[2:]
    if "cuda" in " ".join(flags) and torch.cuda.is_available():
        _cuda_warnings()
    sys.path.insert(0, str(ROOT / "algos"))
    module = __import__(script)
    torch.Tensor.cpu = _counted(torch.Tensor.cpu)
    torch.Tensor.tolist = _counted(torch.Tensor.tolist)
    for name in HOST_FACTORIES:
        setattr(torch, name, _counted_factory(getattr(torch, name), copies_up=name in ("as_tensor", "tensor")))
    torch.Tensor.to, torch.Tensor.cuda = _counted_move(torch.Tensor.to), _counted_move(torch.Tensor.cuda)
    from shared.run import Run

    Run.__enter__, Run.__exit__ = _loop_flag(Run.__enter__, True), _loop_flag(Run.__exit__, False)
    sys.argv = [f"{script}.py", *flags]
    with contextlib.redirect_stdout(io.StringIO()), CountSyncs():
        code = module.main()
    print(json.dumps({"exit": code, "sites": dict(sites)}))


if __name__ == "__main__":
    main()
