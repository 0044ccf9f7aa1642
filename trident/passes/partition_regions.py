"""Cut a graph into regions: maximal runs of consecutive nodes with a native path -- Triton
launches, allocations, and every operator with a schema (called natively through the
dispatcher). What has no native path ends a region: Python callables, data-dependent ops
(`.item()`, nonzero, ...), non-tensor values. Every cut is recorded with its reason, for
explain().

Note [Ints no input carries]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A region's host program computes its sizes from the sizes and strides of its tensor inputs
(Note [Symbolic sizes]). A symbolic int that no tensor input carries -- a Python token counter
passed to the capture as the size of a zero-stride carrier (Note [State the function is
passed]), or an int Dynamo made dynamic -- cannot be read there: carriers live on the CPU and
are no data of the region. What reads such a "free" int is kept out of regions:
  * a view of a value made before the region (`positions[cache.seen]`: a select, slice or narrow
    at a position the int gives) is computed by the host before the region's call, like a size,
    and the region reads the view as an input. Its sizes do not change with the int, only its
    address, so under graph replay it is a staged input (one small copy per replay) and the
    region itself has nothing symbolic: one graph serves every step;
  * anything else (a launch taking the int, arithmetic with it, a view of a value the region
    makes) ends the region, with the reason.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from .common import (
    is_allocation,
    is_launch,
    is_size_node,
    is_view_op,
    launch_kernel,
    launch_kwargs,
    launch_tuner,
    operator_call_reason,
)
from .importable import import_reason


@dataclass
class Region:
    name: str
    nodes: list[torch.fx.Node]


@dataclass
class Partition:
    regions: list[Region] = field(default_factory=list)
    cuts: list[tuple[str, str]] = field(default_factory=list)  # (node, why it is not in a region)


def unsupported_launch_reason(node: torch.fx.Node) -> str | None:
    """Why a launch cannot join a region, or None when it can."""
    kernel = launch_kernel(node)
    if not isinstance(kernel, JITFunction):
        return _wrapper_reason(kernel)
    if node.kwargs.get("tma_descriptor_metadata"):
        return "TMA descriptors are not supported yet"
    grid = node.kwargs["grid"]
    tuner = launch_tuner(node)
    want = len(tuner.configs) if tuner is not None else 1
    if len(grid) != want or not all(_is_size(g) for gr in grid for g in gr):
        what = f"one per config ({want})" if tuner is not None else "one"
        return f"grid {grid} is not {what} (x, y, z) of integers"
    for name, value in launch_kwargs(node).items():
        if isinstance(value, torch.fx.Node):
            val = value.meta.get("val")
            if not isinstance(val, (torch.Tensor, torch.SymInt)):
                return f"argument {name!r} is a traced non-tensor value ({type(val).__name__}); only tensors and integer sizes are"
        elif isinstance(value, (tuple, list)):
            return f"argument {name!r} is a tuple; tuple arguments are not supported yet"
        elif isinstance(value, torch.Tensor):
            return f"argument {name!r} is a tensor constant baked into the graph"
    return None


def _is_size(g) -> bool:
    """An int, or a node of a symbolic trace computing one (Note [Symbolic sizes])."""
    if isinstance(g, torch.fx.Node):
        return isinstance(g.meta.get("val"), torch.SymInt)
    return isinstance(g, int)


def _wrapper_reason(kernel) -> str:
    """Why a wrapped kernel (autotune, heuristics) cannot join a region."""
    name = type(kernel).__name__
    if isinstance(kernel, Autotuner):
        if any(c.pre_hook for c in kernel.configs):
            return "@triton.autotune config with a pre_hook: Python runs before every launch"
        if not isinstance(kernel.fn, JITFunction):
            return f"@triton.autotune over {type(kernel.fn).__name__}: only a @triton.jit function (heuristics below it are folded by torch's tracer)"
        return "@triton.autotune with launch hooks: Python runs around every launch"
    return f"kernel {name} is not a @triton.jit or @triton.autotune function"


def _region_reason(node: torch.fx.Node) -> str | None:
    """None when the node can join a region (besides launches and allocations)."""
    if node.op != "call_function":
        return f"{node.op} node"
    if node.target is operator.getitem:
        src = node.args[0]
        val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if isinstance(val, (tuple, list)) and isinstance(val[node.args[1]], torch.Tensor):
            return None  # a tensor projection of a multi-result op; follows its producer
        return "reads a non-tensor result"

    return operator_call_reason(node) or import_reason(node)


def _carried_symbols(gm: torch.fx.GraphModule) -> set:
    """Symbols that a tensor input a region can read has as a size or stride (Note [Ints no
    input carries]): inputs of which only sizes are read (carriers of ints) do not count."""
    out = set()
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op not in ("placeholder", "get_attr") or not isinstance(val, torch.Tensor):
            continue
        if all(is_size_node(u) for u in node.users):
            continue
        for s in (*val.shape, *val.stride()):
            if isinstance(s, torch.SymInt):
                out |= {str(x) for x in s.node.expr.free_symbols}
    return out


def _free_ints(node: torch.fx.Node, carried: set) -> list[str]:
    """The symbols the node's int arguments depend on that no tensor input carries."""
    free = set()
    for a in node.all_input_nodes:
        val = a.meta.get("val")
        if isinstance(val, torch.SymInt):
            free |= {str(x) for x in val.node.expr.free_symbols} - carried
    return sorted(free)


# Note [Pieces of a symbolic region]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A graph replays one shape (Note [Graph bound]), so a region whose sizes change on every call --
# an HF DynamicCache's attention, whose key/value length grows by one per token -- never replays
# one: its hundreds of launches and operator calls are issued one by one on every step. Yet in a
# decode step only a few nodes have changing sizes (per layer: the cache's concatenation and the
# attention over it); the projections, norms, rotary and MLP around them have the same shapes on
# every step. When graphs may be recorded for the capture's device, a region of a symbolic
# capture is therefore cut into pieces: runs of nodes whose tensors all have static layouts and
# runs of nodes with a symbolic size, stride or offset (in what they read or make). A static
# piece gets its own SCM call and so its own graph, replayed on every step whatever the length;
# a symbolic piece runs its few steps natively. (vLLM's piecewise CUDA graphs leave attention
# out of the graph in the same way.) A static run with fewer than MIN_STATIC_WORK launches and
# operator calls stays with its symbolic neighbours: one more SCM call would cost more than its
# graph saves. A getitem goes with the op it projects, an allocation and a view with their first
# user.
MIN_STATIC_WORK = 4


def _symbolic_layout(val, offset: bool) -> bool:
    if isinstance(val, (list, tuple)):
        return any(_symbolic_layout(v, offset) for v in val)
    if isinstance(val, torch.Tensor):
        return any(isinstance(s, torch.SymInt)
                   for s in (*val.shape, *val.stride(), *((val.storage_offset(),) if offset else ())))
    return isinstance(val, torch.SymInt)


def _symbolic_node(node: torch.fx.Node) -> bool:
    """What the node makes has a symbolic layout, or what it reads a symbolic size or stride (the
    offset of what it reads is an address, staged under replay, not a fact of the graph)."""
    return _symbolic_layout(node.meta.get("val"), True) or any(
        _symbolic_layout(a.meta.get("val"), False) for a in node.all_input_nodes
    )


def _work(nodes) -> int:
    return sum(1 for n in nodes if is_launch(n) or not (is_allocation(n) or is_view_op(n) or n.target is operator.getitem))


def _sink_views(nodes: list) -> list:
    """Each view moved to just before its first user in the run (views read and write no data,
    so this changes nothing but where they stand): a view made in one piece and read by the next
    would leave its piece and be recomputed by Python between the calls (Note [Values leaving a
    region]); next to its reader, the reading piece's host program makes it natively."""
    members = set(nodes)
    # positions in the whole graph, kept exact through the moves: a moved node takes the midpoint
    # of its new neighbours (two views sunk before one user, then their common input before the
    # first of them, must see which of the two now stands first: a tie put a transpose after one
    # of its slices)
    order = {n: float(i) for i, n in enumerate(nodes[0].graph.nodes)}
    for node in reversed(nodes):
        if not is_view_op(node):
            continue
        users = list(node.users)
        if not users or any(u not in members for u in users):
            continue  # read outside the run too (a size of it): it stays where it is
        first = min(users, key=order.__getitem__)
        if first is not node.next:
            order[node] = (order[first.prev] + order[first]) / 2
            first.prepend(node)
    final = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    return sorted(nodes, key=final.__getitem__)


def split_symbolic_regions(regions: list[Region]) -> list[Region]:
    """Note [Pieces of a symbolic region]: each region cut into runs of static and symbolic
    nodes (short static runs kept with their neighbours), regions renamed in order."""
    out: list[list[torch.fx.Node]] = []
    for region in regions:
        region = Region(region.name, _sink_views(region.nodes))
        members = set(region.nodes)
        piece_of: dict = {}
        kinds = []
        position = {n: i for i, n in enumerate(region.nodes)}
        for node in region.nodes:
            if node.target is operator.getitem and node.args[0] in piece_of:
                kinds.append(piece_of[node.args[0]])
            elif is_allocation(node):  # of its first reader in graph order (a shared one has many)
                users = [u for u in node.users if u in members]
                kinds.append(_symbolic_node(min(users, key=position.get)) if users else _symbolic_node(node))
            else:
                kinds.append(_symbolic_node(node))
            piece_of[node] = kinds[-1]
        runs: list[list] = []
        for node, sym in zip(region.nodes, kinds):
            if runs and runs[-1][0] == sym:
                runs[-1][1].append(node)
            else:
                runs.append([sym, [node]])
        merged: list[list] = []
        for sym, nodes in runs:
            if not sym and _work(nodes) < MIN_STATIC_WORK and len(runs) > 1:
                sym = True
            if merged and merged[-1][0] == sym:
                merged[-1][1].extend(nodes)
            else:
                merged.append([sym, nodes])
        out.extend(nodes for _, nodes in merged)
    return [Region(f"region{k}", nodes) for k, nodes in enumerate(out)]


def _reads_a_tensor(nodes: list[torch.fx.Node]) -> bool:
    inside = set(nodes)
    return any(
        a not in inside and isinstance(a.meta.get("val"), torch.Tensor) for n in nodes for a in n.all_input_nodes
    )


def partition_regions(gm: torch.fx.GraphModule) -> Partition:
    part = Partition()
    current: list[torch.fx.Node] = []

    def close(reason_node: torch.fx.Node | None, reason: str | None):
        nonlocal current
        # A run of operator calls is a region with or without launches (a model of ATen ops
        # alone -- Hugging Face's plain Llama -- gets its host work native too); allocations
        # or one operator alone stay outside, and so does a run of operator calls reading no
        # tensor from outside (factories only: the dispatcher could not tell its device).
        if any(is_launch(n) for n in current) or (
            sum(not is_allocation(n) for n in current) >= 2 and _reads_a_tensor(current)
        ):
            part.regions.append(Region(f"region{len(part.regions)}", current))
        # Every node kept out of regions is listed, also where no region precedes it.
        if reason_node is not None and reason is not None:
            part.cuts.append((reason_node.name, reason))
        current = []

    carried = _carried_symbols(gm)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            continue
        free = _free_ints(node, carried) if node.op == "call_function" and not is_size_node(node) else []
        if free:  # Note [Ints no input carries]
            source = node.args[0] if node.args else None
            if is_view_op(node) and isinstance(source, torch.fx.Node) and source not in current:
                continue  # the host computes the view; the region reads it as an input
            close(node, f"reads the traced int {', '.join(free)}, which no tensor input has as a size "
                        "(an int passed to the function: a region cannot compute with it)")
            continue
        if is_launch(node):
            why = unsupported_launch_reason(node)
            if why is None:
                current.append(node)
                continue
            close(node, why)
            continue
        if is_allocation(node):
            current.append(node)
            continue
        if is_size_node(node):
            continue  # sizes stay outside; regions read them as expressions (Note [Symbolic sizes])
        if node.op == "output":
            close(None, None)
            continue
        why = _region_reason(node)
        if why is None and node.target is operator.getitem and node.args[0] not in current:
            why = "projection of a value made outside the region"
        if why is None:
            current.append(node)
            continue
        close(node, why)
    # Allocations left alone in `current` never formed a region; they stay ordinary nodes.
    return part
