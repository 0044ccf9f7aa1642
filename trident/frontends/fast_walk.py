"""Generated structure checks: the hit path of trident.compile without the generic walk.

Note [Generated structure checks]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Every call of a trident.compile'd function flattens its arguments and walks the state of the
objects among them (Note [State the function is passed]) to build its structure key, then hashes
that key to find the captures of the structure. For an HF StaticCache of 16 layers that is ~180
leaves, ~190 µs of Python per call on a 2-core CPU (the walk, a type test per leaf, the size
classes, a tuple of tuples hashed): a tenth of a decode step's device time on an H200.

Once a structure has served a call, `make_checker` writes a Python function for it: straight-line
code that fetches every leaf from the arguments by its path (`args[1].__dict__['layers'][3]
.__dict__['keys']`), and checks on the way exactly what makes the generic walk give the same
structure: the exact class of every walked object, its length or its keys in their order (the
walk's order is the leaves' order, and an absent key is never read), every value leaf's
type and value, every identity leaf by `is`, the class of every leaf a walk does not enter (a
tensor, an int, a walked object met again: the same object as then), that no two walked objects
are one (the walk would make the second a leaf), and with symbolic captures each size and int's
class (0, 1, 2 or more). It returns the call's leaves, tensors and ints in the walk's order, or None
at the first difference, and the call takes the generic path (which may then find another
structure). The check is stricter than the key in one place only -- an object met twice must be
the same object as the one it met then -- so a call it refuses is served all the same, through
the generic walk. Keys that are not plain str or int literals are named constants of the check,
never pasted into its source.

At most CHECKS checkers per function, the one that served last tried first; a structure dropped
past that bound keeps the generic path (regenerating on every call would cost more than it
saves). A structure the generator cannot express (a walk cut at MAX_LEAVES, an argument pytree
flattens as another node than a tuple, list or dict, a dict subclass or a container indexing its
own way in the state, a dict whose keys are not str/int at a leaf, a NaN value) keeps the generic
path.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from . import state

_INDENT = "    "


class Unexpressible(Exception):
    """The structure has something the generated check does not express (the generic path serves it)."""


class _Writer:
    """Emits the check of one structure, mirroring state._visit over the recorded call."""

    def __init__(self):
        self.lines: list[str] = []
        self.env: dict[str, Any] = {"Tensor": torch.Tensor}
        self.leaves: list[str] = []  # per leaf of the walk, in order: its variable
        self.places: list[tuple] = []  # per leaf: (root, steps), to compare with the walk's
        self.nodes: list[str] = []  # per walked object: its variable
        self.seen: dict[int, str] = {}  # id(walked object) -> its variable
        self.count = 0
        self.consts: list[str] = []  # comments naming each constant the checks compare with

    def var(self, expr: str, path: str) -> str:
        name = f"v{self.count}"
        self.count += 1
        self.lines.append(f"{name} = {expr}  # " + path.replace("\n", "\\n").replace("\r", "\\r"))
        return name

    def const(self, obj) -> str:
        for name, value in self.env.items():  # one name per object or value (a class, a device)
            if value is obj or (_plain(obj) and type(value) is type(obj) and value == obj):
                return name
        name = f"c{len(self.env)}"
        self.env[name] = obj
        self.consts.append(f"# {name} = " + _describe(obj).replace("\n", "\\n").replace("\r", "\\r"))
        return name

    def key(self, k) -> str:
        """A dict key in the source: a literal for a plain str or int, else a named constant."""
        return repr(k) if type(k) in (str, int) else self.const(k)

    def fail_if(self, cond: str) -> None:
        self.lines.append(f"if {cond}: return None")

    def leaf(self, var: str, obj, walked: bool) -> None:
        """Checks that the generic walk would give this leaf the entry it gave `obj`."""
        if isinstance(obj, torch.Tensor):
            self.fail_if(f"not isinstance({var}, Tensor)")
        elif type(obj) is int:
            self.fail_if(f"type({var}) is not int")
        elif obj is None:
            self.fail_if(f"{var} is not None")
        elif isinstance(obj, state.VALUE_TYPES):
            if obj != obj:
                raise Unexpressible("a value that is not equal to itself (NaN)")
            self.fail_if(f"type({var}) is not {self.const(type(obj))} or {var} != {self.const(obj)}")
        elif walked and id(obj) in self.seen:  # an object met before: a leaf holding it
            self.fail_if(f"{var} is not {self.seen[id(obj)]}")
        elif walked and state.walkable(obj):
            if isinstance(obj, dict) and not state.followable_keys(obj):
                raise Unexpressible("a dict whose keys are not all str or int")
            self.fail_if(f"type({var}) is not {self.const(type(obj))}")  # at the depth bound
        else:  # matched by identity
            self.fail_if(f"{var} is not {self.const(obj)}")

    def visit(self, var: str, root: str, r: int, steps: tuple, obj, depth: int) -> None:
        """What state._visit does for `obj` at this place, as checks on `var`."""
        if depth >= state.MAX_DEPTH or id(obj) in self.seen:
            self.leaf(var, obj, walked=True)
            self.leaves.append(var)
            self.places.append((r, steps))
            return
        if isinstance(obj, (list, tuple)):
            base = list if isinstance(obj, list) else tuple
            if type(obj).__getitem__ is not base.__getitem__ or type(obj).__iter__ is not base.__iter__:
                raise Unexpressible(f"a {type(obj).__name__} that indexes or iterates its own way")
            kind, items = "item", [(i, f"{var}[{i}]", v) for i, v in enumerate(obj)]
            self.fail_if(f"type({var}) is not {self.const(type(obj))} or len({var}) != {len(obj)}")
        elif isinstance(obj, dict):
            if type(obj) is not dict:
                raise Unexpressible(f"a {type(obj).__name__} (a dict subclass) in the state")
            if not state.followable_keys(obj):
                raise Unexpressible("a dict whose keys are not all str or int")
            kind, items = "key", [(k, f"{var}[{self.key(k)}]", v) for k, v in obj.items()]
            # its keys in their order: the walk's order is the leaves' order (and reading a key
            # that is absent is never tried)
            self.fail_if(f"type({var}) is not dict or tuple({var}) != {self.const(tuple(obj))}")
        else:
            d = getattr(obj, "__dict__", None)
            if d is None or not isinstance(d, dict):
                self.leaf(var, obj, walked=True)
                self.leaves.append(var)
                self.places.append((r, steps))
                return
            self.fail_if(f"type({var}) is not {self.const(type(obj))}")
            dvar = self.var(f"{var}.__dict__", state.path_text(root, steps) + ".__dict__")
            self.fail_if(f"type({dvar}) is not dict or tuple({dvar}) != {self.const(tuple(d))}")
            kind, items = "attr", [(k, f"{dvar}[{self.key(k)}]", v) for k, v in d.items()]
        self.seen[id(obj)] = var
        self.nodes.append(var)
        for k, expr, value in items:
            if len(self.leaves) >= state.MAX_LEAVES:
                raise Unexpressible("a walk cut at MAX_LEAVES")
            at = steps + ((kind, k),)
            child = self.var(expr, state.path_text(root, at))
            if isinstance(value, state._LEAF_TYPES):
                self.leaf(child, value, walked=False)
                self.leaves.append(child)
                self.places.append((r, at))
            else:
                self.visit(child, root, r, at, value, depth + 1)


def _children(spec) -> list:
    """A TreeSpec's children (`children()` from torch 2.13; `children_specs` before)."""
    children = getattr(spec, "children", None)
    return list(children()) if callable(children) else list(spec.children_specs)


def _containers(w: _Writer, spec, expr: str, leaves: list) -> None:
    """Checks that `expr` flattens as `spec` did (tuples, lists and dicts: pytree's own nodes
    among the arguments) and appends the expressions of its leaves, in pytree's order."""
    if spec.is_leaf():
        leaves.append(expr)
        return
    kind = spec.type
    if kind in (tuple, list):
        w.fail_if(f"type({expr}) is not {w.const(kind)} or len({expr}) != {spec.num_children}")
        children = [f"{expr}[{i}]" for i in range(spec.num_children)]
    elif kind is dict:
        keys = list(spec.context)
        if not state.followable_keys(keys):
            raise Unexpressible("an argument dict whose keys are not all str or int")
        w.fail_if(f"type({expr}) is not dict or tuple({expr}) != {w.const(tuple(keys))}")  # pytree keeps their order
        children = [f"{expr}[{w.key(k)}]" for k in keys]
    else:
        raise Unexpressible(f"an argument pytree flattens as a {kind.__name__} (only tuples, lists and dicts are checked)")
    for child, child_spec in zip(children, _children(spec)):
        _containers(w, child_spec, child, leaves)


def _size_class(var: str, n: int) -> str:
    return f"{var} != {n}" if n < 2 else f"{var} < 2"


def _plain(obj) -> bool:
    """A value compared by equality, whose equal constants may share one name (a device, a key tuple)."""
    if type(obj) is tuple:
        return all(type(k) in (str, int) for k in obj)
    return isinstance(obj, state.VALUE_TYPES)


def _describe(obj) -> str:
    if isinstance(obj, type):
        return f"the class {obj.__module__}.{obj.__qualname__}"
    text = repr(obj)
    return text if len(text) <= 60 else f"{type(obj).__name__} object at {id(obj):#x}"


def make_checker(call, dynamic, call_names=None) -> tuple[Optional[Callable], str]:
    """The generated check of `call`'s structure (a compile._Call that was served) and its
    source; (None, why) when the structure cannot be expressed. `call_names`: the arguments'
    names in the caller's words (comments only)."""
    try:
        return _make(call, dynamic, call_names)
    except Unexpressible as e:
        return None, str(e)


def _make(call, dynamic, call_names) -> tuple[Callable, str]:
    if call.walk.truncated:
        raise Unexpressible("a walk cut at MAX_LEAVES")
    w = _Writer()
    # the pytree leaves of (args, kwargs), through the containers pytree flattens there
    arg_exprs: list[str] = []
    args_spec, kwargs_spec = _children(call.spec)
    _containers(w, args_spec, "args", arg_exprs)
    _containers(w, kwargs_spec, "kwargs", arg_exprs)
    if len(arg_exprs) != call.n_args:
        raise Unexpressible("the arguments' pytree structure does not retrace the recorded one")  # a bug
    names = list(call_names) if call_names is not None else [f"leaf {i}" for i in range(call.n_args)]
    arg_vars = [w.var(expr, names[i]) for i, expr in enumerate(arg_exprs)]
    arg_leaves = call.leaves[: call.n_args]
    roots = set(call.root_pos)
    for i, (var, a) in enumerate(zip(arg_vars, arg_leaves)):
        if i not in roots:
            w.leaf(var, a, walked=False)
    for r, i in enumerate(call.root_pos):
        w.visit(arg_vars[i], names[i], r, (), arg_leaves[i], state.root_depth(arg_leaves[i]))
    if w.places != [(r, steps) for r, steps, _ in call.walk.leaves]:
        raise Unexpressible("the generated walk does not retrace the recorded one")  # a bug, not a user error
    if len(w.nodes) > 1:
        w.fail_if(f"len({{{', '.join(f'id({n})' for n in w.nodes)}}}) != {len(w.nodes)}")
    leaves = arg_vars + w.leaves
    tensors = [leaves[i] for i in call.tensor_pos]
    ints = [leaves[i] for i in call.int_pos]
    if dynamic is not False:  # the size classes of compile._Call's structure
        for var, t in zip(tensors, call.tensors):
            shape = w.var(f"{var}.shape", "its sizes: 0, 1 or 2 and more, as the symbolic trace specialized them")
            conds = [f"len({shape}) != {t.dim()}"] + [_size_class(f"{shape}[{d}]", s) for d, s in enumerate(t.shape)]
            w.fail_if(" or ".join(conds))
        for var, n in zip(ints, call.ints):
            w.fail_if(_size_class(var, n))
    body = w.lines + [
        f"return [{', '.join(leaves)}], [{', '.join(tensors)}], ({''.join(i + ', ' for i in ints)})"]
    src = "".join(line + "\n" for line in w.consts) + "def check(args, kwargs):\n" + _INDENT + "try:\n" + "".join(
        2 * _INDENT + line + "\n" for line in body) + _INDENT + "except (KeyError, IndexError, AttributeError, TypeError):\n" \
        + 2 * _INDENT + "return None\n"
    env = dict(w.env)
    exec(compile(src, f"<trident structure check {call.structure.__hash__() & 0xffff:04x}>", "exec"), env)  # noqa: S102
    return env["check"], src
