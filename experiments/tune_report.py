"""The results of a study: ``{root}/tune-report`` with ``report.md`` (printed), ``trials.csv``, ``importances.json``
and Optuna's plots.

Guarantees
- ``report.md`` names the study, its storage, script, env ids, seeds, how a trial is valued, the search space and
  the flags of every run; counts the trials by state (of ``--trials``); gives the best complete trial's flags as
  a ready command line and as a launcher command re-running them beside the defaults on fresh seeds; the
  PED-ANOVA importances (with two complete trials or more); and every trial, best first, with its state (the step
  a pruned one stopped at, a failed one's error line), value and flags.
- ``trials.csv`` has one row per trial (Optuna's ``trials_dataframe``); the plots (history, parallel coordinates,
  slices, intermediate values, importances) are the ones Optuna can draw for this study: one it cannot is left
  out, never an error.
- ``report_only`` (``tune.py ROOT --report``) loads the study from the storage the setup names (checked to exist
  before: nothing is created but ``tune-report/``); a storage without the study is one ``LaunchError``.
"""

from __future__ import annotations

import contextlib
import math
import shlex
import warnings
from pathlib import Path

from experiments.grid import LaunchError
from experiments.records import write_json
from experiments.study import Setup, make_storage


def best_commands(st: Setup, best) -> tuple[str, str]:
    script = Path(st.script)
    with contextlib.suppress(ValueError):
        script = script.relative_to(Path.cwd())
    flags = shlex.split(best.user_attrs.get("flags", ""))
    one = shlex.join(["python", str(script), *st.common, *flags])
    seeds = [max(st.seeds) + 100 + i for i in range(max(len(st.seeds), 5))]
    env = ["--env-ids", *[e for e in st.env_ids if e]] if any(st.env_ids) else []
    rerun = ["python", "experiments/launch.py", f"{st.root}-rerun", "--scripts", script.stem, *env]
    rerun += ["--seeds", *map(str, seeds), "--level", f"best:{shlex.join(flags)}", "default:", "--", *st.common]
    return one, shlex.join(rerun)


def write_report(st: Setup, study, storage_url: str) -> Path:
    """report.md, trials.csv, importances.json and the plots in ``{root}/tune-report``; report.md is printed."""
    import optuna
    from optuna.trial import TrialState

    out = st.root / "tune-report"
    out.mkdir(parents=True, exist_ok=True)
    trials = study.get_trials(deepcopy=False)
    columns = "number value state params user_attrs intermediate_values datetime_start datetime_complete duration"
    df = study.trials_dataframe(attrs=tuple(columns.split()))  # Optuna's columns without system_attrs
    df.to_csv(out / "trials.csv", index=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    lines = [
        f"# Tune {st.study_name}",
        "",
        f"Storage `{storage_url}`; script `{Path(st.script).stem}`, env ids "
        f"{', '.join(str(e) for e in st.env_ids)}, seeds {', '.join(map(str, st.seeds))}; value: the "
        f"{st.aggregate} of the runs' normalised scores ({st.score}, targets "
        f"{', '.join(f'{k} {lo}:{hi}' for k, (lo, hi) in st.targets.items()) or 'none: raw scores'}).",
        "",
        f"Search: {' '.join(p.spec() for p in st.space)}. Flags of every run: `{shlex.join(st.common)}`.",
        "",
    ]
    counts = {s: sum(t.state == s for t in trials) for s in TrialState}
    lines += [", ".join(f"{n} {s.name.lower()}" for s, n in counts.items() if n) + f" (of --trials {st.trials}).", ""]
    importances: dict[str, float] = {}
    if done:
        best = study.best_trial
        one, rerun = best_commands(st, best)
        lines += [
            f"Best: trial {best.number}, value {best.value:.4g}: `{best.user_attrs.get('flags', '')}`",
            "",
            "```bash",
            one + "   # add --env-id and --seed",
            "# the best flags beside the defaults, fresh seeds:",
            rerun,
            "```",
            "",
        ]
        if len(done) >= 2 and st.space:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with contextlib.suppress(Exception):
                    importances = optuna.importance.get_param_importances(
                        study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
                    )
            write_json(out / "importances.json", importances)
            if importances:
                lines += ["Importances (PED-ANOVA): " + ", ".join(f"{k} {v:.3f}" for k, v in importances.items()), ""]
    lines += ["| trial | state | value | flags |", "| --- | --- | --- | --- |"]
    key = lambda t: (t.value is None, -(t.value or 0.0) if t.state == TrialState.COMPLETE else math.inf, t.number)
    for t in sorted(trials, key=key):
        value = f"{t.value:.4g}" if t.value is not None else "-"
        extra = (f" (at step {t.user_attrs['pruned_at_step']})" if "pruned_at_step" in t.user_attrs else "") + (
            f" {t.user_attrs['error']}" if t.state == TrialState.FAIL and t.user_attrs.get("error") else ""
        )
        lines.append(f"| {t.number} | {t.state.name.lower()}{extra} | {value} | `{t.user_attrs.get('flags', '')}` |")
    plots = _plots(study, out, len(done))
    if plots:
        lines += ["", " ".join(f"![{p}]({p})" for p in plots)]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    print(
        text + f"\nwritten to {out}/ (report.md, trials.csv{', importances.json' if importances else ''}"
        f"{', ' + ', '.join(plots) if plots else ''})"
    )
    return out


def _plots(study, out: Path, n_done: int) -> list[str]:
    if n_done < 1:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis
    from optuna.importance import PedAnovaImportanceEvaluator

    made = []
    figures = [
        ("history.png", lambda: vis.plot_optimization_history(study)),
        ("parallel.png", lambda: vis.plot_parallel_coordinate(study)),
        ("slices.png", lambda: vis.plot_slice(study)),
    ]
    if any(t.intermediate_values for t in study.get_trials(deepcopy=False)):  # else Optuna warns and draws nothing
        figures.append(("intermediate.png", lambda: vis.plot_intermediate_values(study)))
    if n_done >= 2:
        figures.append(("importances.png", lambda: vis.plot_param_importances(study, evaluator=PedAnovaImportanceEvaluator())))
    for name, make in figures:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ax = make()
                fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
                fig.set_size_inches(max(fig.get_size_inches()[0], 8), max(fig.get_size_inches()[1], 5))
                fig.tight_layout()
                fig.savefig(out / name, dpi=100)
                made.append(name)
            except Exception:  # a plot Optuna cannot draw for this study (no intermediate values, one parameter)
                pass
            finally:
                plt.close("all")
    return made


def report_only(st: Setup) -> int:
    import optuna

    storage, url = make_storage(st.storage, st.root)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=st.study_name, storage=storage)
    except KeyError:
        raise LaunchError(f"no study {st.study_name!r} in {url}") from None
    write_report(st, study, url)
    return 0
