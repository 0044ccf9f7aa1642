"""Data-dependent values through every door (issue 24): `.item()`, `.tolist()`, a branch on a
tensor's value, a `nonzero`-sized output. Each call returns eager's result; a value a region
cannot hold cuts the region (with the reason in explain()), a branch on data runs eagerly in
trident.compile (reason logged) and breaks the graph in the backend; trident.capture refuses a
branch with a TridentError that names the user's line and says what to do, never torch's
internal exception."""

from __future__ import annotations

import pytest
import torch

import trident
from tests.kernels import axpy


def scaled_by_max(x, y):  # .item(): a float only the data gives
    z = axpy(x, y)
    return z * z.max().item()


def shifted_by_first(x, y):  # .tolist()
    z = axpy(x, y)
    return z + z[:2].tolist()[0]


def branch_on_sum(x, y):  # bool(t): control flow on data
    z = axpy(x, y)
    if bool(z.sum() > 0):
        return z * 2
    return z - 1


def positives_squared(x, y):  # nonzero: an output whose size only the data gives
    z = axpy(x, y)
    idx = torch.nonzero(z > 0).flatten()
    return axpy(z[idx], z[idx])


CASES = [scaled_by_max, shifted_by_first, branch_on_sum, positives_squared]


def _door(door, fn, x, y):
    if door == "optimize":
        return trident.optimize(trident.capture(fn, x, y))
    if door == "compile":
        return trident.compile(fn)
    torch._dynamo.reset()
    return torch.compile(fn, backend="trident")


@pytest.mark.parametrize("door", ["optimize", "compile", "backend"])
@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_data_dependent_values_give_eager_results(fn, door):
    torch.manual_seed(0)
    x, y = torch.randn(100), torch.randn(100)
    if door == "optimize" and fn is branch_on_sum:
        with pytest.raises(trident.CaptureError) as info:
            _door(door, fn, x, y)
        text = str(info.value)
        assert "test_data_dependent.py" in text and "bool(z.sum() > 0)" in text, text
        assert "trident.compile(fn) runs such calls eagerly" in text, text
        assert "Traceback" not in text and len(text.splitlines()) == 2, text
        return
    g = _door(door, fn, x, y)
    for seed in range(4):
        torch.manual_seed(seed)
        x, y = torch.randn(100), torch.randn(100)
        torch.testing.assert_close(g(x, y), fn(x, y))
    if door == "compile":
        text = trident.explain(g)
        if fn is branch_on_sum:
            assert "0 capture(s)" in text and "raised at" in text and "test_data_dependent.py" in text, text
        else:
            assert "1 capture(s)" in text, text
    if door == "optimize" and fn in (scaled_by_max, shifted_by_first):
        assert "traced non-tensor value (SymFloat)" in trident.explain(g) or "SymInt" in trident.explain(g)
