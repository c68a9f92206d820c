"""Tables and figures of an experiment's results: per script x env x variant, the final return over seeds, with
rliable's (Agarwal et al. 2021) stratified-bootstrap confidence intervals, interquartile mean, normalised
scores, aggregates across tasks and performance profiles.

    python experiments/report.py runs/cartpole                               # report.md + PNGs in .../report
    python experiments/report.py runs/atari --reference refs.json --out atari-report --last-episodes 100
    python experiments/report.py runs/                                       # any folder of run folders

Runs. Every run folder under EXPERIMENT (one with a ``progress.csv`` or ``eval.json``; ``.stale``/``.submitit``
left out) is grouped by script, env id and variant: from the ``launch.json`` that ``experiments/launch.py``
writes, else from ``config.json`` (variant ``base``). Runs that the launcher has not finished (``state`` other
than ``done``) are left out unless ``--include-unfinished``. So is every run that cannot be read (a damaged
``launch.json``, ``config.json``, ``eval.json`` or ``progress.csv``: not JSON, a field of the wrong type, a return
that is not a number) or cannot be scored (no evaluation and no finished training episode, a score that is not
finite): a left-out run never counts as a seed. Each table row says how many of its runs were left out, and the
report's last section lists every left-out run folder with the reason.

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
``experiments/plot.py``'s mean and min-max band over seeds, one figure per env id. Written to ``--out`` (default
``EXPERIMENT/report``): ``report.md``, ``curves_<env>.png``, ``aggregates.png``, ``profiles.png``; ``report.md``
is printed too.

Bad arguments (a missing folder or one this user may not read, ``--reps`` outside [10, 100000], ``--seed`` outside
[0, 2**31), an ``--out`` where no folder can be made: under a file, under /proc, in a folder this user may not
write, a damaged ``--reference``) are one ``error:`` line and exit 2, before anything is written. Ctrl-C or
SIGTERM: one line and exit 130 (``experiments.flags.command``).
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C and SIGTERM wait until it has imported: experiments.flags.command (one line)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    if sys.path[0] and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        sys.path[0] = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # modules import once, as experiments.*

import argparse
import json
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from experiments import plot
from experiments.flags import Parser, check_creatable, command
from experiments.grid import LaunchError
from experiments.records import Unusable, json_object
from shared.progress import read_rows

SKIP_DIRS = {".stale", ".submitit", "report"}


@dataclass
class RunResult:
    folder: Path
    script: str | None  # None: not known (its launch.json and config.json both unusable)
    env_id: str
    variant: str
    seed: int | None
    state: str | None  # the launcher's, None without launch.json
    score: float | None = None
    source: str | None = None  # "eval" or "train"
    episodes: int = 0  # episodes behind a train score (eval: the evaluation's)
    problem: str | None = None  # why it has no score: it is then listed as left out, never counted as a seed


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
    """``train_score`` over rows already read (``shared.progress.read_rows``), e.g. those up to some step. A
    ``return_mean`` that is not a number raises ``Unusable``."""
    chunks, prev = [], 0
    for r in rows:
        try:
            episodes = int(float(r["episodes"]))
        except (KeyError, TypeError, ValueError, OverflowError):
            continue
        n = episodes - prev
        prev = episodes
        if n > 0 and r.get("return_mean") not in (None, ""):
            try:
                chunks.append((n, float(r["return_mean"])))
            except ValueError:
                raise Unusable(
                    f"return_mean {r['return_mean']!r:.40} at step {r.get('global_step')} is not a number"
                ) from None
    total, weight = 0.0, 0
    for n, mean in reversed(chunks):
        take = min(n, last - weight)
        total += take * mean
        weight += take
        if weight >= last:
            break
    return (total / weight if weight else None), weight


def _read(path: Path) -> dict:
    """The JSON object in ``path``; ``{}`` when there is none; ``Unusable`` naming the file when it is damaged."""
    try:
        return json_object(path)
    except Unusable as e:
        raise Unusable(f"{path.name}: {e}") from None


def _typed(data: dict, key: str, kind: type | tuple[type, ...], name: str) -> object:
    value = data.get(key)
    if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
        raise Unusable(f"{name}: {key} is {json.dumps(value, default=str)[:40]}, not {kind_name(kind)}")
    return value


def kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {"str": "a string", "int": "an integer", "dict": "an object", "list": "a list"}.get(k.__name__, k.__name__)
        for k in kinds
    )


def read_result(folder: Path, source: str, last: int) -> RunResult:
    """One run folder's identity and score; a run it cannot read or score has ``problem`` set (the reason)."""
    res = RunResult(folder, None, "?", "base", None, None)
    try:
        launch = _read(folder / "launch.json")
        config = _read(folder / "config.json")
        args = _typed(config, "args", dict, "config.json") or {}
        variant = _typed(launch, "variant", dict, "launch.json") or {}
        res.script = _typed(launch, "script", str, "launch.json") or _typed(config, "script", str, "config.json")
        res.env_id = _typed(launch, "env_id", str, "launch.json") or _typed(args, "env_id", str, "config.json args")
        res.env_id = res.env_id or "?"
        res.variant = _typed(variant, "name", str, "launch.json variant") or "base"
        res.seed = (
            _typed(launch, "seed", int, "launch.json") if "seed" in launch else _typed(args, "seed", int, "config.json args")
        )
        res.state = _typed(launch, "state", str, "launch.json")
        res.script = res.script or folder.name  # a run folder made without launch.json or config.json
        res.score, res.source, res.episodes = score_of(folder, source, last)
        if not math.isfinite(res.score):
            res.problem = f"its {res.source} score is {res.score} (a return that is not finite)"
            res.score = None
    except (Unusable, OSError) as e:  # OSError: a file of a folder this user may not enter
        res.problem, res.score = str(e), None
    return res


def score_of(folder: Path, source: str, last: int) -> tuple[float, str, int]:
    """(score, source, episodes) of a run folder; ``Unusable`` with the reason when it has none."""
    ev = _read(folder / "eval.json") if source in ("auto", "eval") else {}
    returns = ev.get("returns")
    if returns is not None and not (
        isinstance(returns, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in returns)
    ):
        raise Unusable("eval.json: returns is not a list of numbers")
    if returns:
        return float(np.mean(returns)), "eval", len(returns)
    if source == "eval":
        raise Unusable("no evaluation returns (eval.json) and --source eval")
    if not (folder / "progress.csv").is_file():
        raise Unusable("no eval.json returns and no progress.csv")
    try:
        score, n = train_score(folder / "progress.csv", last)
    except OSError as e:
        raise Unusable(f"progress.csv: cannot be read ({e.strerror or e})") from None
    except Unusable as e:
        raise Unusable(f"progress.csv: {e}") from None
    if score is None:
        raise Unusable("progress.csv: no training episode finished")
    return score, "train", n


def find_runs(root: Path) -> list[Path]:
    found = set()
    for name in ("progress.csv", "eval.json", "launch.json"):
        for p in root.rglob(name):
            if not SKIP_DIRS & set(p.relative_to(root).parts[:-1]):
                found.add(p.parent)
    return sorted(found)


def survey(root: Path, source: str, last: int, include_unfinished: bool) -> tuple[list[Group], list[RunResult]]:
    """The groups of scored runs, and every run left out (its ``problem`` says why), by folder."""
    groups: dict[tuple[str, str, str], Group] = {}
    left_out = []
    for folder in find_runs(root):
        res = read_result(folder, source, last)
        if res.problem is None and res.state not in (None, "done") and not include_unfinished:
            res.problem = f"not finished (state {res.state}; --include-unfinished counts it)"
        if res.script is not None:
            g = groups.setdefault((res.script, res.env_id, res.variant), Group(res.script, res.env_id, res.variant))
            if res.problem is None:
                g.runs.append(res)
            else:
                g.left_out += 1
        if res.problem is not None:
            left_out.append(res)
    for g in groups.values():
        g.runs.sort(key=lambda r: (r.seed is None, r.seed if r.seed is not None else 0, str(r.folder)))
    return [groups[k] for k in sorted(groups)], left_out


def collect(root: Path, source: str, last: int, include_unfinished: bool) -> list[Group]:
    """The groups of ``survey`` (each counts its runs left out; ``survey`` also says why)."""
    return survey(root, source, last, include_unfinished)[0]


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
    out = {
        "n": len(x),
        "mean": float(x.mean()),
        "std": float(x.std(ddof=1)) if len(x) > 1 else math.nan,
        "iqm": float(metrics.aggregate_iqm(x)),
    }
    if len(x) > 1 and np.ptp(x) > 0:
        points, cis = _bootstrap(
            {"g": x},
            lambda s: np.array([metrics.aggregate_mean(s), metrics.aggregate_iqm(s)]),
            reps=reps,
            random_state=np.random.RandomState(seed),
        )
        (out["mean_lo"], out["iqm_lo"]), (out["mean_hi"], out["iqm_hi"]) = cis["g"].tolist()
    elif len(x) > 1:  # all equal: every resample is the point
        out.update(mean_lo=out["mean"], mean_hi=out["mean"], iqm_lo=out["iqm"], iqm_hi=out["iqm"])
    else:  # one seed: nothing to resample, so no interval (a [x, x] would claim a certainty one run cannot give)
        out.update(mean_lo=math.nan, mean_hi=math.nan, iqm_lo=math.nan, iqm_hi=math.nan)
    return out


def load_reference(path: Path) -> dict[str, tuple[float, float]]:
    """``--reference``: env id -> (random, human) finite scores, distinct; ``ValueError`` naming what is wrong."""
    try:
        data = json_object(path) if path.is_file() else None
    except Unusable as e:
        raise ValueError(f"--reference {path}: {e}") from None
    if not data:
        raise ValueError(f"--reference {path}: expected a JSON file holding an object of env id -> {{random, human}}")
    refs = {}
    for env, r in data.items():
        if not isinstance(r, dict) or "random" not in r:
            raise ValueError(f"--reference {path}: {env} needs a 'random' score")
        top = next((r[k] for k in ("human", "reference", "max") if k in r), None)
        try:
            lo, hi = float(r["random"]), float(top)
        except (TypeError, ValueError):
            raise ValueError(f"--reference {path}: {env} needs numbers for 'random' and 'human' (or 'reference')") from None
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo == hi:
            raise ValueError(
                f"--reference {path}: {env} needs finite 'random' and 'human' (or 'reference') scores that differ"
            )
        refs[env] = (lo, hi)
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
    funcs = lambda s: np.array(
        [metrics.aggregate_mean(s), metrics.aggregate_median(s), metrics.aggregate_iqm(s), metrics.aggregate_optimality_gap(s)]
    )
    points, cis = _bootstrap(matrices, funcs, reps=reps, random_state=np.random.RandomState(seed))
    top = max(1.0, max(float(m.max()) for m in matrices.values()))
    taus = np.linspace(min(0.0, min(float(m.min()) for m in matrices.values())), top, 81)
    profile = lambda s: np.array([np.mean(s > t) for t in taus])  # rliable's score distribution
    profiles, profile_cis = _bootstrap(
        matrices, profile, reps=max(reps // 4, 200), random_state=np.random.RandomState(seed + 1)
    )
    return points, cis, notes, taus, (profiles, profile_cis), matrices


# ---------------------------------------------------------------------------------------------- output


def _f(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def write_report(
    root: Path,
    out: Path,
    groups: list[Group],
    refs: dict | None,
    last: int,
    source: str,
    reps: int,
    seed: int,
    curves: bool = True,
    left_out: Sequence[RunResult] = (),
) -> str:
    lines = [f"# Report: {root}", ""]
    what = {
        "auto": f"eval.json's mean where present, else the mean of the last {last} training episodes",
        "eval": "eval.json's mean",
        "train": f"the mean of the last {last} training episodes (progress.csv)",
    }
    lines += [
        f"Final return per run: {what[source]}. Over seeds: mean, standard deviation (ddof=1), 95% stratified "
        f"bootstrap CI of the mean and the interquartile mean (IQM) with its CI (rliable, {reps} resamples).",
        "",
        "| script | env | variant | seeds | source | mean | std | 95% CI | IQM | IQM 95% CI | left out |",
        "| --- | --- | --- | ---: | --- | ---: | ---: | --- | ---: | --- | ---: |",
    ]
    stats = {}
    for g in groups:
        if not g.runs:
            lines.append(f"| {g.script} | {g.env_id} | {g.variant} | 0 | - | - | - | - | - | - | {g.left_out} |")
            continue
        s = stats[(g.script, g.env_id, g.variant)] = group_stats(g.scores, reps, seed)
        lines.append(
            f"| {g.script} | {g.env_id} | {g.variant} | {s['n']} | {g.source} | {_f(s['mean'])} | "
            f"{_f(s['std'])} | [{_f(s['mean_lo'])}, {_f(s['mean_hi'])}] | {_f(s['iqm'])} | "
            f"[{_f(s['iqm_lo'])}, {_f(s['iqm_hi'])}] | {g.left_out} |"
        )
    lines.append("")
    if refs:
        from rliable import metrics

        lines += [
            "## Normalised scores",
            "",
            "(score - random) / (human - random), from "
            + ", ".join(f"{e}: random {lo:g}, human {hi:g}" for e, (lo, hi) in sorted(refs.items()))
            + ".",
            "",
            "| script | env | variant | mean | IQM |",
            "| --- | --- | --- | ---: | ---: |",
        ]
        for g in groups:
            if g.env_id in refs and g.runs:
                z = normalise(g.scores, refs[g.env_id])
                lines.append(
                    f"| {g.script} | {g.env_id} | {g.variant} | {_f(float(z.mean()))} | "
                    f"{_f(float(metrics.aggregate_iqm(z)))} |"
                )
        points, cis, notes, taus, prof, matrices = aggregates(groups, refs, reps, seed)
        if points:
            lines += [
                "",
                "## Aggregates across tasks (normalised)",
                "",
                "| script variant | tasks | seeds per task | mean [95% CI] | median [95% CI] | IQM [95% CI] | "
                "optimality gap [95% CI] |",
                "| --- | --- | ---: | --- | --- | --- | --- |",
            ]
            for algo in points:
                p, c = points[algo], cis[algo]
                cells = " | ".join(f"{_f(p[i])} [{_f(c[0][i])}, {_f(c[1][i])}]" for i in range(4))
                tasks, n = notes[algo]
                lines.append(f"| {algo} | {', '.join(tasks)} | {n} | {cells} |")
            _aggregate_figures(out, points, cis, taus, prof)
            lines += [
                "",
                "![aggregates](aggregates.png)",
                "",
                "Performance profile: the fraction of runs (all "
                "tasks) whose normalised score is above tau, with its 95% band.",
                "",
                "![profiles](profiles.png)",
            ]
        lines.append("")
    if curves:
        names = _curves(out, groups)
        if names:
            lines += [
                "## Curves",
                "",
                "Training return (progress.csv) against env steps: the mean over seeds and "
                "the min-max band (experiments/plot.py).",
                "",
            ]
            lines += [f"![{env}]({name})" for env, name in names]
            lines.append("")
    if left_out:
        lines += ["## Runs left out", "", f"{len(left_out)} run folder(s) not counted as seeds, each with the reason:", ""]
        for r in left_out:
            try:
                rel = r.folder.relative_to(root)
            except ValueError:
                rel = r.folder
            lines.append(f"- `{rel}`: {r.problem}")
        lines.append("")
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)  # only now (or by the first figure): a Ctrl-C before leaves nothing
    (out / "report.md").write_text(text)
    return text


def _aggregate_figures(out: Path, points, cis, taus, prof) -> None:
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
                except (ValueError, OSError):  # its score came from eval.json: no curve to draw
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


MAX_REPS = 100_000  # rliable holds reps x runs resamples: 10^5 is a few hundred MB at most, 50x the default
SEED_RANGE = 2**31  # numpy's RandomState takes [0, 2**32); the profiles' bootstrap uses seed + 1


def main(argv: Sequence[str] | None = None) -> int:
    p = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", type=Path, help="an experiment root (experiments/launch.py) or any folder of runs")
    p.add_argument("--out", type=Path, default=None, help="folder for report.md and PNGs (default EXPERIMENT/report)")
    source_help = "final return from eval.json (auto: where present) or the last training episodes"
    p.add_argument("--source", choices=["auto", "eval", "train"], default="auto", help=source_help)
    p.add_argument("--last-episodes", type=int, default=100, help="training episodes behind a train score")
    reference_help = 'JSON {"ENV": {"random": R, "human": H}} for normalised scores and aggregates'
    p.add_argument("--reference", type=Path, default=None, help=reference_help)
    p.add_argument("--reps", type=int, default=2000, help=f"bootstrap resamples (10 to {MAX_REPS:,})")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (0 to 2**31 - 1)")
    p.add_argument("--include-unfinished", action="store_true", help="also runs the launcher has not finished")
    p.add_argument("--no-curves", action="store_true", help="skip the curve figures")
    a = p.parse_args(argv)
    try:
        if not a.experiment.is_dir():
            p.error(f"{a.experiment} is not a folder")
        os.listdir(a.experiment)  # one this user may not read is refused, not reported as a folder without runs
    except OSError as e:
        p.error(f"{a.experiment}: cannot be read ({e.strerror or e})")
    if a.last_episodes < 1:
        p.error(f"--last-episodes must be at least 1, got {a.last_episodes}")
    if not 10 <= a.reps <= MAX_REPS:
        p.error(f"--reps must be in [10, {MAX_REPS}], got {a.reps}")
    if not 0 <= a.seed < SEED_RANGE:
        p.error(f"--seed must be in [0, 2**31), got {a.seed}")
    out = a.out or a.experiment / "report"
    try:  # where report.md and the PNGs go: a folder, or a path where one can be made (nothing made here)
        check_creatable(out, f"--out {out}")
        refs = load_reference(a.reference) if a.reference else None
    except (LaunchError, ValueError) as e:
        p.error(str(e))
    groups, left_out = survey(a.experiment, a.source, a.last_episodes, a.include_unfinished)
    if not groups and not left_out:
        p.error(f"no run folders (progress.csv, eval.json or launch.json) under {a.experiment}")
    text = write_report(a.experiment, out, groups, refs, a.last_episodes, a.source, a.reps, a.seed, not a.no_curves, left_out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(command(main))
