"""Cut a graph into regions: maximal runs of consecutive nodes with a native path -- Triton
launches, allocations, and every operator with a schema (called natively through the
dispatcher). What has no native path ends a region: Python callables, data-dependent ops
(`.item()`, nonzero, ...), non-tensor values. Every cut is recorded with its reason, for
explain()."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from triton.runtime.jit import JITFunction

import operator

from .common import (
    is_allocation,
    is_launch,
    is_size_node,
    launch_kernel,
    launch_kwargs,
    launch_tuner,
    operator_call_reason,
)


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
    from triton.runtime.autotuner import Autotuner

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
    from ..lowering.region_to_torch import import_reason  # here: the lowering imports the passes

    return operator_call_reason(node) or import_reason(node)


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

    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
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
