"""Run an experiment: a grid of scripts x env ids x seeds x variants, each run pinned to its own cores, resumable.

An experiment is every combination of ``--scripts``, ``--env-ids``, ``--seeds`` and one variant of each level
(rlpyt's ``VariantLevel``: a level lists complete flag sets, each with a name; levels are crossed, so two levels
of 2 and 3 variants make 6). Every run gets its own folder under the experiment root,
``{root}/{script}/{env id}/{variant names joined by +}/seed{N}``, passed to the script as ``--out-dir`` and
``--run-name``, so the script's run folder (config.json, progress.csv, checkpoint.pt, eval.json) is that
folder. Beside the script's files the launcher writes ``launch.json`` (the exact command of every attempt, the
variant, the git commit, the package versions, the cores and GPUs, the state, the exit code and the last
``error:`` line) and the run's ``stdout.log``/``stderr.log``. The root holds ``experiment.json`` (the grid and
every launch of it) and ``status.json`` (every run's state: queued, running, done, failed, interrupted).

Usage
-----

    # 2 variants x 2 seeds of PPO on CartPole, one physical core per run (flags after -- go to every run)
    python experiments/launch.py runs/cartpole --scripts ppo_atari --env-ids CartPole-v1 --seeds 1 2 \\
        --level "lr1e-3:--learning-rate 1e-3" "lr3e-4:--learning-rate 3e-4" \\
        --cores-per-run 1 -- --preset cartpole --total-timesteps 50000
    python experiments/launch.py runs/cartpole ... --dry-run      # every run, its command and resources
    python experiments/launch.py --config cartpole.toml          # the same grid from a file
    python experiments/launch.py runs/cartpole --status          # the states, from the files (or status.py)
    # again after Ctrl-C, a crash or a reboot: finished runs are skipped, interrupted ones resumed
    python experiments/launch.py --config cartpole.toml [--retry-failed]
    python experiments/launch.py runs/cartpole                   # the root alone: its last launch's grid
    taskset -c 0-7 python experiments/launch.py ... --cores-per-run 2   # 4 slots on the first 8 CPUs
    # a SLURM job array through submitit (each run requeued after a timeout or preemption resumes)
    python experiments/launch.py --config exp.toml --slurm --partition gpu --time 240 --gpus-per-run 1
    python experiments/report.py runs/cartpole                   # tables and figures of the results

The file form (TOML, or JSON with the same keys; the command line overrides ``root``, ``scripts``,
``env_ids`` and ``seeds``, and adds its flags and levels after the file's)::

    root = "runs/cartpole"                 # relative to the current directory
    scripts = ["ppo_atari", "a2c_atari"]   # algos/<name>.py, or a path to a script
    env_ids = ["CartPole-v1"]              # left out: the script's (or the preset's) env
    seeds = [1, 2, 3]
    flags = "--preset cartpole --total-timesteps 50000"    # every run (a string, or a list of tokens)

    [[levels]]                             # one table per level: variant name = its flags
    lr1e-3 = "--learning-rate 1e-3"
    lr3e-4 = "--learning-rate 3e-4"

    [[levels]]
    envs4 = "--num-envs 4"
    envs8 = "--num-envs 8"

What each part does, each guaranteed in its module's docstring (this package's ``__init__.py`` lists them):

- Resources (``slots.py``, ``process.py``): the physical cores this process may use (start the launcher under
  ``taskset`` to give it fewer) are cut into slots of ``--cores-per-run`` cores, hyperthread siblings together.
  Each run is pinned to its slot's CPUs with ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` set to the slot's core
  count; GPUs are spread over the slots (``--gpus-per-run G``: G of its own, ``--runs-per-gpu K``: at most K runs
  on one, ``--gpus-per-run 0``: hidden). A torchrun run (``--nproc-per-node N`` among a variant's flags, or the
  launcher option for every run) takes N slots and runs under ``python -m torch.distributed.run --standalone
  --nproc-per-node N``. Runs wait in a queue and start as slots free.
- Durability (``records.py``): running the same command again skips the runs that finished (exit 0 and a
  ``checkpoint.pt``), resumes the interrupted ones with ``--resume <run folder>`` where a checkpoint exists (a
  run that never wrote one starts afresh; the files it left move to ``.stale/``), and reruns failed runs (exit
  1 or 2) only with ``--retry-failed``.
- Supervision (``local.py``): Ctrl-C or SIGTERM: every running script gets SIGTERM (it writes a checkpoint and
  exits 130), the launcher waits up to ``--stop-timeout`` seconds, then SIGKILLs what is left of each run's
  session, and exits 130 (a second Ctrl-C stops waiting). A failing run does not stop the others.
- Status (``display.py``, ``status.py``): on a terminal, one table refreshed in place (rich): each run's state,
  step of total, latest return, SPS and ETA, and the experiment's ETA. Otherwise plain lines: one per state
  change and a summary every ``--status-every`` seconds.
- Clusters (``slurm.py``): ``--slurm`` submits the runs as job arrays through submitit (one array per resource
  shape) with ``--partition``, ``--time`` (minutes), ``--gpus-per-run``, ``--cores-per-run``, ``--mem-gb``,
  ``--array-parallelism`` and ``--slurm-param KEY=VALUE``; a job requeued after a timeout or a preemption
  resumes its run. ``--cluster local`` runs the same jobs on this machine (for testing) and waits for them; with
  SLURM ``--wait`` waits and summarises.
- Checks first (``grid.py``, ``records.py``, ``flags.py``): before anything is created or changed, the launcher's
  own options (ranges, finite numbers), the config file (each key of its type), the root (not a file, in a folder
  that can be made and written; parents are made as ``mkdir -p`` would) and the records of an existing root
  (``experiment.json``, ``status.json``, each run's ``launch.json``; ``slurm_jobs.json`` with ``--slurm``) are
  checked. A damaged record is named in one line (which file, what is wrong) and never rewritten. Then the flags
  each run will get are checked by its script's own parser and pre-start checks (``RL_CHECK_ONLY``: flag
  ranges, env id, spaces, device), one check per script x env id x variant, the seeds' range folded into those
  checks, at most four at a time; a refusal names the variant and the script's own ``error:`` line, and no run
  folder is made (``--dry-run`` checks too; ``--status`` reads only).

Exit status: 0 when every run of the grid is done; 1 otherwise (the summary names each failed run with the last
``error:`` line of its stderr); 130 after Ctrl-C or SIGTERM; 2 for bad launcher arguments, a damaged record, flags
a script refuses, or an unusable experiment, with one ``error:`` line and nothing written. ``--slurm`` without
waiting: 0 once the jobs are submitted. ``python experiments/status.py ROOT`` prints the same as ``--status``.
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
import fcntl
import shlex
import tempfile
from collections.abc import Sequence
from pathlib import Path

from experiments.display import Display
from experiments.flags import Parser, check_creatable, check_options, command, one_line, refusals, run_options, split_tail
from experiments.grid import LaunchError, Trial, build_grid, load_file, parse_level, saved_grid, split_flags
from experiments.local import Launcher
from experiments.process import pid_runs
from experiments.records import (
    EXIT_INTERRUPTED,
    STATES,
    experiment_problem,
    finished,
    jobs_problem,
    load_record,
    new_record,
    now,
    read_records,
    renewed,
    run_meta,
    status_problem,
    write_json,
)
from experiments.slots import Slot, local_slots
from experiments.slurm import slurm_alive, submit
from experiments.status import print_status, write_status


def parser() -> argparse.ArgumentParser:
    p = Parser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Flags after `--` go to every run (so do --flags). See the module docstring for the file form.",
    )
    s = run_options(p, "experiment root", "submit the runs as SLURM job arrays through submitit")
    s.add_argument("--array-parallelism", type=int, default=256, help="most jobs of an array running at once")
    p.add_argument("--scripts", nargs="+", help="algos/ names (ppo_atari) or paths")
    level_help = "one level of variants, each NAME:FLAGS; repeat for more levels (they are crossed)"
    p.add_argument("--level", action="append", nargs="+", default=[], metavar="NAME:FLAGS", help=level_help)
    p.add_argument("--nproc-per-node", type=int, default=1, help="torchrun processes per run (slots it takes)")
    p.add_argument("--retry-failed", action="store_true", help="rerun runs that failed (exit 1 or 2) before")
    p.add_argument("--status", action="store_true", help="print the runs' states from the files and exit")
    return p


@one_line
def main(argv: Sequence[str] | None = None) -> int:
    argv, tail = split_tail(argv)
    return launch(parser().parse_args(argv), tail)


def check_root(root: Path, runs: Sequence[Trial], write: bool) -> None:
    """The root and the run folders under it can be made (``write``: and written), found out without changing
    anything (``experiments.flags.check_creatable``; ``--dry-run`` leaves even the times as they were)."""
    check_creatable(root, f"experiment root {root}", probe=False)
    for r in runs:
        for p in [r.folder, *r.folder.parents]:
            if p == root:
                break
            if p.exists() and not p.is_dir():
                raise LaunchError(f"{p} is a file where the run folder of {r.rel} goes")
    if write:
        check_creatable(root, f"experiment root {root}")


def check_flags(a: argparse.Namespace, todo: Sequence[Trial]) -> None:
    """The flags each run would get, checked by its script's own parser and pre-start checks (``experiments/
    flags.py``) before anything is written: one check per script x env id x variant (the flags differ there
    alone), identical flags once, with ``--out-dir`` a temporary folder of its own (the root was checked by
    ``check_root``; the scripts' own check of it would touch the root). The seeds change only ``--seed``,
    whose range does not depend on the rest: the lowest is given to a script's first check and the highest to its
    last (or one more check), so the seed range costs no check of its own. The runs' environment: no GPU under
    ``--gpus-per-run 0``; with ``--slurm`` the device is a cluster node's, not this machine's: checked on the CPU."""
    if not todo:
        return
    seeds = sorted({r.seed for r in todo})
    cells: dict[str, dict[tuple, Trial]] = {}
    for r in todo:
        cells.setdefault(r.script_path, {}).setdefault((r.env_id, r.variant), r)
    checks: list[tuple[str, list[str]]] = []
    picked: list[tuple[Trial, int]] = []
    scratch = tempfile.TemporaryDirectory(prefix="launch-check-")
    for script, by_cell in cells.items():
        firsts = list(by_cell.values())
        picks = [(t, seeds[0]) for t in firsts]
        if len(firsts) > 1:
            picks[-1] = (firsts[-1], seeds[-1])
        elif seeds[-1] != seeds[0]:
            picks.append((firsts[0], seeds[-1]))
        for t, seed in picks:
            flags = [*t.common, *(f for _, fl in t.variant for f in fl)]
            flags += ["--env-id", t.env_id] if t.env_id is not None else []
            flags += ["--device", "cpu"] if a.slurm else []
            checks.append((script, [*flags, "--seed", str(seed), "--out-dir", scratch.name, "--run-name", "check"]))
            picked.append((t, seed))
    env = dict(os.environ)
    if a.gpus_per_run == 0 and not a.slurm:
        env["CUDA_VISIBLE_DEVICES"] = ""  # as the runs get it (experiments/slots.py): no GPU
    with scratch:  # a Ctrl-C reaches the checks too (this foreground group): experiments.flags.command's one line
        refused = refusals(checks, jobs=max(1, min(4, len(os.sched_getaffinity(0)))), env=env, stop_at_first=True)
    if refused:
        i, reason = refused[0]
        t, seed = picked[i]
        raise LaunchError(
            f"{Path(t.script_path).name} refuses the flags of {t.rel.rsplit('/', 1)[0]} (seed {seed}): "
            f"{reason} (no run started)"
        )


def plan(
    a: argparse.Namespace, root: Path, runs: list[Trial], records: dict[str, dict]
) -> tuple[list[Trial], list[Trial], dict[str, str]]:
    """What each run needs now: (to run, skipped as failed, the action of each run by its folder)."""
    todo, skipped_failed, actions = [], [], {}
    for r in runs:
        rec = records[r.rel]
        if finished(r.folder, rec):
            actions[r.rel] = "skip (done)"
            continue
        if rec.get("state") == "failed" and not a.retry_failed:
            actions[r.rel] = f"skip (failed, exit {rec.get('exit_code')}; --retry-failed reruns it)"
            skipped_failed.append(r)
            continue
        if rec.get("state") == "running" and pid_runs(rec.get("pid"), r.folder):
            raise LaunchError(f"{r.rel} is still running (pid {rec['pid']}), from an earlier launcher: end it first")
        if a.slurm and rec.get("state") in ("submitted", "running"):
            job = load_record(root / "slurm_jobs.json", jobs_problem).get(r.rel, {})
            if job.get("cluster") == "slurm" and slurm_alive(job.get("job_id")):
                actions[r.rel] = f"skip (job {job['job_id']} is queued or running)"
                continue
        actions[r.rel] = "resume" if (r.folder / "checkpoint.pt").is_file() else "start"
        todo.append(r)
    return todo, skipped_failed, actions


def print_dry_run(
    a: argparse.Namespace, runs: list[Trial], todo: list[Trial], slots: list[Slot], actions: dict[str, str]
) -> None:
    if slots:
        print(f"{len(slots)} slot(s) of {a.cores_per_run} physical core(s):")
        for s in slots:
            gpu = f"  CUDA_VISIBLE_DEVICES={','.join(s.gpus)}" if s.gpus or s.hide_gpus else ""
            print(f"  slot {s.index}: cpus {','.join(map(str, s.cpus))}  OMP_NUM_THREADS={s.cores}  affinity {s.code}{gpu}")
    else:
        print(
            f"SLURM ({a.cluster}): {a.cores_per_run} core(s) and {a.gpus_per_run or 0} GPU(s) per process, "
            f"{a.time} min per job, partition {a.partition or '(default)'}"
        )
    for r in runs:
        res = f"{r.nproc} slot(s)" + (f" (torchrun, {r.nproc} processes)" if r.nproc > 1 else "")
        print(f"{actions[r.rel]:<8} {r.rel}  [{res}]\n    {shlex.join(r.command(actions[r.rel] == 'resume'))}")
    print(f"{len(runs)} runs: {len(todo)} to run, {len(runs) - len(todo)} skipped")


def summarise(runs: list[Trial], records: dict[str, dict], skipped_failed: list[Trial]) -> int:
    counts = {s: sum(records[r.rel]["state"] == s for r in runs) for s in STATES}
    print(f"{len(runs)} runs: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n))
    for r in runs:
        rec = records[r.rel]
        if rec["state"] == "failed":
            again = " (not rerun: --retry-failed reruns it)" if r in skipped_failed else ""
            code = f"exit {rec['exit_code']}" if rec.get("exit_code") is not None else "no exit code"
            print(f"  failed {r.rel}: {code}: {rec.get('error') or '-'}{again}")
        elif rec["state"] not in ("done",):
            print(f"  {rec['state']} {r.rel}" + (f" (exit {rec['exit_code']})" if rec.get("exit_code") else ""))
    return 1 if counts["done"] < len(runs) else 0


def launch(a: argparse.Namespace, tail: list[str]) -> int:
    check_options(a)
    data = load_file(a.config) if a.config else {"levels": []}
    root_s = a.root or data.get("root")
    if not root_s:
        raise LaunchError("no experiment root: give it first (or `root` in the --config file)")
    root = Path(root_s).resolve()
    check_root(root, [], write=False)
    # What the root holds is read (and refused, named, when damaged) before anything is written.
    experiment = load_record(root / "experiment.json", experiment_problem)
    load_record(root / "status.json", status_problem)
    if a.slurm:
        load_record(root / "slurm_jobs.json", jobs_problem)
    saved = saved_grid(experiment, str(root / "experiment.json"))
    if not a.config and not a.scripts and saved:
        # Only the root: the grid of the experiment's last launch (its flags and levels are complete flag lists).
        data = saved
        a.nproc_per_node = saved.get("nproc_per_node", a.nproc_per_node)
    levels = list(data.get("levels", [])) + [parse_level(lv, f"--level {i + 1}") for i, lv in enumerate(a.level)]
    common = split_flags(data.get("flags"), "--config flags") + split_flags(a.flags, "--flags") + tail
    seeds = a.seeds if a.seeds is not None else data.get("seeds", [])
    scripts, env_ids = a.scripts or data.get("scripts", []), a.env_ids or data.get("env_ids", [])
    runs = build_grid(root, scripts, env_ids, seeds, common, levels, a.nproc_per_node)
    grid = {
        "scripts": [r.script_path for r in {r.script: r for r in runs}.values()],
        "env_ids": list(env_ids),
        "seeds": list(seeds),
        "flags": common,
        "levels": [[[n, list(f)] for n, f in lv] for lv in levels],
        "nproc_per_node": a.nproc_per_node,
    }
    records = read_records(runs)
    check_root(root, runs, write=not a.status)

    if a.status:
        print_status(runs, records)
        return 0

    todo, skipped_failed, actions = plan(a, root, runs, records)
    slots: list[Slot] = []
    if not a.slurm:
        slots = local_slots(a)
        too_big = [r for r in runs if r.nproc > len(slots)]
        if too_big:
            raise LaunchError(
                f"{too_big[0].rel} needs {too_big[0].nproc} slots (--nproc-per-node); this machine has "
                f"{len(slots)} of {a.cores_per_run} core(s)"
            )

    check_flags(a, todo)

    if a.dry_run:
        print_dry_run(a, runs, todo, slots, actions)
        return 0

    root.mkdir(parents=True, exist_ok=True)
    lock = open(root / ".launch.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise LaunchError(f"another launcher is running the experiment in {root}") from None
    meta = run_meta()
    experiment = load_record(root / "experiment.json", experiment_problem)  # as the last launcher left it, locked
    experiment.update(root=str(root), grid=grid, runs=[r.rel for r in runs])
    experiment.setdefault("launches", []).append({"time": now(), "argv": sys.argv, "cwd": os.getcwd(), **meta})
    write_json(root / "experiment.json", experiment)
    for r in runs:
        records[r.rel] = renewed(records[r.rel], new_record(r, meta))
        if r in todo:
            records[r.rel]["state"] = "queued"
        r.folder.mkdir(parents=True, exist_ok=True)
        write_json(r.folder / "launch.json", records[r.rel])
    write_status(runs, records)

    display = Display(runs, records, plain=a.plain or not sys.stdout.isatty(), status_every=a.status_every)
    skipped = len(runs) - len(todo)
    display.note(
        f"{len(runs)} runs: {len(todo)} to run"
        + (f", {skipped} skipped" if skipped else "")
        + (f" on {len(slots)} slot(s) of {a.cores_per_run} core(s)" if slots else "")
    )
    try:
        if a.slurm:
            code = submit(a, todo, runs, records, display, lambda r: write_json(r.folder / "launch.json", records[r.rel]))
            display.close()
            if code >= 0:
                if code == EXIT_INTERRUPTED:
                    summarise(runs, records, skipped_failed)
                return code
            return summarise(runs, records, skipped_failed)
        launcher = Launcher(runs, records, slots, display, a.stop_timeout, meta)
        completed = launcher.run_all(todo)
    finally:
        display.close()
        write_status(runs, records)
    code = summarise(runs, records, skipped_failed)
    return code if completed else EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(command(main))
