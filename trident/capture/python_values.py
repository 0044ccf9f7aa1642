"""What Trident tells apart among the Python values a function reaches: plain data, tensors held,
objects of the libraries beneath it. Shared by the trace's state check (Note [Module attributes a
trace rebinds]) and the Dynamo door's (Note [Disabled functions under backend="trident"])."""

from __future__ import annotations

import argparse
import collections
import enum
import itertools
import sys
import types

import torch

DEPTH = 3  # levels below a value that plain() and tensors_in() follow
ITEMS = 256  # items of one container they follow
# modules whose objects the state checks do not look into: torch, Triton and Trident keep their
# own caches (kernel tables, lazily imported attributes, compiled functions' captures), and so
# does the standard library (logging's level cache and handlers, locks, weak dictionaries)
FOREIGN = frozenset({"torch", "triton", "trident", "builtins"}) | frozenset(getattr(sys, "stdlib_module_names", ()))


def foreign(obj) -> bool:
    """Whether `obj` (a module, a class) belongs to torch, Triton, Trident or the standard library."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return not isinstance(name, str) or name.split(".")[0] in FOREIGN


def keeps_state(obj) -> bool:
    """Whether the attributes of `obj` are state a function may keep: an object of a class outside
    torch, Triton, Trident and the standard library, or one of the standard library's plain
    namespaces (SimpleNamespace, argparse's Namespace)."""
    return isinstance(obj, (types.SimpleNamespace, argparse.Namespace)) or not foreign(type(obj))


def plain(value, depth: int = 0) -> bool:
    """Data: numbers, strings, dtypes, devices, enums, and tuples, lists and frozensets of them."""
    if value is None or isinstance(
        value, (bool, int, float, complex, str, bytes, torch.dtype, torch.device, enum.Enum)
    ):
        return True
    if isinstance(value, (tuple, list, frozenset)) and depth < DEPTH:
        return all(plain(v, depth + 1) for v in value)
    return False


CONTAINERS = (dict, list, tuple, set, frozenset, collections.deque)


def stored_items(container) -> list:
    """A container's items as stored, its class's overrides bypassed: (key, value) pairs of a
    dict (an OrderedDict's in its order), the items of a list, tuple, deque or set."""
    if isinstance(container, collections.OrderedDict):
        return [(k, dict.__getitem__(container, k)) for k in collections.OrderedDict.__iter__(container)]
    if isinstance(container, dict):
        return list(dict.items(container))
    for base in (list, tuple, collections.deque, set, frozenset):
        if isinstance(container, base):
            return list(base.__iter__(container))
    raise TypeError(type(container).__name__)


def stored_attributes(obj) -> dict:
    """The object's own attribute table (not through its __getattribute__/__getattr__); {} if none."""
    try:
        table = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - __slots__ only, or refused
        return {}
    return table if type(table) is dict else {}


def tensors_in(value, depth: int = DEPTH, limit: "int | None" = None):
    """The tensors `value` is or holds, `depth` levels down: in containers and the attributes of
    objects that keep state, each read as stored (no user code runs); `limit`: items followed per
    container (None: all)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth and isinstance(value, CONTAINERS):
        for v in itertools.islice(stored_items(value), limit):
            yield from tensors_in(v[1] if isinstance(value, dict) else v, depth - 1, limit)
    elif depth and keeps_state(value):
        for v in itertools.islice(list(stored_attributes(value).values()), limit):
            yield from tensors_in(v, depth - 1, limit)


def holds_tensor(value) -> bool:
    """Whether `value` is a tensor or holds one (containers, a library object's attributes; ITEMS
    items of each followed)."""
    return any(True for _ in tensors_in(value, DEPTH, ITEMS))


def short(value) -> str:
    """A bounded repr (one that raises is named by its type)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a label never fails its caller
        return f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."
