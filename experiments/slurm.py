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

try:
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:  # pragma: no cover - only --slurm needs it
    _Checkpointable = object


class Job(_Checkpointable):
    """What a job runs on its node: one process (a script's run, a tune process) in a session of its own, watched
    until it ends. submitit calls ``checkpoint`` on its timeout or preemption signal: the process gets SIGTERM and
    ``stop_timeout`` seconds to write its checkpoint (then its session is killed), and the job is requeued with the
    same arguments. The local executor's cancel (a KeyboardInterrupt in the job) stops it the same way."""

    stop_timeout = 120.0

    def watch(self, cmd: list[str], folder: Path, env: dict[str, str]) -> int:
        """Start ``cmd`` in ``folder`` (its logs there) and wait for it; its exit status."""
        self._proc, self._signalled = start_process(cmd, folder, env), False
        self.started(self._proc.pid)
        try:
            while self._proc.poll() is None:  # poll, not wait: the signal handler below polls it too
                time.sleep(0.5)
        except KeyboardInterrupt:
            self._terminate()
            raise
        finally:
            kill_session(self._proc.pid)
        return self._proc.returncode

    def started(self, pid: int) -> None:
        """Called once the process runs (``SlurmRun`` records its pid)."""

    def ended(self) -> None:
        """Called when ``checkpoint`` or a cancel has ended the process (``SlurmRun`` records the attempt's end)."""

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
        self.ended()

    def checkpoint(self, *args):  # submitit: on the timeout (USR2) signal, before requeuing
        import submitit

        self._terminate()
        return submitit.helpers.DelayedSubmission(type(self)(), *args)

    def __getstate__(self) -> dict:  # a Popen does not pickle
        return {}


class SlurmRun(Job):
    """The job of one run: the same attempt as the local launcher (resuming when a checkpoint exists), recorded in
    the run's launch.json, with ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` set to ``cores``. It fails (for submitit)
    unless the run ends done."""

    def __call__(self, run: Trial, cores: int) -> str:
        self._run, self._record = run, read_json(run.folder / "launch.json")
        self._record.setdefault("attempts", [])
        job = {"slurm_job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")}
        cmd, _ = begin_attempt(run, self._record, None, job)
        env = dict(os.environ, OMP_NUM_THREADS=str(cores), MKL_NUM_THREADS=str(cores), PYTHONUNBUFFERED="1")
        self.watch(cmd, run.folder, env)
        self.ended()
        state, rec = self._record["state"], self._record
        if state != "done":
            raise RuntimeError(f"{run.rel}: {state}, exit {rec['exit_code']}: {rec.get('error')}")
        return state

    def started(self, pid: int) -> None:
        self._record["pid"] = pid
        write_json(self._run.folder / "launch.json", self._record)

    def ended(self) -> None:
        if self._record.get("state") == "running":
            end_attempt(self._run, self._record, self._proc.returncode, self._signalled)
            write_json(self._run.folder / "launch.json", self._record)


class TuneWorker(Job):
    """One ``experiments/tune.py`` process as a job (``tune.py --slurm --workers N``), with its node's slots, on the
    study's storage with the other workers; SIGTERMed (its trials go back to the study's queue) when the job is
    requeued, and the requeued worker takes them up again. It fails (for submitit) unless the process exits 0."""

    stop_timeout = 300.0

    def __call__(self, root: str, command: list[str]) -> int:
        job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getpid())
        folder = Path(root) / ".workers" / job
        folder.mkdir(parents=True, exist_ok=True)
        if self.watch(command, folder, dict(os.environ, PYTHONUNBUFFERED="1")) != 0:
            raise RuntimeError(f"tune worker exit {self._proc.returncode} (see {folder}/stderr.log)")
        return 0


def executor(a: argparse.Namespace, root: Path):
    """submitit's executor for ``--cluster``, its logs in ``root/.submitit``; the jobs find this module by
    ``PYTHONPATH``, which gets the repository root."""
    try:
        import submitit
    except ImportError:
        raise LaunchError("--slurm needs submitit (pip install -r requirements.txt)") from None
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in paths if p]])
    return submitit.AutoExecutor(folder=root / ".submitit" / "%j", cluster=None if a.cluster == "auto" else a.cluster)


def shape(ex, a: argparse.Namespace, name: str, cpus: int, gpus: int, parallelism: int) -> None:
    """The jobs' shape: ``--time``, ``--partition``, ``--mem-gb``, ``--slurm-param``, CPUs, GPUs and the array's
    parallelism, every job requeueable."""
    extra = dict(kv.split("=", 1) for kv in a.slurm_param)
    params: dict[str, Any] = dict(timeout_min=a.time, cpus_per_task=cpus, nodes=1, tasks_per_node=1, name=name)
    params.update(slurm_array_parallelism=parallelism, slurm_additional_parameters={"requeue": True, **extra})
    params.update({k: v for k, v in (("gpus_per_node", gpus), ("slurm_partition", a.partition), ("mem_gb", a.mem_gb)) if v})
    ex.update_parameters(**params)


def wait(jobs: list, cancel: bool, timeout: float, tick=None) -> int | None:
    """Wait for ``jobs`` (``tick()`` every half second). Ctrl-C or SIGTERM stops waiting: with ``cancel`` the jobs
    are cancelled (their processes write a checkpoint) and waited for up to ``timeout`` seconds. The signal's number,
    or None when every job ended."""
    with stop_signals() as stop:
        while not all(j.done() for j in jobs) and stop.signum is None:
            if tick:
                tick()
            time.sleep(0.5)
        if stop.signum is not None and cancel:
            for j in jobs:
                with contextlib.suppress(Exception):
                    j.cancel(check=False)
            deadline = time.time() + timeout
            while not all(j.done() for j in jobs) and time.time() < deadline:
                time.sleep(0.5)
    return stop.signum


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
    root = runs[0].root
    ex = executor(a, root)
    jobs_file = root / "slurm_jobs.json"
    known = read_json(jobs_file)
    submitted: list[tuple[Trial, Any]] = []
    for nproc in sorted({r.nproc for r in todo}):
        group = [r for r in todo if r.nproc == nproc]
        gpus = (a.gpus_per_run or 0) * nproc
        shape(ex, a, f"launch-{root.name}", a.cores_per_run * nproc, gpus, a.array_parallelism)
        for r in group:  # recorded before submitting: a started job then only moves it on
            records[r.rel].update(state="submitted", exit_code=None, error=None)
            save(r)
        jobs = ex.map_array(SlurmRun(), group, [a.cores_per_run] * len(group))
        for r, job in zip(group, jobs):
            known[r.rel] = {"job_id": job.job_id, "cluster": ex.cluster, "submitted": now()}
            submitted.append((r, job))
            display.note(f"submitted {r.rel} as job {job.job_id} ({ex.cluster})")
    write_json(jobs_file, known)
    write_status(runs, records)
    local = ex.cluster in ("local", "debug")
    if not (a.wait or local):
        display.note(f"{len(submitted)} job(s) submitted; `launch.py {root} --status` shows their states")
        return 0

    def tick() -> None:
        for r in runs:
            records[r.rel] = read_json(r.folder / "launch.json") or records[r.rel]
        display.tick()

    if local:  # the jobs are this machine's: a Ctrl-C ends them (on SLURM it only stops waiting)
        display.note("Ctrl-C or SIGTERM stops the local jobs (their scripts write a checkpoint)")
    stopped = wait([job for _, job in submitted], local, a.stop_timeout, tick)
    for r, job in submitted:
        rec = read_json(r.folder / "launch.json") or records[r.rel]
        if rec.get("state") in ("submitted", "running") and not pid_runs(rec.get("pid"), r.folder):
            failed = f"error: job {job.job_id} ended without recording an exit (see {root}/.submitit/)"
            rec.update(
                state="interrupted" if stopped else "failed", pid=None, error=rec.get("error") or None if stopped else failed
            )
            write_json(r.folder / "launch.json", rec)
        records[r.rel] = rec
    write_status(runs, records)
    return EXIT_INTERRUPTED if stopped is not None else -1  # -1: summarise


def submit_workers(a: argparse.Namespace, command: list[str], root: Path) -> int:
    """``a.workers`` jobs each running ``command`` (the tune without its SLURM options) with ``a.cpus_per_worker``
    CPUs; with ``--cluster local`` or ``--wait``: waits for them (Ctrl-C/SIGTERM cancels them: each tune process
    stops its runs and re-queues its trials) and returns 0 when every worker exited 0, else 1."""
    ex = executor(a, root)
    shape(ex, a, f"tune-{root.name}", a.cpus_per_worker or a.cores_per_run, a.gpus_per_worker, a.workers)
    root.mkdir(parents=True, exist_ok=True)
    jobs = ex.map_array(TuneWorker(), [str(root)] * a.workers, [command] * a.workers)
    ids = ", ".join(j.job_id for j in jobs)
    print(f"{len(jobs)} tune worker(s) submitted ({ex.cluster}): {ids}; logs in {root}/.workers/", flush=True)
    if not (a.wait or ex.cluster in ("local", "debug")):
        return 0
    if wait(jobs, True, a.stop_timeout + 30) is not None:
        return EXIT_INTERRUPTED
    failed = [j.job_id for j in jobs if j.state not in ("COMPLETED", "FINISHED") and j.exception() is not None]
    return 1 if failed else 0
