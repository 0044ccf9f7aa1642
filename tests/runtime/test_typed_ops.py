"""Typed operator entries (trident/csrc/aten_fast.cpp): each operator a decode step (or a
make_fx graph of one) calls, inside a region next to a Triton launch, takes its typed entry
(at::_ops::<op>::call, no boxing) and gives exactly eager's results: values, dtype, shape and
strides. The eager reference runs the kernel's *_ref twin; the inputs are multiples of 1/4 in
[-2, 2], so the kernel (2.5 * x + y) is exact on every device and the comparison can be exact."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import trident
from tests import kernels as K
from trident import knobs
from trident.runtime.native import C
from trident.runtime.scm_module import SCMRuntime

A = torch.ops.aten


def _dev(t):
    return {"device": t.device}


# (id, the operator that must be typed, body(t, y, i)): t is the kernel's output (f32[4, 8]), y a
# region input (f32[4, 8]), i an index input (i64[3], distinct rows/columns 2, 0, 3).
CASES = [
    # arithmetic
    ("add.Tensor", A.add.Tensor, lambda t, y, i: t + y),
    ("add.Tensor-alpha", A.add.Tensor, lambda t, y, i: torch.add(t, y, alpha=2)),
    ("add.Tensor-number", A.add.Tensor, lambda t, y, i: t + 1.5),
    ("add.Scalar", A.add.Scalar, lambda t, y, i: A.add.Scalar(t, 2, 3)),
    ("add_.Tensor", A.add_.Tensor, lambda t, y, i: t.add_(y)),
    ("add_.Scalar", A.add_.Scalar, lambda t, y, i: A.add_.Scalar(t, 1.5)),
    ("sub.Tensor", A.sub.Tensor, lambda t, y, i: torch.sub(t, y, alpha=0.5)),
    ("sub.Scalar", A.sub.Scalar, lambda t, y, i: A.sub.Scalar(t, 1.5)),
    ("sub_.Tensor", A.sub_.Tensor, lambda t, y, i: t.sub_(y, alpha=2)),
    ("rsub.Tensor", A.rsub.Tensor, lambda t, y, i: torch.rsub(t, y)),
    ("rsub.Scalar", A.rsub.Scalar, lambda t, y, i: 1 - t),
    ("mul.Tensor", A.mul.Tensor, lambda t, y, i: t * y),
    ("mul.Scalar", A.mul.Scalar, lambda t, y, i: A.mul.Scalar(t, 3)),
    ("mul_.Tensor", A.mul_.Tensor, lambda t, y, i: t.mul_(y)),
    ("mul_.Scalar", A.mul_.Scalar, lambda t, y, i: A.mul_.Scalar(t, -3)),
    ("div.Tensor", A.div.Tensor, lambda t, y, i: t / y),
    ("div.Scalar", A.div.Scalar, lambda t, y, i: A.div.Scalar(t, 4)),
    ("div.Tensor_mode-floor", A.div.Tensor_mode, lambda t, y, i: torch.div(t, y, rounding_mode="floor")),
    ("div.Tensor_mode-trunc", A.div.Tensor_mode, lambda t, y, i: torch.div(t, y, rounding_mode="trunc")),
    ("div.Tensor_mode-none", A.div.Tensor_mode, lambda t, y, i: A.div.Tensor_mode(t, y, rounding_mode=None)),
    ("div.Scalar_mode", A.div.Scalar_mode, lambda t, y, i: A.div.Scalar_mode(t, 3, rounding_mode="floor")),
    ("div_.Tensor", A.div_.Tensor, lambda t, y, i: t.div_(y)),
    ("div_.Scalar", A.div_.Scalar, lambda t, y, i: A.div_.Scalar(t, 8)),
    ("floor_divide", A.floor_divide.default, lambda t, y, i: t // y),
    ("remainder.Tensor", A.remainder.Tensor, lambda t, y, i: t % y),
    ("remainder.Scalar", A.remainder.Scalar, lambda t, y, i: t % 3),
    ("pow.Tensor_Scalar", A.pow.Tensor_Scalar, lambda t, y, i: t**2),
    ("pow.Tensor_Tensor", A.pow.Tensor_Tensor, lambda t, y, i: t.abs() ** y),
    ("pow.Scalar", A.pow.Scalar, lambda t, y, i: 2**t),
    ("neg", A.neg.default, lambda t, y, i: -t),
    ("abs", A.abs.default, lambda t, y, i: t.abs()),
    ("sign", A.sign.default, lambda t, y, i: t.sign()),
    ("round", A.round.default, lambda t, y, i: (t * 0.3).round()),
    ("rsqrt", A.rsqrt.default, lambda t, y, i: t.rsqrt()),
    ("sqrt", A.sqrt.default, lambda t, y, i: t.sqrt()),
    ("reciprocal", A.reciprocal.default, lambda t, y, i: t.reciprocal()),
    ("exp", A.exp.default, lambda t, y, i: t.exp()),
    ("log", A.log.default, lambda t, y, i: t.log()),
    ("minimum", A.minimum.default, lambda t, y, i: torch.minimum(t, y)),
    ("maximum", A.maximum.default, lambda t, y, i: torch.maximum(t, y)),
    ("clamp", A.clamp.default, lambda t, y, i: t.clamp(-1, 1)),
    ("clamp-max-only", A.clamp.default, lambda t, y, i: A.clamp.default(t, None, 0.5)),
    # activations
    ("silu", A.silu.default, lambda t, y, i: F.silu(t)),
    ("gelu", A.gelu.default, lambda t, y, i: F.gelu(t)),
    ("gelu-tanh", A.gelu.default, lambda t, y, i: F.gelu(t, approximate="tanh")),
    ("sigmoid", A.sigmoid.default, lambda t, y, i: torch.sigmoid(t)),
    ("tanh", A.tanh.default, lambda t, y, i: torch.tanh(t)),
    ("relu", A.relu.default, lambda t, y, i: torch.relu(t)),
    # comparisons, logic, selection
    ("eq.Tensor", A.eq.Tensor, lambda t, y, i: t == y),
    ("eq.Scalar", A.eq.Scalar, lambda t, y, i: t == 0.5),
    ("ne.Tensor", A.ne.Tensor, lambda t, y, i: t != y),
    ("ne.Scalar", A.ne.Scalar, lambda t, y, i: t != 0.5),
    ("lt.Tensor", A.lt.Tensor, lambda t, y, i: t < y),
    ("lt.Scalar", A.lt.Scalar, lambda t, y, i: t < 1),
    ("gt.Tensor", A.gt.Tensor, lambda t, y, i: t > y),
    ("gt.Scalar", A.gt.Scalar, lambda t, y, i: t > 1),
    ("le.Tensor", A.le.Tensor, lambda t, y, i: t <= y),
    ("le.Scalar", A.le.Scalar, lambda t, y, i: t <= 1),
    ("ge.Tensor", A.ge.Tensor, lambda t, y, i: t >= y),
    ("ge.Scalar", A.ge.Scalar, lambda t, y, i: t >= 1),
    ("logical_not", A.logical_not.default, lambda t, y, i: torch.logical_not(t)),
    ("logical_and", A.logical_and.default, lambda t, y, i: torch.logical_and(t, y)),
    ("logical_or", A.logical_or.default, lambda t, y, i: torch.logical_or(t, y)),
    ("bitwise_not", A.bitwise_not.default, lambda t, y, i: ~(t > 0)),
    ("bitwise_and.Tensor", A.bitwise_and.Tensor, lambda t, y, i: (t > 0) & (y > 0)),
    ("bitwise_or.Tensor", A.bitwise_or.Tensor, lambda t, y, i: (t > 0) | (y > 0)),
    ("where.self", A.where.self, lambda t, y, i: torch.where(t > 0, t, y)),
    ("masked_fill.Scalar", A.masked_fill.Scalar, lambda t, y, i: t.masked_fill(y > 0, -1.0)),
    ("masked_fill.Tensor", A.masked_fill.Tensor, lambda t, y, i: t.masked_fill(y > 0, y[0, 0])),
    # reductions, normalizations, sorting
    ("mean.dim", A.mean.dim, lambda t, y, i: t.mean(-1)),
    ("mean.dim-keepdim-dtype", A.mean.dim, lambda t, y, i: t.mean((0, 1), keepdim=True, dtype=torch.float64)),
    ("mean", A.mean.default, lambda t, y, i: t.mean()),
    ("sum.dim_IntList", A.sum.dim_IntList, lambda t, y, i: t.sum(-1)),
    ("sum.dim_IntList-dtype", A.sum.dim_IntList, lambda t, y, i: t.sum(0, keepdim=True, dtype=torch.float64)),
    ("sum", A.sum.default, lambda t, y, i: t.sum()),
    ("amax", A.amax.default, lambda t, y, i: t.amax(-1)),
    ("amin", A.amin.default, lambda t, y, i: t.amin(0, keepdim=True)),
    ("argmax", A.argmax.default, lambda t, y, i: t.argmax(-1)),
    ("argmax-flat", A.argmax.default, lambda t, y, i: t.argmax()),
    ("argmin", A.argmin.default, lambda t, y, i: t.argmin(0, keepdim=True)),
    ("max.dim", A.max.dim, lambda t, y, i: tuple(t.max(-1))),
    ("min.dim", A.min.dim, lambda t, y, i: tuple(t.min(0, keepdim=True))),
    ("max", A.max.default, lambda t, y, i: t.max()),
    ("min", A.min.default, lambda t, y, i: t.min()),
    ("any", A.any.default, lambda t, y, i: (t > 4).any()),
    ("any.dim", A.any.dim, lambda t, y, i: (t > 2).any(-1)),
    ("all", A.all.default, lambda t, y, i: (t > -4).all()),
    ("all.dim", A.all.dim, lambda t, y, i: (t > 0).all(0, keepdim=True)),
    ("var.correction", A.var.correction, lambda t, y, i: t.var(-1)),
    ("var_mean.correction", A.var_mean.correction, lambda t, y, i: torch.var_mean(t, 1, correction=0)),
    ("cumsum", A.cumsum.default, lambda t, y, i: t.cumsum(-1)),
    ("cumsum-dtype", A.cumsum.default, lambda t, y, i: t.cumsum(0, dtype=torch.float64)),
    ("_softmax", A._softmax.default, lambda t, y, i: F.softmax(t, -1)),
    ("_safe_softmax", A._safe_softmax.default, lambda t, y, i: A._safe_softmax.default(t.masked_fill(y > 1, float("-inf")), -1)),
    ("_log_softmax", A._log_softmax.default, lambda t, y, i: F.log_softmax(t, -1)),
    ("native_layer_norm", A.native_layer_norm.default, lambda t, y, i: F.layer_norm(t, (8,), y[0], y[1])),
    ("native_layer_norm-no-affine", A.native_layer_norm.default, lambda t, y, i: F.layer_norm(t, (4, 8))),
    # CPU: pow, mean.dim, add_, rsqrt, mul; CUDA (torch >= 2.9): one fused kernel
    ("rms_norm", (A.add_.Scalar,) + ((A._fused_rms_norm.default,) if hasattr(A, "_fused_rms_norm") else ()),
     lambda t, y, i: F.rms_norm(t, (8,), y[0])),
    ("topk", A.topk.default, lambda t, y, i: tuple(torch.topk(t, 3))),
    ("sort", A.sort.default, lambda t, y, i: tuple(torch.sort(t, -1, descending=True))),
    # indexing, gathering, scattering, joining
    ("embedding", A.embedding.default, lambda t, y, i: F.embedding(i, t)),
    ("index_select", A.index_select.default, lambda t, y, i: t.index_select(0, i)),
    ("gather", A.gather.default, lambda t, y, i: t.gather(1, i[None].expand(4, 3))),
    ("index_put", A.index_put.default, lambda t, y, i: torch.index_put(t, (i,), y[:3])),
    ("index_put-none", A.index_put.default, lambda t, y, i: A.index_put.default(t, [None, i], y[:, :3])),
    ("index_put_", A.index_put_.default, lambda t, y, i: t.index_put_((i,), y[:3])),
    ("index_put_-setitem", A.index_put_.default, lambda t, y, i: (t.__setitem__((slice(None), i), 0.5), t)[1]),
    ("index_copy_", A.index_copy_.default, lambda t, y, i: t.index_copy_(0, i, y[:3])),
    ("scatter.src", A.scatter.src, lambda t, y, i: t.scatter(1, i[None].expand(4, 3), y)),
    ("scatter.value", A.scatter.value, lambda t, y, i: t.scatter(1, i[None].expand(4, 3), 2.0)),
    ("scatter_add", A.scatter_add.default, lambda t, y, i: t.scatter_add(1, i[None].expand(4, 3), y)),
    ("slice_scatter", A.slice_scatter.default, lambda t, y, i: torch.slice_scatter(t, y[:, :2], 1, 2, 4)),
    ("slice_scatter-defaults", A.slice_scatter.default, lambda t, y, i: torch.slice_scatter(t, y)),
    ("select_scatter", A.select_scatter.default, lambda t, y, i: torch.select_scatter(t, y[0], 0, 1)),
    ("cat", A.cat.default, lambda t, y, i: torch.cat([t, y])),
    ("cat-dim", A.cat.default, lambda t, y, i: torch.cat([t, y, t], 1)),
    ("stack", A.stack.default, lambda t, y, i: torch.stack([t, y], 1)),
    ("triu", A.triu.default, lambda t, y, i: t.triu(1)),
    ("tril", A.tril.default, lambda t, y, i: t.tril(-1)),
    ("constant_pad_nd", A.constant_pad_nd.default, lambda t, y, i: F.pad(t, (1, 2), value=0.5)),
    ("repeat", A.repeat.default, lambda t, y, i: t.repeat(2, 1, 3)),
    ("flip", A.flip.default, lambda t, y, i: t.flip(0, 1)),
    ("roll", A.roll.default, lambda t, y, i: torch.roll(t, (1, -3), (0, 1))),
    # copies, conversions, fills, factories
    ("clone", A.clone.default, lambda t, y, i: t.clone()),
    ("copy_", A.copy_.default, lambda t, y, i: t.copy_(y)),
    ("copy_-broadcast", A.copy_.default, lambda t, y, i: t.copy_(i[:, None][:1])),
    ("copy", A.copy.default, lambda t, y, i: A.copy.default(t, y)),
    ("_to_copy-f64", A._to_copy.default, lambda t, y, i: t.to(torch.float64)),
    ("_to_copy-i32", A._to_copy.default, lambda t, y, i: t.to(torch.int32)),
    ("_to_copy-f16", A._to_copy.default, lambda t, y, i: t.half()),
    ("lift_fresh_copy", A.lift_fresh_copy.default, lambda t, y, i: t + torch.tensor([1.5, -2.0], **_dev(t)).repeat(4)),
    ("fill.Scalar", A.fill.Scalar, lambda t, y, i: A.fill.Scalar(t, 2.0)),
    ("fill_.Scalar", A.fill_.Scalar, lambda t, y, i: t.fill_(2.0)),
    ("zero_", A.zero_.default, lambda t, y, i: t.zero_()),
    ("full", A.full.default, lambda t, y, i: torch.full((4, 8), 2.0, **_dev(t)) * t),
    ("ones", A.ones.default, lambda t, y, i: torch.ones(8, **_dev(t)) + t),
    ("ones_like", A.ones_like.default, lambda t, y, i: torch.ones_like(t) + t),
    ("full_like", A.full_like.default, lambda t, y, i: torch.full_like(t, 3.0) * t),
    ("arange", A.arange.default, lambda t, y, i: torch.arange(8, **_dev(t)) + t),
    ("arange.start", A.arange.start, lambda t, y, i: torch.arange(1, 9, **_dev(t)) * t),
    ("arange.start_step", A.arange.start_step, lambda t, y, i: torch.arange(0, 16, 2, **_dev(t)) + t),
    # matrix products (on CUDA aten::mm may take the cuBLASLt path instead: test_gemm.py)
    ("mm", A.mm.default, lambda t, y, i: t @ y.T),
    ("bmm", A.bmm.default, lambda t, y, i: torch.bmm(t[None], y.T[None])),
    ("addmm", A.addmm.default, lambda t, y, i: F.linear(t, y, y[:, 0])),
    ("baddbmm", A.baddbmm.default, lambda t, y, i: torch.baddbmm(y[None, :, :4], t[None], y.T[None], beta=0.5, alpha=2)),
]


def _quarters(*shape, device):
    return (torch.randint(-8, 9, shape) / 4).to(device)


def _flat(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _assert_same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
    assert got.stride() == want.stride(), (got.stride(), want.stride())
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def _steps_of(opt, op):
    """(region id, local index, cached) of every call of `op` in the regions of `opt`."""
    found = []
    for rid in opt.meta["trident_regions"]:
        rt = SCMRuntime.get(rid)
        for step in rt.program.atens:
            if step.op is op:
                found.append((rt.region_id, rt._aten_handles[step.name], step.cached))
    return found


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_typed_entry_matches_eager(case, device):
    _, ops, body = case
    ops = ops if isinstance(ops, tuple) else (ops,)  # alternatives: the decomposition may differ by device
    for op in ops:
        assert C.has_fast_call(op._schema.name, op._schema.overload_name), op._schema

    def fn(x, y, i):
        return body(K.axpy(x, y), y, i)

    x, y = _quarters(4, 8, device=device), _quarters(4, 8, device=device)
    i = torch.tensor([2, 0, 3], device=device)
    # keep clone / index_copy_ and the elementwise ops ATen calls on CUDA too (not fused glue)
    with knobs.scope(triton_copies="", fuse_glue=""):
        opt = trident.optimize(trident.capture(fn, x, y, i))
    assert sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) == 1, opt.code
    steps = [s for op in ops for s in _steps_of(opt, op)]
    assert steps, f"{ops} is not an operator call of the region:\n{trident.scm_text(opt)}"
    assert all(C.aten_is_typed(rid, local) for rid, local, _ in steps), trident.explain(opt)
    (mix,) = [line for line in trident.explain(opt).splitlines() if "operator calls" in line]
    assert mix.endswith("+ 0 boxed calls"), mix

    for _ in range(2):  # the first call and a hit
        x, y = _quarters(4, 8, device=device), _quarters(4, 8, device=device)
        got = _flat(opt(x, y, i))
        want = _flat(body(K.axpy_ref(x, y), y, i))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w)


def test_typed_entries_equal_boxed_calls():
    """The same region with the typed path off (every call boxed) gives the same bits."""

    def fn(x, y, i):
        t = K.axpy(x, y)
        a = F.softmax(t * y + 1.5, -1).sum(-1, keepdim=True)
        b = torch.cat([t.masked_fill(y > 0, -1.0), t.index_select(0, i).to(torch.float64).float()]).rsqrt()
        return a, b, torch.topk(t, 3)[1], t.index_put_((i,), y[:3]).mean(0)

    x, y, i = _quarters(4, 8, device="cpu"), _quarters(4, 8, device="cpu"), torch.tensor([2, 0, 3])
    mixes, results = [], []
    for paths in ("views,constants,typed,gemm", "views,constants,gemm"):
        with knobs.scope(native_paths=paths):
            opt = trident.optimize(trident.capture(fn, x, y, i))
            results.append(opt(x, y, i))
        assert sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) == 1, opt.code
        mixes.append([line for line in trident.explain(opt).splitlines() if "operator calls" in line][0])
    assert mixes[0].endswith("+ 0 boxed calls") and "+ 0 typed calls" in mixes[1], mixes
    for g, w in zip(*results):
        _assert_same(g, w)


# Entries no region of a make_fx graph calls here, kept for graphs captured otherwise: make_fx
# decomposes softmax.int (to _softmax); aten.index.Tensor is cut out of regions (data-dependent
# output); zeros / zeros_like / new_zeros become region allocations (zeroed), not operator calls.
UNEXERCISED = [A.softmax.int, A.index.Tensor, A.zeros.default, A.zeros_like.default, A.new_zeros.default]


@pytest.mark.parametrize("op", UNEXERCISED, ids=str)
def test_entries_outside_regions_exist(op):
    assert C.has_fast_call(op._schema.name, op._schema.overload_name)


def test_every_handle_checked_entry_is_typed_on_this_torch():
    """The attention backends resolve their typed handle against the running torch's schema and
    stay boxed when it differs: on this torch every one of them must resolve."""
    for name in (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
    ):
        assert C.has_fast_call(name, ""), name


def test_operators_without_entry_stay_boxed():
    assert not C.has_fast_call("aten::sin", "")
    assert not C.has_fast_call("aten::add", "out")  # out= overloads have no entry
    assert not C.has_fast_call("aten::no_such_op", "")
