"""Note [One guard table] (trident/scm/guards.py): each call-guard kind checks and explains
itself in the caller's names, serializes to plain data, and the native DisjointInputs check
decides as its Python twin does on generated layouts."""

from __future__ import annotations

import random

import pytest
import torch

import trident
from tests import kernels as K
from trident import knobs
from trident.errors import GuardError
from trident.runtime import SCMRuntime
from trident.scm.guards import ConstantInput, DisjointInputs, KernelGlobal, SameTensor, first_failure


def test_kinds_check_and_explain_in_the_callers_names():
    names = ["x", "scale", "y"]
    t = torch.zeros(2)
    c, same = ConstantInput(1, 3), SameTensor(0, 2)
    assert c.check([t, 3, t]) and not c.check([t, 3.0, t]) and not c.check([t, 4, t])
    assert "'scale' (position 1) was captured as the constant 3, got 4" in c.failure([t, 4, t], names)
    assert same.check([t, 3, t]) and not same.check([t, 3, t.clone()])
    assert "'y' (position 2) and 'x' (position 0) were one tensor" in same.failure([t, 3, t.clone()], names)
    scope = {"__name__": "user_module", "BLOCK": 64}
    g = KernelGlobal("my_kernel", "BLOCK", 64, scope)
    assert g.check()
    scope["BLOCK"] = 128
    assert not g.check() and "was 64 when it was compiled and is 128 now" in g.failure()
    assert first_failure([c, same, g], [t, 3, t]) is g
    nan, zero = ConstantInput(0, float("nan")), ConstantInput(0, 0.0)
    assert nan.check([float("nan")]) and zero.check([0.0]) and not zero.check([-0.0]) and not zero.check([0])
    assert c.describe(names) == "scale == 3 (a captured constant)"
    assert [k.record()["kind"] for k in (c, same, g)] == ["constant_input", "same_tensor", "kernel_global"]
    assert g.record()["module"] == "user_module"


def _write(cache, pos, src):
    cache.index_copy_(0, pos, src)
    return K.axpy(src.flatten(), src.flatten())


def test_native_disjoint_check_equals_its_python_twin():
    """400 random placements of a cache [8, 4] and a source row [1, 4] in one storage (and some
    in two): the region refuses exactly the calls the twin says overlap, and eager's
    index_copy_ refuses them too."""
    with knobs.scope(triton_copies="all"):
        opt = trident.optimize(trident.capture(_write, torch.zeros(8, 4), torch.tensor([2]), torch.ones(1, 4)))
    (rid,) = opt.meta["trident_regions"]
    rt = SCMRuntime.get(rid)
    guards = rt.guards  # cache against src, cache against pos
    assert len(guards) == 2 and all(isinstance(g, DisjointInputs) and g.native for g in guards)
    region_names = [i.name for i in rt.program.inputs]
    rng = random.Random(0)
    refused = 0
    for case in range(400):
        base = torch.zeros(80)
        other = torch.zeros(80)
        c_off, s_off = rng.randrange(0, 48), rng.randrange(0, 76)
        cache = base.as_strided((8, 4), (4, 1), c_off)
        src = (other if case % 5 == 0 else base).as_strided((1, 4), (4, 1), s_off)
        pos = torch.tensor([rng.randrange(8)])
        by_name = {"cache": cache, "pos": pos, "src": src}
        values = [by_name[n] for n in region_names]
        twin_ok = all(g.check(values) for g in guards)
        try:
            opt(cache, pos, src)
            native_ok = True
        except RuntimeError as e:
            assert any(g.failure() in str(e) for g in guards if not g.check(values)), str(e)
            native_ok = False
        assert native_ok == twin_ok, (case, c_off, s_off)
        if not twin_ok:
            refused += 1
            with pytest.raises(RuntimeError, match="single memory location"):
                cache.index_copy_(0, pos, src)  # eager refuses the same call
    assert 50 < refused < 350, refused


def test_explain_lists_the_call_guards():
    def fn(x, n, y):
        return K.axpy(x, y) * n

    x = torch.randn(8)
    opt = trident.optimize(trident.capture(fn, x, 2, x))
    text = trident.explain(opt)
    assert "call guards" in text and "n == 2 (a captured constant)" in text, text
    with pytest.raises(GuardError, match="captured as the constant 2, got 3"):
        opt(x, 3, x)


def test_an_optimized_graph_with_kernel_globals_deep_copies():
    import copy

    from trident.scm.guards import KernelGlobal

    opt = trident.optimize(trident.capture(lambda x: K.scale_by_global(x), torch.randn(8)))
    assert any(isinstance(g, KernelGlobal) for g in opt.meta["trident_call_guards"])
    twin = copy.deepcopy(opt)
    assert twin.meta["trident_call_guards"] is opt.meta["trident_call_guards"]


def test_a_new_shape_fails_the_captured_layout_guard_in_the_callers_names():
    from trident.scm.guards import CapturedLayout

    opt = trident.optimize(trident.capture(lambda x, y: K.axpy(x, y), torch.randn(8), torch.randn(8)))
    (rid,) = opt.meta["trident_regions"]
    rt = SCMRuntime.get(rid)
    assert [type(g) for g in rt.layout_guards] == [CapturedLayout, CapturedLayout]
    assert rt.layout_guards[0].check([torch.randn(8), torch.randn(8)])
    assert not rt.layout_guards[0].check([torch.randn(9), torch.randn(8)])
    with pytest.raises(GuardError, match=r"expected sizes \[8\] and strides \[1\] as captured, got sizes \[9\]"):
        opt(torch.randn(9), torch.randn(9))
    assert rt.layout_guards[0].record() == {"kind": "captured_layout", "input": 0, "sizes": [8], "strides": [1]}


def test_strides_of_size_one_dimensions_are_not_significant():
    """The captured layout guard compares significant strides only (torch._prims_common's rule):
    a dimension of size 1 addresses nothing, so an input whose stride there differs from the
    captured one (a real kernel's output where its meta function predicted another, cuDNN's
    attention) is served -- by a specialization of its own -- with eager's results; a stride that
    matters still fails."""
    from trident.scm.guards import CapturedLayout

    def f(x, y):
        return K.scale_rows(x.reshape(4, 8)) + y.sum(1)

    x0, y0 = torch.randn(4, 1, 8), torch.randn(4, 1, 8)
    opt = trident.optimize(trident.capture(f, x0, y0))
    odd = torch.randn(4, 8).as_strided((4, 1, 8), (8, 1000, 1))
    y = torch.randn(4, 8).as_strided((4, 1, 8), (8, 3, 1))
    (rid,) = opt.meta["trident_regions"]
    assert all(g.check([odd, y]) for g in SCMRuntime.get(rid).layout_guards if isinstance(g, CapturedLayout))
    torch.testing.assert_close(opt(odd, y), f(odd, y))
    torch.testing.assert_close(opt(x0, y0), f(x0, y0))
    with pytest.raises(GuardError, match="strides"):
        opt(torch.randn(8, 4).t().reshape(4, 1, 8).as_strided((4, 1, 8), (1, 8, 4)), y0)
