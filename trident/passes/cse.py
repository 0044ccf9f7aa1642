"""Common-subexpression elimination that respects mutation.

The captured graphs are not functional: Triton launches and in-place ATen ops write tensors,
so torch's CSEPass (torch.fx.passes.dialect.common.cse_pass, which states it cannot be applied
to non-functional dialects) is not safe here. This pass keeps its idea -- a node is replaced by
an earlier node with the same target and the same (already substituted) arguments -- and adds
what mutation requires.

Note [CSE under mutation]
A later call `d = op(args)` is replaced by an earlier `k = op(args)` only when
  * op is an aten/prims OpOverload that writes none of its arguments, returns fresh tensors
    (no alias annotation on any result: views are left alone, they are nearly free natively),
    is not random (Tag.nondeterministic_seeded, torch's CSE ban list, a Generator argument),
    and is no allocation (each empty/zeros is its own buffer);
  * the arguments are the same nodes and equal constants, compared with their type (1, 1.0
    and True differ; floats by their bits, so 0.0 and -0.0 differ);
  * nothing between k and d writes storage any argument may alias. Every value has the
    roots it may alias: a fresh result is its own root, a view/in-place result or a getitem
    has its source's roots, and all graph inputs share ONE root (callers may pass the same
    tensor twice). Launches write the roots of the tensors torch's TTIR analysis says they
    write; operators those of their `(a!)` arguments; anything else (a Python callable, a
    higher-order op) is a barrier that may write everything;
  * neither k nor d is ever written (they would stop being equal, or a write to one would
    reach the readers of the other), and they do not both reach the graph's output (the
    caller would get one tensor twice where eager gives two).
Duplicate projections `getitem(x, i)` are the same Python object in eager, so they merge
unconditionally.
"""

from __future__ import annotations

import operator
import struct

import torch
from torch.fx.passes.dialect.common.cse_pass import rand_ops

from .common import ALLOCATION_OPS, UNANNOTATED_VIEWS, is_launch, written_args
from .outline_regions import written_params

_INPUTS = "<graph inputs>"  # the one root every placeholder/get_attr shares
_BARRIER = object()  # "may write anything"
_NAMESPACES = {"aten", "prims"}
_ENUM_TYPES = (str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _const_key(value):
    """A hashable key equal only for the same node or the same constant of the same type;
    None when the value has no safe key."""
    if isinstance(value, torch.fx.Node):
        return ("node", value)
    t = type(value)
    if t is bool or t is int:
        return (t.__name__, value)
    if t is float:
        return ("float", struct.pack("<d", value))
    if isinstance(value, _ENUM_TYPES):
        return (t.__name__, value)
    if isinstance(value, (list, tuple)):  # fx keeps them as immutable_list, immutable tuple
        keys = tuple(_const_key(v) for v in value)
        return None if any(k is None for k in keys) else ("list" if isinstance(value, list) else "tuple", keys)
    return None


def _call_key(node: torch.fx.Node):
    """(target, bound arguments) in schema order, or None."""
    schema = node.target._schema
    bound = []
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            value = node.args[i]
        elif arg.name in node.kwargs:
            value = node.kwargs[arg.name]
        else:
            bound.append(("default",))
            continue
        key = _const_key(value)
        if key is None:
            return None
        bound.append(key)
    if len(node.args) > len(schema.arguments) or set(node.kwargs) - {a.name for a in schema.arguments}:
        return None
    return (node.target, tuple(bound))


def _returns_alias(op: torch._ops.OpOverload) -> bool:
    return op in UNANNOTATED_VIEWS or any(r.alias_info is not None for r in op._schema.returns)


def _is_pure(node: torch.fx.Node) -> bool:
    """Note [CSE under mutation], first point."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    op = node.target
    schema = op._schema
    if op.namespace not in _NAMESPACES or op in ALLOCATION_OPS or "empty" in op._opname:
        return False
    if torch.Tag.nondeterministic_seeded in op.tags or op.overloadpacket in rand_ops:
        return False
    if schema.is_mutable or any(a.alias_info is not None for a in schema.arguments):
        return False
    if any("Generator" in str(a.type) for a in schema.arguments):
        return False
    if not schema.returns or _returns_alias(op):
        return False
    return all(isinstance(r.type, torch.TensorType) for r in schema.returns)


def _written_nodes(node: torch.fx.Node):
    """Argument nodes the node writes, or _BARRIER when it may write anything."""
    if node.op in ("placeholder", "get_attr", "output"):
        return []
    if is_launch(node):
        kwargs = node.kwargs["kwargs"]
        return [kwargs[name] for name in written_params(node) if isinstance(kwargs.get(name), torch.fx.Node)]
    if node.op == "call_function" and node.target is operator.getitem:
        return []
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return written_args(node)
    return _BARRIER


def _roots(node: torch.fx.Node, roots: dict, inputs_apart: bool = False) -> frozenset:
    """What storage the node's result may alias (Note [CSE under mutation], third point); with
    inputs_apart each graph input and attribute is a root of its own (for a pass that checks at
    run time that the inputs it tells apart do not overlap)."""
    if node.op in ("placeholder", "get_attr"):
        return frozenset([node if inputs_apart else _INPUTS])
    inputs = frozenset().union(*(roots.get(a, frozenset()) for a in node.all_input_nodes))
    if node.op == "call_function" and node.target is operator.getitem:
        return inputs
    if is_launch(node):
        return frozenset()
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return inputs if _returns_alias(node.target) else frozenset([node])
    return inputs | {node}


# What other passes reuse of the alias analysis (trident/passes/fuse_cache_writes.py).
GRAPH_INPUTS = _INPUTS  # the one root of every graph input and attribute
WRITES_ANYTHING = _BARRIER  # written_nodes' answer for a node that may write any tensor
written_nodes = _written_nodes


def alias_roots(gm: torch.fx.GraphModule, inputs_apart: bool = False) -> dict:
    """Per node, the roots of the storage its result may alias (Note [CSE under mutation]); with
    inputs_apart each graph input and attribute is a root of its own."""
    roots: dict = {}
    for node in gm.graph.nodes:
        roots[node] = _roots(node, roots, inputs_apart)
    return roots


def merge_attribute_reads(gm: torch.fx.GraphModule) -> int:
    """Every get_attr of one attribute -> its first get_attr. make_fx emits one get_attr per
    read of a closed-over tensor (a cache's keys read by the update, then by attention), and
    each would become an input of its own: guarded twice, and two inputs to the alias rules of
    the later passes, though one tensor. The first read precedes every later one, and reading
    an attribute reads no data, so the merged node serves them all. Returns how many merged."""
    first: dict = {}
    merged = 0
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        kept = first.setdefault(node.target, node)
        if kept is not node:
            node.replace_all_uses_with(kept)
            gm.graph.erase_node(node)
            merged += 1
    return merged


def eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> int:
    """Replace each pure operator call by an equal earlier one (Note [CSE under mutation]),
    after merging the reads of one attribute (merge_attribute_reads). Returns how many nodes
    were removed."""
    merged = merge_attribute_reads(gm)
    graph = gm.graph
    nodes = list(graph.nodes)

    # Roots, and which roots are ever written, on the graph as captured. A merge only joins
    # nodes that are their own, never-written roots, so neither changes by merging.
    roots: dict[torch.fx.Node, frozenset] = {}
    writes: dict[torch.fx.Node, frozenset | object] = {}
    written: set = set()
    for node in nodes:
        roots[node] = _roots(node, roots)
        w = _written_nodes(node)
        if w is _BARRIER:
            writes[node] = _BARRIER
            written.add(_INPUTS)
            written.update(*roots.values())
        elif w:
            writes[node] = frozenset().union(*(roots.get(a, frozenset()) for a in w))
            written |= writes[node]
    output_roots = set()
    for node in nodes:
        if node.op == "output":
            output_roots.update(*(roots.get(a, frozenset()) for a in node.all_input_nodes))

    table: dict = {}  # key -> (kept node, roots its arguments may alias)
    reaches_output: dict[torch.fx.Node, bool] = {}
    removed = 0
    for node in nodes:
        w = writes.get(node)
        if w is _BARRIER:
            table.clear()
        elif w:
            table = {k: v for k, v in table.items() if not (v[1] & w)}

        if node.op == "call_function" and node.target is operator.getitem:
            key = ("getitem", node.args[0], _const_key(node.args[1]))
            if not isinstance(node.args[0], torch.fx.Node) or key[2] is None or node.kwargs:
                continue
            kept = table.get(key)
            if kept is None:
                # Never invalidated: the same projection is the same object whatever happens.
                table[key] = (node, frozenset())
            else:
                node.replace_all_uses_with(kept[0])
                graph.erase_node(node)
                removed += 1
            continue

        if not _is_pure(node) or node in written:
            continue
        key = _call_key(node)
        if key is None:
            continue
        mine = node in output_roots
        entry = table.get(key)
        if entry is None:
            arg_roots = frozenset().union(*(roots.get(a, frozenset()) for a in node.all_input_nodes))
            table[key] = (node, arg_roots)
            reaches_output[node] = mine
            continue
        kept = entry[0]
        if mine and reaches_output[kept]:
            continue
        reaches_output[kept] |= mine
        node.replace_all_uses_with(kept)
        graph.erase_node(node)
        removed += 1

    if removed or merged:
        graph.lint()
        gm.recompile()
    return removed
