"""Does a long run grow? Runs one training command for a set time and samples its whole process tree every
interval: resident memory (private and shared pages apart), open file descriptors, mapped memfd segments
(``shared.buffer``'s shared memory), processes, and the run's global step. Then it stops the run with SIGINT,
waits for its exit, checks that nothing of it is left (no process, no ``/dev/shm`` entry that was not there), and
prints the growth from the first sample at or after ``--after-step`` (the replay full) to the last, side by side.

    python benchmarks/checks/leak_check.py --minutes 70 --after-step 40000 --out /tmp/longrun -- \\
        python algos/dqn_atari.py --sampler async --buffer-size 30000 --min-steps-learn 5000 --out-dir /tmp/longrun/runs

The command must write its run folder under ``--out`` (``--out-dir``): the global step comes from its
``progress.csv``. Samples go to ``OUT/samples.csv`` as they are taken, so a cut run still has them.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: shared/ imports from the repository
from shared.procs import descendants, process_table

FIELDS = ["minute", "global_step", "processes", "rss_mib", "private_mib", "shared_mib", "fds", "memfds", "memfd_mib"]


def tree(root: int) -> list[int]:
    """``root`` and every process below it, zombies included (``shared.procs.descendants``)."""
    return [root, *descendants(root, zombies=True)]


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def memfds(pid: int) -> dict[str, int]:
    """Mapped memfd segments of ``pid`` (inode -> bytes): shared.buffer's anonymous shared memory."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/memfd:"):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out[parts[4]] = out.get(parts[4], 0) + hi - lo
    except OSError:
        pass
    return out


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def global_step(out: Path) -> int:
    """The last global step in the run's progress.csv under ``out`` (0 before the first row)."""
    files = sorted(out.rglob("progress.csv"), key=lambda p: p.stat().st_mtime)
    if not files:
        return 0
    with open(files[-1]) as f:
        rows = list(csv.reader(f))
    return int(float(rows[-1][0])) if len(rows) > 1 and rows[-1] and rows[-1][0] != "global_step" else 0


def sample(root: int, out: Path, minute: float) -> dict:
    pids = tree(root)
    kib = [status_kib(p) for p in pids]
    segments: dict[str, int] = {}
    for p in pids:
        segments.update(memfds(p))
    mib = lambda key: round(sum(k.get(key, 0) for k in kib) / 1024, 1)
    return {
        "minute": round(minute, 2),
        "global_step": global_step(out),
        "processes": len(pids),
        "rss_mib": mib("VmRSS"),
        "private_mib": mib("RssAnon"),
        "shared_mib": mib("RssShmem"),
        "fds": sum(fd_count(p) for p in pids),
        "memfds": len(segments),
        "memfd_mib": round(sum(segments.values()) / 2**20, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=70.0, help="how long the run goes before SIGINT")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--after-step", type=int, default=0, help="compare from the first sample at this step")
    parser.add_argument("--out", type=Path, required=True, help="samples.csv and the run's log go here")
    parser.add_argument("--stop-timeout", type=float, default=120.0, help="seconds the run may take to end")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the training command after --")
    args.out.mkdir(parents=True, exist_ok=True)
    shm_before = set(os.listdir("/dev/shm"))
    log = open(args.out / "run.log", "w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    start = time.monotonic()
    rows = []
    with open(args.out / "samples.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        while proc.poll() is None and time.monotonic() - start < args.minutes * 60:
            time.sleep(min(args.interval, max(0.1, args.minutes * 60 - (time.monotonic() - start))))
            if proc.poll() is not None:
                break
            rows.append(sample(proc.pid, args.out, (time.monotonic() - start) / 60))
            writer.writerow(rows[-1])
            f.flush()
            print(" ".join(f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    early = proc.poll()
    if early is None:
        os.kill(proc.pid, signal.SIGINT)
    t0 = time.monotonic()
    try:
        code = proc.wait(timeout=args.stop_timeout)
    except subprocess.TimeoutExpired:
        code = None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ended_in = time.monotonic() - t0
    left = survivors(proc.pid)
    for _ in range(50):  # children die with their parent (PDEATHSIG) but take a moment to go
        if not left:
            break
        time.sleep(0.1)
        left = survivors(proc.pid)
    shm_left = sorted(set(os.listdir("/dev/shm")) - shm_before)

    print(f"\ncommand: {' '.join(command)}")
    if early is not None:
        print(
            f"the run ended by itself after {(time.monotonic() - start) / 60:.1f} minutes, exit code {early} "
            f"(see {args.out / 'run.log'})"
        )
    else:
        print(f"stopped with SIGINT after {args.minutes:g} minutes: exit code {code} in {ended_in:.1f} s")
    print(f"left behind 5 s after its exit: {len(left)} processes {left}, {len(shm_left)} /dev/shm entries {shm_left}")
    steady = [r for r in rows if r["global_step"] >= args.after_step]
    if len(steady) < 2:
        print(f"fewer than two samples at or after step {args.after_step}: nothing to compare")
        return 1
    first, last = steady[0], steady[-1]
    hours = (last["minute"] - first["minute"]) / 60
    print(
        f"from minute {first['minute']:g} (step {first['global_step']}) to minute {last['minute']:g} "
        f"(step {last['global_step']}), {len(steady)} samples:"
    )
    print(f"{'':>14} {'first':>10} {'last':>10} {'max':>10} {'last/first':>11} {'per hour':>10}")
    for key in FIELDS[2:]:
        a, b, top = first[key], last[key], max(r[key] for r in steady)
        ratio = f"{b / a:.3f}" if a else "-"
        rate = f"{(b - a) / hours:+.1f}" if hours > 0 else "-"
        print(f"{key:>14} {a:>10} {b:>10} {top:>10} {ratio:>11} {rate:>10}")
    return 0


def survivors(session: int) -> list[str]:
    """Processes still in the run's session (it was started in a new one), zombies included, by pid and command line."""
    out = []
    for stat in process_table().values():
        if stat.sid == session:
            try:
                out.append(f"{stat.pid} {Path(f'/proc/{stat.pid}/cmdline').read_text().replace(chr(0), ' ')[:80]}")
            except OSError:
                continue
    return out


if __name__ == "__main__":
    sys.exit(main())
