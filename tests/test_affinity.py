"""Core assignment: splitting, the string code, pinning."""

import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from shared.affinity import Affinity, available_cpus, make_affinity, physical_cores, slot_code

cpu_sets = st.lists(st.integers(0, 63), min_size=1, max_size=12, unique=True).map(lambda c: tuple(sorted(c)))


@given(learner=cpu_sets, workers=st.lists(cpu_sets, max_size=5), threads=st.integers(1, 16), pin=st.booleans())
def test_code_round_trips(learner, workers, threads, pin):
    a = Affinity(learner, tuple(workers), threads, pin)
    code = a.encode()
    assert all(ch.isalnum() or ch in "+-,." for ch in code)  # shell-safe, no quoting needed
    assert Affinity.decode(code) == a


def test_code_reads_as_documented():
    a = Affinity.decode("L0-1+W2,3.5+T2")
    assert a.learner_cpus == (0, 1) and a.worker_cpus == ((2,), (3, 5)) and a.torch_threads == 2 and a.pin
    assert Affinity.decode("L4+N") == Affinity((4,), (), 1, False)


@pytest.mark.parametrize("code", ["", "W1", "L", "L1-0", "Lx", "L1+Q2", "L1+W", "L1+T0"])
def test_bad_codes_raise_value_error(code):
    with pytest.raises(ValueError):
        Affinity.decode(code)


@given(
    cpus=st.lists(st.integers(0, 31), min_size=1, max_size=16, unique=True).map(tuple), n_workers=st.none() | st.integers(0, 8)
)
def test_async_split_keeps_learner_and_workers_apart(cpus, n_workers):
    a = make_affinity("async", n_workers, cpus)
    used = set(a.learner_cpus) | {c for w in a.worker_cpus for c in w}
    assert used <= set(cpus)
    if len(physical_cores(cpus)) > 1:
        assert not set(a.learner_cpus) & {c for w in a.worker_cpus for c in w}
    assert a.torch_threads == len(physical_cores(a.learner_cpus))
    assert a.pin  # explicit cpus: pinned


def test_async_gives_its_one_sampler_every_core_the_learner_leaves_and_a_gpu_learner_one_core(monkeypatch):
    """Every script's async mode runs one sampler process (worker 0): it holds all the non-learner cores (not one
    of them, the others idle) with a torch thread per core; a GPU learner keeps one core (review F18)."""
    monkeypatch.setattr(
        "shared.affinity.physical_cores", lambda cpus=None: [(c,) for c in (cpus if cpus is not None else range(8))]
    )
    cpu_learner = make_affinity("async", cpus=tuple(range(8)))
    assert cpu_learner.learner_cpus == (0, 1, 2, 3) and cpu_learner.worker_cpus == ((4, 5, 6, 7),)
    gpu_learner = make_affinity("async", cpus=tuple(range(8)), gpu_learner=True)
    assert gpu_learner.learner_cpus == (0,) and gpu_learner.worker_cpus == ((1, 2, 3, 4, 5, 6, 7),)
    assert gpu_learner.torch_threads == 1
    applied = []
    monkeypatch.setattr("shared.affinity._apply", lambda cpus, threads, pin: applied.append((cpus, threads)))
    gpu_learner.apply_worker(0)
    assert applied == [((1, 2, 3, 4, 5, 6, 7), 7)]
    make_affinity("async", cpus=tuple(range(8)), pin=False).apply_worker(0)  # cores it may share: one thread
    assert applied[-1] == ((4, 5, 6, 7), 1)
    two = make_affinity("async", cpus=(0, 1), gpu_learner=True)  # this machine: one core each, as before
    assert two.learner_cpus == (0,) and two.worker_cpus == ((1,),)
    assert make_affinity("async", 3, tuple(range(8))).worker_cpus == ((4,), (5,), (6,))


def test_parallel_spreads_workers_round_robin_and_serial_takes_everything():
    cpus = (0, 1, 2)
    par = make_affinity("parallel", 5, cpus)
    assert [w[0] for w in par.worker_cpus] == [0, 1, 2, 0, 1]
    ser = make_affinity("serial", cpus=cpus)
    assert ser.learner_cpus == cpus and ser.worker_cpus == ()


def test_default_does_the_right_thing_on_a_laptop():
    a = make_affinity()
    assert set(a.learner_cpus) == set(available_cpus())
    assert not a.pin and a.torch_threads == len(physical_cores())


def test_slots_are_disjoint_and_cover_equal_shares():
    cpus = tuple(range(8))
    codes = [slot_code(k, 4, "async", cpus=cpus) for k in range(4)]
    seen = set()
    for code in codes:
        a = Affinity.decode(code)
        mine = set(a.learner_cpus) | {c for w in a.worker_cpus for c in w}
        assert not mine & seen
        seen |= mine
    assert seen == set(cpus)
    with pytest.raises(ValueError, match="run_slot"):
        slot_code(4, 4, cpus=cpus)
    with pytest.raises(ValueError, match="n_slots"):
        slot_code(0, 9, cpus=cpus)


def test_apply_pins_and_sets_threads():
    before_cpus, before_threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        one = (min(available_cpus()),)
        Affinity(one, ((one[0],),), 1, True).apply_learner()
        assert os.sched_getaffinity(0) == set(one) and torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, before_cpus)
        torch.set_num_threads(before_threads)


def test_bad_mode_and_counts():
    with pytest.raises(ValueError, match="mode"):
        make_affinity("threads")
    with pytest.raises(ValueError, match="n_workers"):
        make_affinity("parallel", -1)


@pytest.mark.parametrize("mode", ["serial", "parallel", "async"])
def test_local_torchrun_ranks_split_the_cores_between_them(mode, monkeypatch):
    cores = physical_cores()
    for world in range(2, len(cores) + 1):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
        mine = []
        for r in range(world):
            monkeypatch.setenv("LOCAL_RANK", str(r))
            a = make_affinity(mode)
            used = set(a.learner_cpus).union(*map(set, a.worker_cpus))
            assert a.pin and used and used <= set(available_cpus())
            mine.append(used)
        assert all(not (mine[i] & mine[j]) for i in range(world) for j in range(i + 1, world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(len(cores) + 1))  # more ranks than cores: no pinning
    monkeypatch.setenv("LOCAL_RANK", "0")
    a = make_affinity(mode)
    assert not a.pin and a.torch_threads == 1
