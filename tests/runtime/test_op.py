"""torch.ops.trident.scm as an operator: opcheck (schema, fake kernel, AOT dispatch), and the
direct call path agreeing with the op (csrc/module.cpp, Note [Direct call of the SCM])."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import trident
from tests import kernels as K
from trident.runtime.native import C


def _region_args(opt, *inputs):
    node = next(n for n in opt.graph.nodes if n.target is torch.ops.trident.scm.default)
    placeholders = [n.name for n in opt.graph.nodes if n.op == "placeholder"]
    by_name = dict(zip(placeholders, inputs))
    return node.args[0], [by_name[a.name] for a in node.args[1]], [by_name[a.name] for a in node.args[2]]


@pytest.mark.parametrize("fn, n_inputs", [(K.axpy, 2), (K.inplace_mul, 1), (K.two_kernels, 2)])
def test_opcheck(fn, n_inputs, device):
    example = [torch.randn(1000, device=device) for _ in range(n_inputs)]
    opt = trident.optimize(trident.capture(fn, *example))
    region, mutated, reads = _region_args(opt, *[torch.randn(1000, device=device) for _ in range(n_inputs)])
    torch.library.opcheck(torch.ops.trident.scm.default, (region, mutated, reads))


def test_direct_call_matches_op_and_falls_back():
    opt = trident.optimize(trident.capture(K.axpy, torch.randn(1000), torch.randn(1000)))
    x, y = torch.randn(1000), torch.randn(1000)
    region, mutated, reads = _region_args(opt, x, y)
    (via_op,) = torch.ops.trident.scm.default(region, mutated, reads)
    (direct,) = C.scm_call(region, mutated, reads)
    torch.testing.assert_close(direct, via_op)
    # Fake tensors (tracing) take the op, whose fake kernel answers.
    with FakeTensorMode():
        fx, fy = torch.empty(1000), torch.empty(1000)
        (out,) = C.scm_call(region, [], [fx, fy])
        assert isinstance(out, FakeTensor) and out.shape == (1000,)
    # Inputs that require grad take the op too (same result, no direct call).
    (g,) = C.scm_call(region, [], [x.requires_grad_(), y])
    torch.testing.assert_close(g.detach(), K.axpy_ref(x.detach(), y))


def test_typed_operator_calls_match_eager():
    """Operators with a typed entry (csrc/aten_fast.cpp) give eager's results inside a region."""
    assert C.has_fast_call("aten::mm", "") and C.has_fast_call("aten::where", "self")
    assert not C.has_fast_call("aten::sin", "")

    def fn(x, y, m, b):
        t = K.axpy(x, y)
        a = torch.addmm(b, m, m) + t.view(4, 250)[:, :4].sum()
        c = torch.bmm(m[None], m[None])[0] * 2
        d = torch.where(a > 0, a, c)
        return K.axpy(torch.cat([d.reshape(-1)] * 63)[:1000], y)

    x, y, m, b = torch.randn(1000), torch.randn(1000), torch.randn(4, 4), torch.randn(4, 4)
    opt = trident.optimize(trident.capture(fn, x, y, m, b))
    assert sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) == 1
    for _ in range(2):
        x, y, m, b = torch.randn(1000), torch.randn(1000), torch.randn(4, 4), torch.randn(4, 4)
        t = K.axpy_ref(x, y)
        a = torch.addmm(b, m, m) + t.view(4, 250)[:, :4].sum()
        d = torch.where(a > 0, a, (m @ m) * 2)
        want = K.axpy_ref(torch.cat([d.reshape(-1)] * 63)[:1000], y)
        torch.testing.assert_close(opt(x, y, m, b), want)
