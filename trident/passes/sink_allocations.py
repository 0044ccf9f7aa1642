"""Move each allocation right before its first user, so that allocations join the region of
the launches they feed instead of being separated from them by unrelated ops."""

from __future__ import annotations

import operator

import torch

from .common import is_allocation


def sink_allocations(gm: torch.fx.GraphModule) -> None:
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in list(gm.graph.nodes):
        if not is_allocation(node) or not node.users:
            continue
        first_user = min(node.users, key=lambda u: order[u])
        # Every input of the allocation (shape values, a tensor for *_like) must stay earlier.
        if all(order[i] < order[first_user] for i in node.all_input_nodes):
            first_user.prepend(node)
    order.clear()
    gm.graph.lint()
    gm.recompile()


def drop_unused_projections(gm: torch.fx.GraphModule) -> None:
    """Erase getitem nodes nobody reads (make_fx keeps one per result, e.g. the ints of
    flash/cuDNN attention); they would otherwise end regions for nothing."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
