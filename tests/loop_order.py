"""The order of a replay script's loop: which of acting, updating and stepping the envs comes first.

Usage: ``python tests/loop_order.py SCRIPT UPDATE [FLAGS...]`` runs ``algos/SCRIPT.py``'s ``main()`` in this process
and prints one line (``record`` runs it so, for a test, and returns the letters): a letter per event, in order: ``A``
an acting step's copy down (``to_host``, the call that waits for the GPU), ``U`` a call of the script's function
``UPDATE``, ``E`` a step of the envs. On a GPU an acting step's copy waits for every update launched before it, so
an ``A`` right after a ``U`` means the envs' step cannot run while that update does.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
events: list[str] = []


def recorded(fn, letter: str):
    def call(*args, **kwargs):
        events.append(letter)
        return fn(*args, **kwargs)

    return call


def record(script: str, update: str, flags: list[str]) -> str:
    """The letters of a run of ``algos/<script>.py`` with ``flags``, in a process of its own; it must exit 0."""
    out = subprocess.run([sys.executable, __file__, script, update, *flags], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    events, code = out.stdout.split()
    assert code == "0", out.stdout
    return events


def main() -> None:
    script, update, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    sys.path.insert(0, str(ROOT / "algos"))
    module = __import__(script)
    module.to_host = recorded(module.to_host, "A")
    setattr(module, update, recorded(getattr(module, update), "U"))
    make_envs = module.make_envs

    def envs_recorded(*args, **kwargs):
        envs = make_envs(*args, **kwargs)
        envs.step = recorded(envs.step, "E")
        return envs

    module.make_envs = envs_recorded
    sys.argv = [f"{script}.py", *flags]
    with contextlib.redirect_stdout(io.StringIO()):
        code = module.main()
    print("".join(events), code)


if __name__ == "__main__":
    main()
