"""The project's plumbing, shared by the scripts in algos/: data structures, replay, shared memory, affinity.

Each module stands alone and says in its docstring what it guarantees. Scripts put the repository root on
sys.path themselves, so nothing needs installing.
"""
