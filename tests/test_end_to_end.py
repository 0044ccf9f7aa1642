"""capture -> optimize -> SCM (guards, lowering, launch) -> results, against eager, on fresh
random inputs, for every launch style in tests/kernels.py. Runs on CPU tensors in CI (Triton's
interpreter behind the native launch path) and on CUDA tensors on the device machine."""

from __future__ import annotations

import json
import os

import pytest
import torch

import trident
from tests import kernels as K

CASES = {
    # name: (fn, reference, input makers)
    "1d_lambda_grid_float_scalar": (K.axpy, K.axpy_ref, [lambda d: torch.randn(1000, device=d)] * 2),
    "two_launches_num_warps_zeros": (K.two_kernels, K.two_kernels_ref, [lambda d: torch.randn(777, device=d)] * 2),
    "2d_grid_constexprs": (K.scale_rows, K.scale_rows_ref, [lambda d: torch.randn(40, 70, device=d)]),
    "inplace_on_input": (K.inplace_mul, K.inplace_mul_ref, [lambda d: torch.randn(300, device=d)]),
    "none_pointer_and_constexpr_bool": (K.bias_act, K.bias_act_ref, [lambda d: torch.randn(500, device=d)] * 2),
    "int_and_bool_scalars": (K.int_ops, K.int_ops_ref, [lambda d: torch.randint(-50, 50, (200,), device=d, dtype=torch.int32)]),
    "triton_op": (K.via_triton_op, K.via_triton_op_ref, [lambda d: torch.randn(1000, device=d)] * 2),
    "wrap_triton": (K.via_wrap_triton, K.axpy_ref, [lambda d: torch.randn(1000, device=d)] * 2),
}


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_eager(case, device):
    fn, ref, makers = CASES[case]
    example = [m(device) for m in makers]
    gm = trident.capture(fn, *[e.clone() for e in example])
    opt = trident.optimize(gm)
    scm_nodes = [n for n in opt.graph.nodes if n.target is torch.ops.trident.scm.default]
    assert len(scm_nodes) == 1, opt.code
    assert not any("triton_kernel_wrapper" in str(n.target) for n in opt.graph.nodes), opt.code
    for _ in range(3):  # fresh random inputs every call: no stale buffer can pass
        inputs = [m(device) for m in makers]
        expected_inputs = [i.clone() for i in inputs]
        got = _as_tuple(opt(*inputs))
        want = _as_tuple(ref(*expected_inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.device == w.device and g.shape == w.shape
            torch.testing.assert_close(g, w)
        for i, e in zip(inputs, expected_inputs):  # mutated inputs mutated exactly as eager
            torch.testing.assert_close(i, e)
    info = trident.cache_info(opt)
    (stats,) = info.values()
    assert stats["misses"] == 0 and stats["hits"] == 3 and stats["specializations"] == 1


def test_an_operator_failing_in_a_region_says_what_eager_says(device):
    """An ATen error inside a region (fp16 input, fp32 weight) reaches the caller as eager's own
    one-line message, in an OperatorError (a TridentError and a RuntimeError) naming the region
    and operator, chained to the runtime's error: no C++ frames, on every call."""
    lin = torch.nn.Linear(8, 8).to(device)

    def f(x):
        return K.axpy(lin(x), x)

    x = torch.randn(2, 8, device=device)
    opt = trident.optimize(trident.capture(f, x))
    with pytest.raises(RuntimeError) as eager:
        f(x.half())
    for _ in range(2):
        with pytest.raises(trident.OperatorError) as got:
            opt(x.half())
        text = str(got.value)
        assert text.startswith(str(eager.value).splitlines()[0]) and "frame #" not in text, text
        assert "aten::addmm" in text and got.value.operator == "aten::addmm"
        assert isinstance(got.value, RuntimeError) and isinstance(got.value.__cause__, RuntimeError)
    torch.testing.assert_close(opt(x), f(x))


def test_a_specialization_whose_first_run_failed_is_retired_once_per_input_facts(device, tmp_path):
    """Note [A specialization proves itself]: the fp16 call's specialization fails on its first
    run; it is retired (explain says why) and its TRIDENT_CACHE_DIR record removed; the next fp16
    call plans again, and that one, failing for the same facts, is kept: later fp16 calls fail at
    once (as eager fails), with no planning; specialization 0 still serves fp32."""
    from trident import knobs
    from trident.optimize import _regions

    lin = torch.nn.Linear(8, 8).to(device)

    def f(x):
        return K.axpy(lin(x), x)

    x = torch.randn(2, 8, device=device)
    with knobs.scope(cache_dir=str(tmp_path / "plans")):
        opt = trident.optimize(trident.capture(f, x))
        (rt,) = _regions(opt)

        def records():  # the specialization index each record was written for
            folder = rt._plans.folder
            names = [n for n in os.listdir(folder) if n.endswith(".json")] if os.path.isdir(folder) else []
            return sorted(json.load(open(os.path.join(folder, n)))["payload"]["index"] for n in names)

        assert records() == [0]  # written when built
        torch.testing.assert_close(opt(x), f(x))
        for _ in range(4):
            with pytest.raises(trident.OperatorError):
                opt(x.half())
        assert sorted(rt.retired) == [1] and "aten::addmm" in rt.retired[1]
        assert rt.stats()["misses"] == 2 and len(rt.scm.specializations) == 3  # planned twice, not four times
        assert records() == [0, 2]  # 1's removed; 2 (the same facts, kept) written under the same name
        text = trident.explain(opt)
        assert "specialization 1: retired, its first run failed" in text, text
        torch.testing.assert_close(opt(x), f(x))  # specialization 0 still serves
        assert rt.stats()["misses"] == 2


def test_an_input_whose_storage_was_freed_is_refused_before_anything_runs(device):
    """Note [Inputs with too little storage]: a tensor whose storage was freed in place
    (`untyped_storage().resize_(0)`, as FSDP frees parameters) keeps its sizes; the region refuses
    it by name before any step (it crashed the process in the hit path), and serves the next call."""
    x, y = torch.randn(100, device=device), torch.randn(100, device=device)
    opt = trident.optimize(trident.capture(K.axpy, x, y))
    freed = torch.randn(100, device=device)
    freed.untyped_storage().resize_(0)
    with pytest.raises(trident.GuardError, match=r"input 'x' of region 'region0' addresses 400 bytes of its storage, which holds 0"):
        opt(freed, y)
    grown_back = torch.randn(100, device=device)
    grown_back.untyped_storage().resize_(40)  # shrunk, not freed: still too small
    with pytest.raises(trident.GuardError, match="addresses 400 bytes of its storage, which holds 40"):
        opt(grown_back, y)
    torch.testing.assert_close(opt(x, y), K.axpy_ref(x, y))


def test_a_meta_tensor_input_is_refused_as_eager_refuses_it():
    """A meta tensor holds no data: eager refuses it, so does the region (by name, nothing ran)."""
    x, y = torch.randn(100), torch.randn(100)
    opt = trident.optimize(trident.capture(K.axpy, x, y))
    with pytest.raises(trident.GuardError, match=r"input 'x' of region 'region0' is a meta tensor"):
        opt(torch.empty(100, device="meta"), y)
    torch.testing.assert_close(opt(x, y), K.axpy_ref(x, y))


def test_the_hit_path_reads_closed_over_tensors_without_module_lookups(monkeypatch):
    """Note [Constants bound once]: the parameters a graph closes over are bound into its forward
    when it is made (each nn.Module.__getattr__ costs ~0.5 us; a 24-layer step reads ~290), and
    an in-place update of one is still seen."""
    import trident

    lin = torch.nn.Linear(8, 8)

    def fn(x):
        return lin(x).relu() + lin.bias

    x = torch.randn(2, 8)
    opt = trident.optimize(trident.capture(fn, x))
    torch.testing.assert_close(opt(x), fn(x))
    lookups = []
    real = torch.nn.Module.__getattr__
    monkeypatch.setattr(torch.nn.Module, "__getattr__", lambda self, name: lookups.append(name) or real(self, name))
    with torch.no_grad():
        lin.weight.mul_(2)  # in place: the bound tensor is the parameter itself
    torch.testing.assert_close(opt(x), fn(x))
    assert not [n for n in lookups if "constant" in n], lookups


def test_a_tensor_parameter_named_self_is_served():
    """A plain function whose first tensor parameter is named `self` (FX's generated forward
    takes the module as `self`): the input is renamed `self_`, and the call is served."""
    import trident
    from tests.kernels import axpy

    def f(self, y):
        return axpy(self, y) * 2

    x, y = torch.randn(100), torch.randn(100)
    opt = trident.optimize(trident.capture(f, x, y))
    assert [n.name for n in opt.graph.nodes if n.op == "placeholder"] == ["self_", "y"]
    torch.testing.assert_close(opt(x, y), f(x, y))
