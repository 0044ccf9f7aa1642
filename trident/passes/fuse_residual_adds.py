"""`x + a @ b` -> trident.residual_mm(x, a, b): the residual add of a projection in one matrix product.

Note [Residual adds in the GEMM]
A transformer layer ends both of its halves with `hidden = residual + proj(h)`: an aten.mm (the
output or down projection), a view back to [batch, seq, hidden], and an elementwise add -- a
kernel launch of its own (~1.4 us of device time each inside a CUDA graph at decode sizes on an
H200, two per layer). This pass rewrites

    m = aten.mm(a, b);  v = view(m, S);  r = aten.add.Tensor(x, v)     (or add(v, x))
 -> r = aten.view(trident.residual_mm(aten.view(x, [M, N]), a, b), S)

and the SCM runs residual_mm as ONE cuBLASLt matmul with C = x and beta = 1 (Note [Cached GEMM
plans]). The operator itself (trident/csrc/module.cpp) is aten.addmm(x, a, b) when x, a and b
have one dtype -- ATen's addmm on CUDA copies x into the output first -- and eager's
x + mm(a, b) otherwise, so a later call bringing other dtypes than the capture (a new
specialization of the same graph) gets eager's type promotion, not addmm's dtype error.

Numerics: the sum is formed in the product's fp32 accumulator and rounded once, where eager
rounds the product to the tensor dtype and then rounds the sum again. That is aten.addmm's
result (more accurate, not eager's bits), so by default the pass runs only where it pays and
where the difference is within the dtype's own rounding: bf16 and fp16 CUDA tensors (knob
TRIDENT_GEMM_EPILOGUES: "cuda"; "all" everywhere, for tests; "" never, for eager's bits).

What must hold (else nothing changes):
  * the add has alpha 1 and no broadcasting: x and v have one shape, one dtype, one device, and
    both are contiguous, so [M, N] row-major pairs their elements as the add does;
  * m has the view chain (views and _unsafe_views, each with one user) as its only use, so its
    value is needed nowhere else;
  * every node between m and r is part of that chain, or makes a view or an allocation, or
    names a module attribute: nothing writes a or b there, so the product may move to r.
"""

from __future__ import annotations

import math

import torch

from .. import knobs
from .common import moves_no_data

aten = torch.ops.aten

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_DTYPES = (torch.bfloat16, torch.float16)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _product(v: torch.fx.Node):
    """(the mm node, the view chain from it to v) when v is mm(a, b) seen through one-user views."""
    chain = []
    node = v
    while node.op == "call_function" and node.target in _VIEWS and len(node.users) == 1:
        chain.append(node)
        node = node.args[0]
        if not isinstance(node, torch.fx.Node):
            return None
    if node.op != "call_function" or node.target is not aten.mm.default or len(node.users) != 1:
        return None
    if chain and next(iter(node.users)) is not chain[-1]:
        return None
    return node, chain


def _contiguous_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and t.layout == torch.strided and t.is_contiguous()


def _allowed(t: torch.Tensor, mode: str) -> bool:
    return mode == "all" or (t.device.type == "cuda" and t.dtype in _DTYPES)


def _fuse(gm, add: torch.fx.Node, mode: str) -> bool:
    if len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1 or set(add.kwargs) - {"alpha"}:
        return False
    for v, x in (add.args, reversed(add.args)):
        if not isinstance(v, torch.fx.Node) or not isinstance(x, torch.fx.Node):
            continue
        found = _product(v)
        if found is None:
            continue
        m, chain = found
        if x is m or x in chain:
            continue  # y + y: the product is the residual too
        xv, vv, mv, rv = _val(x), _val(v), _val(m), _val(add)
        if not all(_contiguous_tensor(t) for t in (xv, vv, mv, rv)):
            continue
        if not (xv.shape == vv.shape == rv.shape and xv.dtype == vv.dtype == rv.dtype and xv.device == vv.device):
            continue
        if not _allowed(xv, mode) or any(type(s) is not int for s in (*xv.shape, *mv.shape)):
            continue
        if math.prod(xv.shape) != math.prod(mv.shape) or mv.dim() != 2:
            continue
        node, members = m.next, set(chain)
        while node is not add and (node in members or moves_no_data(node)):
            node = node.next
        if node is not add:
            continue
        a, b = m.args[0], m.args[1]
        with gm.graph.inserting_before(add):
            x2 = gm.graph.call_function(aten.view.default, (x, list(mv.shape)))
            x2.meta["val"] = xv.view(mv.shape)
            prod = gm.graph.call_function(torch.ops.trident.residual_mm.default, (x2, a, b))
            prod.meta.update({k: val for k, val in m.meta.items() if k != "val"})
            prod.meta["val"] = mv  # the product's layout: addmm's result has mm's
            out = gm.graph.call_function(aten.view.default, (prod, list(rv.shape)))
            out.meta.update({k: val for k, val in add.meta.items() if k != "val"})
            out.meta["val"] = prod.meta["val"].view(rv.shape)
        add.replace_all_uses_with(out)
        gm.graph.erase_node(add)
        for n in chain:
            gm.graph.erase_node(n)
        gm.graph.erase_node(m)
        return True
    return False


def fuse_residual_adds(gm: torch.fx.GraphModule) -> int:
    """Fold every `x + a @ b` the Note allows into one addmm; returns how many."""
    mode = knobs.gemm_epilogues()
    if not mode:
        return 0
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.add.Tensor and _fuse(gm, node, mode):
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
