"""Plot the return of any run folders against env steps (or wall time): one line per (script, env id), the mean
over its runs (seeds) with a min-max band.

    python experiments/plot.py runs/CartPole-v1__ppo_atari__1__* runs/CartPole-v1__ppo_atari__2__* --out ppo.png
    python experiments/plot.py runs/* --x wall_time --smooth 10 --out all.png

Each run's curve is the ``return_mean`` column of its ``progress.csv`` (the mean of the episodes finished since
the previous row; rows without episodes are skipped), smoothed by a trailing mean over ``--smooth`` rows. Runs
of one group are resampled on a common grid over the steps every one of them reached, so the band is the spread
between seeds and never an extrapolation. One env id gives one panel; several give one panel each.

Guarantees
- One module for every figure: ``experiments/report.py``, the benchmarks (``from experiments.plot import curve,
  figure, save``) and the documentation site draw with ``figure``, ``curve`` and ``save`` from here; it imports
  only numpy, matplotlib (Agg: no display needed) and ``experiments.flags`` (with ``grid``).
- ``read_run`` raises ``ValueError`` naming the file for a folder that is not a run folder or holds a damaged
  ``config.json`` or ``progress.csv``; the command line refuses any bad argument or run folder with one
  ``error:`` line and exit 2, before the PNG is written.
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C and SIGTERM wait until it has imported: experiments.flags.command (one line)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    if sys.path[0] and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # modules import once, as experiments.*

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from experiments.flags import Parser, check_creatable, command
from experiments.grid import LaunchError

Points = Sequence[tuple[float, float]]  # (x, return) pairs of one run, x increasing


def figure(panels: int = 1, width: float = 7.0, height: float = 4.5):
    """A figure with ``panels`` axes side by side (matplotlib's Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(width * panels, height), squeeze=False)
    return fig, list(axes[0])


def smooth(points: Points, window: int) -> list[tuple[float, float]]:
    """Trailing mean of the returns over ``window`` points (fewer at the start)."""
    xs, ys = [p[0] for p in points], np.asarray([p[1] for p in points], np.float64)
    if window <= 1 or not len(ys):
        return list(zip(xs, ys.tolist()))
    c = np.concatenate([[0.0], np.cumsum(ys)])
    lo = np.maximum(np.arange(len(ys)) + 1 - window, 0)
    return list(zip(xs, ((c[1:] - c[lo]) / (np.arange(len(ys)) + 1 - lo)).tolist()))


def band(runs: Sequence[Points], points: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max over ``runs`` on a common grid of x where every run has data (one run: its own x)."""
    runs = [r for r in runs if len(r)]
    if len(runs) == 1:
        x, y = np.asarray(runs[0], np.float64).T
        return x, y, y, y
    start, stop = max(r[0][0] for r in runs), min(r[-1][0] for r in runs)
    grid = np.linspace(start, stop, points) if stop > start else np.asarray([stop], np.float64)
    ys = np.stack([np.interp(grid, [p[0] for p in r], [p[1] for p in r]) for r in runs])
    return grid, ys.mean(0), ys.min(0), ys.max(0)


def curve(ax, label: str, runs: Sequence[Points], window: int = 1, **style) -> None:
    """One line (the mean over ``runs``, each smoothed over ``window`` points) and its min-max band."""
    runs = [smooth(r, window) for r in runs if len(r)]
    if not runs:
        return
    x, mean, lo, hi = band(runs)
    n = f" ({len(runs)} runs)" if len(runs) > 1 else ""
    (line,) = ax.plot(x, mean, label=label + n, **style)
    if len(runs) > 1:
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, lw=0)


def save(
    fig,
    out: str | Path,
    axes: Sequence | None = None,
    xlabel: str = "env steps",
    ylabel: str = "episode return",
    title: str | None = None,
) -> None:
    """Label ``axes`` (default: all), add legends, and write ``out`` (folders created)."""
    for ax in axes if axes is not None else fig.axes:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        (axes or fig.axes)[0].set_title(title)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    print(f"saved {out}")


def read_run(folder: Path, x: str = "global_step") -> tuple[str, str, list[tuple[float, float]]]:
    """(script, env id, points) of one run folder; raises ValueError naming what is missing."""
    config, progress = folder / "config.json", folder / "progress.csv"
    if not config.is_file() or not progress.is_file():
        raise ValueError(f"{folder}: not a run folder (no config.json or progress.csv)")
    try:
        meta = json.loads(config.read_text())
        script, env_id = meta["script"], meta["args"]["env_id"]
        if not (isinstance(script, str) and isinstance(env_id, str)):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{config}: damaged (no script and args.env_id strings)") from None
    column = "global_step" if x == "global_step" else "wall_time_s"
    with open(progress, newline="", errors="replace") as f:
        rows = [r for r in csv.DictReader(f) if r.get("return_mean")]
    try:
        return script, env_id, [(float(r[column]), float(r["return_mean"])) for r in rows]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{progress}: damaged (a row without a number in {column} or return_mean)") from None


def main(argv: Sequence[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run folders (each with config.json and progress.csv)")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--x", choices=["global_step", "wall_time"], default="global_step")
    p.add_argument("--smooth", type=int, default=1, help="trailing mean over this many progress rows")
    a = p.parse_args(argv)
    if a.smooth < 1:
        p.exit(2, "error: --smooth must be at least 1\n")
    try:  # the PNG's folder exists or can be made (experiments.flags: nothing made here)
        if Path(a.out).is_dir():
            raise LaunchError(f"--out {a.out}: a folder, not a PNG's path")
        check_creatable(Path(a.out).absolute().parent, f"--out {a.out}")
    except (LaunchError, OSError) as e:
        p.error(str(e) if isinstance(e, LaunchError) else f"--out {a.out}: {e.strerror or e}")
    groups: dict[str, dict[str, list]] = {}
    for folder in a.runs:
        try:
            script, env_id, points = read_run(folder, a.x)
        except (ValueError, OSError) as e:
            p.exit(2, f"error: {e}\n")
        groups.setdefault(env_id, {}).setdefault(script, []).append(points)
    fig, axes = figure(len(groups))
    for ax, (env_id, scripts) in zip(axes, sorted(groups.items())):
        for script, runs in sorted(scripts.items()):
            curve(ax, script, runs, a.smooth)
        ax.set_title(env_id)
    save(
        fig,
        a.out,
        xlabel="env steps (every rank's)" if a.x == "global_step" else "wall time (s)",
        ylabel="return (mean of the episodes per progress row)",
    )
    return 0


if __name__ == "__main__":
    sys.exit(command(main))
