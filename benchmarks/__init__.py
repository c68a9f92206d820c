"""Benchmarks by what they measure: ``speed/`` (steps per second, time and memory, ours beside SB3, CleanRL and
LeanRL), ``learning/`` (returns and curves), ``checks/`` (pass or fail: a long run's growth, the torch range, the
scripts' size, the cheap learning figures re-measured) and ``gpu/`` (the one command for a GPU node). Each file
runs as a script (``python benchmarks/speed/sum_tree.py``); ``README.md`` has one line per benchmark, and
``results/README.md`` the figures with their commits and commands."""
