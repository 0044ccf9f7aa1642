"""Note [Allocation arena]: buffers that cannot leave the region are slices of one allocation
per call; buffers an output shares (directly, through a view, or written in place) keep their own."""

from __future__ import annotations

import torch

import trident
from tests import kernels as K
from trident import knobs


def temps_and_view(x, y):
    t = torch.empty_like(x)  # temporary: arena
    K.axpy_kernel[(4,)](x, y, t, x.numel(), 0.5, BLOCK=64)
    z = torch.zeros_like(x)  # temporary, zero-filled: arena
    K.axpy_kernel[(4,)](t, z, z, x.numel(), 2.0, BLOCK=64)
    big = torch.empty(2 * x.numel(), device=x.device, dtype=x.dtype)  # leaves through a view: own buffer
    K.axpy_kernel[(8,)](torch.cat([z, z]), torch.cat([t, t]), big, big.numel(), 1.0, BLOCK=64)
    return big[: x.numel()].view_as(x), torch.mm(t.view(16, 16), z.view(16, 16))


def reference(x, y):
    t = 0.5 * x + y
    z = 2.0 * t
    big = torch.cat([z, z]) + torch.cat([t, t])
    return big[: x.numel()].view_as(x), torch.mm(t.view(16, 16), z.view(16, 16))


def _arena_line(opt):
    return [line.strip() for line in trident.explain(opt).splitlines() if line.strip().startswith("arena:")]


def test_arena_holds_temporaries_only(device):
    x, y = torch.randn(256, device=device), torch.randn(256, device=device)
    opt = trident.optimize(trident.capture(temps_and_view, x, y))
    (line,) = _arena_line(opt)
    assert line.startswith("arena: 2 of "), line  # t and z; big leaves through its view
    for _ in range(3):  # a fresh arena per call: earlier results stay intact
        first = opt(x, y)
        second = opt(x * 2, y)
        for got, want in zip(first, reference(x, y)):
            torch.testing.assert_close(got, want)
        for got, want in zip(second, reference(x * 2, y)):
            torch.testing.assert_close(got, want)
    out, prod = first
    # The view output keeps its own 512-element buffer (not an arena), the product its own result.
    assert out.untyped_storage().nbytes() == 512 * 4 and out.storage_offset() == 0
    assert prod.untyped_storage().nbytes() == 256 * 4


def test_arena_can_be_switched_off(device):
    x, y = torch.randn(256, device=device), torch.randn(256, device=device)
    with knobs.scope(native_paths="views,constants,typed,gemm"):
        opt = trident.optimize(trident.capture(temps_and_view, x, y))
    assert _arena_line(opt) == []
    for got, want in zip(opt(x, y), reference(x, y)):
        torch.testing.assert_close(got, want)
