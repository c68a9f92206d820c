"""The GPU race (issue 67): our scripts beside LeanRL's own, on the same node, in the same step window, one after
the other, each figure the median of per-interval SPS after a burn-in. ``benchmarks/gpu/check.py``'s ``race`` and
``long`` parts run what this module plans; everything here is plain Python (no torch), so the CPU tests call it.

Why (the review of 2026-12-02): the figures of 2026-11-28 timed ours over 2 progress rows right after compiling
(PPO Atari: steps 1,024 -> 3,072 of an untrained agent; async's two rows were 37,329 and 1,741 SPS, a mean of
3,325), while LeanRL's README averages over 1M-10M steps. Here both sides run on the node in the same window:

- the PPO family: a 3-rollout burn-in (compiling and capturing fall in it), then at least 30k agent steps;
  LeanRL's ``--measure-burnin 4`` starts its clock at the start of iteration 4, where our 3rd row is written;
- SAC, TD3, DDPG, DQN, C51: learning from step 5,000 (DQN/C51: 2,000, the benchmark's), 5k learning steps of
  burn-in, then a 10k-step window; LeanRL's ``--learning-starts 5000 --measure-burnin 5000``.

Our figure: the median of the SPS between consecutive progress rows (``progress.csv``'s ``global_step`` and
``wall_time_s``) whose interval starts at or after the burn-in, beside the window's mean (its steps over its
seconds). LeanRL's: its tqdm line (``speed: 5000.0 sps, ...``, redrawn with ``\\r``), turned into intervals from
the schedule its script prints on (PPO Atari: each value the SPS of its own 10 iterations; PPO continuous, SAC,
TD3: the mean since the clock started, so consecutive values give each interval), then the same median and mean.
The ratio ours/LeanRL is given for both. The env-only ceiling (8 Breakout envs, ale-py's threads, random actions)
runs first, beside them; ``envs-threads`` times how it scales with the node's cores (1 env, then the 8 on 1, 2, 4
and 8 threads, and on ``os.cpu_count()`` of them as the ceiling item runs), since a node whose cores do not give
their count caps both sides alike. ``contexts`` times a small acting step alone and beside a busy learner in another
process or in a thread of its own (``benchmarks/speed/contexts.py``): whether two CUDA contexts taking turns slow an
async sampler's every step.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.speed.contexts import MODES  # where and how the contexts item's learner runs beside the act

BREAKOUT = "BreakoutNoFrameskip-v4"
CHEETAH = "HalfCheetah-v5"  # LeanRL's default is HalfCheetah-v4: both sides get v5
LONG_STEPS = 2_500_000  # PPO Breakout, 10M frames (4 per agent step)
# Beside the long part's run: CleanRL's published average episodic return of its ppo_atari.py on Breakout after its
# default 10M agent steps, 40M frames (four times the long run's 10M frames), mean +- std over its seeds (CleanRL's
# docs/rl-algorithms/ppo.md and benchmark/ppo.sh at 7a96de2; openai/baselines' PPO there: 406.57 +- 31.55). Its
# curves, which would give the point at 10M frames, live in a Weights & Biases project this repository cannot reach.
CLEANRL_BREAKOUT_40M_FRAMES = (414.66, 28.09)
THREADS = (1, 2, 4, 8)  # envs-threads: ale-py's threads for the 8 envs (the envs item: os.cpu_count() of them)


# --- LeanRL's speed, from its tqdm output ---------------------------------------------------------------------

_SPS = re.compile(r"([-+]?(?:\d+(?:\.\d*)?|nan|inf))\s+sps\b")
_BAR = re.compile(r"^(?P<desc>.*?):\s+\d+%\|")


def tqdm_speeds(text: str) -> list[float]:
    """The successive speeds a LeanRL script showed, in order. tqdm redraws its line with ``\\r`` (a line break at
    the end), and redraws the same description until the script sets a new one, so a value is taken each time the
    description changes. The step a value belongs to is not read from the bar: tqdm's counter there lags (it is
    synced only when tqdm redraws on its own), so ``leanrl_intervals`` places them by the script's schedule."""
    out, last = [], None
    for line in re.split(r"[\r\n]+", text):
        m = _SPS.search(line)
        if not m:
            continue
        bar = _BAR.match(line)
        desc = bar.group("desc") if bar else line.strip()
        if desc != last:
            out.append(float(m.group(1)))
            last = desc
    return out


@dataclass(frozen=True)
class Schedule:
    """When a LeanRL script prints its speed. ``kind``: ``windows`` (each value the SPS since the previous print:
    PPO Atari) or ``cumulative`` (the mean since the clock started: PPO continuous, SAC, TD3). ``start``: the step
    where its clock starts; ``first``: the step of its first print; ``every``: steps between prints."""

    kind: str
    start: int
    first: int
    every: int


def leanrl_intervals(speeds: list[float], s: Schedule) -> list[tuple[int, int, float]]:
    """(from step, to step, seconds) of each interval between LeanRL's prints. The k-th value is placed at step
    ``first + k * every``; a value at the clock's start (0 steps: SAC and TD3 print 0.0 there) is left out."""
    out, prev_step, prev_t = [], s.start, 0.0
    for k, v in enumerate(speeds):
        step = s.first + k * s.every
        if step <= s.start or v <= 0 or v != v:
            continue
        if s.kind == "windows":
            dt = (step - prev_step) / v
            out.append((prev_step, step, dt))
        else:  # cumulative: t = steps since the start / mean speed
            t = (step - s.start) / v
            out.append((prev_step, step, t - prev_t))
            prev_t = t
        prev_step = step
    return out


# --- what the race runs -----------------------------------------------------------------------------------------


@dataclass
class Run:
    """One process of the race. ``kind``: ``ours`` (a script of algos/, read from its progress.csv), ``leanrl``
    (a LeanRL script, read from its tqdm line) or ``value`` (a benchmark function that prints one number).
    ``argv`` follows the Python interpreter; ``LEANRL/`` stands for the ``--leanrl`` folder and is replaced there."""

    label: str
    kind: str
    argv: list[str]
    burn_in: int = 0
    min_steps: int = 0
    every: int = 0  # LeanRL's intervals regrouped to multiples of this (our rows' spacing)
    schedule: Schedule | None = None
    unit: str = "SPS"
    edited: bool = False  # a LeanRL script that runs only with LEANRL_EDITS made (a copy; never the kit's file as it is)


@dataclass
class Item:
    name: str
    what: str
    runs: list[Run] = field(default_factory=list)


# the default order: the pairs beside LeanRL first (issue 67's order), then ours alone, then the envs' scaling
ORDER = ["envs", "ppo-atari", "ppo-mujoco", "td3", "sac", "dqn", "c51", "ddpg", "r2d1", "envs-threads", "contexts"]


def _value_code(module: str, call: str) -> list[str]:
    """A benchmark function's one number, printed by a child Python (the repository on its PYTHONPATH)."""
    return ["-c", f"import torch; from benchmarks.speed import {module} as b; print(b.{call})"]


def plan(name: str, dry: bool = False) -> Item:
    """The runs of one race item. ``dry``: the same plumbing on the CPU (no CUDA, no compiling), tiny windows."""
    dev = "--device cpu" if dry else "--device cuda --compile"
    lean = "--no-cuda" if dry else "--compile --cudagraphs"
    common = f"--eval-episodes 0 --seed 1 {dev}"
    if name == "envs":
        n, secs = (2, 1.0) if dry else (8, 10.0)
        call = f"envs_only('{BREAKOUT}', {n}, 'parallel', {secs})"
        what = f"ceiling: {n} Breakout envs, parallel (ale-py's threads), random actions, {secs:.0f} s"
        return Item(name, what, [Run("envs only", "value", _value_code("ppo_sampling", call))])
    if name == "envs-threads":  # how the env steps scale with the node's cores: what caps the ceiling above
        n, secs, threads = (2, 0.5, (1, 2)) if dry else (8, 5.0, THREADS)
        cpus = os.cpu_count() or 1
        if not dry and cpus > max(threads):  # the ceiling item's own count: the two told apart
            threads = (*threads, cpus)
        one = Run("1 env, serial", "value", _value_code("ppo_sampling", f"envs_only('{BREAKOUT}', 1, 'serial', {secs})"))
        # DQN's and C51's race runs step their 4 envs one after the other: their ceiling
        four = Run("4 envs, serial", "value", _value_code("ppo_sampling", f"envs_only('{BREAKOUT}', 4, 'serial', {secs})"))
        runs = [
            Run(
                f"{n} on {k} thread{'s' if k > 1 else ''}",  # within the summary's label column
                "value",
                _value_code("ppo_sampling", f"envs_only('{BREAKOUT}', {n}, 'parallel', {secs}, threads={k})"),
            )
            for k in threads
        ]
        what = (
            f"the ceiling's scaling: 1 Breakout env, 4 one after the other, then {n} on ale-py's threads, random actions, "
            f"{secs:g} s each"
        )
        return Item(name, what, [one, four, *runs])
    if name == "ppo-atari":
        envs, steps, iters = (2, 16, 20) if dry else (8, 128, 40)
        batch, total = envs * steps, envs * steps * iters
        burn, least = 3 * batch, 0 if dry else 30_000
        size = f"--num-envs {envs} --num-steps {steps}"
        runs = [
            Run(
                f"ours {sampler}",
                "ours",
                f"algos/ppo_atari.py --env-id {BREAKOUT} --total-timesteps {total} "
                f"--sampler {sampler} {size} {common}".split(),
                burn,
                least,
            )
            for sampler in ("parallel", "async")
        ]
        # LeanRL's clock starts at the start of iteration 4 (where our 3rd row is written), a print every 10th
        runs.append(
            Run(
                "LeanRL",
                "leanrl",
                f"LEANRL/ppo_atari_ale_torchcompile.py --total-timesteps {total} "
                f"--measure-burnin 4 --seed 1 {size} {lean}".split(),
                burn,
                least,
                schedule=Schedule("windows", burn, 10 * batch, 10 * batch),
            )
        )
        return Item(name, f"PPO Breakout, {envs} envs x {steps}, iterations 4-{iters} ({total - burn:,} steps)", runs)
    if name == "ppo-mujoco":
        steps, iters = (64, 20) if dry else (2048, 20)
        total, burn, least = steps * iters, 3 * steps, 0 if dry else 30_000
        size = f"--num-steps {steps}" + (" --num-minibatches 4 --update-epochs 2" if dry else "")
        ours = Run(
            "ours",
            "ours",
            f"algos/ppo_mujoco.py --env-id {CHEETAH} --total-timesteps {total} --num-envs 1 "
            f"--sampler serial {size} {common}".split(),
            burn,
            least,
        )
        leanrl = Run(
            "LeanRL",
            "leanrl",
            f"LEANRL/ppo_continuous_action_torchcompile.py --env-id {CHEETAH} "
            f"--total-timesteps {total} --measure-burnin 4 --seed 1 {size} {lean}".split(),
            burn,
            least,
            schedule=Schedule("cumulative", burn, 10 * steps, 10 * steps),
        )
        return Item(
            name, f"PPO HalfCheetah-v5, 1 env x {steps}, iterations 4-{iters} ({total - burn:,} steps)", [ours, leanrl]
        )
    if name in ("td3", "sac", "ddpg"):
        learn, burn_steps, window, every = (100, 100, 200, 100) if dry else (5000, 5000, 10_000, 500)
        burn, total, least = learn + burn_steps, learn + burn_steps + window, 0 if dry else window
        small = "--batch-size 64 --buffer-size 1000" if dry else ""
        ratio = "--replay-ratio 64" if dry else ""  # ours: one update per env step, as LeanRL's, at either batch
        runs = [
            Run(
                "ours",
                "ours",
                f"algos/{name}_mujoco.py --env-id {CHEETAH} --sampler serial --total-timesteps "
                f"{total} --min-steps-learn {learn} --log-every {every} {small} {ratio} {common}".split(),
                burn,
                least,
            )
        ]
        if name != "ddpg":  # LeanRL has no DDPG
            # its clock starts at step learn + burn-in (a print of 0.0 there), then a print every 100 steps
            runs.append(
                Run(
                    "LeanRL",
                    "leanrl",
                    f"LEANRL/{name}_continuous_action_torchcompile.py --env-id {CHEETAH} "
                    f"--total-timesteps {total + 1} --learning-starts {learn} --measure-burnin {burn_steps} "
                    f"--seed 1 {small} {lean}".split(),
                    burn,
                    least,
                    every,
                    Schedule("cumulative", burn, burn, 100),
                    edited=True,
                )
            )
        return Item(name, f"{name.upper()} HalfCheetah-v5, learning from {learn:,}, steps {burn:,}-{total:,}", runs)
    if name in ("dqn", "c51"):
        learn, burn_steps, window, every = (200, 200, 200, 100) if dry else (2000, 5000, 10_000, 500)
        burn, total = learn + burn_steps, learn + burn_steps + window
        script = "dqn_atari.py" if name == "dqn" else "catdqn_atari.py"
        # benchmarks/speed/dqn_atari_vs_sb3.py's settings: 4 envs, replay ratio 8, batch 32, Adam 1e-4, no double DQN
        argv = (
            f"algos/{script} --env-id {BREAKOUT} --sampler serial --total-timesteps {total} --num-envs 4 "
            "--replay-ratio 8 --batch-size 32 --optimizer adam --learning-rate 1e-4 --target-update-interval 1000 "
            f"--no-double-dqn --buffer-size {1000 if dry else 100_000} --min-steps-learn {learn} "
            f"--log-every {every} {common}"
        ).split()
        what = f"{name.upper()} Breakout, 4 envs, learning from {learn:,}, steps {burn:,}-{total:,}"
        return Item(name, what, [Run("ours", "ours", argv, burn, 0 if dry else window)])
    if name == "r2d1":
        repeats, device, compile = (1, "cpu", False) if dry else (5, "cuda", True)
        call = f"learner_sequences_per_second({repeats}, '{device}', 2500.0, compile={compile})"
        mode = "--compile (torso and heads compiled, the LSTM eager inside the graph)" if compile else "eager"
        what = f"R2D1's learner alone, {mode} ({repeats} timed updates of 64 sequences after the untimed ones, random frames)"
        return Item(name, what, [Run("ours", "value", _value_code("r2d1_atari", call), unit="sequences/s")])
    if name == "contexts":
        device, secs = ("cpu", 0.5) if dry else ("cuda", 5.0)
        runs = [
            Run(
                f"beside {mode}" if mode != "alone" else mode,
                "value",
                _value_code("contexts", f"acting_us({mode!r}, {device!r}, {secs})"),
                unit="us an act",
            )
            for mode in MODES
        ]
        what = (
            "an acting step (ppo_atari's network, 8 observations) alone, then beside a busy learner (another process, a "
            f"thread) and a learner at its duty (another process), mean of {secs:g} s"
        )
        return Item(name, what, runs)
    raise ValueError(f"unknown race item {name!r}; known: {ORDER}")


# LeanRL's SAC and TD3 on torch 2.11 with tensordict 0.15 (the first race, 2026-12-04): their ``batched_qf`` keeps
# ``to_module``'s default ``preserve_module_state=True``, which makes an ``nn.Parameter`` inside the compiled update;
# dynamo then guards its type on a temporary it cannot name, and the first update raises ``NameError: name
# 'SYNTHETIC_LOCAL' is not defined`` (also on the CPU, and without tensordict: ``nn.Parameter(x)`` then ``type(p) is
# nn.Parameter`` under ``torch.compile``). The peer kit's edit (a), made at the one place it left; the race runs an
# edited copy, never the kit's file, and the summary says so.
LEANRL_EDITS = [("params.to_module(qnet):", "params.to_module(qnet, preserve_module_state=False):")]


def leanrl_edited(text: str) -> tuple[str, list[str]]:
    """``text``, a LeanRL script, with each of ``LEANRL_EDITS`` made where it occurs, and the edits it made."""
    made = []
    for old, new in LEANRL_EDITS:
        if old in text:
            text, made = text.replace(old, new), [*made, f"{old} -> {new}"]
    return text, made


def leanrl_argv(run: Run, leanrl: Path) -> list[str]:
    return [str(leanrl / a[len("LEANRL/") :]) if a.startswith("LEANRL/") else a for a in run.argv]


def long_argv(run_dir: Path, steps: int = LONG_STEPS, dry: bool = False) -> list[str]:
    """PPO Breakout for ``steps`` agent steps, one seed, parallel sampling, compiled, a checkpoint every 2 minutes
    of wall time; ``run_dir`` with a checkpoint in it is resumed (its recorded flags, the total given here)."""
    if (run_dir / "checkpoint.pt").exists():
        return ["algos/ppo_atari.py", "--resume", str(run_dir), "--total-timesteps", str(steps)]
    dev = "--device cpu --num-envs 2 --num-steps 16" if dry else "--device cuda --compile"
    return (
        f"algos/ppo_atari.py --env-id {BREAKOUT} --total-timesteps {steps} --sampler parallel --seed 1 --eval-episodes 0 "
        f"--checkpoint-minutes 2 {dev}".split()
        + ["--out-dir", str(run_dir.parent), "--run-name", run_dir.name]  # paths may hold spaces
    )


def ratio_line(item: dict) -> str:
    """``ours/LeanRL`` for each of our runs of an item that has a LeanRL run: median against median, and the
    window means in brackets; empty when either side has no figure."""
    runs = item.get("runs", {})
    lean = runs.get("LeanRL", {})
    if lean.get("median") is None:
        return ""
    parts = []
    for label, r in runs.items():
        if label != "LeanRL" and r.get("median") is not None:
            who = label.removeprefix("ours").strip() or "ours"
            parts.append(f"{who} {r['median'] / lean['median']:.2f} (window mean {r['mean'] / lean['mean']:.2f})")
    return "ours/LeanRL: " + ", ".join(parts) if parts else ""


def ceiling_line(item: dict, envs: dict | None) -> str:
    """Each PPO Atari figure as a fraction of the env-only ceiling (the ``envs`` item) measured on the same node."""
    ceiling = ((envs or {}).get("runs", {}).get("envs only") or {}).get("value")
    parts = [f"{label} {r['median'] / ceiling:.2f}" for label, r in item.get("runs", {}).items() if r.get("median")]
    return f"of the envs-only ceiling ({ceiling:.0f} SPS): " + ", ".join(parts) if ceiling and parts else ""


def contexts_line(item: dict) -> str:
    """The ``contexts`` item's acting step beside a learner over its time alone, and beside a busy process over beside
    a busy thread (two contexts taking turns on the GPU: well above 1); empty without the figure alone."""
    runs = {label: r.get("value") for label, r in item.get("runs", {}).items()}
    alone = runs.pop("alone", None)
    if not alone:
        return ""
    parts = [f"{label} {v / alone:.2f}x" for label, v in runs.items() if v]
    process, thread = runs.get("beside process"), runs.get("beside thread")
    both = f"; process over thread {process / thread:.2f}x" if process and thread else ""
    return "over alone: " + ", ".join(parts) + both if parts else ""


def scaling_line(item: dict) -> str:
    """The ``envs-threads`` item's figures with more than one thread over its one-thread figure (k threads, no cap: a
    speed-up near k); empty without the one-thread figure."""
    runs = {label: r.get("value") for label, r in item.get("runs", {}).items()}
    base = next((v for label, v in runs.items() if label.endswith(" on 1 thread")), None)
    if not base:
        return ""
    parts = [f"{label.split(' on ')[-1]} {v / base:.2f}x" for label, v in runs.items() if v and label.endswith("threads")]
    return "over 1 thread: " + ", ".join(parts) if parts else ""


def busy(r: dict) -> str:
    """``, 2.9 cores busy``: the run's CPU time (every process and thread of it) over its wall time, a mean over the
    whole run, start-up and compiling included; empty where either is missing."""
    return f", {r['cpu_s'] / r['wall_s']:.1f} cores busy" if r.get("cpu_s") is not None and r.get("wall_s") else ""


def run_line(label: str, r: dict) -> str:
    """One run's figure for the summary: ``median [window mean; intervals; steps from->to; compile s]``."""
    if r.get("median") is None and r.get("value") is None:
        return f"{label:<15} {r.get('state', 'not run')}"  # its error, if any, on the summary's next line
    if r.get("value") is not None:
        return f"{label:<15} {r['value']:9.1f} {r.get('unit', 'SPS')}" + (
            f"  (wall {r['wall_s']:.0f} s{busy(r)})" if "wall_s" in r else ""
        )
    extra = f"; compile {r['compile_s']:.0f} s" if r.get("compile_s") is not None else ""
    short = f"; SHORT: under {r['min_steps']:,} steps" if r.get("short") else ""
    cut = f"; {r['state']}" if r.get("state", "done") != "done" else ""
    edits = f"; {len(r['edits'])} edit(s): race.LEANRL_EDITS" if r.get("edits") else ""
    return (
        f"{label:<15} {r['median']:9.1f} SPS  [mean {r['mean']:.1f}; {r['intervals']} intervals, steps "
        f"{r['from']:,}->{r['to']:,}, {r['min']:.0f}-{r['max']:.0f}{extra}{short}{cut}{edits}; "
        f"wall {r.get('wall_s', 0):.0f} s{busy(r)}]"
    )
