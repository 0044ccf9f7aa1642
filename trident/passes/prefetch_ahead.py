"""Each GEMV launch asks the L2 for the weights of the next product's launch (Note [The next
product's weights], trident/kernels/gemv.py), so that the latency-bound kernels between two
products of a decode step run while HBM streams the second one's weights.

For each launch G of gemv_kernel / gemv_group_kernel (choose_matmuls) on a CUDA device, the GEMV
launch P before it in the graph carries G's weights (`next<i>_ptr`, `next_bytes<i>`, `next_chunk`,
NEXT: gemv.next_args) where
  * no other matrix product runs between P and G (an operator's product would stream its own
    weights and evict the prefetched lines);
  * each weight of G is defined before P, itself or as a view of a tensor that is (the weight
    read through `.t()` of a parameter) or of a module attribute (make_fx reads one where it is
    first used: that read moves before P), and is dense with nonnegative strides, so that its
    bytes are the ones from its first element's address on.
TRIDENT_PREFETCH_AHEAD='' leaves the launches as they are."""

from __future__ import annotations

import math

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false

from .. import knobs
from ..kernels import gemv as G
from .common import is_launch, launch_kernel, node_val

aten = torch.ops.aten

_VIEWS = {aten.t.default, aten.permute.default, aten.transpose.int, aten.view.default, aten._unsafe_view.default,
          aten.alias.default, aten.reshape.default}
_PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.matmul.default,
             aten.linear.default, aten._scaled_mm.default}


def _gemv(node: torch.fx.Node) -> bool:
    return is_launch(node) and launch_kernel(node) in (G.gemv_kernel, G.gemv_group_kernel)


def _is_product(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and (node.target in _PRODUCTS or node.target is torch.ops.trident.residual_mm.default)


def _weights(node: torch.fx.Node) -> list:
    """The weight nodes of a GEMV launch, in the order its programs read them."""
    kwargs = node.kwargs["kwargs"]
    if launch_kernel(node) is G.gemv_kernel:
        return [kwargs["b_ptr"]]
    return [kwargs[f"b{i}_ptr"] for i in range(kwargs["MEMBERS"])]


def _readable_at(weight, order: dict, before: int):
    """(node, bytes) of `weight` as a node defined before position `before` or a module attribute
    read (which may move there): itself, or what a chain of views of it starts from, with the same
    first element; None where there is none or the bytes are not one dense span from that element."""
    want = node_val(weight)
    x = weight
    while isinstance(x, torch.fx.Node) and order[x] >= before and x.op != "get_attr":
        if not (x.op == "call_function" and x.target in _VIEWS and isinstance(x.args[0], torch.fx.Node)):
            return None
        x = x.args[0]
    v = node_val(x)
    if not isinstance(v, torch.Tensor) or not isinstance(want, torch.Tensor) or v.device != want.device:
        return None
    if v.numel() != want.numel() or v.storage_offset() != want.storage_offset():
        return None
    if any(s < 0 for s in v.stride()) or not is_non_overlapping_and_dense_or_false(v):
        return None
    return x, v.numel() * v.element_size()


def prefetch_ahead(gm: torch.fx.GraphModule, device_types=("cuda",)) -> int:
    """Give each GEMV launch the weights of the next one to prefetch (module docstring); returns
    how many launches carry some. `device_types`: where the kernels run compiled (their inline PTX
    is no instruction of Triton's interpreter; the tests pass others to see the plan)."""
    if not knobs.prefetch_ahead():
        return 0
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    carried = 0
    previous = None  # the last GEMV launch, while no other product followed it
    for node in nodes:
        if _is_product(node):
            previous = None
            continue
        if not _gemv(node):
            continue
        if previous is not None and "NEXT" not in previous.kwargs["kwargs"]:
            weights = [_readable_at(w, order, order[previous]) for w in _weights(node)]
            devices = {node_val(w).device for w in _weights(node) + _weights(previous)}
            if all(weights) and len(devices) == 1 and next(iter(devices)).type in device_types:
                for x, _ in weights:
                    if order[x] > order[previous]:  # an attribute read, read before P now
                        previous.prepend(x)
                        order[x] = order[previous] - 0.5
                programs = math.prod(previous.kwargs["grid"][0])
                args = G.next_args(programs, weights)
                previous.kwargs = {**previous.kwargs, "kwargs": {**previous.kwargs["kwargs"], **args}}
                carried += 1
        previous = node
    if carried:
        gm.graph.lint()
        gm.recompile()
    return carried
