"""Note [Layouts per input facts]: a symbolic region's value layouts for new sizes, from its
expressions and an earlier propagation, equal what fake-tensor propagation gives, on many sizes."""

from __future__ import annotations

import random

import pytest
import torch

import trident
from tests import kernels as K
from tests.capture.test_symbolic import reshaped_rowsum
from trident.optimize import _regions
from trident.scm.ir import TensorFacts
from trident.scm.specialize import _fake_layouts, _symbolic_layouts, propagate_values


def sliced_axpy(x):
    y = x[3:]  # a view of the input at an offset
    out = K.axpy(y, y)
    return out[1:].reshape(-1, 1) * 2.0  # views of a region value, then an operator


def rows_then_transpose(x):
    y = K.scale_rows(x)
    return y.t()[1:].contiguous() + 1.0


CASES = [
    (reshaped_rowsum, lambda r: (16 * r.randrange(2, 300),), (64,)),
    (sliced_axpy, lambda r: (r.randrange(6, 5000),), (100,)),
    (K.scale_rows, lambda r: (r.randrange(2, 90), r.randrange(2, 90)), (40, 70)),
    (rows_then_transpose, lambda r: (r.randrange(3, 60), r.randrange(2, 60)), (12, 9)),
]


@pytest.mark.parametrize("fn, sizes, example", CASES, ids=[c[0].__name__ for c in CASES])
def test_symbolic_layouts_equal_fake_propagation(fn, sizes, example):
    opt = trident.optimize(trident.capture(fn, torch.randn(*example), dynamic=True))
    (rt,) = _regions(opt)
    program = rt.program
    assert program.symbolic and len(program.inputs) == 1
    rng = random.Random(0)
    checked = 0
    for _ in range(60):
        x = torch.randn(*sizes(rng))
        facts = [TensorFacts.of(x)]
        derived = _symbolic_layouts(program, facts)
        assert derived is not None  # the capture's own facts were propagated
        assert derived == _fake_layouts(program, facts), x.shape
        checked += 1
    assert checked == 60
    # and a call at a new size plans from them, with the right result
    x = torch.randn(*sizes(rng))
    torch.testing.assert_close(opt(x), fn(x))


def test_other_dtypes_are_propagated_not_derived():
    opt = trident.optimize(trident.capture(K.scale_rows, torch.randn(40, 70), dynamic=True))
    (rt,) = _regions(opt)
    facts = [TensorFacts.of(torch.randn(5, 6, dtype=torch.float64))]
    assert _symbolic_layouts(rt.program, facts) is None  # no propagation of float64 facts yet
    propagate_values(rt.program, facts, [0])
    assert _symbolic_layouts(rt.program, [TensorFacts.of(torch.randn(7, 3, dtype=torch.float64))]) is not None


def test_a_miss_at_new_sizes_plans_without_fake_propagation(monkeypatch):
    """sliced_axpy's kernel keys its length (% 16, == 1): sizes that change that key miss, and
    the new specializations take their layouts from the expressions."""
    from trident.scm import specialize

    opt = trident.optimize(trident.capture(sliced_axpy, torch.randn(100), dynamic=True))
    (rt,) = _regions(opt)

    def no_fake(*a):
        raise AssertionError("fake propagation on a symbolic miss")

    monkeypatch.setattr(specialize, "_fake_layouts", no_fake)
    for n in (100, 19, 35, 4099, 67):  # lengths n - 3: 97, 16, 32, 4096, 64
        x = torch.randn(n)
        torch.testing.assert_close(opt(x), sliced_axpy(x))
    assert len(rt.scm.specializations) >= 2
