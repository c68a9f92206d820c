"""namedarraytuple: a namedtuple whose indexing reaches into every field.

Guarantees
- ``nat[loc]`` indexes every field (nested namedarraytuples too) and returns the same type; ``None`` fields
  stay ``None``.
- ``nat[loc] = value`` writes ``value`` into every field, or field by field when ``value`` has the same fields
  (a namedarraytuple or namedtuple) or is a mapping that holds every field by name (a gymnasium Dict
  observation; its other keys are not written); ``None`` fields are skipped.
- Tuple-style access stays available: ``nat.get(i)``, unpacking, ``len``; ``'x' in nat`` tests a field *name*.
- Classes pickle by their schema (name and fields), not by module path, so instances and classes made anywhere
  (inside a function, in a script run as ``__main__``) unpickle in a child started with ``spawn``; unpickling
  returns the one class registered for that schema, so ``type(a) is type(b)`` holds across pickling.
- ``flatten_structure`` / ``unflatten_structure``: the leaves of a structure as ``map_structure`` walks it, in
  order, and a hashable shape that rebuilds it with every type (``shared.compiling``'s graphs key on it).
- ``walk_structure(struct, *others)``: every leaf with its path (the keys from the root: a field name, an index, a
  dict key), in ``map_structure``'s order; with ``others`` (structures shaped like ``struct``, as samples are
  like their example) each one's leaf at that path too, and ``ValueError`` naming the path where one is shaped
  otherwise. ``replace_leaves(struct, by_path)`` is its inverse: the same structure (every type kept; a dict as a
  ``dict``) with the leaves at the given paths replaced, the others kept.
  Both see the same nodes as ``map_structure`` (dicts, tuples and lists, named or not) unless
  ``sequences=False`` (plain tuples and lists are leaves); ``None`` is a leaf. ``shared.device`` (upload),
  ``shared.replay`` (sample checks, stored arrays) and ``shared.checkpoint`` (tensors to the CPU) walk with them.
  ``map_structure`` and ``flatten_structure`` keep their own plain recursion: ``torch.compile`` traces the first
  inside graphs and ``shared.compiling`` keys its graphs on the second's shape.
- ``torch.compile`` (fullgraph, torch 2.11 and later) traces them as namedtuples: building, indexing, reading
  fields and returning or taking one. Dynamo before 2.13 reads namedtuple's ``_field_defaults`` (empty here) and
  cannot trace ``tuple.__new__`` on a class it got from ``type(self)``, so results are built by calling the class.
"""

from __future__ import annotations

import copyreg
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "dotted",
    "flatten_structure",
    "is_namedarraytuple",
    "map_structure",
    "namedarraytuple",
    "replace_leaves",
    "unflatten_structure",
    "walk_structure",
]

_CLASSES: dict[tuple[str, tuple[str, ...]], type] = {}


class _NamedArrayTupleMeta(type):
    """Metaclass: marks namedarraytuple classes so pickling can find them (see ``_reduce_class``)."""


class _NamedArrayTupleBase(tuple):
    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __new__(cls, *args: Any, **kwargs: Any):
        if not kwargs and len(args) == len(cls._fields):  # the common case, and how indexing builds its result
            return tuple.__new__(cls, args)
        if len(args) > len(cls._fields):
            raise TypeError(f"{cls.__name__} takes {len(cls._fields)} fields, got {len(args)}")
        values = list(args) + [_MISSING] * (len(cls._fields) - len(args))
        for name, value in kwargs.items():
            try:
                i = cls._fields.index(name)
            except ValueError:
                raise TypeError(f"{cls.__name__} has no field {name!r}") from None
            if values[i] is not _MISSING:
                raise TypeError(f"{cls.__name__} got field {name!r} twice")
            values[i] = value
        missing = [f for f, v in zip(cls._fields, values) if v is _MISSING]
        if missing:
            raise TypeError(f"{cls.__name__} is missing fields {missing}")
        return tuple.__new__(cls, values)

    @classmethod
    def _make(cls, iterable: Iterable[Any]):
        values = list(iterable)
        if len(values) != len(cls._fields):
            raise TypeError(f"{cls.__name__} expects {len(cls._fields)} values, got {len(values)}")
        return cls(*values)

    def __getitem__(self, loc: Any):
        try:
            return type(self)(*[None if v is None else v[loc] for v in self])
        except IndexError as e:
            raise IndexError(f"{type(self).__name__}[{loc!r}]: {e}") from e

    def __setitem__(self, loc: Any, value: Any) -> None:
        # Same fields: write field by field; anything else is broadcast to every field.
        if isinstance(value, Mapping):
            value = type(self)(*(value[name] if mine is not None else None for name, mine in self.items()))
        if isinstance(value, tuple) and getattr(value, "_fields", None) == self._fields:
            for name, mine, theirs in zip(self._fields, self, value):
                if mine is None:
                    continue
                if theirs is None:
                    raise ValueError(f"field {name!r}: cannot write None into an allocated field")
                mine[loc] = theirs
        else:
            for mine in self:
                if mine is not None:
                    mine[loc] = value

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails; fields are properties, so this is an unknown name.
        raise AttributeError(f"{type(self).__name__} has no field {name!r} (fields: {self._fields})")

    def get(self, index: int) -> Any:
        """Plain tuple indexing: the ``index``-th field itself."""
        return tuple(self)[index]

    def items(self) -> Iterator[tuple[str, Any]]:
        return zip(self._fields, self)

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self))

    def _replace(self, **kwargs: Any):
        d = self._asdict()
        for k in kwargs:
            if k not in d:
                raise ValueError(f"{type(self).__name__} has no field {k!r}")
        d.update(kwargs)
        return self._make(d[f] for f in self._fields)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.items())
        return f"{type(self).__name__}({inner})"

    def __getnewargs__(self):
        return tuple(self)

    def __reduce__(self):
        return (_rebuild_instance, (type(self), tuple(self)))


_MISSING = object()
try:  # CPython's C accessor of namedtuple fields (collections' own, since 3.8)
    from collections import _tuplegetter  # type: ignore[attr-defined]
except ImportError:  # another implementation: a Python property
    _tuplegetter = None


def _field_property(i: int, name: str) -> Any:
    """Field ``i``: the tuple's own item (``__getitem__`` is overridden), read in C as a namedtuple's fields are."""
    if _tuplegetter is not None:
        return _tuplegetter(i, f"field {i}: {name}")
    return property(lambda self: tuple.__getitem__(self, i), doc=f"field {i}: {name}")


def namedarraytuple(typename: str, field_names: Iterable[str] | str) -> type:
    """Return the namedarraytuple class with this name and these fields (one class per schema).

    ``field_names`` is a sequence of identifiers or one string separated by spaces or commas.
    """
    if isinstance(field_names, str):
        field_names = field_names.replace(",", " ").split()
    fields = tuple(str(f) for f in field_names)
    if not typename.isidentifier():
        raise ValueError(f"typename {typename!r} is not an identifier")
    for f in fields:
        if not f.isidentifier() or f.startswith("_"):
            raise ValueError(f"field name {f!r} must be an identifier not starting with '_'")
        if f in {"get", "items"}:
            raise ValueError(f"field name {f!r} would hide a namedarraytuple method")
    if len(set(fields)) != len(fields):
        raise ValueError(f"duplicate field names in {fields}")
    key = (typename, fields)
    cls = _CLASSES.get(key)
    if cls is None:
        namespace = {"__slots__": (), "_fields": fields, "_field_defaults": {}, "__module__": __name__}
        namespace.update({f: _field_property(i, f) for i, f in enumerate(fields)})
        cls = _NamedArrayTupleMeta(typename, (_NamedArrayTupleBase,), namespace)
        cls.__qualname__ = typename
        _CLASSES[key] = cls
    return cls


def _rebuild_instance(cls: type, values: tuple) -> Any:
    return tuple.__new__(cls, values)


def _reduce_class(cls: type):
    return (namedarraytuple, (cls.__name__, cls._fields))


copyreg.pickle(_NamedArrayTupleMeta, _reduce_class)


def is_namedarraytuple(obj: Any) -> bool:
    """True for namedarraytuple instances (not classes)."""
    return isinstance(obj, _NamedArrayTupleBase)


def map_structure(fn: Callable[[Any], Any], struct: Any) -> Any:
    """Apply ``fn`` to every leaf of a structure of (named)tuples/namedarraytuples/dicts; ``None`` stays ``None``.

    Returns a new structure of the same types.
    """
    if struct is None:
        return None
    if isinstance(struct, _NamedArrayTupleBase):
        return type(struct)._make(map_structure(fn, v) for v in struct)
    if isinstance(struct, tuple) and hasattr(struct, "_fields"):  # plain namedtuple
        return type(struct)(*(map_structure(fn, v) for v in struct))
    if isinstance(struct, (tuple, list)):
        return type(struct)(map_structure(fn, v) for v in struct)
    if isinstance(struct, dict):
        return {k: map_structure(fn, v) for k, v in struct.items()}
    return fn(struct)


def flatten_structure(struct: Any, leaves: list) -> Any:
    """The leaves of the structure (as ``map_structure`` walks it; ``None`` is a leaf here) appended to ``leaves`` in
    order; returns its shape, hashable, which ``unflatten_structure`` fills again."""
    if isinstance(struct, dict):
        return (dict, tuple(struct), tuple([flatten_structure(v, leaves) for v in struct.values()]))
    if isinstance(struct, (tuple, list)):
        return (type(struct), None, tuple([flatten_structure(v, leaves) for v in struct]))
    leaves.append(struct)
    return None


def unflatten_structure(shape: Any, leaves: Iterator[Any]) -> Any:
    """The structure ``shape`` (from ``flatten_structure``) with its leaves taken in order from the iterator."""
    if shape is None:
        return next(leaves)
    kind, keys, children = shape
    values = [unflatten_structure(c, leaves) for c in children]
    if kind is dict:
        return dict(zip(keys, values))
    return kind(values) if kind in (list, tuple) or not hasattr(kind, "_fields") else kind(*values)


# ----------------------------------------------------------------------------------------- the walk with paths


def _children(node: Any, sequences: bool) -> Iterable[tuple[Any, Any]] | None:
    """A node's (key, child) pairs in order, or None for a leaf: the one rule of what the walk descends into."""
    if isinstance(node, dict):
        return node.items()
    if isinstance(node, tuple) and hasattr(node, "_fields"):  # a namedarraytuple or a namedtuple: by field name
        return zip(node._fields, node)
    if sequences and isinstance(node, (tuple, list)):
        return enumerate(node)
    return None


def dotted(path: tuple) -> str:
    """A path as one name, its keys joined by dots (``obs.image``, ``state.0``)."""
    return ".".join(map(str, path))


def _matching(node: Any, other: Any, path: tuple) -> list:
    """``other``'s children in the order of ``node``'s keys; ``ValueError`` naming ``path`` when it is shaped otherwise:
    another kind of node, other dict keys, another length, other field names."""
    if isinstance(node, dict):
        if isinstance(other, Mapping) and set(other) == set(node):
            return [other[k] for k in node]
    elif isinstance(other, (tuple, list)) and len(other) == len(node):
        fields = getattr(other, "_fields", None)
        if fields is None or fields == getattr(node, "_fields", fields):
            return list(other)
    where = dotted(path) or "the structure"
    raise ValueError(f"{where}: expected the structure of the example ({type(node).__name__}), got {type(other).__name__}")


def walk_structure(struct: Any, *others: Any, path: tuple = (), sequences: bool = True) -> list[tuple]:
    """``(path, leaf, *others' leaves at path)`` for every leaf of ``struct`` in order (see the module docstring);
    ``path`` prefixes every path. Below a leaf of ``struct`` (``None`` included) the others are not looked into."""
    out: list[tuple] = []  # a list, not a generator, which would pass each leaf up through every level
    if others:
        _walk_along(struct, others, path, sequences, out)
    else:  # the common case (an upload per step), without the others' bookkeeping
        _walk(struct, path, sequences, out)
    return out


def _walk(node: Any, path: tuple, sequences: bool, out: list) -> None:
    children = _children(node, sequences)
    if children is None:
        out.append((path, node))
        return
    for key, child in children:
        _walk(child, (*path, key), sequences, out)


def _walk_along(node: Any, others: tuple, path: tuple, sequences: bool, out: list) -> None:
    children = _children(node, sequences)
    if children is None:
        out.append((path, node, *others))
        return
    theirs = [_matching(node, other, path) for other in others]
    for i, (key, child) in enumerate(children):
        _walk_along(child, tuple([t[i] for t in theirs]), (*path, key), sequences, out)


def replace_leaves(struct: Any, by_path: Mapping[tuple, Any], path: tuple = (), sequences: bool = True) -> Any:
    """``struct`` rebuilt with the leaf at each path of ``by_path`` (as the walk names it) replaced by its value there,
    every other leaf kept: the walk's inverse."""
    children = _children(struct, sequences)
    if children is None:
        return by_path.get(path, struct)
    if isinstance(struct, dict):
        return {key: replace_leaves(child, by_path, (*path, key), sequences) for key, child in children}
    values = [replace_leaves(child, by_path, (*path, key), sequences) for key, child in children]
    return type(struct)(*values) if hasattr(struct, "_fields") else type(struct)(values)
