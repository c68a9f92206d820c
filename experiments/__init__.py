"""Experiments over the scripts in algos/: a grid of scripts x env ids x seeds x variants launched on this machine
(each run pinned to its own cores) or on a SLURM cluster, resumable, and the statistics of its results.

The modules, each saying in its docstring what it guarantees (``MODULES``):

- command lines: ``launch`` (run a grid), ``status`` (its runs' states, read only), ``report`` (tables and
  figures over the runs: rliable), ``plot`` (curves of any run folders; the one plotting module, which the
  benchmarks and the documentation site import too), ``tune`` (hyperparameter search over the launcher);
- what they are built from: ``flags`` (the one-line refusal of every command line, and the flags a launch
  passes checked by each script's own parser before anything is written), ``grid`` (the grid: parsing and
  expansion), ``slots`` (CPU and GPU slots), ``process`` (a run's process: pinned, in its own session, never
  outliving the launcher), ``records`` (each run's ``launch.json``: attempts, resuming, durability, damaged
  records refused), ``display`` (the live table), ``local`` (the local runner), ``slurm`` (job arrays through
  submitit); and tune's: ``search_space`` (``--search`` parsed and checked against a script's ``Args``), ``study``
  (a tune's storage, sampler and pruner, its checked ``Setup``, a trial's value), ``tune_folder`` (``tune.json``,
  the trials' run records, one study per tune folder), ``tune_display`` (the study's live table),
  ``tune_report`` (``tune-report/``).

They import each other without cycles (tested), and ``shared/`` only for its files, progress rows, affinity and
process helpers. Each imports as ``experiments.<name>``, and the command lines run as ``python
experiments/<name>.py``: run as scripts they put the repository root on sys.path themselves, so nothing needs
installing (``pip install -e .`` makes the package importable from anywhere).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: algos/ and shared/ are here

# The package's modules (its files), and those that are command lines (``python experiments/<name>.py``).
# tests/test_launch_contract.py imports every module of the folder and runs every command.
MODULES = tuple(sorted(p.stem for p in Path(__file__).parent.glob("*.py") if p.stem != "__init__"))
COMMANDS = ("launch", "plot", "report", "status", "tune")
