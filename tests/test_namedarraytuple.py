"""namedarraytuple semantics, pickling under spawn, and the array-structure helpers (shared memory included)."""

import gc
import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.buffer import SharedArray, buffer_from_example, shared_zeros
from shared.namedarraytuple import flatten_structure, is_namedarraytuple, map_structure, namedarraytuple, unflatten_structure
from tests.helpers import our_shm

Point = namedarraytuple("Point", ["x", "y"])
Outer = namedarraytuple("Outer", "obs inner extra")


def _nested(T=5):
    return Outer(np.arange(T * 2).reshape(T, 2), Point(np.arange(T), np.arange(T) * 10.0), None)


def test_index_and_slice_reach_every_field_and_keep_type():
    p = _nested()
    q = p[1:3]
    assert type(q) is Outer and type(q.inner) is Point and q.extra is None
    np.testing.assert_array_equal(q.obs, p.obs[1:3])
    np.testing.assert_array_equal(q.inner.y, [10.0, 20.0])
    r = p[4]
    assert r.inner.x == 4 and r.inner.y == 40.0
    fancy = p[np.array([0, 0, 3])]
    np.testing.assert_array_equal(fancy.inner.x, [0, 0, 3])


def test_setitem_broadcasts_scalars_and_writes_structures_field_by_field():
    p = _nested()
    p[0] = 7
    assert (p.obs[0] == 7).all() and p.inner.x[0] == 7 and p.inner.y[0] == 7.0
    p[1:3] = Outer(np.full((2, 2), -1), Point(np.array([100, 200]), np.array([0.5, 0.25])), None)
    np.testing.assert_array_equal(p.obs[1:3], -1)
    np.testing.assert_array_equal(p.inner.x[1:3], [100, 200])
    np.testing.assert_array_equal(p.inner.y[1:3], [0.5, 0.25])
    assert p.extra is None


def test_setitem_refuses_none_into_allocated_field():
    p = Point(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="field 'y'"):
        p[0] = Point(1.0, None)


def test_tuple_style_access():
    p = Point(np.array([1, 2]), np.array([3, 4]))
    x, y = p
    np.testing.assert_array_equal(p.get(1), y)
    assert [k for k, _ in p.items()] == ["x", "y"]
    assert "x" in p and "z" not in p and len(p) == 2
    assert p._replace(x=None).x is None
    assert Point._make([1, 2]) == Point(1, 2) == Point(x=1, y=2)
    assert is_namedarraytuple(p) and not is_namedarraytuple(Point)
    with pytest.raises(AttributeError, match="no field 'z'"):
        _ = p.z
    with pytest.raises(TypeError):
        Point(1)
    with pytest.raises(ValueError):
        namedarraytuple("Bad", ["get"])


def test_same_schema_gives_same_class():
    assert namedarraytuple("Point", "x y") is Point


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data())
def test_indexing_matches_per_field_indexing(shape, data):
    a = np.arange(int(np.prod(shape))).reshape(shape)
    p = Outer(a, Point(a * 2, a.astype(float) / 3), None)
    idx = data.draw(st.integers(-shape[0], shape[0] - 1) | st.slices(shape[0]))
    q = p[idx]
    np.testing.assert_array_equal(q.obs, a[idx])
    np.testing.assert_array_equal(q.inner.x, (a * 2)[idx])
    np.testing.assert_array_equal(q.inner.y, (a.astype(float) / 3)[idx])
    # Writing a scalar through the structure equals writing it into each field.
    ref = a.copy()
    ref[idx] = -5
    p[idx] = -5
    np.testing.assert_array_equal(p.obs, ref)


def _local_class():
    return namedarraytuple("MadeInAFunction", ["a", "b"])


def test_classes_made_in_functions_pickle_by_schema():
    cls = _local_class()
    inst = cls(np.arange(3), None)
    assert pickle.loads(pickle.dumps(cls)) is cls
    back = pickle.loads(pickle.dumps(inst))
    assert type(back) is cls and back.b is None
    np.testing.assert_array_equal(back.a, inst.a)


def _child_roundtrip(cls, inst, q):
    made_here = namedarraytuple(cls.__name__, cls._fields)
    q.put((made_here is cls, type(inst) is cls, inst[1:]))


def test_instances_and_classes_cross_a_spawn_boundary():
    cls = _local_class()
    inst = cls(np.arange(4), Point(np.ones(4), np.zeros(4)))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child_roundtrip, args=(cls, inst, q))
    p.start()
    same_cls, same_type, sliced = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0 and same_cls and same_type
    assert type(sliced) is cls
    np.testing.assert_array_equal(sliced.a, [1, 2, 3])


def test_map_structure_keeps_none_and_types():
    out = map_structure(lambda x: x + 1, _nested(2))
    assert type(out) is Outer and out.extra is None
    np.testing.assert_array_equal(out.inner.x, [1, 2])


# ---------------------------------------------------------------- under torch.compile (dynamo 2.11 and later)


def _fullgraph(fn):
    import torch

    torch._dynamo.reset()
    return torch.compile(fn, backend="eager", fullgraph=True)


def _assert_same(a, b):
    import torch

    assert type(a) is type(b)
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif a is not None:
        torch.testing.assert_close(a, b)


def test_compiled_function_builds_indexes_and_returns_namedarraytuples():
    """The recurrent scripts' pattern (a state built inside a compiled function, indexed, returned): dynamo traces
    the classes as namedtuples, and before 2.13 it read ``_field_defaults`` and failed at the constructor."""
    import torch

    def f(x):
        p = Outer(x, Point(x * 2, x + 1), None)
        q = p[1:]  # a slice of every field, the nested one too; None stays None
        h = q.inner.x.sum(0)
        r = Point(h, y=h * 3)  # a field by keyword
        return q, p[0], r, q.obs.sum() + p.get(0)[2].sum()

    x = torch.arange(12.0).reshape(4, 3)
    _assert_same(_fullgraph(f)(x), f(x))
    out = _fullgraph(f)(x)
    assert type(out[0]) is Outer and type(out[0].inner) is Point and out[0].extra is None
    assert out[1].obs.shape == (3,) and out[2].y.shape == (3,)


def test_compiled_function_takes_namedarraytuples_and_the_tuple_methods_trace():
    """Passed in, indexed from the end, ``_replace``, ``_make``, ``_asdict``, ``items``, ``len``, ``in`` and
    map_structure inside one graph."""
    import torch

    def f(p):
        q = p[-2:]._replace(extra=p.obs * 0)
        doubled = map_structure(lambda t: t * 2, q)
        total = sum(v.sum() for _, v in doubled.inner.items()) + q._asdict()["obs"].sum()
        return doubled, Point._make([total, q.inner.y.max()]), len(p) if "inner" in p else -1

    p = Outer(torch.arange(8.0).reshape(4, 2), Point(torch.arange(4.0), torch.ones(4)), None)
    _assert_same(_fullgraph(f)(p), f(p))


# ---------------------------------------------------------------- buffers and shared memory


def test_buffer_from_example_shapes_dtypes_and_none():
    ex = Outer(np.zeros((3, 2), np.uint8), Point(np.int64(0), np.float32(0)), None)
    buf = buffer_from_example(ex, (4, 5))
    assert buf.obs.shape == (4, 5, 3, 2) and buf.obs.dtype == np.uint8
    assert buf.inner.x.shape == (4, 5) and buf.inner.x.dtype == np.int64
    assert buf.inner.y.dtype == np.float32 and buf.extra is None
    assert not buf.obs.any()
    with pytest.raises(ValueError, match="leading_dims"):
        buffer_from_example(ex, (-1,))


def _child_writes(buf, q):
    buf.obs[1] = 9
    buf.inner.y[:] = 2.5
    q.put(os.getpid())


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_child_writes_into_shared_memory_seen_by_parent(method):
    ex = Outer(np.zeros(3, np.int16), Point(np.int64(0), np.float32(0)), None)
    buf = buffer_from_example(ex, (4,), shared=True)
    assert isinstance(buf.obs, SharedArray)
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_child_writes, args=(buf[1:], q))  # a view travels as a view
    p.start()
    q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0
    np.testing.assert_array_equal(buf.obs[:, 0], [0, 0, 9, 0])
    np.testing.assert_array_equal(buf.inner.y, [0, 2.5, 2.5, 2.5])


def _memfd_count():
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "memfd:rl-shared" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_shared_memory_is_freed_with_its_last_array_and_never_named():
    before_fds, before_shm = _memfd_count(), our_shm()
    a = shared_zeros((1000, 100), np.float32)
    view = a[10:20]
    held = _memfd_count()
    assert held > before_fds
    assert our_shm() == before_shm
    del a
    gc.collect()
    assert _memfd_count() == held  # the view still holds it
    view[:] = 1
    del view
    gc.collect()
    assert _memfd_count() == before_fds


def test_derived_arrays_are_private_and_deepcopy_copies():
    import copy

    a = shared_zeros(5, np.float64)
    b = a + 1
    assert b._segment is None
    c = copy.deepcopy(a)
    c[:] = 3
    assert not a.any() and type(c) is np.ndarray
    assert pickle.loads(pickle.dumps(b)).tolist() == [1.0] * 5


@pytest.mark.parametrize(
    "derive",
    [
        lambda a: a[3],
        lambda a: a[3][1],
        lambda a: a[1:3, ::2],
        lambda a: a.T,
        lambda a: a.reshape(-1)[5:9],
        lambda a: a[2].view(np.uint8),
        lambda a: a[[0, 2]],
        lambda a: a[:, [1, 0]],
        lambda a: a[:, [1, 0]][0],
        lambda a: a[a > 0],
        lambda a: a + 1,
        lambda a: (a + 1)[2],
        lambda a: a.astype(np.float64)[1],
        lambda a: np.ascontiguousarray(a.T)[0],
    ],
)
def test_an_array_derived_from_shared_memory_is_shared_exactly_where_it_lies_there(derive):
    """Views (rows, slices, transposes, reshapes, views of views) carry the segment, and pickle as handles to it;
    fancy indexing, arithmetic and copies (and views of them) are private memory and carry none, so they pickle by
    value: the segment goes with an array exactly where its memory lies in it."""
    a = shared_zeros((4, 3, 5), np.float32)
    a[...] = np.arange(a.size, dtype=np.float32).reshape(a.shape)
    d = derive(a)
    segment = getattr(d, "_segment", None)  # a plain ndarray has none
    assert (segment is a._segment) == np.shares_memory(d, a)
    assert segment is None or segment is a._segment
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(d)), d)


SCRIPT = """
import multiprocessing as mp, sys
import numpy as np
sys.path.insert(0, {root!r})
from tests.helpers import our_shm
from shared.namedarraytuple import namedarraytuple
Transition = namedarraytuple("Transition", ["obs", "reward"])  # defined in a script run as __main__

def child(batch, q):
    q.put((type(batch).__name__, batch[1].reward.item(), type(batch) is Transition))

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(Transition(np.zeros((3, 2)), np.arange(3.0)), q))
    p.start()
    print(q.get(timeout=60))
    p.join()
    sys.exit(p.exitcode)
"""


def test_class_defined_in_a_main_script_crosses_spawn(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(root=str(Path(__file__).resolve().parents[1])))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('Transition', 1.0, True)"


def test_flatten_structure_round_trips_what_map_structure_walks():
    """shared.compiling's graphs key on the shape and copy the leaves: the shape is hashable and equal for equal
    structures, and filling it again rebuilds every type (dicts, lists, tuples, namedtuples, namedarraytuples)."""
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    S = namedarraytuple("S", ["x", "y"])
    struct = ({"obs": 1, "state": S(2, None)}, [3, Pair(4, 5)], "six")
    leaves = []
    shape = flatten_structure(struct, leaves)
    assert leaves == [1, 2, None, 3, 4, 5, "six"] and hash(shape) == hash(flatten_structure(struct, []))
    again = unflatten_structure(shape, iter(leaves))
    assert again == struct and type(again[0]["state"]) is S and type(again[1][1]) is Pair
    assert map_structure(lambda v: v, struct) == again


def test_the_walk_names_each_leaf_by_its_path_in_map_structures_order_and_its_inverse_keeps_every_type():
    """walk_structure: (path, leaf) with the keys from the root (field names, indices, dict keys), the leaves those
    flatten_structure finds, in its order; replace_leaves puts new leaves at paths back into the same types."""
    from collections import namedtuple

    from shared.namedarraytuple import dotted, replace_leaves, walk_structure

    Pair = namedtuple("Pair", "a b")
    S = namedarraytuple("S", ["x", "y"])
    struct = ({"obs": 1, "state": S(2, None)}, [3, Pair(4, 5)], "six")
    walked = walk_structure(struct)
    flat = []
    flatten_structure(struct, flat)
    assert [leaf for _, leaf in walked] == flat
    assert [dotted(p) for p, _ in walked] == ["0.obs", "0.state.x", "0.state.y", "1.0", "1.1.a", "1.1.b", "2"]
    assert walk_structure(7, path=("x",)) == [(("x",), 7)]  # a leaf alone, under the given prefix
    again = replace_leaves(struct, {path: f"<{leaf}>" for path, leaf in walked if isinstance(leaf, int)})
    assert again == ({"obs": "<1>", "state": S("<2>", None)}, ["<3>", Pair("<4>", "<5>")], "six")
    assert type(again[0]["state"]) is S and type(again[1]) is list and type(again[1][1]) is Pair
    # sequences=False: a plain tuple or list is a leaf (shared.device uploads one as one array)
    assert walk_structure({"a": [1, 2], "b": S((3, 4), None)}, sequences=False) == [
        (("a",), [1, 2]),
        (("b", "x"), (3, 4)),
        (("b", "y"), None),
    ]


def test_the_walk_along_others_pairs_their_leaves_and_names_where_one_is_shaped_otherwise():
    from shared.namedarraytuple import walk_structure

    S = namedarraytuple("S", ["x", "y"])
    T = namedarraytuple("T", ["x", "z"])
    example = S({"a": 1, "b": (2, 3)}, None)
    sample = S({"b": [20, 30], "a": 10}, "anything")  # keys in another order, a list for a tuple
    assert walk_structure(example, sample, path=("s",)) == [
        (("s", "x", "a"), 1, 10),
        (("s", "x", "b", 0), 2, 20),
        (("s", "x", "b", 1), 3, 30),
        (("s", "y"), None, "anything"),  # below the example's leaf the sample is not looked into
    ]
    for bad, where in [
        (S({"a": 1}, None), "s.x"),  # a key missing
        (S({"a": 1, "b": (2,)}, None), "s.x.b"),  # shorter
        (S({"a": 1, "b": 5}, None), "s.x.b"),  # a leaf for a node
        (T({"a": 1, "b": (2, 3)}, None), "s"),  # other field names
    ]:
        with pytest.raises(ValueError, match=f"^{where}: expected the structure of the example"):
            walk_structure(example, bad, path=("s",))
