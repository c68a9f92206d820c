"""Experiments over the scripts in algos/: a grid of scripts x env ids x seeds x variants launched on this machine
(each run pinned to its own cores) or on a SLURM cluster, resumable, and the statistics of its results.

``launch.py`` is the command line; each other module does one job of it and says in its docstring what it
guarantees: ``grid`` (the grid: parsing and expansion), ``slots`` (CPU and GPU slots), ``process`` (a run's
process: pinned, in its own session, never outliving the launcher), ``records`` (each run's ``launch.json``:
attempts, resuming, durability), ``status`` (what the runs reached: progress, ``status.json``), ``display`` (the
live table), ``local`` (the local runner), ``slurm`` (job arrays through submitit); ``report.py`` is the report
over the runs (rliable). They import each other without cycles (tested), and ``shared/`` only for its files,
progress rows, affinity and process helpers. Run as scripts, ``launch.py`` and ``report.py`` put the repository
root on sys.path themselves, so nothing needs installing.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: algos/ and shared/ are here
