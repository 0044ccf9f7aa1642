"""Two independent copy launches of lower_copies -> one launch of a two-pair kernel.

A decode step writes the K and V caches of a layer with two index_copy_kernel launches of one
shape, and clones the expanded K and V caches with two strided_copy_kernel launches of one
shape (trident/passes/lower_copies.py). Each launch costs ~3.2 us of host time in the SCM's
program; this pass merges such a pair into one launch of strided_copy2_kernel /
index_copy2_kernel (trident/kernels/copy.py): grid (n, 2, 1), tl.program_id(1) picks the pair,
and each pair runs the very body of the single kernel with its own pointers and strides, so the
results are the two launches' bit for bit.

A launch A and the next launch B are merged when
  * both were emitted by lower_copies (node.meta[LOWERED_COPY]) and launch the same kernel
    (strided_copy_kernel or index_copy_kernel) with no constant args: never user kernels;
  * they have the same grid and equal shared arguments (sizes, numel, dim_size and every
    constexpr, compared with their type); only the pointers and the per-operand strides
    (src_stride*, dst_stride*, index_stride) may differ;
  * every node between them only makes views or allocations or names an attribute
    (common.moves_no_data: no data is read or written there), and neither launch has users:
    the merged launch takes B's place, where all of A's operands are defined, and moving A's
    writes past views and fresh allocations changes nothing;
  * they are independent (Note [Independent copy launches]).

Note [Independent copy launches]
In one launch the two pairs run in any order, interleaved. So the storage each launch writes
(its dst) may not be the storage of any operand of the other (src, index or dst), which the
fake tensors in node.meta["val"] tell for everything the graph computes. Graph inputs are
distinct storages there, though a caller may pass views of one tensor (Note [Aliasing graph
inputs] in lower_copies.py), so when a write target and an operand of the other launch both
live in graph inputs the pair is merged only when the operand is read by both launches through
one node (the `pos` index of two cache writes): the write target overlapping it would overlap
an operand of its own launch, which eager refuses (ATen's overlap checks of index_copy_ /
index_put_) and lower_copies already lowers with an unspecified result. Two writes into graph
inputs (the K and V caches) are never merged: a caller may pass one tensor, or overlapping views
of one, as both, and the unfused graph then gives the second write where one launch would race.
Anything else sharing input storage stays two launches.
"""

from __future__ import annotations

import torch
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_mutation
from torch.multiprocessing.reductions import StorageWeakRef

from ..kernels.copy import index_copy2_kernel, index_copy_kernel, strided_copy2_kernel, strided_copy_kernel
from .common import is_launch, moves_no_data
from .lower_copies import LOWERED_COPY

aten = torch.ops.aten

_FUSED = {strided_copy_kernel: strided_copy2_kernel, index_copy_kernel: index_copy2_kernel}
_WRITES = ("dst_ptr",)
_READS = ("src_ptr", "index_ptr")


def _per_pair(name: str) -> bool:
    return name.endswith("_ptr") or "_stride" in name


def _copy_kernel(node: torch.fx.Node):
    """The lower_copies kernel `node` launches, or None."""
    if not is_launch(node) or not node.meta.get(LOWERED_COPY) or node.users:
        return None
    kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
    if kernel not in _FUSED or kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"]):
        return None
    if len(node.kwargs["grid"]) != 1 or tuple(node.kwargs["grid"][0])[1:] != (1, 1):
        return None
    return kernel


def _storage(node):
    v = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(v, torch.Tensor) or v.layout != torch.strided:
        return None
    return StorageWeakRef(v.untyped_storage())


def _operands(launch: torch.fx.Node, names):
    return [launch.kwargs["kwargs"][k] for k in names if k in launch.kwargs["kwargs"]]


def _one_way_ok(a: torch.fx.Node, b: torch.fx.Node, inputs: set) -> bool:
    """a's writes cannot meet b's operands (Note [Independent copy launches])."""
    a_reads = _operands(a, _READS)
    b_writes, b_reads = _operands(b, _WRITES), _operands(b, _READS)
    for w in _operands(a, _WRITES):
        sw = _storage(w)
        if sw is None:
            return False
        for o, is_write in [(o, True) for o in b_writes] + [(o, False) for o in b_reads]:
            so = _storage(o)
            if so is None or so == sw:
                return False
            if sw in inputs and so in inputs and (is_write or o not in a_reads):
                return False
    return True


def _args_match(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    ka, kb = a.kwargs["kwargs"], b.kwargs["kwargs"]
    if ka.keys() != kb.keys() or tuple(a.kwargs["grid"][0]) != tuple(b.kwargs["grid"][0]):
        return False
    for name, va in ka.items():
        vb = kb[name]
        if _per_pair(name):
            continue
        if type(va) is not type(vb) or va != vb or isinstance(va, torch.fx.Node):
            return False
    return True


def _merge(gm, a: torch.fx.Node, b: torch.fx.Node, kernel) -> torch.fx.Node:
    ka, kb = a.kwargs["kwargs"], b.kwargs["kwargs"]
    named = {}
    for name in ka:
        if _per_pair(name):
            named[f"{name}_0"], named[f"{name}_1"] = ka[name], kb[name]
        else:
            named[name] = ka[name]
    fused = _FUSED[kernel]
    kwargs = {k: named.pop(k) for k in fused.arg_names if k in named}
    assert not named, named  # every argument has its parameter
    n = a.kwargs["grid"][0][0]
    with gm.graph.inserting_before(b):
        node = gm.graph.call_function(
            triton_kernel_wrapper_mutation,
            (),
            {
                "kernel_idx": kernel_side_table.add_kernel(fused),
                "constant_args_idx": kernel_side_table.add_constant_args({}),
                "grid": [(n, 2, 1)],
                "tma_descriptor_metadata": {},
                "kwargs": kwargs,
            },
        )
    node.meta["val"] = None
    node.meta.update({k: v for k, v in b.meta.items() if k not in ("val", LOWERED_COPY)})
    gm.graph.erase_node(a)
    gm.graph.erase_node(b)
    return node


def fuse_copy_launches(gm: torch.fx.GraphModule) -> int:
    """Merge independent pairs of lower_copies launches; returns how many pairs were merged."""
    inputs = {s for n in gm.graph.nodes if n.op in ("placeholder", "get_attr") and (s := _storage(n)) is not None}
    count = 0
    node = next(iter(gm.graph.nodes), None)
    while node is not None and node.op != "root":
        kernel = _copy_kernel(node)
        if kernel is None:
            node = node.next
            continue
        b = node.next
        while b.op != "root" and moves_no_data(b):
            b = b.next
        if b.op != "root" and _copy_kernel(b) is kernel and _args_match(node, b):
            if _one_way_ok(node, b, inputs) and _one_way_ok(b, node, inputs):
                merged = _merge(gm, node, b, kernel)
                count += 1
                node = merged.next
                continue
        node = node.next
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
