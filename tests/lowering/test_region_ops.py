"""Operators whose arguments torch-mlir's FX importer converts (a scalar for a Tensor argument,
a bool for a Scalar), ops with no result, and ops the importer drops, inside a region: the
torch-dialect steps still match the SCM program (Note [Steps by location]) and results equal
eager's."""

from __future__ import annotations

import pytest
import torch

import trident
from tests import kernels as K
from trident.lowering.scm_to_llvm import program_steps, region_steps
from trident.runtime import SCMRuntime

# name: what follows the kernel, post(out, x, y) -> result; out is the kernel's fresh output.
POST = {
    "add_scalar_inplace": lambda o, x, y: o.add_(1),
    "mul_float_inplace": lambda o, x, y: o.mul_(2.0),
    "add_tensor_alpha_inplace": lambda o, x, y: o.add_(y, alpha=2),
    "fill_inplace": lambda o, x, y: o.fill_(0),
    "clamp_min_inplace": lambda o, x, y: o.clamp_(min=0),
    "inplace_then_read": lambda o, x, y: o.add_(1).mul(2) + o,
    "inplace_on_input": lambda o, x, y: (o, x.mul_(3)),
    "full_bool": lambda o, x, y: torch.where(torch.full(x.shape, True, device=x.device), o, 0.0),
    "full_float": lambda o, x, y: o + torch.full(x.shape, 1.5, device=x.device),
    "full_int": lambda o, x, y: (o, torch.full(x.shape, 3, device=x.device)),
    "zeros_bool": lambda o, x, y: torch.where(torch.zeros(x.shape, dtype=torch.bool, device=x.device), 0.0, o),
    "ones_bool": lambda o, x, y: torch.where(torch.ones(x.shape, dtype=torch.bool, device=x.device), o, 0.0),
    "masked_fill_bool_value": lambda o, x, y: o.masked_fill_(x > 0, True),
    "no_result_op": lambda o, x, y: (torch._foreach_mul_([o, y], 2.0), o)[1],
    "as_strided": lambda o, x, y: o.as_strided((10, 10), (1, 10)) + 1,
}


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _fn(post):
    return lambda x, y: post(K.axpy(x, y), x, y)


def _eager(post):  # the same function with the kernel's reference in place of the launch
    return lambda x, y: post(K.axpy_ref(x, y), x, y)


def _scm_nodes(opt):
    return [n for n in opt.graph.nodes if n.target is torch.ops.trident.scm.default]


def _runtime(opt) -> SCMRuntime:
    (rid,) = opt.meta["trident_regions"]
    return SCMRuntime.get(rid)


@pytest.mark.parametrize("case", sorted(POST))
def test_matches_eager_in_one_region(case, device):
    post = POST[case]
    make = [lambda: torch.randn(100, device=device)] * 2
    opt = trident.optimize(trident.capture(_fn(post), *[m() for m in make]))
    assert len(_scm_nodes(opt)) == 1, opt.code
    assert "cuts:" not in trident.explain(opt)
    for _ in range(2):
        inputs = [m() for m in make]
        expected_inputs = [i.clone() for i in inputs]
        got, want = _as_tuple(opt(*inputs)), _as_tuple(_eager(post)(*expected_inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)  # dtype, device and shape too
        for i, e in zip(inputs, expected_inputs):  # inputs written as eager writes them
            torch.testing.assert_close(i, e)


@pytest.mark.parametrize(
    "case, conversion, op",
    [
        ("add_scalar_inplace", "torch.prim.NumToTensor.Scalar", "torch.aten.add_.Tensor"),
        ("full_bool", "torch.aten.Int.bool", "torch.aten.full"),
    ],
)
def test_argument_conversions_belong_to_their_step(case, conversion, op):
    x, y = torch.randn(100), torch.randn(100)
    rt = _runtime(trident.optimize(trident.capture(_fn(POST[case]), x, y)))
    assert conversion in rt.torch_mlir  # the importer's extra op ...
    from torch_mlir import ir

    from trident.lowering import import_region

    module = import_region(rt.program, ir.Context())
    steps = region_steps(module, rt.program.name)
    assert [s[:2] if s[1] == "op" else s for s in steps] == program_steps(rt.scm)
    assert op in [s[2] for s in steps]  # ... is not a step of its own: the op it feeds is
    assert conversion not in [s[2] for s in steps]


def test_op_the_importer_drops_is_cut_with_a_reason():
    def fn(x, y):
        out = K.axpy(x, y)
        torch._assert_async((x > -1e6).all(), "too small")
        return out

    x, y = torch.randn(100), torch.randn(100)
    opt = trident.optimize(trident.capture(fn, x, y))
    assert len(_scm_nodes(opt)) == 1
    assert any(n.target is torch.ops.aten._assert_async.msg for n in opt.graph.nodes)  # runs eagerly
    assert "_assert_async: aten._assert_async.msg: torch-mlir's FX importer drops it" in trident.explain(opt)
    torch.testing.assert_close(opt(x, y), K.axpy_ref(x, y))


def test_as_strided_the_importer_cannot_rewrite_is_cut_not_fatal():
    """torch-mlir rewrites as_strided to indexing and raises for storage offsets that map to no
    index of the base; such a node stays out of the region (explain says why), results stay right."""
    import torch

    import trident
    from tests import kernels as K

    def f(x):
        y = torch.as_strided(x, (4, 4), (1, 8), 2)
        return K.axpy(y.contiguous(), y.contiguous())

    for x in (torch.randn(8, 8), torch.randn(16, 16)[::2, ::2]):
        opt = trident.optimize(trident.capture(f, x))
        y = torch.as_strided(x, (4, 4), (1, 8), 2).contiguous()
        torch.testing.assert_close(opt(x), K.axpy_ref(y, y))
    cuts = [line for line in trident.explain(opt).splitlines() if "as_strided" in line and "rewrite" in line]
    assert cuts and "cannot rewrite it to indexing" in cuts[0], trident.explain(opt)
