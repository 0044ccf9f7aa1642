"""Values a trace specializes: data-dependent sizes and scalars read at capture, guarded per call.

Note [Values a trace specializes]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A function that decides something from a tensor's values has no one graph: flash-linear-
attention unpads its tokens with `torch.nonzero(attention_mask[:, -1:].flatten())` in every layer
and then computes a Triton constexpr from the count (`NB = cdiv(T, 65536)`); others branch on
`.item()` or `bool(t)`. A trace that fails on such a value (an unbacked symbol a guard or a
constexpr needs, a scalar read in a static trace) is retried by trident.compile with the values
specialized (`capture(..., values=True)`), as Dynamo specializes what it reads, behind a guard
that holds before anything of the call runs -- last: a static trace's failure is first retried
symbolically, where libraries take traceable paths that need no guard (HF's masks):

  * where the trace reaches `aten.nonzero`, `aten._local_scalar_dense` (`.item()`, `bool(t)`,
    `.tolist()`) or `aten.repeat_interleave.Tensor` without an output size (`torch.repeat_interleave(
    x, counts)`: fla builds its chunk indices so), the part of the graph traced so far that
    computes the operand -- its slice, back to the graph's inputs and the tensors the function
    holds -- is checked to be pure: ATen ops without writes or randomness, and size arithmetic;
    no write traced before it (an in-place op, a Triton launch's stores by torch's TTIR analysis,
    anything else taking a tensor) touches a tensor of the slice or what it views (through view
    ops and the pieces of `split`/`unbind`); an input written before it must not share memory
    with an input the slice reads, at capture and on every call (two inputs over one storage:
    the guard says so);
  * the slice runs on the capture's real inputs (the example inputs trident.compile passes are
    the call's own tensors; the function does not run) and gives the value: the count of
    nonzero elements, the sum of the repeats, or the scalar;
  * `nonzero` is traced as `aten.nonzero_static(x, size=count)` and `repeat_interleave` with its
    `output_size=total` (static sizes from there on: the same rows, no device-to-host read,
    capturable in a CUDA graph), and a scalar read as the Python constant it gave;
  * the slice and its value become a `TracedValue` call guard of the optimized graph (scm/guards.py,
    Note [One guard table]): each call runs the slice on its inputs and compares (one
    device-to-host read per distinct slice on CUDA, as eager's nonzero or `.item()` costs). A call
    with another value raises GuardError before anything ran, and trident.compile serves it with
    another capture of the family, or makes one for that value (at most REGIMES per family; past
    that the family goes through Dynamo, Note [Data-dependent calls through Dynamo]).

A slice through a node traced with a value fixed (the rows a count selected) computes that node
anew (`nonzero`, `repeat_interleave` without a size), never with the earlier value's size. A
total is also checked for negative repeats, which eager refuses. Values are specialized in a
symbolic trace too: a total that comes from sizes (`x.repeat_interleave(2)` over a tensor of
repeats) then holds for one size, each new one a capture (as `nonzero`'s count), past REGIMES
Dynamo.
A slice that is not pure, or an input that is not a real tensor (the caller traced with fake
inputs), is declined: the trace fails as it would have, and the door serves the call otherwise.
Equal slices (one mask read by every layer) make one guard. Only `trident.compile` asks for it:
`trident.capture` keeps refusing such functions (its graph would hold for one value only).
"""

from __future__ import annotations

import contextlib
import math
import operator
import threading
import traceback
from typing import Any, Optional, Sequence

import torch
from torch._higher_order_ops import triton_kernel_wrap as tkw
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot
from torch.utils._python_dispatch import _disable_current_modes

from .. import logs
from ..scm.guards import TracedValue, shares_storage
from .frames import user_line

aten = torch.ops.aten

_PURE_BUILTINS = {operator.__name__, math.__name__, "_operator"}
_SYM_FUNCTIONS = {getattr(torch, n) for n in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_ite",
                                              "sym_sqrt", "sym_sum") if hasattr(torch, n)}
_active = threading.local()
# ops whose result's size or value only the data gives: a slice through one is declined (its
# value would wait for another read); a repeat_interleave without output_size runs as it is
_DATA_DEPENDENT = (aten.nonzero.default, aten._local_scalar_dense.default)


class _Specializing:
    """This thread's specialization while one trace runs: the real example inputs and the
    guards found so far."""

    def __init__(self, example_inputs: Sequence):
        self.inputs = list(example_inputs)
        self.found: list[TracedValue] = []
        self.keys: set = set()
        self.written: dict = {}  # node -> the nodes it writes (_written)
        self.specialized: dict = {}  # node traced with a value fixed -> the op that computes it anew


@contextlib.contextmanager
def specializing(example_inputs: Sequence):
    """While a trace runs in this thread: specialize its data-dependent values (the
    decompositions below act only here). Yields the list of TracedValue guards found."""
    outer = getattr(_active, "state", None)
    _active.state = state = _Specializing(example_inputs)
    try:
        yield state.found
    finally:
        _active.state = outer


def _pure_target(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        schema = t._schema
        return not schema.is_mutable and torch.Tag.nondeterministic_seeded not in t.tags and \
            t not in _DATA_DEPENDENT
    return t in _SYM_FUNCTIONS or getattr(t, "__module__", None) in _PURE_BUILTINS


def _written(node: torch.fx.Node, known: dict) -> list:
    """The nodes `node` may write (remembered in `known` for the trace: a launch's analysis
    compiles its kernel to TTIR): an op's arguments its schema marks written; the pointer
    arguments a Triton launch stores through; every tensor a call of anything else takes."""
    if node not in known:
        known[node] = _writes_of(node)
    return known[node]


def _writes_of(node: torch.fx.Node) -> list:
    if node.op != "call_function" or _pure_target(node):
        return []
    t = node.target
    if isinstance(t, torch._ops.OpOverload) and t not in _DATA_DEPENDENT:
        out = []
        for i, a in enumerate(t._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                v = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
                out += [n for n in ([v] if not isinstance(v, (list, tuple)) else v) if isinstance(n, torch.fx.Node)]
        return out
    if isinstance(t, torch._ops.OpOverload):
        return []
    if t is torch.ops.higher_order.triton_kernel_wrapper_mutation:
        args = node.kwargs["kwargs"]
        try:  # torch's own analysis of the kernel's TTIR: the pointer arguments it stores through
            with _disable_current_modes(), logs.torch_analysis_quiet():  # Note [torch's launch analysis, quietly]
                names = tkw.get_mutated_tensors(
                    node.kwargs["kernel_idx"], node.kwargs["constant_args_idx"],
                    {k: v.meta["val"] if isinstance(v, torch.fx.Node) else v for k, v in args.items()},
                    node.kwargs["tma_descriptor_metadata"])
            return [args[n] for n in names if isinstance(args.get(n), torch.fx.Node)]
        except Exception:  # noqa: BLE001 - not analysable: every tensor it takes, as torch assumes
            pass
    return list(node.all_input_nodes)


def _base(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose memory `node` views (through view ops, and the pieces of ops returning
    several: `split`, `unbind`, `chunk` read through getitem), or `node`."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node) and (
            node.target is operator.getitem
            or (isinstance(node.target, torch._ops.OpOverload) and node.target.is_view)):
        node = node.args[0]
    return node


def _slice(graph: torch.fx.Graph, target: torch.fx.Node, known: dict) -> "Optional[tuple[list, list, list]]":
    """(the nodes computing `target` in graph order, its leaves: placeholders and get_attrs, the
    leaves written before it -- another leaf may share their memory), or None where it is not
    pure."""
    needed: set = set()
    stack = [target]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        needed.add(n)
        if n.op in ("placeholder", "get_attr"):
            continue
        if not _pure_target(n):
            return None
        stack.extend(n.all_input_nodes)
    bases = {_base(n) for n in needed}
    written_leaves = []
    for n in graph.nodes:  # every write traced before this point
        for w in _written(n, known):
            b = _base(w)
            if b in bases or w in needed:
                return None
            if b.op in ("placeholder", "get_attr") and b not in written_leaves:
                written_leaves.append(b)
    order = [n for n in graph.nodes if n in needed]
    return order, [n for n in order if n.op in ("placeholder", "get_attr")], written_leaves


def _structure(order: list, out: torch.fx.Node) -> tuple:
    """The slice as plain data, nodes by position: two slices computing the same from the same
    leaves (one mask unpadded by every layer, its ops traced again each time) compare equal."""
    index = {n: i for i, n in enumerate(order)}

    def arg(a):
        if isinstance(a, torch.fx.Node):
            return ("node", index[a])
        if isinstance(a, (list, tuple)):
            return tuple(map(arg, a))
        return repr(a)

    rows = tuple((n.op, str(n.target) if n.op == "call_function" else "", arg(n.args),
                  tuple((k, arg(v)) for k, v in n.kwargs.items())) for n in order if n.op == "call_function")
    leaves = tuple(i for i, n in enumerate(order) if n.op != "call_function")
    return rows, leaves, index[out]


def _where() -> str:
    """The user's line that read the value."""
    return user_line(traceback.extract_stack()) or "?"


def _value_of(kind: str, operand) -> "tuple[Any, Any] | None":
    """(the TracedValue guard, its value) for `operand` of `kind` in the trace running now, or
    None where it cannot be specialized (Note [Values a trace specializes])."""
    state = getattr(_active, "state", None)
    mode = get_proxy_mode()
    if state is None or mode is None or not isinstance(operand, torch.Tensor):
        return None
    tracer = mode.tracer
    try:
        node = get_proxy_slot(operand, tracer).proxy.node
    except (KeyError, RuntimeError, AttributeError):
        return None
    found = _slice(tracer.graph, node, state.written)
    if found is None:
        return None
    order, leaves, written_leaves = found
    placeholders = [n for n in tracer.graph.nodes if n.op == "placeholder"]

    def source_of(leaf):
        """(the real value, the guard's source: a graph-input position or the held tensor)."""
        if leaf.op == "placeholder":
            i = placeholders.index(leaf)
            return (state.inputs[i], i) if i < len(state.inputs) else (None, None)
        value = getattr(tracer.root, leaf.target, None)
        return value, value

    sources = []
    for leaf in leaves:
        value, source = source_of(leaf)
        if source is None or isinstance(value, FakeTensor) or (
                isinstance(value, torch.Tensor) and value.device.type == "meta"):
            return None
        sources.append(source)
    # a tensor written before the read may share memory with one the slice reads (two inputs
    # over one storage): then the value is not the inputs' any more; checked again every call
    written = []
    for v, src in map(source_of, written_leaves):
        if src is None or isinstance(v, FakeTensor) or (isinstance(v, torch.Tensor) and v.device.type == "meta"):
            return None  # a written input the guard could not check
        if isinstance(v, torch.Tensor):
            written.append(src)
    guard_inputs = [s if not isinstance(s, int) else state.inputs[s] for s in sources]
    for w in written:
        wt = state.inputs[w] if isinstance(w, int) else w
        if any(isinstance(t, torch.Tensor) and shares_storage(t, wt) for t in guard_inputs):
            return None
    graph = torch.fx.Graph()
    env: dict = {}
    for n in order:
        if n.op in ("placeholder", "get_attr"):
            env[n] = graph.placeholder(f"in{len(env)}")
        elif n in state.specialized:  # computed anew, never with an earlier value's size fixed
            env[n] = graph.call_function(state.specialized[n], (env[n.args[0]],))
        else:
            env[n] = graph.node_copy(n, lambda a: env[a])
            env[n].meta = {}
    graph.output(env[node])
    program = torch.fx.GraphModule(torch.nn.Module(), graph)
    guard = TracedValue(program, tuple(sources), kind, None, _where(), tuple(written))
    try:
        with _disable_current_modes(), torch.no_grad():
            value = guard.evaluate(state.inputs)
    except Exception:  # noqa: BLE001 - not computable here: the trace fails as it would have
        return None
    guard = TracedValue(program, tuple(sources), kind, value, guard.where, guard.disjoint)
    key = (kind, _structure(order, node), tuple(id(s) if isinstance(s, torch.Tensor) else s for s in sources),
           tuple(id(w) if isinstance(w, torch.Tensor) else w for w in written))  # a read after more writes: its own
    if key not in state.keys:
        state.keys.add(key)
        state.found.append(guard)
    return guard, value


def _nonzero(x):
    got = _value_of("count", x)
    if got is None:
        return NotImplemented
    return _specialized(aten.nonzero_static.default(x, size=got[1], fill_value=-1), aten.nonzero.default)


def _repeat_interleave(repeats, output_size=None):
    if output_size is not None:  # the caller gave the size: nothing to specialize
        return NotImplemented
    got = _value_of("total", repeats)
    if got is None:
        return NotImplemented
    return _specialized(aten.repeat_interleave.Tensor(repeats, output_size=got[1]), aten.repeat_interleave.Tensor)


def _specialized(result, anew):
    """Remembers the node just traced with a value fixed: a later value's slice through it (a
    count over the rows it selected) computes it with `anew` on the call's inputs, so that slice
    never runs with an earlier value's size -- on CUDA a wrong size is a device-side assert, which
    the guard could not catch -- whatever order the guards are checked in."""
    try:
        node = get_proxy_slot(result, get_proxy_mode().tracer).proxy.node
    except (KeyError, RuntimeError, AttributeError):
        return result
    _active.state.specialized[node] = anew
    return result


def _item(x):
    got = _value_of("scalar", x)
    if got is None:
        return NotImplemented
    return got[1]


# make_fx's decomposition table while a trace specializes values: consulted before the op
# reaches the fake tensors (a decomposition returning NotImplemented leaves the op as it was)
DECOMPOSITIONS = {aten.nonzero.default: _nonzero, aten._local_scalar_dense.default: _item,
                  aten.repeat_interleave.Tensor: _repeat_interleave}
