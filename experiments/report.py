"""Tables and figures of an experiment's results: per script x env x variant, the final return over seeds, with
rliable's (Agarwal et al. 2021) stratified-bootstrap confidence intervals, interquartile mean, normalised
scores, aggregates across tasks and performance profiles.

    python experiments/report.py runs/cartpole                               # report.md + PNGs in .../report
    python experiments/report.py runs/atari --reference refs.json --out atari-report --last-episodes 100
    python experiments/report.py runs/                                       # any folder of run folders

Runs. Every run folder under EXPERIMENT (one with a ``progress.csv`` or ``eval.json``; ``.stale``/``.submitit``
left out) is grouped by script, env id and variant: from the ``launch.json`` that ``experiments/launch.py``
writes, else from ``config.json`` (variant ``base``). Runs that the launcher has not finished (``state`` other
than ``done``) are left out unless ``--include-unfinished``; the tables say how many.

Final return of a run (the table's ``source`` column says which):
- ``eval``: the mean of ``eval.json``'s returns (the greedy/deterministic policy after training), when present and
  ``--source`` is ``auto`` or ``eval``;
- ``train``: the mean of the last ``--last-episodes`` training episodes, from ``progress.csv`` (its complete rows,
  ``shared.progress.read_rows``): its rows' ``return_mean`` weighted by the episodes each row covers (the
  ``episodes`` column's increase), from the last row back, the earliest row counted for only the episodes still
  needed.

Per group: the mean over seeds, the standard deviation (ddof=1), the 95% stratified-bootstrap confidence interval
of the mean and the interquartile mean (IQM, with its interval), all from rliable (one task: the bootstrap
resamples the seeds). With ``--reference FILE`` (JSON: ``{"CartPole-v1": {"random": 22.0, "human": 500.0}}``;
``reference`` or ``max`` may stand for ``human``) scores are normalised ``(score - random) / (human - random)``,
and for each script x variant across the env ids in the file: mean, median, IQM and optimality gap with their
95% intervals (rliable's definitions: mean and median of the per-task means, IQM and optimality gap over every
run of every task), and the performance profile (fraction of runs above each normalised score, with its band).
Aggregates need the same number of seeds on every task: the first seeds of each task, as many as the task with
fewest has (said in the table). One seed (per task) has no interval: its cells read ``-``. Curves:
``benchmarks/plot.py``'s mean and min-max band over seeds, one figure per env id. Written to ``--out`` (default
``EXPERIMENT/report``): ``report.md``, ``curves_<env>.png``, ``aggregates.png``, ``profiles.png``; ``report.md``
is printed too.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Find the repository without an install step, as experiments/launch.py does (see there).
_HERE = Path(__file__).resolve().parent
if sys.path and sys.path[0] and Path(sys.path[0]).resolve() == _HERE:
    del sys.path[0]
sys.path.insert(0, str(next(p for p in _HERE.parents if (p / "shared" / "__init__.py").exists())))

from experiments import ROOT
from experiments.records import read_json
from shared.progress import read_rows

SKIP_DIRS = {".stale", ".submitit", "report"}


def _plot_module():
    """``benchmarks/plot.py`` (figure, curve, save, read_run), loaded by path."""
    spec = importlib.util.spec_from_file_location("benchmarks_plot", ROOT / "benchmarks" / "plot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class RunResult:
    folder: Path
    script: str
    env_id: str
    variant: str
    seed: int | None
    state: str | None  # the launcher's, None without launch.json
    score: float | None = None
    source: str | None = None  # "eval" or "train"
    episodes: int = 0  # episodes behind a train score (eval: the evaluation's)


@dataclass
class Group:
    script: str
    env_id: str
    variant: str
    runs: list[RunResult] = field(default_factory=list)
    left_out: int = 0

    @property
    def scores(self) -> np.ndarray:
        return np.asarray([r.score for r in self.runs], np.float64)

    @property
    def source(self) -> str:
        sources = sorted({r.source for r in self.runs})
        return sources[0] if len(sources) == 1 else "mixed: " + ", ".join(sources)


def train_score(progress: Path, last: int) -> tuple[float | None, int]:
    """Mean of the last ``last`` training episodes from progress.csv rows (each row's return_mean weighted by the
    episodes it covers); returns (score, episodes used)."""
    return rows_score(read_rows(progress), last)


def rows_score(rows: list[dict[str, str]], last: int) -> tuple[float | None, int]:
    """``train_score`` over rows already read (``shared.progress.read_rows``), e.g. those up to some step."""
    chunks, prev = [], 0
    for r in rows:
        try:
            episodes = int(float(r["episodes"]))
        except (KeyError, TypeError, ValueError):
            continue
        n = episodes - prev
        prev = episodes
        if n > 0 and r.get("return_mean") not in (None, ""):
            chunks.append((n, float(r["return_mean"])))
    total, weight = 0.0, 0
    for n, mean in reversed(chunks):
        take = min(n, last - weight)
        total += take * mean
        weight += take
        if weight >= last:
            break
    return (total / weight if weight else None), weight


def read_result(folder: Path, source: str, last: int) -> RunResult:
    launch = read_json(folder / "launch.json")
    config = read_json(folder / "config.json")
    args = config.get("args", {})
    script = launch.get("script") or config.get("script") or folder.name
    env_id = launch.get("env_id") or args.get("env_id") or "?"
    variant = (launch.get("variant") or {}).get("name") or "base"
    seed = launch.get("seed", args.get("seed"))
    res = RunResult(folder, script, env_id, variant, seed, launch.get("state"))
    ev = read_json(folder / "eval.json")
    if source in ("auto", "eval") and ev.get("returns"):
        res.score, res.source, res.episodes = float(np.mean(ev["returns"])), "eval", len(ev["returns"])
    elif source in ("auto", "train") and (folder / "progress.csv").is_file():
        score, n = train_score(folder / "progress.csv", last)
        if score is not None:
            res.score, res.source, res.episodes = score, "train", n
    return res


def find_runs(root: Path) -> list[Path]:
    found = set()
    for name in ("progress.csv", "eval.json", "launch.json"):
        for p in root.rglob(name):
            if not SKIP_DIRS & set(p.relative_to(root).parts[:-1]):
                found.add(p.parent)
    return sorted(found)


def collect(root: Path, source: str, last: int, include_unfinished: bool) -> list[Group]:
    groups: dict[tuple[str, str, str], Group] = {}
    for folder in find_runs(root):
        res = read_result(folder, source, last)
        g = groups.setdefault((res.script, res.env_id, res.variant), Group(res.script, res.env_id, res.variant))
        if res.score is None or (res.state not in (None, "done") and not include_unfinished):
            g.left_out += 1
        else:
            g.runs.append(res)
    for g in groups.values():
        g.runs.sort(key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, str(r.folder)))
    return [groups[k] for k in sorted(groups)]


# ---------------------------------------------------------------------------------------------- statistics


def _bootstrap(score_dict: dict[str, np.ndarray], func, *, random_state: np.random.RandomState, **kwargs):
    """``rliable.library.get_interval_estimates``, reproducible for a given ``random_state``: rliable 1.2's
    stratified bootstrap draws its resamples from numpy's global generator (``np.random.choice``), whatever
    ``random_state`` it is given, so that generator is seeded from ``random_state`` for the call and restored after
    it (the caller's global stream is left as it was). A key with one run per task gets NaN intervals: the
    stratified bootstrap can only return the point there, and [x, x] would claim a certainty one run cannot give.
    Without arch's warning that rliable passes ``random_state``."""
    from rliable import library as rly

    saved = np.random.get_state()
    np.random.seed(random_state.randint(2**31))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="random_state is deprecated", category=FutureWarning)
            points, cis = rly.get_interval_estimates(score_dict, func, random_state=random_state, **kwargs)
    finally:
        np.random.set_state(saved)
    for key, scores in score_dict.items():
        if len(scores) < 2:
            cis[key] = np.full_like(cis[key], np.nan)
    return points, cis


def group_stats(scores: np.ndarray, reps: int, seed: int) -> dict[str, float]:
    """Mean, std (ddof=1), IQM and their 95% stratified-bootstrap intervals over seeds (rliable; one task)."""
    from rliable import metrics

    x = np.asarray(scores, np.float64).reshape(-1, 1)  # [seeds, 1 task]
    out = {"n": len(x), "mean": float(x.mean()), "std": float(x.std(ddof=1)) if len(x) > 1 else math.nan,
           "iqm": float(metrics.aggregate_iqm(x))}
    if len(x) > 1 and np.ptp(x) > 0:
        points, cis = _bootstrap(
            {"g": x}, lambda s: np.array([metrics.aggregate_mean(s), metrics.aggregate_iqm(s)]), reps=reps,
            random_state=np.random.RandomState(seed))
        (out["mean_lo"], out["iqm_lo"]), (out["mean_hi"], out["iqm_hi"]) = cis["g"].tolist()
    elif len(x) > 1:  # all equal: every resample is the point
        out.update(mean_lo=out["mean"], mean_hi=out["mean"], iqm_lo=out["iqm"], iqm_hi=out["iqm"])
    else:  # one seed: nothing to resample, so no interval (a [x, x] would claim a certainty one run cannot give)
        out.update(mean_lo=math.nan, mean_hi=math.nan, iqm_lo=math.nan, iqm_hi=math.nan)
    return out


def load_reference(path: Path) -> dict[str, tuple[float, float]]:
    data = read_json(path)
    if not data:
        raise ValueError(f"--reference {path}: expected a JSON object of env id -> {{random, human}}")
    refs = {}
    for env, r in data.items():
        if not isinstance(r, dict) or "random" not in r:
            raise ValueError(f"--reference {path}: {env} needs a 'random' score")
        top = next((r[k] for k in ("human", "reference", "max") if k in r), None)
        if top is None or float(top) == float(r["random"]):
            raise ValueError(f"--reference {path}: {env} needs a 'human' (or 'reference') score other than random")
        refs[env] = (float(r["random"]), float(top))
    return refs


def normalise(score: np.ndarray, ref: tuple[float, float]) -> np.ndarray:
    lo, hi = ref
    return (np.asarray(score, np.float64) - lo) / (hi - lo)


def aggregates(groups: list[Group], refs: dict[str, tuple[float, float]], reps: int, seed: int):
    """Per script x variant: normalised [seeds, tasks] matrices over the env ids in ``refs``, their aggregates
    (mean, median, IQM, optimality gap) with 95% intervals, and performance profiles with bands."""
    from rliable import metrics

    algos: dict[str, dict[str, np.ndarray]] = {}
    for g in groups:
        if g.env_id in refs and g.runs:
            algos.setdefault(f"{g.script} {g.variant}", {})[g.env_id] = normalise(g.scores, refs[g.env_id])
    envs = sorted(refs)
    matrices, notes = {}, {}
    for algo, per_env in algos.items():
        tasks = [e for e in envs if e in per_env]
        n = min(len(per_env[e]) for e in tasks)
        matrices[algo] = np.stack([per_env[e][:n] for e in tasks], axis=1)  # [runs, tasks]
        notes[algo] = (tasks, n)
    if not matrices:
        return {}, {}, {}, None, None, {}
    funcs = lambda s: np.array([metrics.aggregate_mean(s), metrics.aggregate_median(s), metrics.aggregate_iqm(s),
                                metrics.aggregate_optimality_gap(s)])
    points, cis = _bootstrap(matrices, funcs, reps=reps, random_state=np.random.RandomState(seed))
    top = max(1.0, max(float(m.max()) for m in matrices.values()))
    taus = np.linspace(min(0.0, min(float(m.min()) for m in matrices.values())), top, 81)
    profile = lambda s: np.array([np.mean(s > t) for t in taus])  # rliable's score distribution
    profiles, profile_cis = _bootstrap(matrices, profile, reps=max(reps // 4, 200),
                                                       random_state=np.random.RandomState(seed + 1))
    return points, cis, notes, taus, (profiles, profile_cis), matrices


# ---------------------------------------------------------------------------------------------- output


def _f(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def write_report(root: Path, out: Path, groups: list[Group], refs: dict | None, last: int, source: str, reps: int,
                 seed: int, curves: bool = True) -> str:
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# Report: {root}", ""]
    what = {"auto": f"eval.json's mean where present, else the mean of the last {last} training episodes",
            "eval": "eval.json's mean", "train": f"the mean of the last {last} training episodes (progress.csv)"}
    lines += [f"Final return per run: {what[source]}. Over seeds: mean, standard deviation (ddof=1), 95% stratified "
              f"bootstrap CI of the mean and the interquartile mean (IQM) with its CI (rliable, {reps} resamples).",
              "", "| script | env | variant | seeds | source | mean | std | 95% CI | IQM | IQM 95% CI | left out |",
              "| --- | --- | --- | ---: | --- | ---: | ---: | --- | ---: | --- | ---: |"]
    stats = {}
    for g in groups:
        if not g.runs:
            lines.append(f"| {g.script} | {g.env_id} | {g.variant} | 0 | - | - | - | - | - | - | {g.left_out} |")
            continue
        s = stats[(g.script, g.env_id, g.variant)] = group_stats(g.scores, reps, seed)
        lines.append(f"| {g.script} | {g.env_id} | {g.variant} | {s['n']} | {g.source} | {_f(s['mean'])} | "
                     f"{_f(s['std'])} | [{_f(s['mean_lo'])}, {_f(s['mean_hi'])}] | {_f(s['iqm'])} | "
                     f"[{_f(s['iqm_lo'])}, {_f(s['iqm_hi'])}] | {g.left_out} |")
    lines.append("")
    if refs:
        from rliable import metrics

        lines += ["## Normalised scores", "",
                  "(score - random) / (human - random), from " + ", ".join(
                      f"{e}: random {lo:g}, human {hi:g}" for e, (lo, hi) in sorted(refs.items())) + ".", "",
                  "| script | env | variant | mean | IQM |", "| --- | --- | --- | ---: | ---: |"]
        for g in groups:
            if g.env_id in refs and g.runs:
                z = normalise(g.scores, refs[g.env_id])
                lines.append(f"| {g.script} | {g.env_id} | {g.variant} | {_f(float(z.mean()))} | "
                             f"{_f(float(metrics.aggregate_iqm(z)))} |")
        points, cis, notes, taus, prof, matrices = aggregates(groups, refs, reps, seed)
        if points:
            lines += ["", "## Aggregates across tasks (normalised)", "",
                      "| script variant | tasks | seeds per task | mean [95% CI] | median [95% CI] | IQM [95% CI] | "
                      "optimality gap [95% CI] |", "| --- | --- | ---: | --- | --- | --- | --- |"]
            for algo in points:
                p, c = points[algo], cis[algo]
                cells = " | ".join(f"{_f(p[i])} [{_f(c[0][i])}, {_f(c[1][i])}]" for i in range(4))
                tasks, n = notes[algo]
                lines.append(f"| {algo} | {', '.join(tasks)} | {n} | {cells} |")
            _aggregate_figures(out, points, cis, taus, prof)
            lines += ["", "![aggregates](aggregates.png)", "", "Performance profile: the fraction of runs (all "
                      "tasks) whose normalised score is above tau, with its 95% band.", "",
                      "![profiles](profiles.png)"]
        lines.append("")
    if curves:
        names = _curves(out, groups)
        if names:
            lines += ["## Curves", "", "Training return (progress.csv) against env steps: the mean over seeds and "
                      "the min-max band (benchmarks/plot.py).", ""]
            lines += [f"![{env}]({name})" for env, name in names]
            lines.append("")
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    return text


def _aggregate_figures(out: Path, points, cis, taus, prof) -> None:
    plot = _plot_module()
    names = ["Mean", "Median", "IQM", "Optimality gap"]
    from matplotlib.ticker import MaxNLocator

    fig, axes = plot.figure(4, width=3.6, height=1.6 + 0.4 * len(points))
    algos = list(points)
    for i, ax in enumerate(axes):
        for j, algo in enumerate(algos):
            lo, hi = cis[algo][0][i], cis[algo][1][i]
            ax.barh(j, hi - lo, left=lo, height=0.6, alpha=0.6)
            ax.plot([points[algo][i]] * 2, [j - 0.3, j + 0.3], color="k", lw=1.5)
        ax.set_yticks(range(len(algos)), algos if i == 0 else [""] * len(algos), fontsize=8)
        ax.set_title(names[i], fontsize=10)
        ax.xaxis.set_major_locator(MaxNLocator(4))
    plot.save(fig, out / "aggregates.png", xlabel="normalised score", ylabel="")
    profiles, bands = prof
    fig, axes = plot.figure(1)
    for algo in algos:
        (line,) = axes[0].plot(taus, profiles[algo], label=algo)
        axes[0].fill_between(taus, bands[algo][0], bands[algo][1], color=line.get_color(), alpha=0.2, lw=0)
    plot.save(fig, out / "profiles.png", xlabel="normalised score tau", ylabel="fraction of runs with score > tau")


def _curves(out: Path, groups: list[Group]) -> list[tuple[str, str]]:
    plot = _plot_module()
    by_env: dict[str, list[Group]] = {}
    for g in groups:
        if g.runs:
            by_env.setdefault(g.env_id, []).append(g)
    names = []
    for env, gs in sorted(by_env.items()):
        fig, axes = plot.figure(1)
        drawn = False
        for g in gs:
            runs = []
            for r in g.runs:
                try:
                    runs.append(plot.read_run(r.folder)[2])
                except (ValueError, OSError, KeyError):
                    continue
            runs = [pts for pts in runs if pts]
            if runs:
                plot.curve(axes[0], f"{g.script} {g.variant}", runs)
                drawn = True
        if drawn:
            axes[0].set_title(env)
            name = f"curves_{_safe(env)}.png"
            plot.save(fig, out / name, ylabel="return (mean of the episodes per progress row)")
            names.append((env, name))
        else:
            import matplotlib.pyplot as plt

            plt.close(fig)
    return names


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", type=Path, help="an experiment root (experiments/launch.py) or any folder of runs")
    p.add_argument("--out", type=Path, default=None, help="folder for report.md and PNGs (default EXPERIMENT/report)")
    p.add_argument("--source", choices=["auto", "eval", "train"], default="auto",
                   help="final return from eval.json (auto: where present) or the last training episodes")
    p.add_argument("--last-episodes", type=int, default=100, help="training episodes behind a train score")
    p.add_argument("--reference", type=Path, default=None,
                   help='JSON {"ENV": {"random": R, "human": H}} for normalised scores and aggregates')
    p.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    p.add_argument("--include-unfinished", action="store_true", help="also runs the launcher has not finished")
    p.add_argument("--no-curves", action="store_true", help="skip the curve figures")
    a = p.parse_args(argv)
    if not a.experiment.is_dir():
        p.exit(2, f"error: {a.experiment} is not a folder\n")
    if a.last_episodes < 1 or a.reps < 10:
        p.exit(2, "error: --last-episodes must be at least 1 and --reps at least 10\n")
    try:
        refs = load_reference(a.reference) if a.reference else None
    except ValueError as e:
        p.exit(2, f"error: {e}\n")
    groups = collect(a.experiment, a.source, a.last_episodes, a.include_unfinished)
    if not groups:
        p.exit(2, f"error: no run folders (progress.csv or eval.json) under {a.experiment}\n")
    out = a.out or a.experiment / "report"
    print(write_report(a.experiment, out, groups, refs, a.last_episodes, a.source, a.reps, a.seed,
                       curves=not a.no_curves))
    return 0


if __name__ == "__main__":
    sys.exit(main())
