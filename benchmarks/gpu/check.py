"""One prepared command for a fresh GPU node: install, check, run the cuda test set, take the GPU figures, and say
what passed even when cut short (docs/gpu.md, "One command on a GPU node").

    python benchmarks/gpu/check.py OUT                      # about 8 minutes on 16 cores and one GPU
    python benchmarks/gpu/check.py OUT2 --redo OUT          # a second, shorter run: only what failed or was not run
    python benchmarks/gpu/check.py OUT --parts cuda --cuda-s 120 --workers 8
    python benchmarks/gpu/check.py OUT --unit               # adds the unit tier on the node's own torch
    python benchmarks/gpu/check.py OUT --parts checks,race --race ppo-atari td3 --leanrl .peers/leanrl
    python benchmarks/gpu/check.py OUT --parts race --dry   # the race's plumbing on a CPU (no figures)

From the repository root, in this order, each part within its own budget and all within ``--budget``:

1. ``checks``: installs the wheels of ``--wheels`` (default ``.whl/``, if there) that the node lacks or has in an
   older version (``pip install --no-index --no-deps``; never a downgrade), checks every import, a few envs
   (CartPole, Pendulum, InvertedPendulum, HalfCheetah, Breakout, ale-py's vector env) and a CUDA matmul and
   convolution, prints the GPU, driver, torch, CUDA and cuDNN versions, and stops there if a check fails;
2. ``cuda``: ``python -m pytest -m cuda`` on ``--workers`` pytest-xdist workers (serial without xdist), ordered
   so that the first tests run each script once (then each script's sync check, then the other sampling modes),
   no ``--maxfail``; a cut kills the whole process tree it leaves;
3. ``figures``: short GPU figures (``--figure-s`` each), every one a call of the benchmark's own function
   (``benchmarks/speed/ppo_atari_vs_sb3.py``'s ``ours`` and ``sb3``, ...) on ``--device cuda`` beside the same on
   ``--device cpu``: first every script's ``--compile`` figure (each update one CUDA graph; LeanRL's H100 figures
   beside them in docs/gpu.md), then PPO Breakout (serial, parallel, async) and SAC HalfCheetah against
   Stable-Baselines3 on the GPU, DQN and C51 Breakout, R2D1's learner sequences/s;
4. ``race`` (asked for by ``--parts``): ours beside LeanRL's own scripts (``--leanrl``, their packages from
   ``<--wheels>/leanrl/``, installed for their processes only), on the same node, in the same step window, one
   after the other (``benchmarks/gpu/race.py``): each figure the median SPS of the intervals after a burn-in (3
   rollouts, then 30k+ steps for the PPO family; 5k learning steps, then 10k for the replay scripts), beside the
   window's mean, the env-only ceiling and the ratio ours/LeanRL; then DQN, C51, DDPG and R2D1's learner alone
   (``--race`` picks and orders the items, ``--race-run-s`` caps each process);
5. ``long`` (asked for by ``--parts``): PPO Breakout for 10M frames, one seed, for what the budget leaves; its
   ``progress.csv`` is copied to ``OUT/long-progress.csv``, and a later call resumes the run from ``--long-dir``;
6. ``unit`` (``--unit``): ``python -m pytest -m unit`` on the node's torch;
7. ``OUT/summary.txt``, rewritten after every test and figure (one screen: what passed, what failed with its first
   error lines, every figure with its command), ``OUT/results.json`` (what ``--redo`` reads) and every log.

Without a CUDA device (this script's own test on a CPU machine) the GPU parts are skipped; ``--dry`` runs the race
and long parts there anyway, on the CPU with tiny windows, to check their plumbing. Python rather than
bash: the budget cut, the process-tree kill, the test order and the summary are functions a test can call.
Exit 0 when everything asked for ran and passed, 1 otherwise.
"""

import argparse
import datetime
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a file: the repository's packages import from it
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu import race as R
from benchmarks.gpu.commands import Interrupted, become_subreaper, interrupt, kill_tree, run_cmd
from benchmarks.gpu.figures import FIGURES, inductor_cache_dir, progress_at_cut
from benchmarks.gpu.summary import all_passed, counts_line, first_error, last_float, rank, summary, versions_line
from benchmarks.gpu.wheels import wanted as wheels_wanted
from benchmarks.gpu.wheels import wheel_name
from benchmarks.script_speed import intervals_from_rows, progress_sps, window_sps

MARK = "GPU_CHECK_RUN"  # in the environment of every process this check starts (tests/test_gpu_check.py looks)


class Check:
    def __init__(self, args: argparse.Namespace):
        self.a = args
        self.out = Path(args.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.budget
        self.env = {
            **os.environ,
            MARK: str(self.out),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.prev = json.loads((Path(args.redo) / "results.json").read_text()) if args.redo else None
        self.r: dict = {
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "argv": sys.argv[1:],
            "budget_s": args.budget,
            "status": "running",
            "node": {},
            "install": {},
            "checks": [],
            "parts_asked": args.parts,
            "parts": {},
            "figures": {},
        }
        # a part the earlier run had and this one does not redo stays as it was, so that this run's results.json
        # holds everything known (the next --redo reads it)
        for name, part in ((self.prev or {}).get("parts") or {}).items():
            if name not in args.parts and name != "figures":
                self.r["parts"][name] = {**part, "note": "earlier run, not redone"}
        for name in ("race", "long"):  # their figures too
            if name not in args.parts and (self.prev or {}).get(name):
                self.r[name] = self.prev[name]

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> None:
        self.r["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        (self.out / "results.json").write_text(json.dumps(self.r, indent=1))
        (self.out / "summary.txt").write_text(summary(self.r, self.out) + "\n")

    def say(self, line: str) -> None:
        print(f"[{time.monotonic() - self.t0:5.0f} s] {line}", flush=True)

    # 1. install, imports, envs, CUDA, versions
    def install(self) -> None:
        folder = Path(self.a.wheels) if self.a.wheels else None
        wheels = sorted(folder.glob("*.whl")) if folder and folder.is_dir() else []
        if not wheels:
            self.r["install"] = {"state": f"no wheels in {folder}" if folder else "off"}
            return
        todo, kept = wheels_wanted(wheels)
        self.r["install"] = {"state": "nothing to install", "kept": kept, "installed": []}
        if todo:
            log = self.out / "install.log"
            cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", *(str(w) for w, _ in todo)]
            rc, cut, _ = run_cmd(cmd, log, min(120, self.left()), self.env)
            if rc != 0 and not cut:  # a read-only site-packages: the user's own
                rc, cut, _ = run_cmd([*cmd[:4], "--user", *cmd[4:]], log, min(120, self.left()), self.env)
            self.r["install"].update(
                state="installed" if rc == 0 else f"pip failed (exit {rc}), see install.log",
                installed=[label for _, label in todo],
            )
        self.say(f"install: {self.r['install']['state']}")

    def checks(self) -> bool:
        self.install()
        self.save()
        return self.probe(full=True)

    def probe(self, full: bool) -> bool:
        log = self.out / "checks.log"
        code = f"from benchmarks.gpu.probe import probe; probe({full})"
        rc, cut, _ = run_cmd([sys.executable, "-c", code], log, min(self.a.checks_s, self.left()), self.env)
        for line in log.read_text().splitlines():
            if line.startswith("{"):
                d = json.loads(line)
                if "versions" in d:
                    self.r["node"].update(d["versions"])
                else:
                    self.r["checks"].append(d)
        self.r["node"].update(driver=self._driver())
        node = self.r["node"]
        failed = [c for c in self.r["checks"] if c["ok"] is False]
        if cut or rc != 0 or "torch" not in node:
            failed.append(
                {
                    "check": "the checks themselves",
                    "ok": False,
                    "detail": f"cut after {self.a.checks_s:.0f} s" if cut else f"exit {rc}, see checks.log",
                }
            )
        if node.get("driver") and node.get("cuda") is False:
            failed.append(
                {
                    "check": "torch sees the GPU",
                    "ok": False,
                    "detail": f"nvidia-smi: {node['driver']}, torch.cuda.is_available() is False",
                }
            )
        self.r["checks"] += [c for c in failed if c not in self.r["checks"]]
        self.say(
            f"checks: {sum(c['ok'] is True for c in self.r['checks'])} passed, {len(failed)} failed; {versions_line(node)}"
        )
        return not failed

    def _driver(self) -> str:
        if not shutil.which("nvidia-smi"):
            return ""
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            return out.stdout.strip().splitlines()[0] if out.stdout.strip() else out.stderr.strip()[:200]
        except (OSError, subprocess.SubprocessError) as e:
            return f"nvidia-smi failed: {e}"

    # 2 and 4: a pytest tier, its outcomes read test by test
    def pytest_part(self, part: str, mark: str, budget: float, workers: int, order: bool) -> None:
        p = self.r["parts"][part] = {"state": "running", "tests": {}, "collected": []}
        if budget < 10:
            p["state"] = "not run: budget spent"
            return
        prev = ((self.prev or {}).get("parts", {}).get(part) or {}).get("tests", {})
        done = {i for i, t in prev.items() if t["outcome"] in ("passed", "skipped")}
        reports, collected, skip = (self.out / f"{part}.jsonl", self.out / f"{part}.collected", self.out / f"{part}.skip")
        for f in (reports, collected):
            f.unlink(missing_ok=True)
        skip.write_text("".join(i + "\n" for i in sorted(done)))
        xdist = workers > 1 and importable("xdist")
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "benchmarks.gpu.pytest_order",
            "-m",
            mark,
            "-v",
            "--tb=short",
            "-o",
            "console_output_style=classic",
            *(["-n", str(workers)] if xdist else []),
            *shlex.split(self.a.pytest_args),
        ]
        p["cmd"] = " ".join(["python", *cmd[1:]])
        p["workers"] = workers if xdist else 1
        if workers > 1 and not xdist:
            p["note"] = "pytest-xdist missing: one at a time"
        env = {
            **self.env,
            "GPU_CHECK_REPORTS": str(reports),
            "GPU_CHECK_COLLECTED": str(collected),
            "GPU_CHECK_SKIP": str(skip),
            **({"GPU_CHECK_ORDER": "1"} if order else {}),
        }
        self.say(f"{part}: {p['cmd']} (within {budget:.0f} s)")
        self.save()
        t_end = time.monotonic() + budget
        proc_log = self.out / f"{part}.log"
        # run_cmd blocks; a watcher thread turns the reports into the summary as they come
        import threading

        stop = threading.Event()

        def watch() -> None:
            seen = 0
            while not stop.wait(2.0):
                n = self._read_reports(p, reports, collected, prev)
                if n != seen:
                    seen = n
                    self.save()

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        try:
            rc, cut, wall = run_cmd(cmd, proc_log, max(t_end - time.monotonic(), 0.1), env)
        finally:
            stop.set()
            t.join()
            self._read_reports(p, reports, collected, prev)
        p["wall_s"] = round(wall, 1)
        p["exit"] = rc
        p["state"] = "cut" if cut else "done"
        if not cut and rc not in (0, 1, 5):
            p["state"] = f"pytest exit {rc}, see {proc_log.name}"
        self.say(f"{part}: {counts_line(p)}")
        self.save()

    def _read_reports(self, p: dict, reports: Path, collected: Path, prev: dict) -> int:
        if collected.exists():
            p["collected"] = [ln for ln in collected.read_text().splitlines() if ln]
        tests = {i: dict(t, earlier=True) for i, t in prev.items() if t["outcome"] in ("passed", "skipped")}
        if reports.exists():
            for line in reports.read_text().splitlines():
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line being written
                old = tests.get(d["id"])
                if old is None or old.get("earlier") or rank(d["outcome"]) > rank(old["outcome"]):
                    tests[d["id"]] = {"outcome": d["outcome"], "error": d["error"]}
        p["tests"] = tests
        return len(tests)

    # 3. figures
    def figures(self) -> None:
        names = self.a.figures or list(FIGURES)
        unknown = [n for n in names if n not in FIGURES]
        if unknown:
            raise SystemExit(f"unknown figure(s): {unknown}; known: {list(FIGURES)}")
        if self.prev:
            names = [n for n in names if (self.prev.get("figures", {}).get(n) or {}).get("value") is None]
        figs = self.r["figures"]
        for n in names:
            figs[n] = {"state": "not run", "cmd": FIGURES[n].cmd, "unit": FIGURES[n].unit}
        if self.prev:
            for n, f in self.prev.get("figures", {}).items():
                if f.get("value") is not None and n not in figs:
                    figs[n] = dict(f, earlier=True)
        (self.out / "figures").mkdir(exist_ok=True)
        for n in names:
            fig = FIGURES[n]
            if fig.device == "cuda" and not self.r["node"].get("cuda"):
                figs[n]["state"] = "skipped: no CUDA device"
                continue
            budget = min(self.a.figure_s * fig.weight, self.left() - 5)
            if budget < min(5, self.a.figure_s):
                figs[n]["state"] = "not run: budget spent"
                continue
            code = fig.code()
            log = self.out / "figures" / f"{n}.log"
            # the benchmark's run folders (tempfile) land here, where a cut leaves them to be read
            tmp = self.out / "figures" / f"{n}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)  # an earlier run's, cut by a signal
            tmp.mkdir()
            # inductor's cache stays where it was (it follows TMPDIR): the compiled figures reuse what the cuda
            # tests compiled
            env = {
                **self.env,
                "TMPDIR": str(tmp),
                "TORCHINDUCTOR_CACHE_DIR": self.env.get("TORCHINDUCTOR_CACHE_DIR") or inductor_cache_dir(),
            }
            try:
                rc, cut, wall = run_cmd([sys.executable, "-c", code], log, budget, env)
                got = progress_at_cut(tmp) if rc is None else None
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            text = log.read_text()
            f = figs[n]
            f["wall_s"] = round(wall, 1)
            value = last_float(text) if rc == 0 else None
            if value is not None:
                f.update(state="done", value=round(value, 1))
            elif cut:
                f["state"] = f"cut after {budget:.0f} s" + (f" ({got})" if got else "")
                with open(log, "a") as lf:
                    lf.write(f"[gpu_check] at the cut: {got or 'no progress.csv row (none yet, or none kept)'}\n")
            else:
                f.update(state="failed", error=first_error(text))
            self.say(f"figure {n}: {f.get('value', f['state'])} {fig.unit if value is not None else ''}")
            self.save()

    # 5. the race beside LeanRL's own scripts (benchmarks/gpu/race.py), same node, same window, one after another
    def race(self) -> None:
        a = self.a
        names = a.race or R.ORDER
        folder = self.out / "race"
        folder.mkdir(exist_ok=True)
        leanrl = Path(a.leanrl).resolve() if a.leanrl else None
        prev = (self.prev or {}).get("race", {})
        results, site = self.r["race"], None
        try:
            for name in names:
                if (prev.get(name) or {}).get("state") == "done":
                    results[name] = dict(prev[name], earlier=True)
                    continue
                item = R.plan(name, a.dry)
                entry = results[name] = {"what": item.what, "state": "running", "runs": {}}
                for run in item.runs:
                    r = entry["runs"][run.label] = {"state": "not run", "unit": run.unit, "min_steps": run.min_steps}
                    if run.kind == "leanrl" and not (leanrl and Path(R.leanrl_argv(run, leanrl)[0]).exists()):
                        r["state"] = f"skipped: no {run.argv[0].split('/')[-1]} in --leanrl {a.leanrl or '(none)'}"
                        continue
                    budget = min(a.race_run_s, self.left() - 5)
                    if budget < min(15, a.race_run_s):
                        r["state"] = "not run: budget spent"
                        continue
                    if run.kind == "leanrl" and site is None:
                        site = self._leanrl_site(folder)
                    self._race_run(name, run, r, budget, folder, leanrl, site)
                    self.say(f"race {name}, {run.label}: " + (R.run_line("", r).strip()))
                    self.save()
                has = [
                    x.get("median") is not None or x.get("value") is not None or x["state"].startswith("skipped")
                    for x in entry["runs"].values()
                ]
                entry["state"] = "done" if all(has) else "incomplete"
                self.save()
        finally:
            if site:
                shutil.rmtree(site, ignore_errors=True)

    def _leanrl_site(self, folder: Path) -> str:
        """LeanRL's wheels (``<--wheels>/leanrl/*.whl``: tensordict, torchrl, pyvers, hoptorch) installed into a
        folder of their own that only LeanRL's processes see: ours run on the node's packages as in every figure."""
        import tempfile

        wheels = sorted((Path(self.a.wheels) / "leanrl").glob("*.whl")) if self.a.wheels else []
        if not wheels:
            self.r["race_install"] = "no LeanRL wheels (<--wheels>/leanrl/*.whl): the node's own packages"
            return ""
        site = tempfile.mkdtemp(prefix="leanrl-site-")
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", site]
        rc, _, _ = run_cmd([*cmd, *map(str, wheels)], folder / "install.log", min(120, self.left()), self.env)
        names = ", ".join(" ".join(wheel_name(w)) for w in wheels)
        self.r["race_install"] = (
            f"installed {names} for LeanRL only" if rc == 0 else f"pip failed (exit {rc}) for {names}, see race/install.log"
        )
        return site

    def _race_run(self, name: str, run, r: dict, budget: float, folder: Path, leanrl: Path | None, site: str) -> None:
        """One process of the race, cut after ``budget`` seconds; its figure from what it wrote, also when cut."""
        import tempfile

        slug = f"{name}-{re.sub(r'[^a-z0-9]+', '-', run.label.lower()).strip('-')}"
        log, env, cwd, edited = folder / f"{slug}.log", dict(self.env), None, ""
        if run.kind == "ours":
            argv = [*run.argv, "--out-dir", str(folder), "--run-name", slug]
        elif run.kind == "leanrl":
            argv = R.leanrl_argv(run, leanrl)
            paths = [site, str(leanrl / "stubs"), str(leanrl), env.get("PYTHONPATH")]  # the kit's folder: a copy runs
            env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
            if run.edited:  # race.LEANRL_EDITS made in a copy; the kit's own file is never written nor run unedited
                edited, r["edits"] = R.leanrl_edited(Path(argv[0]).read_text())
                if not r["edits"]:
                    r["state"] = f"not run: race.LEANRL_EDITS matched nothing in {Path(argv[0]).name}"
                    return
            cwd = Path(tempfile.mkdtemp(prefix=f"{slug}-"))  # whatever LeanRL writes lands there, not in the repo
        else:
            argv = run.argv
        r["cmd"] = "python " + " ".join(shlex.quote(a) for a in argv) + (" (an edited copy)" if edited else "")
        try:
            if edited:  # the copy runs from cwd, removed below whatever happens
                argv = [str(cwd / Path(argv[0]).name), *argv[1:]]
                Path(argv[0]).write_text(edited)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            rc, cut, wall = run_cmd([sys.executable, *argv], log, budget, env, cwd=cwd)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the whole tree, reaped by run_cmd: threads too
        finally:
            if cwd:
                shutil.rmtree(cwd, ignore_errors=True)
        r["wall_s"] = round(wall, 1)
        # the CPU time the run's processes used over its wall time: cores busy, beside the node line's cores and quota
        r["cpu_s"] = round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1)
        text = log.read_bytes().decode(errors="replace")
        r["state"] = "done" if rc == 0 else f"cut after {budget:.0f} s" if cut else "failed"
        if rc not in (0, None):
            r["error"] = first_error(text)
        try:
            if run.kind == "ours":
                r.update(progress_sps(folder / slug / "progress.csv", run.burn_in, run.min_steps))
                for junk in [*(folder / slug).glob("*.pt"), *(folder / slug).glob("events.out.tfevents*")]:
                    junk.unlink()  # the checkpoint and TensorBoard's copy of the rows: not needed here
            elif run.kind == "leanrl":
                speeds = R.tqdm_speeds(text)
                r["prints"] = len(speeds)
                r.update(window_sps(R.leanrl_intervals(speeds, run.schedule), run.burn_in, run.min_steps, run.every))
            elif rc == 0 and last_float(text) is not None:
                r["value"] = round(last_float(text), 1)
        except (OSError, ValueError) as e:  # no progress.csv, or no interval after the burn-in (yet)
            r.setdefault("error", f"no figure: {e}")

    # 6. PPO Breakout, 10M frames, one seed: the curve (progress.csv) comes back
    def long(self) -> None:
        a = self.a
        run_dir = Path(a.long_dir).resolve()
        r = self.r["long"] = {"state": "not run", "steps": a.long_steps, "run_dir": str(run_dir)}
        budget = min(a.long_s or float("inf"), self.left() - 30)  # SIGTERM: the script writes a row and checkpoint
        if budget < 30:
            r["state"] = "not run: budget spent"
            return
        argv = R.long_argv(run_dir, a.long_steps, a.dry)
        r["cmd"] = "python " + " ".join(argv)
        r["resumed"] = "--resume" in argv
        self.say(f"long: {r['cmd']} (within {budget:.0f} s)")
        self.save()
        rc, cut, wall = run_cmd([sys.executable, *argv], self.out / "long.log", budget, self.env, grace=20)
        r.update(wall_s=round(wall, 1), state="done" if rc == 0 else f"cut after {budget:.0f} s" if cut else "failed")
        if rc not in (0, None):
            r["error"] = first_error((self.out / "long.log").read_text(errors="replace"))
        progress = run_dir / "progress.csv"
        if progress.exists():
            shutil.copy(progress, self.out / "long-progress.csv")
            if str(ROOT) not in sys.path:
                sys.path.insert(0, str(ROOT))
            from shared.progress import read_rows

            rows = read_rows(progress)
            returns = [row["return_mean"] for row in rows if row.get("return_mean")]
            r.update(reached=int(rows[-1]["global_step"]) if rows else 0, rows=len(rows))
            r["return_mean"] = float(returns[-1]) if returns else None
            try:
                r["sps"] = window_sps(intervals_from_rows(rows), int(rows[0]["global_step"]))["median"]
            except (ValueError, IndexError):
                pass
        self.say(f"long: {r['state']}, step {r.get('reached', 0):,} of {a.long_steps:,}")
        self.save()

    def run(self) -> int:
        a = self.a
        try:
            ok = self.checks() if "checks" in a.parts else self.probe(full=False)
            self.save()
            if not ok:
                self.r["status"] = "stopped: a check failed"
                return 1
            gpu = bool(self.r["node"].get("cuda"))
            for part in a.parts:
                if part == "cuda":
                    if not gpu:
                        self.r["parts"]["cuda"] = {"state": "skipped: no CUDA device", "tests": {}}
                        continue
                    self.pytest_part("cuda", "cuda", min(a.cuda_s, self.left() - 10), a.workers, order=True)
                elif part == "figures":
                    if not gpu and not a.figures:
                        self.r["figures"] = {}
                        self.r["parts"]["figures"] = {"state": "skipped: no CUDA device"}
                        continue
                    self.r["parts"]["figures"] = {"state": "running"}
                    self.figures()
                    self.r["parts"]["figures"]["state"] = "done"
                elif part in ("race", "long"):
                    self.r[part] = {}
                    if not gpu and not a.dry:
                        self.r["parts"][part] = {"state": "skipped: no CUDA device (--dry runs it on the CPU)"}
                        continue
                    self.r["parts"][part] = {"state": "running"}
                    self.race() if part == "race" else self.long()
                    self.r["parts"][part]["state"] = "done"
                elif part == "unit":
                    self.pytest_part("unit", "unit", min(a.unit_s, self.left() - 5), a.unit_workers, order=False)
                self.save()
            cut = [n for n, p in self.r["parts"].items() if str(p.get("state", "")).startswith("cut")]
            cut += [n for n, f in self.r["figures"].items() if f["state"].startswith(("cut", "not run"))]
            cut += [f"race {n}" for n, e in self.r.get("race", {}).items() if e.get("state") != "done"]
            cut += ["long"] if self.r.get("long") and self.r["long"].get("state") != "done" else []
            self.r["status"] = ("finished" if self.left() > 0 else "budget spent") + (
                f", cut or not run: {', '.join(cut)}" if cut else ""
            )
        except Interrupted as e:
            self.r["status"] = f"interrupted ({e})"
        finally:
            left = kill_tree()
            if left:
                self.r["leftovers_killed"] = left
            self.save()
        return 0 if all_passed(self.r) else 1


def importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="folder for the summary, results.json and every log")
    p.add_argument("--budget", type=float, default=480, help="seconds for everything (default 480)")
    p.add_argument(
        "--parts",
        default="checks,cuda,figures",
        help="comma-separated, in order: checks (install, imports, envs; without it only torch's "
        "versions and the CUDA checks), cuda, figures, race, long, unit (default checks,cuda,figures)",
    )
    p.add_argument("--unit", action="store_true", help="add the unit tier (python -m pytest -m unit), about 3 min")
    p.add_argument("--checks-s", type=float, default=150, help="seconds for the imports, envs and CUDA checks")
    p.add_argument("--cuda-s", type=float, default=220, help="seconds for the cuda test set (default 220)")
    p.add_argument("--workers", type=int, default=4, help="pytest-xdist workers for the cuda tests (default 4)")
    p.add_argument("--figure-s", type=float, default=30, help="seconds for each figure (default 30)")
    p.add_argument("--figures", nargs="*", help=f"which figures, in order (default all: {' '.join(FIGURES)})")
    p.add_argument("--unit-s", type=float, default=240, help="seconds for the unit tier (default 240)")
    p.add_argument("--unit-workers", type=int, default=1, help="pytest-xdist workers for the unit tier (default 1)")
    p.add_argument(
        "--pytest-args", default="", help="more pytest arguments for the cuda and unit parts, e.g. '-k sync' or a test file"
    )
    p.add_argument("--wheels", default=str(ROOT / ".whl"), help="wheel folder to install from ('' for none)")
    p.add_argument(
        "--race",
        nargs="*",
        help="race items, in order (default all: envs ppo-atari ppo-mujoco td3 sac dqn c51 ddpg r2d1 envs-threads contexts)",
    )
    p.add_argument(
        "--leanrl",
        default=str(ROOT / ".peers" / "leanrl"),
        help="folder of LeanRL's scripts adapted to ale-py, with stubs/ (default .peers/leanrl); its packages come "
        "from <--wheels>/leanrl/*.whl, installed for LeanRL's processes only",
    )
    p.add_argument("--race-run-s", type=float, default=150, help="seconds for each process of the race (default 150)")
    p.add_argument("--long-steps", type=int, default=2_500_000, help="the long part's agent steps (default 2.5M: 10M frames)")
    p.add_argument(
        "--long-dir",
        default=str(ROOT / "runs" / "gpu-check-ppo-breakout-10m"),
        help="the long part's run folder; resumed when it holds a checkpoint (default runs/gpu-check-ppo-breakout-10m)",
    )
    p.add_argument("--long-s", type=float, default=0, help="seconds for the long part (default: what the budget leaves)")
    p.add_argument(
        "--dry",
        action="store_true",
        help="run the race and long parts on the CPU (no CUDA, no compiling, tiny windows): the plumbing, not figures",
    )
    p.add_argument(
        "--redo", metavar="PREV_OUT", help="an earlier run's folder: run only the tests and figures that did not pass there"
    )
    a = p.parse_args()
    a.parts = [x for x in a.parts.split(",") if x] + (["unit"] if a.unit and "unit" not in a.parts else [])
    bad = set(a.parts) - {"checks", "cuda", "figures", "race", "long", "unit"}
    if bad:
        p.error(f"unknown part(s) {sorted(bad)}")
    unknown = [n for n in a.race or [] if n not in R.ORDER]
    if unknown:
        p.error(f"unknown race item(s) {unknown}; known: {' '.join(R.ORDER)}")
    become_subreaper()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, interrupt)
    check = Check(a)
    code = check.run()
    print(summary(check.r, check.out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
