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


def chain(x, y):
    # t1 -> t2 -> t3 -> out: t1 is dead once t2 is written, so t3 may take its bytes.
    t1, t2, t3, out = (torch.empty_like(x) for _ in range(4))
    n = x.numel()
    K.axpy_kernel[(4,)](x, y, t1, n, 1.0, BLOCK=64)
    K.axpy_kernel[(4,)](t1, y, t2, n, 2.0, BLOCK=64)
    K.axpy_kernel[(4,)](t2, y, t3, n, 3.0, BLOCK=64)
    K.axpy_kernel[(4,)](t3, y, out, n, 4.0, BLOCK=64)
    return out


def test_arena_reuses_bytes_of_dead_buffers(device):
    x, y = torch.randn(256, device=device), torch.randn(256, device=device)
    opt = trident.optimize(trident.capture(chain, x, y))
    (line,) = _arena_line(opt)
    # three 1 KiB temporaries, at most two alive at once
    assert line == "arena: 3 of 4 allocation(s) in one buffer of 2048 bytes per call", line
    want = 4.0 * (3.0 * (2.0 * (x + y) + y) + y) + y
    for _ in range(2):
        torch.testing.assert_close(opt(x, y), want)


def test_arena_lifetimes_follow_views_and_in_place_results(device):
    """A buffer stays reserved while a view of it is still read, even after its own last use."""

    def fn(x, y):
        t = torch.empty_like(x)
        K.axpy_kernel[(4,)](x, y, t, x.numel(), 1.0, BLOCK=64)
        tv = t.view(16, 16)[:8]  # the view is read after t's last direct use
        u = torch.empty_like(x)
        K.axpy_kernel[(4,)](y, y, u, x.numel(), 1.0, BLOCK=64)
        return torch.mm(tv, u.view(16, 16))

    x, y = torch.randn(256, device=device), torch.randn(256, device=device)
    opt = trident.optimize(trident.capture(fn, x, y))
    (line,) = _arena_line(opt)
    assert line == "arena: 2 of 2 allocation(s) in one buffer of 2048 bytes per call", line
    for _ in range(2):
        torch.testing.assert_close(opt(x, y), torch.mm((x + y).view(16, 16)[:8], (2 * y).view(16, 16)))
