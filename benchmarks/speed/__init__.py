"""How fast and how much memory: each file one figure or table, measured side by side in one run
(``benchmarks/script_speed.py`` reads a script's SPS from its progress rows)."""
