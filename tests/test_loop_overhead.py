"""The loops' own host work, held to budgets (``benchmarks/speed/loop_overhead.py``), and the two switches that let a CPU
count it as a GPU runs it: ``RL_HOST_PATH`` (``shared.device``) and ``RL_COMPILE_GRAPHS=dry`` (``shared.compiling``).

The budgets are counts that do not depend on the machine (Python calls, torch calls, syncs, bytes copied, per vector
step and per rollout), so a change that adds host work to a loop fails here on any machine; the times the benchmark
prints are not asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from benchmarks.speed import loop_overhead
from tests.helpers import ROOT

SCRIPTS = list(loop_overhead.SCRIPTS)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def counts(tmp_path_factory) -> dict:
    """Every script's counts, from two runs of the benchmark side by side (each its own process: the switches are read
    at import; the counts do not depend on what else runs, and the tests' other core is idle meanwhile)."""
    tmp = tmp_path_factory.mktemp("overhead")
    command = [sys.executable, str(ROOT / "benchmarks" / "speed" / "loop_overhead.py"), "--counts", "--async", "--json"]
    halves = [["r2d1_atari"], [s for s in SCRIPTS if s != "r2d1_atari"]]  # R2D1's warm-up updates take as long as the rest
    procs = [
        subprocess.Popen([*command, str(tmp / f"{i}.json"), *half], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i, half in enumerate(halves)
    ]
    out = {}
    try:
        for i, proc in enumerate(procs):
            _, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, err.decode()[-3000:]
            out.update(json.loads((tmp / f"{i}.json").read_text()))
    finally:  # a failure or a timeout leaves no benchmark running
        for proc in procs:
            proc.kill()
            proc.wait()
    return out


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_loop_keeps_to_its_budget_of_host_work(counts, script):
    assert script in loop_overhead.BUDGETS, f"{script} has no budget in benchmarks/speed/loop_overhead.py"
    # {count: (now, budget)}; the call counts are those of the pinned torch and numpy (requirements.txt)
    assert loop_overhead.over_budget(script, counts[script]) == {}
    # the one declared copy a step makes (R2D1: a chunk's state, 1 in 32); every loop reads its actions back, so a
    # step counted with none is a read the counter missed (a copy to the host made some other way than .cpu())
    assert 1 <= counts[script]["syncs"] <= 1.05


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_floor_acts_through_the_host_paths_three_calls_and_does_no_more_than_the_script(counts, script):
    """The floor (``floor_loop``): every env's observations up through ``upload``, one ``@graphed`` acting call and
    its updates due, the actions back in ``to_host``'s one copy; and no more calls, bytes or replays than the script's
    loop, so that its ratio to the bare loop bounds the script's."""
    c = counts[script]
    space = loop_overhead.CHEETAH_OBS if script.endswith("_mujoco") else loop_overhead.ATARI_OBS
    one_env = int(np.prod(space.shape)) * (4 if script.endswith("_mujoco") else 1)  # float32 (normalised) or uint8
    assert c["floor_bytes_up"] == c["floor_envs"] * one_env and c["floor_syncs"] == 1
    assert c["floor_graph_calls"] == pytest.approx(1 + c["updates_per_step"])
    for k in ["python_calls", "torch_calls", "graph_calls", "bytes_up", "bytes_down"]:
        assert c[f"floor_{k}"] <= c[k], k


@pytest.mark.parametrize("script", ["ppo_atari", "a2c_atari", "ppo_lstm", "ppo_mujoco"])
def test_the_async_samplers_step_is_as_cheap_as_parallels(counts, script):
    """Issue 67, item 4: the async sampler process acts on the learner's device as the parallel sampler does, so its
    step costs the host what parallel's does (a few calls more: the host's arrays written into shared memory), one
    sync a step; on its CPU it ran the network itself."""
    c = counts[script]
    assert 1 <= c["async_syncs"] <= 1.02 and c["async_bytes_up"] == c["bytes_up"]
    assert c["async_torch_calls"] <= c["torch_calls"] + 2 and c["async_python_calls"] <= c["python_calls"] + 6


@pytest.mark.unit
def test_a_budget_is_broken_by_a_sync_or_a_torch_call_more():
    """What the budgets rely on: an extra ``.item()`` is a sync and a torch call, an extra upload its bytes."""
    t = torch.ones(3)
    base = loop_overhead.count(lambda: t + 1, 1)
    more = loop_overhead.count(
        lambda: ((t + 1).sum().item(), loop_overhead.device.upload(np.zeros(10), torch.device("cpu"))), 1
    )
    assert (base["syncs"], more["syncs"]) == (0, 1)
    assert loop_overhead.count(lambda: (t[t > 0], bool(t.sum())), 1)["syncs"] == 2  # a boolean-mask index, bool(t)
    assert more["torch_calls"] > base["torch_calls"]
    assert (base["bytes_up"], more["bytes_up"]) == (0, 80)
    loop_overhead.BUDGETS["fake"] = {"torch_calls": base["torch_calls"], "syncs": 0}
    try:
        assert loop_overhead.over_budget("fake", base) == {}
        assert set(loop_overhead.over_budget("fake", more)) == {"torch_calls", "syncs"}
    finally:
        del loop_overhead.BUDGETS["fake"]


CODE = """
import numpy as np, torch
from shared import device
t = torch.arange(6, dtype=torch.float32)
calls = []
one_copy = device.one_copy
device.one_copy = lambda ts: calls.append(len(ts)) or one_copy(ts)
out = device.to_host(t, t.long(), t > 2)
up = device.upload({"a": np.arange(4.0), "b": np.ones(3, bool)}, torch.device("cpu"))
print(calls, [o.tolist() for o in out], up["a"].tolist(), up["b"].tolist(), device._uploaders[torch.device("cpu")].copies)
"""


def test_the_cuda_host_path_on_the_cpu_packs_and_joins_and_keeps_the_values():
    """RL_HOST_PATH=cuda: to_host through one joined copy, upload packed in one block, values exact; without it the
    CPU path copies nothing (no join, no pack)."""
    cuda = run_python(CODE, RL_HOST_PATH="cuda")
    assert cuda.returncode == 0, cuda.stderr
    exact = "[[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [0, 1, 2, 3, 4, 5], [False, False, False, True, True, True]]"
    assert cuda.stdout.split() == f"[3] {exact} [0.0, 1.0, 2.0, 3.0] [True, True, True] 1".split()
    cpu = run_python(CODE, RL_HOST_PATH="")
    assert cpu.stdout.split() == f"[] {exact} [0.0, 1.0, 2.0, 3.0] [True, True, True] 0".split()


DRY = """
import json
import torch
from shared import compiling
calls = []

@compiling.graphed
def step(w, x):
    calls.append(1)
    return {"y": x * 2, "s": x.sum()}

compiling.enable("cpu")
w = torch.ones(1, requires_grad=True)
outs = [step(w, torch.full((3,), float(i))) for i in range(5)]
print(json.dumps([len(calls), [o["y"].tolist() for o in outs], [float(o["s"]) for o in outs]]))
"""


def test_dry_graphs_run_the_function_for_the_warm_up_and_the_capture_then_only_copy_out():
    """RL_COMPILE_GRAPHS=dry: calls 1-3 run the function (warm-up, the "capture"), later calls only its protocol, and
    copy out the third call's outputs again; without dry, every call runs it on the CPU."""
    dry = run_python(DRY, RL_COMPILE_GRAPHS="dry")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == [3, [[0.0] * 3, [2.0] * 3, [4.0] * 3, [4.0] * 3, [4.0] * 3], [0.0, 3.0, 6.0, 6.0, 6.0]]
    plain = run_python(DRY)
    assert json.loads(plain.stdout) == [5, [[2.0 * i] * 3 for i in range(5)], [3.0 * i for i in range(5)]]


@pytest.mark.unit
def test_a_row_reads_all_its_statistics_in_one_copy(monkeypatch):
    """80 statistics of 16 minibatches (and a count, a None) cost one read of the device, not one each."""
    from shared import progress

    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self.shape) or real(self))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("a statistic read on its own"))
    values = {f"s{k}": [torch.tensor(float(k + i)) for i in range(16)] for k in range(5)}
    row = progress.scalars({**values, "updates": 7, "none": None, "n": torch.tensor(3), "ok": torch.tensor(True)})
    assert reads == [torch.Size([80]), torch.Size([1]), torch.Size([1])]  # float32, then the int64 and the bool
    assert row["s2"] == pytest.approx(np.mean([2 + i for i in range(16)]))
    assert (row["updates"], row["none"], row["n"], row["ok"]) == (7, None, 3, True)
    assert type(row["n"]) is int and type(row["ok"]) is bool


@pytest.mark.unit
def test_compiling_announces_itself_once_per_function(capsys, monkeypatch):
    from shared import compiling

    monkeypatch.setenv("RL_COMPILE_BACKEND", "eager")
    f = compiling.compiled(plus_one)
    compiling.enable("cpu")
    try:
        f(torch.ones(2))
        f(torch.ones(2))
    finally:
        compiling.disable()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("--compile: compiling")]
    assert lines == ["--compile: compiling plus_one (eager, on cpu): its first calls wait"]


def plus_one(x):
    return x + 1


@pytest.mark.parametrize(
    "script, sampler",
    [("ppo_atari", "serial"), ("ppo_atari", "async"), pytest.param("a2c_atari", "serial", marks=pytest.mark.slow)],
)
def test_the_cuda_host_path_trains_exactly_as_the_cpu_path(tmp_path, script, sampler):
    """The host work counted above is the work that gives the results: a seeded CartPole run through CUDA's host path
    (packed uploads, the rollout's observations on the "device", joined reads, --compile's graph protocol with its
    one-copy inputs; async: the sampler's steps written into its page-locked rollout and copied up from there) writes
    the same statistics, to the last digit, as the plain CPU path."""
    from tests.helpers import progress, run

    flags = ["--preset", "cartpole", "--total-timesteps", "1024", "--eval-episodes", "0", "--compile", "--seed", "3"]
    flags += ["--sampler", sampler]
    flags += ["--log-every", "4"] if script == "a2c_atari" else []  # its rollouts are 64 steps
    env = {"RL_COMPILE_BACKEND": "eager"}
    rows = {}
    for path in ("", "cuda"):
        out = tmp_path / (path or "cpu")
        proc = run(f"{script}.py", *flags, "--out-dir", str(out), "--run-name", "r", env={**env, "RL_HOST_PATH": path})
        assert proc.returncode == 0, proc.stderr[-2000:]
        rows[path] = [
            {k: v for k, v in r.items() if k not in ("wall_time_s", "sps", "compile_s")} for r in progress(out / "r")
        ]
    csv = (tmp_path / "cpu" / "r" / "progress.csv").read_text()
    assert len(rows[""]) >= 2, csv
    assert rows["cuda"] == rows[""]


@pytest.fixture
def clock(monkeypatch) -> None:
    """A clock that moves 1 µs each time it is read, so time passes only where code reads it (the stub env's and the
    tests' busy waits, the segments' own reads): a segment's figure is then exact on a loaded machine. CI's 2 cores
    once timed a 1 ms segment at 3.8 ms with the real clock."""
    import itertools
    import time

    ticks = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: 1e-6 * next(ticks))


def busy(us: int) -> None:
    import time

    end = time.perf_counter() + 1e-6 * us
    while time.perf_counter() < end:
        pass


@pytest.mark.unit
def test_segments_time_each_named_call_and_leave_the_rest_to_the_caller(clock):
    """``--segments``: a call among the named ones is timed around itself (here an upload and a stub env step), the
    remainder is ``rest``, they add up to the whole, and every patched method is put back."""
    import time

    from shared import device

    envs = loop_overhead.StubVectorEnv(loop_overhead.CHEETAH_OBS, loop_overhead.CHEETAH_ACT, 2, cost_us=2000.0)
    uploader = device.Uploader(torch.device("cpu"), pack=True)
    before = (device.Uploader.packed, device.one_copy, loop_overhead.StubVectorEnv.step)

    def step() -> None:
        uploader({"x": np.zeros(3)})
        envs.step(np.zeros((2, 6)))
        busy(1000)  # the caller's own millisecond

    t0 = time.perf_counter()
    step()
    whole = 1e6 * (time.perf_counter() - t0)
    seg = loop_overhead.segments(step, 1)
    assert 2000 <= seg["seg_env"] < 2010 and 1000 <= seg["seg_rest"] < 1010 and seg["seg_upload"] > 0
    assert seg["seg_sample"] == seg["seg_append"] == seg["seg_graph"] == 0
    assert sum(seg.values()) == pytest.approx(whole, abs=10)
    assert (device.Uploader.packed, device.one_copy, loop_overhead.StubVectorEnv.step) == before


@pytest.mark.unit
def test_ablations_save_what_each_part_costs_and_put_everything_back(monkeypatch, clock):
    """``--ablate``: in a step whose launches cost 100 µs, ``to_host``'s copy 300 and a graph's copy-out 700, leaving
    each out saves that much (the rest of the step, 1 ms, stays), and every patched method and attribute is put back."""
    from shared import compiling, device

    monkeypatch.setenv("RL_COMPILE_GRAPHS", "dry")
    monkeypatch.setattr(compiling, "WARMUP_CALLS", 0)
    monkeypatch.setattr(device.Uploader, "_launch", lambda self: busy(100))
    one_copy = device.one_copy
    monkeypatch.setattr(device, "one_copy", lambda tensors: busy(300) or one_copy(tensors))

    @compiling.graphed
    def double(x):
        return x * 2, x + 1

    compiling.enable("cpu")
    try:
        x = torch.ones(3)
        double(x)  # the dry "capture"
        (graph,) = [g for entries, _ in compiling._graphed_entries for g in entries.values() if g.graphs]
        copy_out = graph.copy_out
        graph.copy_out = lambda: busy(700) or copy_out()

        def step() -> None:
            device.Uploader._launch(None)
            device.to_host(*double(x)) if device.CUDA_PATH else device.one_copy(double(x))
            busy(1000)

        before = (device.Uploader._launch, compiling._Graph._copy, device.one_copy, graph.copy_out)
        saved = loop_overhead.ablations(step, 1, 3)
        after = (device.Uploader._launch, compiling._Graph._copy, device.one_copy, graph.copy_out)
    finally:
        compiling.disable()
    assert 100 <= saved["abl_launches"] < 105
    assert 300 <= saved["abl_to_host"] < 305
    assert 700 <= saved["abl_copy_out"] < 705
    assert after == before


@pytest.mark.unit
def test_a_named_call_inside_another_is_counted_once_as_its_own(monkeypatch, clock):
    """``--segments``: a mirror's sync that steps the env inside (as a sync runs an upload) is timed without the env's
    2 ms, which go to ``env`` alone: the segments still add up to the whole."""
    import time

    from shared.device_replay import DeviceReplay

    envs = loop_overhead.StubVectorEnv(loop_overhead.CHEETAH_OBS, loop_overhead.CHEETAH_ACT, 2, cost_us=2000.0)

    def sync(self) -> None:  # 1 ms of its own around a named call of 2 ms
        busy(500)
        envs.step(np.zeros((2, 6)))
        busy(500)

    monkeypatch.setattr(DeviceReplay, "sync", sync)
    step = lambda: DeviceReplay.sync(None)  # through the class: what segments wraps
    t0 = time.perf_counter()
    step()
    whole = 1e6 * (time.perf_counter() - t0)
    seg = loop_overhead.segments(step, 1)
    assert 2000 <= seg["seg_env"] < 2010 and 1000 <= seg["seg_append"] < 1010  # counted twice, it would be 3000 or more
    assert sum(seg.values()) == pytest.approx(whole, abs=10)  # twice: 5 ms where the whole is 3


def test_two_checkouts_race_in_turns_and_a_missing_one_is_refused(tmp_path):
    """``loop_overhead_vs.py``: this checkout against itself gives one row per script, both sides timed (a ratio near 1
    is not asserted: two runs of one loop differ by what the machine does), an on-policy and an off-policy one (whose
    measures time the loop beside the bare one: a side that waited for a lone timing served nothing); a folder without
    the benchmark exits 2."""
    command = [sys.executable, "benchmarks/speed/loop_overhead_vs.py"]
    scripts = ["ppo_mujoco", "sac_mujoco"]
    proc = subprocess.run([*command, str(ROOT), *scripts, "--chunks", "2"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for script in scripts:
        (row,) = [line.split() for line in proc.stdout.splitlines() if line.startswith(script)]
        old_us, new_us, ratio = map(float, row[1:])
        assert old_us > 0 and new_us > 0 and ratio == pytest.approx(new_us / old_us, rel=1e-2)
    bad = subprocess.run([*command, str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "error:" in bad.stderr and "loop_overhead.py" in bad.stderr
