"""trident.compile: capture on the first call per input signature (Note [What trident.compile
guards]); keyword and nested arguments, module state, new shapes, parameter reassignment."""

from __future__ import annotations

import torch
import triton

import trident
from tests import kernels as K


def _axpy(x, y, alpha):
    out = torch.empty_like(x)
    K.axpy_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), alpha, BLOCK=64)
    return out


def test_keyword_and_nested_arguments_and_new_shapes():
    def f(x, pair, *, opts):
        a, b = pair
        return _axpy(x, a, opts["alpha"]) + b

    compiled = trident.compile(f)
    for n in (100, 300):  # a new shape: a new capture, never an error
        x, a, b = torch.randn(n), torch.randn(n), torch.randn(n)
        for alpha in (2.0, 2.0, 2.0, -1.0):
            torch.testing.assert_close(compiled(x, (a, b), opts={"alpha": alpha}), alpha * x + a + b)
    # a signature's first call runs eagerly, its second captures: (n, 2.0) captured, (n, -1.0) eager once
    assert len(compiled.captures) == 2 and compiled.eager_calls == 4
    for opt in compiled.captures.values():
        (stats,) = trident.cache_info(opt).values()
        assert stats["misses"] == 0


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
        self.register_buffer("bias2", torch.randn(16))

    def forward(self, x):
        return _axpy(self.lin(x), self.bias2.expand(x.shape[0], 16).contiguous(), 2.0)


def _net_reference(m, x):
    return 2.0 * m.lin(x) + m.bias2


def test_module_state_updates_and_reassignment():
    m = _Net().eval()
    m.forward = trident.compile(m.forward)
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(m(x), _net_reference(m, x))  # eager, then captured
        torch.testing.assert_close(m(x), _net_reference(m, x))
        m.lin.weight.mul_(3.0)  # in place: seen without a new capture
        torch.testing.assert_close(m(x), _net_reference(m, x))
        assert len(m.forward.captures) == 1
        m.lin.weight = torch.nn.Parameter(torch.randn(16, 16))  # reassigned: captured again
        for _ in range(2):
            torch.testing.assert_close(m(x), _net_reference(m, x))
        m.register_buffer("bias2", torch.zeros(16))
        for _ in range(2):
            torch.testing.assert_close(m(x), _net_reference(m, x))
    assert len(m.forward.captures) == 1 and m.forward.eager_calls == 3  # stale captures dropped


def test_explain_and_cache_info_of_a_compiled_function():
    compiled = trident.compile(lambda x, y: _axpy(x, y, 2.0))
    x, y = torch.randn(64), torch.randn(64)
    for _ in range(3):
        torch.testing.assert_close(compiled(x, y), 2.0 * x + y)
    text = trident.explain(compiled)
    assert text.startswith("1 capture(s); 1 call(s) ran eagerly\ncapture 0:\n1 region(s)")
    (info,) = trident.cache_info(compiled).values()
    (stats,) = info.values()
    assert stats["hits"] == 2 and stats["misses"] == 0  # the second call captured, then ran it
