"""aten::mm through cuBLASLt with cached plans (Note [Cached GEMM plans]) against ATen's own mm:
layouts (row-/column-major operands, transposed weights, strided rows, misaligned views), dtypes,
shapes from decode (m = 1, 8) to prefill, and the cases the plan path must decline."""

from __future__ import annotations

import pytest
import torch

import trident
from tests.kernels import axpy
from trident.runtime.native import gemm_stats

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _no_graph_replay():
    """These tests count calls through the plan path; a replayed graph (Note [Graph replay])
    runs no host program, so its calls would not be counted. Replay of GEMMs: test_graph_replay.
    Decode products stay cuBLAS's (CUDA's default measures Trident's GEMV against it:
    tests/passes/test_choose_matmuls.py) and no ATen op is fused around them."""
    with trident.knobs.scope(graphs="", decode_matmuls="", fuse_glue=""):
        yield


def mm_then_kernel(a, b):
    y = torch.mm(a, b)
    return y, axpy(y, y)


def _gemm_stats(opt) -> list[dict]:
    (rid,) = opt.meta["trident_regions"]
    rt = trident.runtime.SCMRuntime.get(rid)
    stats = [gemm_stats(rid, h) for h in rt._aten_handles.values()]
    return [s for s in stats if s is not None]


def _operand(shape, layout, dtype, gen):
    r, c = shape
    if layout == "row":
        return torch.randn(r, c, generator=gen, device="cuda").to(dtype)
    if layout == "col":  # a transposed weight: t(w) as F.linear passes it
        return torch.randn(c, r, generator=gen, device="cuda").to(dtype).t()
    if layout == "padded":  # rows with a leading dimension larger than the row
        return torch.randn(r, c + 8, generator=gen, device="cuda").to(dtype)[:, :c]
    if layout == "offset":  # a view 2 elements into its storage: 4-byte aligned only
        return torch.randn(r * c + 2, generator=gen, device="cuda").to(dtype)[2:].view(r, c)
    raise AssertionError(layout)


CASES = [
    (1, 2048, 2048, "row", "col"),
    (8, 2048, 512, "row", "col"),
    (1, 896, 9728, "row", "col"),
    (3, 64, 40, "row", "row"),
    (64, 128, 96, "col", "row"),
    (5, 32, 48, "padded", "col"),
    (4, 32, 16, "offset", "row"),
    (128, 256, 512, "row", "col"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,k,n,la,lb", CASES)
def test_cublaslt_mm_matches_aten(dtype, m, k, n, la, lb):
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    a, b = _operand((m, k), la, dtype, gen), _operand((k, n), lb, dtype, gen)
    opt = trident.optimize(trident.capture(mm_then_kernel, a, b))
    got, got2 = opt(a, b)
    want = torch.mm(a, b)
    assert got.shape == want.shape and got.stride() == want.stride() and got.dtype == dtype
    # Same accumulation (fp32) and inputs; the algorithm may differ from the one cuBLAS picks
    # for at::mm, so compare at the dtype's rounding.
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * k**0.5 / 10)
    torch.testing.assert_close(got2, 3.5 * got)
    for _ in range(3):  # hits reuse the plan
        opt(a, b)
    (st,) = _gemm_stats(opt)
    assert st["declined"] == 0 and st["taken"] >= 4 and len(st["plans"]) == 1, st
    assert st["plans"][0]["m"] == m and st["plans"][0]["n"] == n and st["plans"][0]["k"] == k, st


def test_cublaslt_declines_what_aten_must_do():
    """fp32 (TF32 rules), autograd recording and a layout with no unit stride go to ATen."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    a32, b32 = torch.randn(4, 32, device="cuda", generator=gen), torch.randn(32, 8, device="cuda", generator=gen)
    opt = trident.optimize(trident.capture(mm_then_kernel, a32, b32))
    torch.testing.assert_close(opt(a32, b32)[0], torch.mm(a32, b32))
    (st,) = _gemm_stats(opt)
    assert st["taken"] == 0 and not st["plans"], st

    a = torch.randn(4, 32, device="cuda", generator=gen).bfloat16()
    b = torch.randn(64, 16, device="cuda", generator=gen).bfloat16()[::2, ::2]  # strides (32, 2)
    opt = trident.optimize(trident.capture(mm_then_kernel, a, b))
    torch.testing.assert_close(opt(a, b)[0], torch.mm(a, b))
    (st,) = _gemm_stats(opt)
    assert st["taken"] == 0 and st["declined"] >= 1 and not st["plans"], st


def test_cublaslt_plan_per_layout_within_one_entry():
    """One operator entry, inputs whose alignment differs between calls: a plan per alignment."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    base = torch.randn(8 * 64 + 8, device="cuda", generator=gen).bfloat16()
    b = torch.randn(64, 32, device="cuda", generator=gen).bfloat16()
    aligned = base[:512].view(8, 64)
    opt = trident.optimize(trident.capture(mm_then_kernel, aligned, b))
    torch.testing.assert_close(opt(aligned, b)[0], torch.mm(aligned, b), rtol=2e-2, atol=2e-2)
    for shift in (1, 2, 4):  # 2-, 4-, 8-byte aligned views: guards may respecialize; results stay right
        view = base[shift: shift + 512].view(8, 64)
        torch.testing.assert_close(opt(view, b)[0], torch.mm(view, b), rtol=2e-2, atol=2e-2)
    stats = _gemm_stats(opt)
    assert sum(s["taken"] for s in stats) >= 4 and all(len(s["plans"]) <= 4 for s in stats), stats


def test_cublaslt_results_bitwise_vs_aten_report():
    """Not an equality requirement: records how often the cached plan reproduces at::mm bit for
    bit on decode shapes (printed; tools/bench_decode.py reports the end-to-end difference)."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    same = total = 0
    for m, k, n in [(1, 2048, 2048), (1, 2048, 512), (1, 2048, 16384), (1, 8192, 2048), (8, 2048, 2048), (1, 896, 9728)]:
        a = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        w = torch.randn(n, k, device="cuda", generator=gen).bfloat16()
        opt = trident.optimize(trident.capture(mm_then_kernel, a, w.t()))
        total += 1
        same += bool(torch.equal(opt(a, w.t())[0], torch.mm(a, w.t())))
    print(f"cuBLASLt cached plans bitwise equal to at::mm on {same}/{total} decode shapes")


def test_cublaslt_plan_inside_a_replayed_graph():
    """The plan path captured into a graph (Note [Graph replay]): a fresh activation every call
    (staged), the weight pinned; every replayed result equals at::mm's at the dtype's rounding."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    w = torch.randn(512, 256, device="cuda", generator=gen).bfloat16()
    xs = [torch.randn(4, 256, device="cuda", generator=gen).bfloat16() for _ in range(6)]
    with trident.knobs.scope(graphs="cuda"):
        opt = trident.optimize(trident.capture(mm_then_kernel, xs[0], w.t()))
        for x in xs:
            got, got2 = opt(x, w.t())
            torch.testing.assert_close(got, torch.mm(x, w.t()), rtol=2e-2, atol=2e-2 * 256**0.5 / 10)
            torch.testing.assert_close(got2, 3.5 * got)
    (info,) = trident.cache_info(opt).values()
    assert info["graph_replays"] >= 3, info
