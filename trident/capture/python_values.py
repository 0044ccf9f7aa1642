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

DEPTH = 3  # levels below a value that plain() and holds_tensor() follow
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


def holds_tensor(value, depth: int = 0) -> bool:
    """Whether `value` is a tensor or holds one (containers, a library object's attributes)."""
    if isinstance(value, torch.Tensor):
        return True
    if depth >= DEPTH:
        return False
    if isinstance(value, dict):
        value = list(value.values())
    elif not isinstance(value, (tuple, list, set, frozenset, collections.deque)):
        value = list(vars(value).values()) if hasattr(value, "__dict__") and keeps_state(value) else ()
    return any(holds_tensor(v, depth + 1) for v in itertools.islice(value, ITEMS))


def short(value) -> str:
    """A bounded repr (one that raises is named by its type)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a label never fails its caller
        return f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= 40 else text[:37] + "..."
