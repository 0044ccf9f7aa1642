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
    for step, w, (n, k) in ((first, ws[1], (256, 512)), (second, ws[2], (512, 256))):
        programs = G.grid(n, k, _CONFIG)[0]
        assert step.args["next_bytes0"] == w.numel() * 4 and step.args["NEXT"] is True
        assert step.args["next_chunk"] % 16 == 0 and step.args["next_chunk"] * programs >= w.numel() * 4
        assert (step.args["next_chunk"] - 16) * programs < w.numel() * 4 and "next1_ptr" not in step.args
    assert "NEXT" not in third.args  # the last product: nothing after it
    with knobs.scope(prefetch_ahead="0"):
        CM.set_timer(_favor_gemv)
        with knobs.scope(decode_matmuls="all"):
            off = trident.optimize(trident.capture(_mlp, x, *ws))
    assert all("NEXT" not in s.args for s in _gemv_steps(off))


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
    assert all("NEXT" not in s.args for s in _gemv_steps(opt))
    monkeypatch.undo()
    CM.set_timer(_favor_gemv)
    with knobs.scope(decode_matmuls="all"):
        opt = trident.optimize(trident.capture(_mlp, x, w1, w2, w1))
    steps = _gemv_steps(opt)
    assert len(steps) == 3 and all("NEXT" not in s.args for s in steps)


def test_next_args_split_the_budget_over_the_members():
    """The first AHEAD_BYTES of the members in order (multiples of 16 bytes), each program's span the
    least multiple of 16 that covers the largest; a member past the budget is not asked for."""
    mb = 1 << 20
    args = G.next_args(128, [("w0", 10 * mb), ("w1", 10 * mb), ("w2", 10 * mb)])
    assert args == {"NEXT": True, "next_chunk": 10 * mb // 128, "next0_ptr": "w0", "next_bytes0": 10 * mb,
                    "next1_ptr": "w1", "next_bytes1": 6 * mb}
    assert G.next_args(4, [("w", 200)]) == {"NEXT": True, "next_chunk": 48, "next0_ptr": "w", "next_bytes0": 192}


@pytest.mark.parametrize("kernel", [G.gemv_kernel, G.gemv_group_kernel], ids=lambda k: k.__name__)
def test_the_kernels_prefetch_after_their_wait(kernel):
    """sm_90 code (compiled without a GPU, through ptxas): with NEXT the kernel holds one bulk
    prefetch per weight, after its wait (the launch stays provably programmatic); without, none."""
    from tests.test_pdl import _warmup

    w = torch.empty(4096, dtype=torch.bfloat16)
    ptx = _warmup(kernel, True, next0_ptr=w, next1_ptr=w, next_bytes0=4096, next_bytes1=2048, next_chunk=64,
                  NEXT=True).asm["ptx"]
    assert "cp.async.bulk.prefetch.L2" not in _warmup(kernel, True).asm["ptx"]
    assert ptx.count("cp.async.bulk.prefetch.L2.global") == 3  # _warmup gives next2_ptr a tensor too
    assert ptx.index("griddepcontrol.wait") < ptx.index("cp.async.bulk.prefetch.L2")
    assert pdl.waits_before_memory(ptx)


def test_weights_read_as_module_attributes_move_before_the_carrier(monkeypatch):
    """make_fx reads a closed-over weight (a module's parameter) where it is first used: after the
    GEMV that is to prefetch it. The read moves before that launch, which then carries it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 512, generator=g)
    w1, w2 = torch.randn(256, 512, generator=g), torch.randn(512, 256, generator=g)

    def closed_over(x):
        h = K.axpy(x, x) @ w1.t()
        return K.axpy(h, h) @ w2.t()

    opt = _plan(monkeypatch, closed_over, [x])
    first, second = _gemv_steps(opt)
    assert first.args["next_bytes0"] == w2.numel() * 4 and "NEXT" not in second.args


@_CUDA
def test_carried_prefetch_on_cuda_changes_no_bit():
    """On the GPU the pass runs by default: every GEMV but the last carries the next one's weights,
    and the results are those without the prefetch bit for bit (and eager's within bf16), call
    after call; the weights closed over (module attributes) as a model's are."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2048, generator=g).cuda().bfloat16()
    ws = [(torch.randn(n, k, generator=g) / k ** 0.5).cuda().bfloat16() for n, k in ((4096, 2048), (2048, 4096),
                                                                                       (1024, 2048))]

    def model(x):
        return _mlp(x, *ws)

    def build():
        CM.set_timer(_favor_gemv)
        with knobs.scope(decode_matmuls="cuda"):
            return trident.optimize(trident.capture(model, x))

    opt = build()
    steps = _gemv_steps(opt)
    assert len(steps) == 3 and all("NEXT" in s.args for s in steps[:2]), [s.args for s in steps]
    with knobs.scope(prefetch_ahead="0"):
        plain = build()
    assert all("NEXT" not in s.args for s in _gemv_steps(plain))
    want = plain(x)
    for _ in range(3):
        got = opt(x)
        assert torch.equal(got, want)
    torch.testing.assert_close(got.float(), model(x).float(), rtol=3e-2, atol=3e-2)
