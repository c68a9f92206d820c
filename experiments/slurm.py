"""Clusters: the runs of the grid as SLURM job arrays through submitit, each job the same attempt as the local
runner's.

Guarantees
- ``submit`` sends the runs as job arrays (one array per resource shape) with ``--partition``, ``--time``
  (minutes), ``--gpus-per-run``, ``--cores-per-run``, ``--mem-gb``, ``--array-parallelism`` and
  ``--slurm-param KEY=VALUE``, every job requeueable. Each run is recorded as submitted before its array is sent
  (a started job then only moves it on), and its job id is kept in the root's ``slurm_jobs.json``; a run whose
  job is still queued or running is not submitted again (``slurm_alive``).
- A job (``SlurmRun``) runs the same attempt as the local runner (resuming when a checkpoint exists, recorded in
  the run's ``launch.json``), with ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` set to ``--cores-per-run``. On
  submitit's timeout signal it SIGTERMs the script, waits for its checkpoint and requeues itself; a preempted job
  (SLURM's SIGTERM reaches the script, which checkpoints) resumes when SLURM requeues it. It fails (for submitit)
  unless its run ends done.
- ``--cluster local`` runs the same jobs on this machine with submitit's local executor (all at once, not
  pinned; for testing) and waits for them; with SLURM ``--wait`` waits and summarises. While waiting, Ctrl-C or
  SIGTERM stops waiting (the local jobs are cancelled: their scripts checkpoint); a job that ended without
  recording an exit is failed (interrupted after a signal).
- The jobs import this module by name (``experiments.slurm``): the repository root is put on their
  ``PYTHONPATH``.
- ``submit_workers`` (``experiments/tune.py --slurm --workers N``): N jobs, each one tune process (``TuneWorker``)
  with its node's slots, all on one study's storage; a worker's timeout SIGTERMs its tune process (its trials go
  back to the study's queue) and requeues the job.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import time
import types
from pathlib import Path
from typing import Any

from experiments import ROOT
from experiments.display import Display
from experiments.grid import LaunchError, Trial
from experiments.process import kill_session, pid_runs, start_process
from experiments.records import EXIT_INTERRUPTED, begin_attempt, end_attempt, now, read_json, write_json
from experiments.status import write_status

__all__ = ["SlurmRun", "TuneWorker", "slurm_alive", "submit", "submit_workers"]

try:
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:  # pragma: no cover - only --slurm needs it
    _Checkpointable = object


class SlurmRun(_Checkpointable):
    """The job of one run on a cluster node: the same attempt as the local launcher (resuming when a checkpoint
    exists), recorded in the run's launch.json. submitit calls ``checkpoint`` on its timeout/preemption signal:
    the script gets SIGTERM, writes its checkpoint, and the requeued job resumes it."""

    stop_timeout = 120.0

    def __call__(self, spec: dict) -> str:
        run, record = spec_run(spec), read_json(Path(spec["folder"]) / "launch.json")
        record.setdefault("attempts", [])
        job = {"slurm_job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")}
        cmd, _ = begin_attempt(run, record, None, job)
        threads = str(spec["cores_per_run"])
        env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONUNBUFFERED="1")
        self._proc = start_process(cmd, run.folder, env)
        self._run, self._record, self._signalled = run, record, False
        record["pid"] = self._proc.pid
        write_json(run.folder / "launch.json", record)
        try:
            while self._proc.poll() is None:  # poll, not wait: the signal handler below polls it too
                time.sleep(0.5)
        except KeyboardInterrupt:  # the local executor's cancel
            self._terminate()
            raise
        finally:
            kill_session(self._proc.pid)
        state = self._finish()
        if state != "done":
            raise RuntimeError(f"{run.rel}: {state}, exit {record['exit_code']}: {record.get('error')}")
        return state

    def _terminate(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is None or proc.poll() is not None:
            return
        self._signalled = True
        proc.send_signal(signal.SIGTERM)
        deadline = time.time() + self.stop_timeout
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        kill_session(proc.pid)
        proc.wait()
        self._finish()

    def _finish(self) -> str:
        if self._record.get("state") != "running":
            return self._record["state"]
        state = end_attempt(self._run, self._record, self._proc.returncode, self._signalled)
        write_json(self._run.folder / "launch.json", self._record)
        return state

    def checkpoint(self, spec: dict):  # submitit: on the timeout (USR2) signal, before requeuing
        import submitit

        self._terminate()
        return submitit.helpers.DelayedSubmission(SlurmRun(), spec)

    def __getstate__(self) -> dict:  # a Popen does not pickle
        return {}


@contextlib.contextmanager
def stop_signals():
    """While inside: SIGINT and SIGTERM are recorded (``stop.signum``), not raised, so the caller can stop its jobs
    its own way; the previous handlers are restored on the way out."""
    stop = types.SimpleNamespace(signum=None)

    def on_signal(signum, frame):
        stop.signum = signum

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_spec(run: Trial, cores_per_run: int) -> dict:
    return {
        "root": str(run.root),
        "script": run.script,
        "script_path": run.script_path,
        "env_id": run.env_id,
        "seed": run.seed,
        "variant": [[n, list(f)] for n, f in run.variant],
        "common": list(run.common),
        "nproc": run.nproc,
        "folder": str(run.folder),
        "cores_per_run": cores_per_run,
    }


def spec_run(spec: dict) -> Trial:
    return Trial(
        Path(spec["root"]),
        spec["script"],
        spec["script_path"],
        spec["env_id"],
        int(spec["seed"]),
        tuple((n, tuple(f)) for n, f in spec["variant"]),
        tuple(spec["common"]),
        int(spec["nproc"]),
    )


def job_fn() -> SlurmRun:
    """A ``SlurmRun``, which cloudpickle pickles by reference to ``experiments.slurm``; the jobs find that module
    through PYTHONPATH, which gets the repository root here."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in paths if p]])
    return SlurmRun()


def slurm_alive(job_id: str | None) -> bool:
    if not job_id:
        return False
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id)], capture_output=True, text=True, timeout=60)
        return bool(out.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        return False


def submit(
    a: argparse.Namespace, todo: list[Trial], runs: list[Trial], records: dict[str, dict], display: Display, save
) -> int:
    try:
        import submitit
    except ImportError:
        raise LaunchError("--slurm needs submitit (pip install -r requirements.txt)") from None
    root = runs[0].root
    cluster = None if a.cluster == "auto" else a.cluster
    executor = submitit.AutoExecutor(folder=root / ".submitit" / "%j", cluster=cluster)
    jobs_file = root / "slurm_jobs.json"
    known = read_json(jobs_file)
    submitted: list[tuple[Trial, Any]] = []
    for nproc in sorted({r.nproc for r in todo}):
        group = [r for r in todo if r.nproc == nproc]
        extra = dict(kv.split("=", 1) for kv in a.slurm_param)
        params: dict[str, Any] = dict(
            timeout_min=a.time,
            cpus_per_task=a.cores_per_run * nproc,
            nodes=1,
            tasks_per_node=1,
            name=f"launch-{root.name}",
            slurm_array_parallelism=a.array_parallelism,
            slurm_additional_parameters={"requeue": True, **extra},
        )
        if a.gpus_per_run:
            params["gpus_per_node"] = a.gpus_per_run * nproc
        if a.partition:
            params["slurm_partition"] = a.partition
        if a.mem_gb:
            params["mem_gb"] = a.mem_gb
        executor.update_parameters(**params)
        for r in group:  # recorded before submitting: a started job then only moves it on
            records[r.rel].update(state="submitted", exit_code=None, error=None)
            save(r)
        jobs = executor.map_array(job_fn(), [run_spec(r, a.cores_per_run) for r in group])
        for r, job in zip(group, jobs):
            known[r.rel] = {"job_id": job.job_id, "cluster": executor.cluster, "submitted": now()}
            submitted.append((r, job))
            display.note(f"submitted {r.rel} as job {job.job_id} ({executor.cluster})")
    write_json(jobs_file, known)
    write_status(runs, records)
    if not (a.wait or executor.cluster in ("local", "debug")):
        display.note(f"{len(submitted)} job(s) submitted; `launch.py {root} --status` shows their states")
        return 0
    with stop_signals() as stop:
        while not all(job.done() for _, job in submitted):
            if stop.signum is not None:
                break
            for r in runs:
                records[r.rel] = read_json(r.folder / "launch.json") or records[r.rel]
            display.tick()
            time.sleep(0.5)
        if stop.signum is not None and executor.cluster in ("local", "debug"):
            display.note("stopping the local jobs (their scripts write a checkpoint)")
            pids = [read_json(r.folder / "launch.json").get("pid") for r, _ in submitted]
            for _, job in submitted:
                with contextlib.suppress(Exception):
                    job.cancel(check=False)
            deadline = time.time() + a.stop_timeout
            while any(pid_runs(p, r.folder) for p, (r, _) in zip(pids, submitted)) and time.time() < deadline:
                time.sleep(0.2)
    for r, job in submitted:
        rec = read_json(r.folder / "launch.json") or records[r.rel]
        if rec.get("state") in ("submitted", "running") and not pid_runs(rec.get("pid"), r.folder):
            rec.update(
                state="interrupted" if stop.signum else "failed",
                pid=None,
                error=rec.get("error") or None
                if stop.signum
                else f"error: job {job.job_id} ended without recording an exit (see {root}/.submitit/)",
            )
            write_json(r.folder / "launch.json", rec)
        records[r.rel] = rec
    write_status(runs, records)
    return EXIT_INTERRUPTED if stop.signum is not None else -1  # -1: summarise


# ---------------------------------------------------------------------------------------------- tune workers


class TuneWorker(_Checkpointable):
    """One ``experiments/tune.py`` process as a job (``tune.py --slurm --workers N``): the tune process runs on
    the job's node with that node's slots, sharing the study's storage with the other workers. On submitit's
    timeout signal it gets SIGTERM (its runs checkpoint, its trials go back to the study's queue) and the job
    requeues itself; the requeued worker takes the trials up again. It fails (for submitit) unless the tune
    process exits 0."""

    stop_timeout = 300.0

    def __call__(self, spec: dict) -> int:
        job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getpid())
        folder = Path(spec["root"]) / ".workers" / job
        folder.mkdir(parents=True, exist_ok=True)
        self._proc = start_process(spec["command"], folder, dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            while self._proc.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:  # the local executor's cancel
            self._terminate()
            raise
        finally:
            kill_session(self._proc.pid)
        if self._proc.returncode != 0:
            raise RuntimeError(f"tune worker exit {self._proc.returncode} (see {folder}/stderr.log)")
        return 0

    def _terminate(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        deadline = time.time() + self.stop_timeout
        while proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        kill_session(proc.pid)
        proc.wait()

    def checkpoint(self, spec: dict):  # submitit: on the timeout (USR2) signal, before requeuing
        import submitit

        self._terminate()
        return submitit.helpers.DelayedSubmission(TuneWorker(), spec)

    def __getstate__(self) -> dict:  # a Popen does not pickle
        return {}


def submit_workers(a: argparse.Namespace, command: list[str], root: Path) -> int:
    """``a.workers`` jobs each running ``command`` (the tune without its SLURM options) with ``a.cpus_per_worker``
    CPUs; with ``--cluster local`` or ``--wait``: waits for them (Ctrl-C/SIGTERM cancels them: each tune process
    stops its runs and re-queues its trials) and returns 0 when every worker exited 0, else 1."""
    try:
        import submitit
    except ImportError:
        raise LaunchError("--slurm needs submitit (pip install -r requirements.txt)") from None
    executor = submitit.AutoExecutor(folder=root / ".submitit" / "%j", cluster=None if a.cluster == "auto" else a.cluster)
    extra = dict(kv.split("=", 1) for kv in a.slurm_param)
    params: dict[str, Any] = dict(
        timeout_min=a.time,
        cpus_per_task=a.cpus_per_worker or a.cores_per_run,
        nodes=1,
        tasks_per_node=1,
        name=f"tune-{root.name}",
        slurm_array_parallelism=a.workers,
        slurm_additional_parameters={"requeue": True, **extra},
    )
    if a.gpus_per_worker:
        params["gpus_per_node"] = a.gpus_per_worker
    if a.partition:
        params["slurm_partition"] = a.partition
    if a.mem_gb:
        params["mem_gb"] = a.mem_gb
    executor.update_parameters(**params)
    root.mkdir(parents=True, exist_ok=True)
    jobs = executor.map_array(job_fn_tune(), [{"root": str(root), "command": command}] * a.workers)
    print(
        f"{len(jobs)} tune worker(s) submitted ({executor.cluster}): {', '.join(j.job_id for j in jobs)}; logs in "
        f"{root}/.workers/",
        flush=True,
    )
    if not (a.wait or executor.cluster in ("local", "debug")):
        return 0
    with stop_signals() as stop:
        while not all(j.done() for j in jobs) and stop.signum is None:
            time.sleep(0.5)
        if stop.signum is not None:
            for j in jobs:
                with contextlib.suppress(Exception):
                    j.cancel(check=False)
            deadline = time.time() + a.stop_timeout + 30
            while not all(j.done() for j in jobs) and time.time() < deadline:
                time.sleep(0.5)
    if stop.signum is not None:
        return EXIT_INTERRUPTED
    failed = [j.job_id for j in jobs if j.state not in ("COMPLETED", "FINISHED") and j.exception() is not None]
    return 1 if failed else 0


def job_fn_tune() -> TuneWorker:
    job_fn()  # the repository root on PYTHONPATH, as for the runs' jobs
    return TuneWorker()
