"""The state of the objects a function is passed: read as inputs, written back as Dynamo does.

Note [State the function is passed]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Libraries keep decode state in objects: an HF Cache holds layers that hold key/value tensors,
a recurrent library's cache holds a dict of per-layer state tensors and a Python token count.
Many of them *replace* those tensors every step (`self.keys = torch.cat([self.keys, k])`,
`state["recurrent_state"] = new`) and advance Python ints (`self.seen += 1`). A capture that
bound the tensors it saw by identity would replay a stale state; one keyed by the ints would
make a new capture every step.

So trident.compile walks every object among its arguments (`walk`): the attributes of plain
objects (`__dict__`), lists, tuples and dicts, `MAX_DEPTH` levels deep, not nn.Modules (their
parameters and buffers have registration hooks), classes, functions or modules (those are
matched by identity). What it finds is part of the call: tensors are inputs of the capture;
Python scalars, dtypes and devices are values of the signature; other objects are matched by
identity. An object's own identity is not: a new HF Cache of the same shape reuses the capture
of the last one. A list or dict passed as an argument is such an object too, not a pytree node
(compile.flatten_arguments): flattened into its tensors, the entries a function replaces in it
(`state[i] = state[i] + x`) were lost on every captured call.

While tracing, the traced tensors are put into the objects (`install`), the function runs, and
the objects are walked again (`record_writes`): every leaf that changed becomes a `Write` --
a tensor the trace made (an extra output of the capture), another input, a Python value, or an
int computed from ints made symbolic (`SymbolicInt`). Then the objects get back exactly what
they held (`Snapshot.restore`). After each call of the optimized program the writes are applied
to the caller's own objects (`apply_writes`), so the caller sees what eager would have left:
the new tensors, the advanced counters. A list appended to or truncated (a cache's per-layer
list filled on the first step) is written as a resize: its kept items one by one, the rest as
new values (containers of new tensors and Python values). A new object of another class created
by the function inside the state, or a list rebuilt in another order, cannot be replayed: the
capture is refused and the call runs eagerly with that reason.

Ints that change between calls of one family (Note [Symbolic sizes]) are made symbolic, as
Dynamo's automatic dynamic does: each is passed to the trace as the size of a zero-stride
carrier tensor (`carrier`), so the SCM's size guards and size programs treat it as any other
size, and an int the function writes back (`seen + 1`) is computed from the call's ints.
"""

from __future__ import annotations

import collections
import functools
import math
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._sympy.printers import PythonPrinter

MAX_DEPTH = 5  # Cache -> layers -> layer -> state dict -> tensor, with one level to spare
MAX_LEAVES = 4096  # a walk stops here; trident.compile runs such calls eagerly (their state is not all seen)
# The argument containers walked as state, by exact type (compile.flatten_arguments): a registered
# pytree node that subclasses dict (an HF ModelOutput) stays a pytree node
ARGUMENT_CONTAINERS = (list, dict, collections.OrderedDict, collections.defaultdict)

# Leaves matched by value.
VALUE_TYPES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
# Objects never walked: matched by identity (modules have their parameters' registration hooks).
_OPAQUE = (
    torch.nn.Module, type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
    types.BuiltinMethodType, functools.partial,
)

_LEAF_TYPES = (torch.Tensor, *VALUE_TYPES, *_OPAQUE)  # what a walk does not enter

# A step of a path: ("attr", name), ("item", index) or ("key", dict key).
Step = tuple


def path_text(root: str, steps: tuple) -> str:
    """`past_key_values.layers[3].state['recurrent_state']`: a leaf in the caller's words."""
    out = root
    for kind, k in steps:
        out += f".{k}" if kind == "attr" else f"[{k!r}]" if kind == "key" else f"[{k}]"
    return out


def walkable(obj) -> bool:
    """Whether an argument leaf is an object whose state is walked (not a value, tensor or
    opaque object)."""
    if isinstance(obj, (torch.Tensor, *VALUE_TYPES, *_OPAQUE)):
        return False
    return isinstance(obj, (list, tuple, dict)) or hasattr(obj, "__dict__")


def _children(obj):
    if isinstance(obj, (list, tuple)):
        return [(("item", i), v) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if not followable_keys(obj):
            return None
        return [(("key", k), v) for k, v in obj.items()]
    d = getattr(obj, "__dict__", None)
    if d is None or not isinstance(d, dict):
        return None
    return [(("attr", k), v) for k, v in d.items()]


@dataclass
class Walk:
    """What a walk of some root objects found, in a fixed order.

    leaves: (root index, steps, value) per leaf: tensors, values, opaque objects.
    nodes: (root index, steps, object, container kind, keys) per object walked, in order; its
    keys (attribute names, dict keys, list length) are part of the structure.
    """

    leaves: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    truncated: bool = False


def walk(roots: list) -> Walk:
    """Walk the objects `roots` (a list of objects) depth-first (Note [State the function is
    passed]). An object met twice is walked once (the second place is a leaf holding it).
    (Every call of a trident.compile'd function walks its arguments: written for speed.)"""
    out = Walk()
    seen: dict[int, Any] = {}
    for r, obj in enumerate(roots):
        _visit(out, seen, r, (), obj, root_depth(obj))
    return out


def root_depth(obj) -> int:
    """The depth a root's walk starts at: a list or dict argument (compile.flatten_arguments) costs
    no level of MAX_DEPTH, as when pytree flattened it and the objects inside were the roots."""
    return -1 if type(obj) in ARGUMENT_CONTAINERS else 0


def followable_keys(keys) -> bool:
    """Whether the walk follows a dict's entries (`keys`: the dict or its keys): its keys are str
    or int (a path step names them); else the dict is one leaf (trident.compile's arguments then
    flatten it by pytree)."""
    return all(isinstance(k, (str, int)) for k in keys)


# Note [No cycles on the call path]: a module-level function, not a closure that calls itself. A
# recursive closure is a reference cycle (the function, its cell, the lists it fills): the
# walk's leaves -- the caller's tensors -- then lived until Python's cyclic collector ran, and a
# CUDA graph whose lent state such a leaf held could not replay (found on the H200: each graph of
# a rotating pair replayed once, then saw its state "held by another").
def _visit(out: Walk, seen: dict, r: int, steps: tuple, obj, depth: int) -> None:
    leaves = out.leaves
    if depth >= MAX_DEPTH or id(obj) in seen:
        leaves.append((r, steps, obj))
        return
    if isinstance(obj, (list, tuple)):
        kind, items = "item", enumerate(obj)
        keys = len(obj) if type(obj) is list else tuple(range(len(obj)))
    elif isinstance(obj, dict):
        if not followable_keys(obj):
            leaves.append((r, steps, obj))
            return
        kind, items, keys = "key", obj.items(), tuple(obj)
    else:
        d = getattr(obj, "__dict__", None)
        if d is None or not isinstance(d, dict):
            leaves.append((r, steps, obj))
            return
        kind, items, keys = "attr", d.items(), tuple(d)
    seen[id(obj)] = obj
    out.nodes.append((r, steps, obj, type(obj), keys))
    for k, value in items:
        if len(leaves) >= MAX_LEAVES:
            out.truncated = True
            return
        at = steps + ((kind, k),)
        if isinstance(value, _LEAF_TYPES):
            leaves.append((r, at, value))
        else:
            _visit(out, seen, r, at, value, depth + 1)


def get_path(root, steps):
    obj = root
    for kind, k in steps:
        obj = getattr(obj, k) if kind == "attr" else obj[k]
    return obj


def set_path(root, steps, value) -> None:
    parent = get_path(root, steps[:-1])
    kind, k = steps[-1]
    if kind == "attr":
        object.__setattr__(parent, k, value) if _plain_setattr(parent) else setattr(parent, k, value)
    elif isinstance(parent, tuple):  # tuples are replaced in their own parent
        items = list(parent)
        items[k] = value
        set_path(root, steps[:-1], type(parent)(items) if type(parent) is tuple else type(parent)(*items))
    else:
        parent[k] = value


def _plain_setattr(obj) -> bool:
    # An object whose class overrides __setattr__ (a dataclass with frozen fields, a config) is
    # written through its own __setattr__; everything else directly.
    return type(obj).__setattr__ is object.__setattr__


class Snapshot:
    """What the walked objects held, to put back after a trace changed them."""

    def __init__(self, w: Walk):
        self.saved = []
        for _, _, obj, kind, _ in w.nodes:
            if kind is list:
                self.saved.append((obj, list(obj)))
            elif isinstance(obj, dict):
                self.saved.append((obj, dict(obj)))
            elif isinstance(obj, tuple):
                continue
            else:
                self.saved.append((obj, dict(obj.__dict__)))

    def cover(self, other: "Snapshot") -> None:
        """Also hold, with their contents now, the objects `other` would restore that this
        snapshot does not reach (detached since, or past a walk's limits)."""
        have = {id(obj) for obj, _ in self.saved}
        for obj, _ in other.saved:
            if id(obj) not in have:
                have.add(id(obj))
                self.saved.append((obj, list(obj) if isinstance(obj, list) else dict(obj) if isinstance(obj, dict)
                                   else dict(obj.__dict__)))

    def restore(self) -> None:
        for obj, saved in self.saved:
            if isinstance(obj, list):
                obj[:] = saved
            elif isinstance(obj, dict):
                obj.clear()
                obj.update(saved)
            else:
                d = obj.__dict__
                d.clear()
                d.update(saved)


@dataclass(frozen=True)
class SymbolicInt:
    """An int the function wrote (or returned) that depends on the call's sizes: `fn(ints,
    leaves)` computes it from the call's dynamic ints (by position among them) and the sizes of
    its tensor leaves (by position among the call's flattened leaves)."""

    text: str  # the expression, for explain (`s3 + 1`)
    fn: Callable


@dataclass(frozen=True)
class Write:
    """After a call, put `source` at `steps` below root `root`. source: ("out", k): the k-th
    extra output; ("leaf", j): the call's j-th flattened leaf; ("const", v): v; ("int", SymbolicInt);
    ("delete", None): remove the attribute or key."""

    root: int
    steps: tuple
    source: tuple
    text: str  # the leaf in the caller's words, for explain and errors


def carrier(value: int) -> torch.Tensor:
    """A zero-stride int64 tensor of size `value`: an int passed to a symbolic capture as a size."""
    return _CARRIER_BASE.as_strided((value,), (0,))


_CARRIER_BASE = torch.zeros(1, dtype=torch.int8)


def apply_writes(writes, roots: list, leaves: list, extra: list, ints: list) -> None:
    """Note [State the function is passed]: the writes of a capture, on the caller's objects.
    Every value is read before any is written (a write may move an object another reads)."""
    values = [_value(w.source, roots, leaves, extra, ints) for w in writes]
    for w, value in zip(writes, values):
        if w.source[0] == "resize":
            get_path(roots[w.root], w.steps)[w.source[1][0]:] = value
        elif w.source[0] == "delete":
            parent = get_path(roots[w.root], w.steps[:-1])
            kind, k = w.steps[-1]
            if kind == "attr":
                delattr(parent, k)
            else:
                del parent[k]
        else:
            set_path(roots[w.root], w.steps, value)


def symbolic_int(value, symbols: dict, sizes: Optional[dict] = None) -> Optional[SymbolicInt]:
    """The SymbolicInt of a SymInt the trace wrote, over `symbols` ({sympy symbol: position among
    the call's dynamic ints}) and `sizes` ({sympy symbol: (leaf position, dim)}: the symbolic
    sizes of the call's tensors), or None when it uses any other symbol (a size of a tensor the
    trace made from values: the caller would need the trace).

    An int the function computes from an int made symbolic can come out in terms of a tensor's
    size: where the trace found the two equal (a cache's Python token count and the length of
    its key tensor, until a sliding window fills), torch's shape environment replaces one symbol
    by the other; the write then reads that size of the call's tensor."""
    expr = value.node.expr
    sizes = sizes or {}
    free = expr.free_symbols
    if not free <= set(symbols) | set(sizes):
        return None
    names = {s: f"ints[{symbols[s]}]" if s in symbols else f"leaves[{sizes[s][0]}].shape[{sizes[s][1]}]" for s in free}
    text = PythonPrinter().doprint(expr.xreplace({s: sympy.Symbol(n, integer=True) for s, n in names.items()}))
    fn = eval(f"lambda ints, leaves: int({text})", {"math": math})  # noqa: S307 - printed by torch's PythonPrinter
    return SymbolicInt(str(expr), fn)


def is_traced(t: torch.Tensor) -> bool:
    """Whether a tensor was made while tracing (a fake tensor), not one that existed before."""
    return isinstance(t, FakeTensor)


class Unreplayable(Exception):
    """The function changed its state in a way a capture cannot replay (the message says how)."""


def record_writes(before: Walk, snapshot: Snapshot, installed: list, offset: int, traced_ids: dict,
                  roots: list, root_names: list, symbols: dict, sizes: Optional[dict] = None) -> tuple[list, list]:
    """The Writes that bring the caller's objects from `before` to what they hold now (Note
    [State the function is passed]), and the traced tensors they read (the capture's extra
    outputs, in order). `installed[i]` is what the i-th leaf of `before` held during the trace
    (its traced tensor, SymInt, or value); the call's leaf `offset + i` is that leaf;
    `traced_ids` maps id(traced tensor) to its call leaf; `symbols` and `sizes` as symbolic_int
    takes them. Raises Unreplayable."""
    saved = {id(obj): contents for obj, contents in snapshot.saved}
    place = {}  # id(object) -> (root, steps) of an object walked before
    for r, steps, obj, _, _ in before.nodes:
        place.setdefault(id(obj), (r, steps))
    for r, steps, value in before.leaves:
        if not isinstance(value, (torch.Tensor, *VALUE_TYPES)):
            place.setdefault(id(value), (r, steps))
    leaf_at = {(r, steps): i for i, (r, steps, _) in enumerate(before.leaves)}
    extra: list = []
    extra_ids: dict = {}
    writes: list = []

    def source(value, text):
        if isinstance(value, torch.Tensor):
            j = traced_ids.get(id(value))
            if j is not None:
                return ("leaf", j)
            if not is_traced(value):
                return ("const", value)
            k = extra_ids.get(id(value))
            if k is None:
                k = extra_ids[id(value)] = len(extra)
                extra.append(value)
            return ("out", k)
        if isinstance(value, torch.SymInt):
            s = symbolic_int(value, symbols, sizes)
            if s is None:
                raise Unreplayable(f"{text} becomes an int computed from tensor sizes ({value})")
            return ("int", s)
        if isinstance(value, (torch.SymFloat, torch.SymBool)):
            raise Unreplayable(f"{text} becomes a {type(value).__name__} computed from sizes ({value})")
        if isinstance(value, VALUE_TYPES) or isinstance(value, _OPAQUE):
            return ("const", value)
        if id(value) in place:
            return ("path", place[id(value)])
        if isinstance(value, (list, tuple, dict)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            return ("new", (type(value), tuple((k, source(v, f"{text}[{k!r}]")) for k, v in items)))
        raise Unreplayable(f"{text} becomes a new {type(value).__name__} object; Trident replays new tensors, "
                           "Python values and containers of them in the state it is passed, not new objects")

    replaced: list = []  # paths whose object was replaced: what was below them is not written
    for r, steps, obj, _kind, _keys in before.nodes:
        if isinstance(obj, tuple) or any(r == rr and steps[:len(p)] == p for rr, p in replaced):
            continue
        text = path_text(root_names[r], steps)
        before_children = saved[id(obj)]
        now = _children(obj)
        if now is None:
            raise Unreplayable(f"{text} changed its kind of contents")
        resized = isinstance(obj, list) and len(obj) != len(before_children)
        if resized:  # appended to or truncated: the kept items are written one by one below
            n = min(len(obj), len(before_children))
            # kept objects must be the same ones (a kept leaf may change: a write of its own)
            if any(leaf_at.get((r, steps + (st,))) is None and v is not b
                   for (st, v), b in zip(now[:n], before_children)):
                raise Unreplayable(f"{text} changes length ({len(before_children)} -> {len(obj)}) and the items "
                                   "before the change too; Trident replays a list appended to or truncated, not "
                                   "one rebuilt in another order")
            writes.append(Write(r, steps, ("resize", (n, tuple(source(v, path_text(root_names[r], steps + (st,)))
                                                               for st, v in now[n:]))), text))
            now = now[:n]
        old = dict(enumerate(before_children)) if isinstance(obj, list) else before_children
        for step, value in now:
            k = step[1]
            at = steps + (step,)
            i = leaf_at.get((r, at))
            expect = installed[i] if i is not None else old.get(k, _MISSING)
            if value is expect or (
                isinstance(value, VALUE_TYPES) and type(value) is type(expect) and value == expect
            ):
                continue
            child_text = path_text(root_names[r], at)
            writes.append(Write(r, at, source(value, child_text), child_text))
            if i is None and expect is not _MISSING:
                replaced.append((r, at))
        present = {s[1] for s, _ in now}
        for k in old:
            if k not in present and not resized:
                at = steps + (("key" if isinstance(obj, dict) else "attr", k),)
                writes.append(Write(r, at, ("delete", None), path_text(root_names[r], at)))
    return writes, extra


_MISSING = object()


def _value(source, roots, leaves, extra, ints):
    kind, v = source
    if kind == "out":
        return extra[v]
    if kind == "leaf":
        return leaves[v]
    if kind == "int":
        return v.fn(ints, leaves)
    if kind == "path":
        return get_path(roots[v[0]], v[1])
    if kind == "resize":
        return [_value(s, roots, leaves, extra, ints) for s in v[1]]
    if kind == "new":
        container, items = v
        if container is dict:
            return {k: _value(s, roots, leaves, extra, ints) for k, s in items}
        values = [_value(s, roots, leaves, extra, ints) for _, s in items]
        return values if container is list else container(values) if container is tuple else container(*values)
    return v
