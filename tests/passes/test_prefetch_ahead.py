"""Note [The next product's weights]: a GEMV launch asks the L2 for the next GEMV launch's weights
(trident/passes/prefetch_ahead.py, gemv.next_args, the kernels' `_prefetch_next`)."""

from __future__ import annotations

import pytest
import torch

import trident
from tests import kernels as K
from trident import knobs, pdl
from trident.kernels import gemv as G
from trident.passes import choose_matmuls as CM
from trident.passes import prefetch_ahead as PA
from trident.runtime import SCMRuntime

_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device machine)")
_CONFIG = (32, 256, 1, 4, 0)


@pytest.fixture(autouse=True)
def _no_timer():
    CM.set_timer(None)
    yield
    CM.set_timer(None)


def _favor_gemv(name, shape, cfg):
    return 0.5 if cfg is not None and tuple(cfg) == _CONFIG else (1.0 if name == "aten" else 0.9)


def _mlp(x, w1, w2, w3):
    h = K.axpy(x, x) @ w1.t()
    h = K.axpy(h, h) @ w2.t()  # a user kernel between two products
    return K.axpy(h, h) @ w3.t()


def _gemv_steps(opt):
    return [s for rid in opt.meta["trident_regions"] for s in SCMRuntime.get(rid).program.launches
            if s.kernel_name == "gemv_kernel"]


def _plan(monkeypatch, fn, args, **scope):
    """The optimized graph with the pass planning for CPU tensors too (never run: the interpreter
    runs no inline PTX)."""
    monkeypatch.setattr(PA.prefetch_ahead, "__defaults__", (("cuda", "cpu"),))
    CM.set_timer(_favor_gemv)
    with knobs.scope(decode_matmuls="all", **scope):
        return trident.optimize(trident.capture(fn, *args))


def test_each_gemv_carries_the_next_ones_weights(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 512, generator=g)
    ws = [torch.randn(256, 512, generator=g), torch.randn(512, 256, generator=g), torch.randn(128, 512, generator=g)]
    opt = _plan(monkeypatch, _mlp, [x, *ws])
    first, second, third = _gemv_steps(opt)
    lines = [w.numel() * 4 // 128 for w in ws]
    for step, n in ((first, lines[1]), (second, lines[2])):
        programs = G.grid(*(256, 512) if step is first else (512, 256), _CONFIG)[0]
        assert step.args["next_lines0"] == n and step.args["NEXT_PER"] == triton_next_pow2(-(-n // programs))
        assert "next1_ptr" not in step.args
    assert "NEXT_PER" not in third.args  # the last product: nothing after it
    with knobs.scope(prefetch_ahead="0"):
        CM.set_timer(_favor_gemv)
        with knobs.scope(decode_matmuls="all"):
            off = trident.optimize(trident.capture(_mlp, x, *ws))
    assert all("NEXT_PER" not in s.args for s in _gemv_steps(off))


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_not_across_another_product_nor_on_the_cpu(monkeypatch):
    """An operator's product between two GEMVs ends the chain (it would evict the lines); on the CPU
    (the interpreter: no inline PTX) the pass plans nothing."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 512, generator=g)
    w1, w2, w3 = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g), torch.randn(64, 512, generator=g)

    def with_operator_between(x, w1, w2, w3):
        h = K.axpy(x, x) @ w1.t()
        h = torch.bmm(h[None], w3.t()[None, :, :64].expand(1, 512, 64).contiguous())[0]  # stays an operator
        return h @ w2.t()[:64]

    opt = _plan(monkeypatch, with_operator_between, [x, w1, w2, w3])
    assert all("NEXT_PER" not in s.args for s in _gemv_steps(opt))
    monkeypatch.undo()
    CM.set_timer(_favor_gemv)
    with knobs.scope(decode_matmuls="all"):
        opt = trident.optimize(trident.capture(_mlp, x, w1, w2, w1))
    steps = _gemv_steps(opt)
    assert len(steps) == 3 and all("NEXT_PER" not in s.args for s in steps)


def test_next_args_split_the_budget_over_the_members():
    """The first AHEAD_BYTES of the members in order, in 128-byte lines, as few per program as cover
    the largest; a member past the budget is not asked for."""
    mb = 1 << 20
    args = G.next_args(128, [("w0", 10 * mb), ("w1", 10 * mb), ("w2", 10 * mb)])
    assert args == {"NEXT_PER": 1 << (10 * mb // 128 // 128 - 1).bit_length(), "next0_ptr": "w0",
                    "next_lines0": 10 * mb // 128, "next1_ptr": "w1", "next_lines1": 6 * mb // 128}
    assert G.next_args(4, [("w", 200)]) == {"NEXT_PER": 1, "next0_ptr": "w", "next_lines0": 2}


@pytest.mark.parametrize("kernel", [G.gemv_kernel, G.gemv_group_kernel], ids=lambda k: k.__name__)
def test_the_kernels_prefetch_after_their_wait(kernel):
    """sm_90 PTX (compiled without a GPU): with NEXT_PER the kernel holds the prefetches, after its
    wait (the launch stays provably programmatic); without, none beyond its own PREFETCH."""
    from tests.test_pdl import _warmup

    w = torch.empty(4096, dtype=torch.bfloat16)
    ptx = _warmup(kernel, True, next0_ptr=w, next1_ptr=w, next_lines0=32, next_lines1=16, NEXT_PER=4).asm["ptx"]
    plain = _warmup(kernel, True).asm["ptx"]
    assert ptx.count("prefetch.global.L2") > plain.count("prefetch.global.L2")
    assert ptx.index("griddepcontrol.wait") < ptx.rindex("prefetch.global.L2")
    assert pdl.waits_before_memory(ptx)


@_CUDA
def test_carried_prefetch_on_cuda_equals_eager():
    """On the GPU the pass runs by default: the products equal eager's, call after call, and every
    GEMV but the last carries the next one's weights."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2048, generator=g).cuda().bfloat16()
    ws = [torch.randn(n, k, generator=g).cuda().bfloat16() for n, k in ((4096, 2048), (2048, 4096), (1024, 2048))]
    CM.set_timer(_favor_gemv)
    with knobs.scope(decode_matmuls="cuda"):
        opt = trident.optimize(trident.capture(_mlp, x, *ws))
    steps = _gemv_steps(opt)
    assert len(steps) == 3 and all("NEXT_PER" in s.args for s in steps[:2]), [s.args for s in steps]
    for _ in range(3):
        torch.testing.assert_close(opt(x, *ws), _mlp(x, *ws), rtol=2e-2, atol=2e-2)
