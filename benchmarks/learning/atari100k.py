"""Atari 100k: data-efficient Rainbow (``catdqn_atari.py --preset atari100k``) game by game beside the published
scores, with human-normalised mean, median and interquartile mean over games and their bootstrap intervals.

    taskset -c 1 python benchmarks/learning/atari100k.py ~/atari100k                  # 8 games x seeds 1 2, one core a run
    python benchmarks/learning/atari100k.py ~/atari100k --games RoadRunner Freeway --seeds 3 4
    python benchmarks/learning/atari100k.py ~/atari100k --report-only                 # the tables from the finished runs
    python benchmarks/learning/atari100k.py ~/atari100k -- --eval-episodes 30         # flags after -- go to every run

Runs go through ``experiments/launch.py`` (one folder per game and seed under the root, each pinned to its own
cores, checkpointed every 15 minutes with its replay, so that running the same command again after an
interruption resumes them): seed by seed, so that every game has its first seed before any has its second. The
report is ``experiments/report.py``'s with the random and human scores as its reference (``reference.json`` in the
root), then a table per game: ours (the mean over seeds of each run's 100 evaluation episodes after training, the
protocol of the published numbers; see the preset's comment) beside data-efficient Rainbow's published score,
random and human, and the human-normalised scores.

Published scores. Random and human: the Atari 100k tables rliable and Dopamine use (checked against them).
DER: van Hasselt et al. (2019), as tabulated in the SPR paper (Schwarzer et al. 2021, table of Atari 100k scores,
column DER), one mean over their seeds per game; all eight checked against the SPR repository's own copy
(mila-iqia/spr, analysis/100k_comparison.ipynb, ``der_scores``, with its random and human scores).
RoadRunner, Freeway, Krull, Jamesbond and Kangaroo come first: there data-efficient Rainbow clearly beats random,
so a broken agent shows; on Boxing, Breakout and Pong it does not (a check that we are not far above it either).

One run is 100k agent steps at one update each: 47 minutes on one core of an AVX2 EPYC, its 100 evaluation
episodes included (RoadRunner, about 37 steps/s while learning); 8 games x 2 seeds are about 13 core-hours.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

# game: (random, human, data-efficient Rainbow as published)
SCORES = {
    "RoadRunner": (11.5, 7845.0, 9600.0),
    "Freeway": (0.0, 29.6, 27.9),
    "Krull": (1598.0, 2665.5, 2851.5),
    "Jamesbond": (29.0, 302.8, 301.6),
    "Kangaroo": (52.0, 3035.0, 779.3),
    "Boxing": (0.1, 12.1, 0.2),
    "Breakout": (1.7, 30.5, 1.9),
    "Pong": (-20.7, 14.6, -19.3),
}
SCRIPT = "catdqn_atari"
FLAGS = "--preset atari100k --save-replay --checkpoint-minutes 15"


def _module(name: str):
    """``experiments/<name>.py`` (the launcher, the report): the repository's package, imported as any other
    (the repository is put on sys.path first, so a checkout without ``pip install -e .`` runs this too)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"experiments.{name}")


def env_id(game: str) -> str:
    return f"{game}NoFrameskip-v4"


def launch(root: Path, games: list[str], seeds: list[int], cores: int, tail: list[str]) -> int:
    """Seed by seed over the games; returns the first non-zero exit of the launcher (0 when every run finished)."""
    launcher = _module("launch")
    code = 0
    for seed in seeds:
        argv = [
            str(root),
            "--scripts",
            SCRIPT,
            "--env-ids",
            *map(env_id, games),
            "--seeds",
            str(seed),
            "--cores-per-run",
            str(cores),
            "--plain",
            "--status-every",
            "600",
            "--flags",
            FLAGS,
        ]
        rc = launcher.main(argv + (["--", *tail] if tail else []))
        code = code or rc
        if rc not in (0, 1):  # 1: some run failed (the others went on); anything else: the launch itself stopped
            return rc
    return code


def table(root: Path, games: list[str], reps: int) -> str:
    """Per game: ours beside DER, random and human; then the human-normalised aggregates of both."""
    report = _module("report")
    groups = {g.env_id: g for g in report.collect(root, "eval", 100, False) if g.script == SCRIPT}
    lines = [
        "| game | seeds | ours: mean (min-max) | DER (published) | random | human | ours HNS | DER HNS |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ours_hns, der_hns = {}, {}
    for game in games:
        lo, hi, der = SCORES[game]
        g = groups.get(env_id(game))
        scores = np.asarray(g.scores if g is not None else [], np.float64)
        der_hns[game] = (der - lo) / (hi - lo)
        if len(scores):
            ours_hns[game] = (scores - lo) / (hi - lo)
            ours = f"{scores.mean():.1f} ({scores.min():.1f} to {scores.max():.1f})"
            hns = f"{ours_hns[game].mean():.3f}"
        else:
            ours, hns = "-", "-"
        lines.append(f"| {game} | {len(scores)} | {ours} | {der} | {lo} | {hi} | {hns} | {der_hns[game]:.3f} |")
    out = "\n".join(lines)
    if ours_hns:
        done = [g for g in games if g in ours_hns]
        n = min(len(ours_hns[g]) for g in done)
        x = np.stack([ours_hns[g][:n] for g in done], axis=1)  # [runs, games]
        from rliable import metrics

        funcs = lambda s: np.array([metrics.aggregate_mean(s), metrics.aggregate_median(s), metrics.aggregate_iqm(s)])
        point, ci = report._bootstrap({"ours": x}, funcs, reps=reps, random_state=np.random.RandomState(0))
        d = np.array([der_hns[g] for g in done])
        names = ("mean", "median", "IQM")
        ci_lo, ci_hi = ci["ours"]  # NaN with one seed a game (report._bootstrap): no interval printed
        band = ["" if np.isnan(ci_lo[i]) else f" [{ci_lo[i]:.3f}, {ci_hi[i]:.3f}]" for i in range(3)]
        rows = [
            f"| {k} | {point['ours'][i]:.3f}{band[i]} | {[d.mean(), np.median(d), metrics.aggregate_iqm(d[None])][i]:.3f} |"
            for i, k in enumerate(names)
        ]
        out += (
            f"\n\nHuman-normalised over {len(done)} games ({', '.join(done)}), {n} seed(s) each ("
            f"{'95% stratified bootstrap intervals, rliable' if n > 1 else 'one seed: no interval'}; DER: its "
            f"published per-game means)\n\n| | ours | DER |\n"
            "| --- | --- | --- |\n" + "\n".join(rows)
        )
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, tail = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", type=Path, help="the experiment's folder (outside the repository: replays are large)")
    p.add_argument(
        "--games",
        nargs="+",
        default=list(SCORES),
        choices=list(SCORES),
        metavar="GAME",
        help=f"games, in the order they run (default: {' '.join(SCORES)})",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2], help="seeds, each over every game before the next")
    p.add_argument("--cores-per-run", type=int, default=1, help="physical cores per run (default 1)")
    p.add_argument("--report-only", action="store_true", help="only the tables, from the runs finished so far")
    p.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    a = p.parse_args(argv)
    root = a.root.resolve()
    code = 0
    if not a.report_only:
        code = launch(root, a.games, a.seeds, a.cores_per_run, tail)
    if not root.is_dir():
        p.exit(2, f"error: {root} is not a folder\n")
    (root / "reference.json").write_text(
        json.dumps({env_id(g): {"random": lo, "human": hi} for g, (lo, hi, _) in SCORES.items()}, indent=1)
    )
    if not list(root.rglob("eval.json")):
        print("no finished runs yet")
        return code
    _module("report").main([str(root), "--reference", str(root / "reference.json"), "--source", "eval", "--reps", str(a.reps)])
    print(table(root, a.games, a.reps))
    return code


if __name__ == "__main__":
    sys.exit(main())
