"""The GPU check's verdict and its one screen: what passed (``all_passed``: everything asked for ran and passed),
the first error lines of what failed, every figure with its command and ratios, the race's and long run's lines;
and the two readings of a log it needs (``last_float``, ``first_error``). Plain Python: no torch, no subprocess."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.gpu import race as R
from benchmarks.gpu.figures import BESIDE_SB3

MAX_FAILURES = 12  # listed with their first error lines in the summary (all of them in results.json)


def last_float(text: str) -> float | None:
    for line in reversed(text.strip().splitlines()):
        try:
            return float(line.strip())
        except ValueError:
            continue
    return None


def first_error(text: str, n: int = 2) -> str:
    """The last ``n`` lines that read as an error (a traceback's end), else the last non-empty lines."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if re.match(r"^([\w.]*(Error|Exception|Interrupt)\b(:|$)|error:)", ln.strip())]
    return "\n".join((errs or lines)[-n:])[:400]


def rank(outcome: str) -> int:
    return {"passed": 0, "skipped": 1, "failed": 2, "error": 3}.get(outcome, 0)


def all_passed(r: dict) -> bool:
    if r["status"] != "finished" or any(c["ok"] is False for c in r["checks"]):
        return False
    for p in r["parts"].values():
        if str(p.get("state", "")).startswith(("cut", "pytest exit")):
            return False
        tests = p.get("tests", {})
        if any(t["outcome"] in ("failed", "error") for t in tests.values()):
            return False
        if p.get("collected") and set(p["collected"]) - set(tests):
            return False
    for item in r.get("race", {}).values():
        for run in item.get("runs", {}).values():
            if not run["state"].startswith(("done", "skipped")) or (
                run["state"] == "done" and run.get("median") is None and run.get("value") is None
            ):
                return False
    if r.get("long") and r["long"].get("state") != "done":
        return False
    return all(f.get("value") is not None or f["state"].startswith("skipped") for f in r["figures"].values())


def versions_line(v: dict) -> str:
    if not v.get("torch"):
        return "versions unknown"
    gpu = (
        f"{v.get('gpu')} (sm {v.get('capability')}, {v.get('gpu_memory_gib')} GiB, {v.get('gpus')} GPU), "
        f"driver {v.get('driver', '').split(',')[-1].strip() or '?'}, "
        if v.get("cuda")
        else "no CUDA device, "
    )
    return (
        f"{gpu}torch {v['torch']}, CUDA {v.get('cuda_build')}, cuDNN {v.get('cudnn', '-')}, "
        f"Python {v.get('python')}, {v.get('cores')} cores" + cpu_detail(v)
    )


def cpu_detail(v: dict) -> str:
    """`` (8 physical, at most 4.0 by the cgroup's quota, os.cpu_count() 32; MODEL)``: what the cores counted may
    really give the envs (``os.cpu_count()``, shown where it differs: the threads of the race's envs item); empty for
    a results file written before the probe read these."""
    parts = [f"{v['physical_cores']} physical"] if v.get("physical_cores") else []
    if "cpu_quota" in v:
        q = v["cpu_quota"]
        parts.append(
            "no cgroup quota" if q == "none" else "cgroup quota unread" if q is None else f"at most {q} by the cgroup's quota"
        )
    if v.get("cpu_count") and v["cpu_count"] != v.get("cores"):
        parts.append(f"os.cpu_count() {v['cpu_count']}")
    detail = ", ".join(parts) + (f"; {v['cpu_model']}" if v.get("cpu_model") else "")
    return f" ({detail})" if detail else ""


def counts_line(p: dict) -> str:
    tests = p.get("tests", {})
    by = {o: sum(t["outcome"] == o for t in tests.values()) for o in ("passed", "failed", "error", "skipped")}
    not_run = len(set(p.get("collected", [])) - set(tests))
    earlier = sum(bool(t.get("earlier")) for t in tests.values())
    parts = [f"{by['passed']} passed" + (f" ({earlier} in the earlier run)" if earlier else ""), f"{by['failed']} failed"]
    parts += [f"{by[k]} {k}" for k in ("error", "skipped") if by[k]]
    parts += [f"{not_run} not run"] if not_run else []
    return ", ".join(parts) + f"; {p.get('state')}" + (f", {p['wall_s']} s" if "wall_s" in p else "")


def ratio(name: str, figs: dict) -> str:
    """A cpu figure against the same on cuda ("gpu 2.5x": the GPU's figure is 2.5 times this one); ours on cuda
    against Stable-Baselines3's on cuda ("1.8x sb3")."""
    value = (figs.get(name) or {}).get("value")
    algo = name.split("-")[0]
    other, label = (
        (name[:-4] + "-cuda", "gpu {:.2f}x")
        if name.endswith("-cpu")
        else (f"sb3-{algo}-cuda", "{:.2f}x sb3")
        if name in BESIDE_SB3
        else (None, "")
    )
    base = (figs.get(other) or {}).get("value")
    if not value or not base:
        return ""
    return label.format(base / value if name.endswith("-cpu") else value / base)


def summary(r: dict, out: Path) -> str:
    """One screen: the node, each part's outcome with the first lines of every failure, every figure with its
    command; what was cut or not run says so."""
    lines = [
        f"GPU check {r['started']}: {r['status']}, {r.get('elapsed_s', 0):.0f} of {r['budget_s']:.0f} s "
        f"({' '.join(r['argv'])})",
        "node: " + versions_line(r["node"]),
    ]
    inst = r.get("install", {})
    if inst.get("state") not in (None, "off"):
        lines.append(
            f"install: {inst['state']}"
            + (f" {', '.join(inst['installed'])}" if inst.get("installed") else "")
            + (f"; kept the node's own {', '.join(inst['kept'])}" if inst.get("kept") else "")
        )
    checks = r.get("checks", [])
    bad = [c for c in checks if c["ok"] is False]
    left_out = "checks" not in r.get("parts_asked", ["checks"])
    lines.append(
        ("checks: left out (torch's versions and the CUDA checks only), " if left_out else "checks: ")
        + f"{sum(c['ok'] is True for c in checks)} passed, {len(bad)} failed"
        + "".join(f"\n  FAILED {c['check']}: {c['detail']}" for c in bad)
    )
    opt = [c for c in checks if c["ok"] is None]
    lines += [f"  {c['check']}: {c['detail']}" for c in opt]
    for name, p in r.get("parts", {}).items():
        if name in ("figures", "race", "long"):  # their own lines below
            continue
        extra = p.get("cmd", "").split("console_output_style=classic")[-1].strip()
        head = (
            f"{name} tests (python -m pytest -m {name} {extra}".rstrip() + f", {p.get('workers', 1)} worker(s))"
            if "cmd" in p
            else f"{name} tests"
        )
        lines.append(
            f"{head}: {counts_line(p) if 'tests' in p and 'cmd' in p else p.get('state')}"
            + (f" [{p['note']}]" if p.get("note") else "")
        )
        bad = [(i, t) for i, t in p.get("tests", {}).items() if t["outcome"] in ("failed", "error")]
        for i, t in bad[:MAX_FAILURES]:
            err = t["error"].replace("\n", "\n      ")
            lines.append(f"  {t['outcome'].upper()} {i.split('::')[-1]}\n      {err}")
        if len(bad) > MAX_FAILURES:
            lines.append(f"  ... and {len(bad) - MAX_FAILURES} more: {name}.log, results.json")
        not_run = [i for i in p.get("collected", []) if i not in p.get("tests", {})]
        if not_run and len(not_run) <= 6:
            lines.append("  not run: " + ", ".join(i.split("::")[-1] for i in not_run))
    figs = r.get("figures", {})
    fp = r.get("parts", {}).get("figures")
    if fp and not figs:
        lines.append(f"figures: {fp.get('state')}")
    if figs:
        lines.append(
            'figures (each: python -c "import torch; from benchmarks.speed import MODULE; print(MODULE.CALL)" '
            "from the repository root):"
        )
        for n, f in figs.items():
            val = f"{f['value']:9.1f} {f['unit']:<11}" if f.get("value") is not None else f"{f['state'][:21]:<21}"
            lines.append(f"  {n:<18} {val} {ratio(n, figs):<10} {f['cmd']}" + (" [earlier run]" if f.get("earlier") else ""))
            if f.get("value") is None and len(f["state"]) > 21:  # a cut's progress, a skip's reason: in full
                lines.append(f"      {f['state']}")
            if f.get("error"):
                lines.append("      " + f["error"].replace("\n", "\n      "))
    lines += race_lines(r)
    if r.get("leftovers_killed"):
        lines.append(f"left behind and killed at the end: {r['leftovers_killed']}")
    lines.append(f"logs: {out}/ (checks.log, cuda.log, figures/*.log, race/*.log, long.log, unit.log, results.json)")
    return "\n".join(lines)


def race_lines(r: dict) -> list[str]:
    """The race's and the long run's lines of the summary: every run's figure with its window, the ratios."""
    lines = []
    for part in ("race", "long"):
        p = r.get("parts", {}).get(part)
        if p and not r.get(part):
            lines.append(f"{part}: {p.get('state')}")
    if r.get("race"):
        lines.append(
            "race (benchmarks/gpu/race.py; median SPS of the intervals after the burn-in [window mean; intervals; steps; "
            "slowest-fastest]; same node, one after another):"
        )
        if r.get("race_install"):
            lines.append(f"  LeanRL's packages: {r['race_install']}")
    for name, item in r.get("race", {}).items():
        lines.append(f"  {name}: {item.get('what', '')}" + (" [earlier run]" if item.get("earlier") else ""))
        for label, run in item.get("runs", {}).items():
            lines.append("    " + R.run_line(label, run))
            if run.get("error"):
                lines.append("        " + run["error"].replace("\n", "\n        "))
        if R.ratio_line(item):
            lines.append("    " + R.ratio_line(item))
        if name == "envs-threads" and R.scaling_line(item):
            lines.append("    " + R.scaling_line(item))
        if name == "contexts" and R.contexts_line(item):
            lines.append("    " + R.contexts_line(item))
        if name == "ppo-atari" and R.ceiling_line(item, r["race"].get("envs")):
            lines.append("    " + R.ceiling_line(item, r["race"].get("envs")))
    g = r.get("long")
    if g:
        last = g.get("return_mean") is not None  # an episode ended: its return goes beside CleanRL's
        cleanrl = R.CLEANRL_BREAKOUT_40M_FRAMES
        lines.append(
            f"long: PPO Breakout {g['steps']:,} agent steps ({4 * g['steps']:,} frames), seed 1: {g['state']}"
            + (", resumed" if g.get("resumed") else "")
            + (f"; step {g['reached']:,} ({g['rows']} rows)" if "reached" in g else "")
            + (f", median {g['sps']:.1f} SPS" if g.get("sps") else "")
            + (f", last return_mean {g['return_mean']:.1f}" if last else "")
            + (f" (CleanRL's published after 40M frames, 4x this run's: {cleanrl[0]:.2f} +- {cleanrl[1]:.2f})" if last else "")
            + ("; long-progress.csv" if "reached" in g else "")
        )
        if g.get("error"):
            lines.append("    " + g["error"].replace("\n", "\n    "))
    return lines
