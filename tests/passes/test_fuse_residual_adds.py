"""trident/passes/fuse_residual_adds.py (Note [Residual adds in the GEMM]): `residual + a @ b`
becomes one trident.residual_mm -- where the knob allows it (bf16/fp16 CUDA by default, "all"
here) -- whose result is addmm's (one rounding), or eager's promotion when a later call brings
other dtypes; what the pass cannot prove stays an add."""

from __future__ import annotations

import expecttest
import pytest
import torch

import trident
from tests import kernels as K
from tests.conftest import normalize
from trident import knobs
from trident.passes.fuse_residual_adds import fuse_residual_adds

aten = torch.ops.aten


def _block(x, w1, w2, res):
    """Two residual halves of a layer: h = K(x); r = res + o_proj(h); out = r + down(r)."""
    h = K.axpy(x, x).view(1, 1, 64)
    r = res + (h.view(1, 64) @ w1.t()).view(1, 1, 64)
    return (r.view(1, 64) @ w2.t()).view(1, 1, 64) + r  # the product on the left


def _args(dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(dtype).to(device) for s in ((64,), (64, 64), (64, 64), (1, 1, 64))]


def _reference(x, w1, w2, res):
    """The same math as the fused graph computes it: addmm, one rounding per product."""
    h = K.axpy_ref(x, x).view(1, 64)
    r = torch.addmm(res.view(1, 64), h, w1.t())
    return torch.addmm(r, r, w2.t()).view(1, 1, 64)


def _count(gm, target):
    return sum(n.op == "call_function" and n.target is target for n in gm.graph.nodes)


def _captured(fn, args):
    return trident.capture(fn, *[a.clone() for a in args])


def test_both_residual_adds_fold_and_equal_addmm():
    args = _args()
    with knobs.scope(gemm_epilogues="all"):
        gm = _captured(_block, args)
        assert fuse_residual_adds(gm) == 2, gm.code
        assert _count(gm, aten.add.Tensor) == 0 and _count(gm, aten.mm.default) == 0 and _count(gm, torch.ops.trident.residual_mm.default) == 2
        opt = trident.optimize(_captured(_block, args))
    got = opt(*args)
    assert torch.equal(got, _reference(*args))
    assert torch.allclose(got, _block(*args), rtol=1e-5, atol=1e-5)


def test_default_folds_only_bf16_and_fp16_cuda():
    gm = _captured(_block, _args())
    assert knobs.gemm_epilogues() == "cuda" and fuse_residual_adds(gm) == 0
    with knobs.scope(gemm_epilogues=""):
        assert fuse_residual_adds(_captured(_block, _args())) == 0


def _broadcast(x, w, res):
    return res + (K.axpy(x, x).view(1, 64) @ w.t())  # res is [64]: broadcast


def _product_used_twice(x, w, res):
    p = K.axpy(x, x).view(1, 64) @ w.t()
    return res + p, p * 2


def _alpha(x, w, res):
    return torch.add(res, K.axpy(x, x).view(1, 64) @ w.t(), alpha=2)


def _transposed_residual(x, w, res):
    return res.t() + K.axpy(x, x).view(2, 32) @ w[:32]  # res.t(): [2, 64], not contiguous


def _weight_written_between(x, w, res):
    p = K.axpy(x, x).view(1, 64) @ w.t()
    K.inplace_mul_kernel[(1,)](w, w.numel(), 3.0, BLOCK=4096)  # writes w after the product read it
    return res + p


@pytest.mark.parametrize(
    "fn,res_shape",
    [(_broadcast, (64,)), (_product_used_twice, (1, 64)), (_alpha, (1, 64)), (_transposed_residual, (64, 2)),
     (_weight_written_between, (1, 64))],  # fmt: skip
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_left_as_adds(fn, res_shape):
    g = torch.Generator().manual_seed(1)
    args = [torch.randn(64, generator=g), torch.randn(64, 64, generator=g), torch.randn(res_shape, generator=g)]
    with knobs.scope(gemm_epilogues="all"):
        gm = _captured(fn, args)
        assert fuse_residual_adds(gm) == 0, gm.code
        opt = trident.optimize(_captured(fn, args))
    got, want = opt(*[a.clone() for a in args]), fn(*[a.clone() for a in args])
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cuda_residual_adds_in_one_matmul(dtype):
    """bf16/fp16 on CUDA (the default): both adds fold, and the SCM runs each addmm as one
    cuBLASLt matmul with C = the residual (the native path takes every call); the result is as
    close to the exact (float64) one as eager's two roundings are."""
    from trident.runtime import SCMRuntime
    from trident.runtime.native import gemm_stats

    args = _args(dtype, "cuda")
    gm = _captured(_block, args)
    assert fuse_residual_adds(gm) == 2
    with knobs.scope(decode_matmuls=""):  # not Trident's GEMV where it measures faster (the default)
        opt = trident.optimize(_captured(_block, args))
    for _ in range(3):  # the native path, then graph replay
        got = opt(*args)
    exact = _block(*[a.double() for a in args])
    eager = _block(*args)
    err, eager_err = (got.double() - exact).abs().max(), (eager.double() - exact).abs().max()
    assert err <= 2 * eager_err + 1e-9, (err, eager_err)
    assert err <= exact.abs().max() * (2**-6 if dtype is torch.bfloat16 else 2**-9)
    (rid,) = opt.meta["trident_regions"]
    rt = SCMRuntime.get(rid)
    stats = [st for h in rt._aten_handles.values() if (st := gemm_stats(rid, h)) is not None]
    assert len(stats) == 2 and all(st["taken"] >= 1 and st["declined"] == 0 for st in stats), stats


class TestResidualAddGraph(expecttest.TestCase):
    def test_golden(self):
        with knobs.scope(gemm_epilogues="all"):
            gm = _captured(_block, _args())
            assert fuse_residual_adds(gm) == 2
        self.assertExpectedInline(normalize(gm.code.strip()), """\
def forward(self, x, w1, w2, res):
    empty_like = torch.ops.aten.empty_like.default(x, pin_memory = False)
    triton_kernel_wrapper_mutation_proxy = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(1, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'x_ptr': x, 'y_ptr': x, 'out_ptr': empty_like, 'n': 64, 'alpha': 2.5, 'BLOCK': 128});  x = triton_kernel_wrapper_mutation_proxy = None
    view = torch.ops.aten.view.default(empty_like, [1, 1, 64]);  empty_like = None
    view_1 = torch.ops.aten.view.default(view, [1, 64]);  view = None
    t = torch.ops.aten.t.default(w1);  w1 = None
    view_default = torch.ops.aten.view.default(res, [1, 64]);  res = None
    residual_mm_default = torch.ops.trident.residual_mm.default(view_default, view_1, t);  view_default = view_1 = t = None
    view_default_1 = torch.ops.aten.view.default(residual_mm_default, [1, 1, 64]);  residual_mm_default = None
    view_3 = torch.ops.aten.view.default(view_default_1, [1, 64])
    t_1 = torch.ops.aten.t.default(w2);  w2 = None
    view_default_2 = torch.ops.aten.view.default(view_default_1, [1, 64]);  view_default_1 = None
    residual_mm_default_1 = torch.ops.trident.residual_mm.default(view_default_2, view_3, t_1);  view_default_2 = view_3 = t_1 = None
    view_default_3 = torch.ops.aten.view.default(residual_mm_default_1, [1, 1, 64]);  residual_mm_default_1 = None
    return view_default_3""")


def test_a_product_added_to_itself_stays_an_add():
    def fn(x, w):
        y = (K.axpy(x, x).view(2, 32) @ w).view(2, 4, 16)
        return y + y

    args = [torch.randn(64), torch.randn(32, 64)]
    with knobs.scope(gemm_epilogues="all"):
        gm = _captured(fn, args)
        assert fuse_residual_adds(gm) == 0
        opt = trident.optimize(_captured(fn, args))
    assert torch.equal(opt(*args), fn(*args))


def test_residual_mm_operator():
    """The operator: addmm for one dtype, eager's promotion otherwise; opcheck (schema, fake
    tensors, AOT dispatch)."""
    g = torch.Generator().manual_seed(3)
    x, a, b = torch.randn(3, 5, generator=g), torch.randn(3, 4, generator=g), torch.randn(4, 5, generator=g)
    op = torch.ops.trident.residual_mm.default
    assert torch.equal(op(x, a, b), torch.addmm(x, a, b))
    assert torch.equal(op(x.double(), a, b), x.double() + a @ b)  # promotion, as eager's add
    assert torch.equal(op(x[0], a, b), x[0] + a @ b)  # broadcasting
    torch.library.opcheck(op, (x, a, b))
    torch.library.opcheck(op, (x.double(), a, b))


def test_other_dtypes_at_call_time_get_eagers_promotion():
    """Captured with one dtype (the rewrite applies), called with a float64 residual: a new
    specialization of the same graph, eager's x + mm(a, b) (not addmm's dtype error)."""
    def fn(x, w1, w2, res):
        h = K.axpy(x, x).view(1, 64)
        return res + (h @ w1.t()).view(1, 1, 64), (h @ w2.t()).view(1, 1, 64) + res

    args = _args()
    with knobs.scope(gemm_epilogues="all"):
        gm = _captured(fn, args)
        assert fuse_residual_adds(gm) == 2
        opt = trident.optimize(_captured(fn, args))
    got_args = list(args)
    got_args[3] = args[3].double()
    for got, want in zip(opt(*got_args), fn(*got_args)):
        assert got.dtype == want.dtype == torch.float64 and torch.equal(got, want)
