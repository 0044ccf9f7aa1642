"""Note [One capture cache]: one bound and one overflow policy for both front doors (the
backend's side: tests/capture/test_dynamo.py, the TRIDENT_CAPTURES=2 case)."""

from __future__ import annotations

import logging

import torch
import triton

import trident
from tests import kernels as K
from trident import knobs


def _axpy(x, y):
    out = torch.empty_like(x)
    K.axpy_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), 2.0, BLOCK=64)
    return out


def test_past_the_bound_new_signatures_run_eagerly(caplog, monkeypatch):
    """TRIDENT_CAPTURES=2: a trident.compile'd function's third static signature runs eagerly
    (correctly), said in eager_log with the leaf that changed, and once as a warning naming the
    knob; the first two keep hitting, none is dropped."""
    monkeypatch.setattr(logging.getLogger("trident.misses"), "propagate", True)  # to caplog, under TRIDENT_LOG too
    with knobs.scope(captures=2), caplog.at_level(logging.WARNING, logger="trident.misses"):
        compiled = trident.compile(_axpy, dynamic=False)
        for n in (64, 128, 192, 64, 128, 192):
            for _ in range(2):
                x, y = torch.randn(n), torch.randn(n)
                torch.testing.assert_close(compiled(x, y), 2.0 * x + y)
    said = [r.getMessage() for r in caplog.records if "captures (TRIDENT_CAPTURES) reached" in r.getMessage()]
    assert said == ["trident.compile(_axpy): 2 captures (TRIDENT_CAPTURES) reached; calls of a signature none of "
                    "them serves run eagerly from now on. Raise TRIDENT_CAPTURES (e.g. TRIDENT_CAPTURES=4) if "
                    "this function meets more shapes; trident.explain() lists each eager call and what changed."], said
    assert len(compiled.captures) == 2
    assert "past TRIDENT_CAPTURES=2 captures of this function" in compiled.eager_log[-1]
    # the leaf that changed, in the caller's words (issue 22: every eager call says why)
    assert any("past TRIDENT_CAPTURES=2" in r and "x: float32[128] -> float32[192]" in r for r in compiled.eager_log), \
        compiled.eager_log
    hits = [v["hits"] for opt in compiled.captures.values() for v in trident.cache_info(opt).values()]
    assert hits == [3, 3]  # 64 and 128: captured at their second call, then hit twice more
    assert compiled.eager_calls == 3 + 3  # the first call of each size, then 192 past the bound three times


def test_no_captures_asked_for_runs_eagerly_without_a_warning(caplog, monkeypatch):
    """TRIDENT_CAPTURES=0 asks for every call eager: each says why, none warns that a bound was
    reached (there is nothing to raise it for)."""
    monkeypatch.setattr(logging.getLogger("trident.misses"), "propagate", True)
    with knobs.scope(captures=0), caplog.at_level(logging.WARNING, logger="trident.misses"):
        compiled = trident.compile(_axpy)
        for n in (64, 64, 128):
            x, y = torch.randn(n), torch.randn(n)
            torch.testing.assert_close(compiled(x, y), 2.0 * x + y)
    assert not compiled.captures and compiled.eager_calls == 3
    assert "past TRIDENT_CAPTURES=0" in compiled.eager_log[-1], compiled.eager_log
    assert not [r for r in caplog.records if "TRIDENT_CAPTURES" in r.getMessage()]


def test_compiling_a_module_gives_a_module_back():
    """trident.compile(module) returns a Module, as torch.compile's OptimizedModule: parameters,
    state_dict (keys under `_orig_mod.`), eval/train, attributes of the original; to()/double()
    forget the captures (made for the old tensors) and the next calls capture again; explain and
    cache_info read it as the compiled function."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    model.flag = "kept"
    compiled = trident.compile(model)
    assert isinstance(compiled, torch.nn.Module) and compiled._orig_mod is model
    x = torch.randn(2, 4)
    with torch.no_grad():  # its parameters require grad: with grad enabled it runs eagerly (test_grad.py)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    assert len(compiled.captures) == 1 and compiled.eager_calls == 1
    assert compiled.dynamo_calls == 0 and compiled.dynamo_reason is None  # the function door's counters too
    assert [n for n, _ in compiled.named_parameters()] == ["_orig_mod.0.weight", "_orig_mod.0.bias"]
    assert list(compiled.state_dict()) == ["_orig_mod.0.weight", "_orig_mod.0.bias"]
    assert compiled.flag == "kept" and compiled.eval() is compiled and not model.training
    assert "1 capture(s); 1 call(s) ran eagerly" in trident.explain(compiled)
    assert len(trident.cache_info(compiled)) == 1
    compiled.double()
    assert not compiled.captures and model[0].weight.dtype == torch.float64
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x.double()), model(x.double()))
    assert len(compiled.captures) == 1
