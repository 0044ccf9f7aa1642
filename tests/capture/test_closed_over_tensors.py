"""Note [Closed-over tensors]: parameters, buffers and caches a function reads without being
passed them are bound to the graph by identity; in-place updates are seen and made."""

from __future__ import annotations

import torch
import triton

import trident
from tests import kernels as K
from trident import knobs


def test_module_state_is_read_from_the_tensors_captured():
    lin = torch.nn.Linear(32, 32)
    shift = torch.randn(32)

    def f(x):
        h = lin(x)
        out = torch.empty_like(h)
        K.axpy_kernel[(triton.cdiv(h.numel(), 64),)](h, shift.expand_as(h).contiguous(), out, h.numel(), 3.0, BLOCK=64)
        return out

    def reference(x):
        return 3.0 * lin(x) + shift

    with torch.no_grad():
        opt = trident.optimize(trident.capture(f, torch.randn(4, 32)))
        for _ in range(2):
            x = torch.randn(4, 32)
            torch.testing.assert_close(opt(x), reference(x))
            lin.weight.mul_(-0.5)  # in place, as an optimizer step or load_state_dict does
            shift.add_(1.0)
    assert sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) == 1


def test_a_closed_over_cache_written_in_place_every_step(device):
    """A KV-cache-like buffer the step closes over and writes at a new position each call, with
    graph replay (emulated on the CPU): outputs and the cache equal the reference every step."""
    cache = torch.zeros(8, 16, device=device)
    lin = torch.nn.Linear(16, 16).to(device)

    def step(x, pos):
        h = lin(x)
        cache.index_copy_(0, pos, h)
        out = torch.empty_like(h)
        K.axpy_kernel[(1,)](h, cache.sum(0, keepdim=True).contiguous(), out, h.numel(), 2.0, BLOCK=16)
        return out

    def reference(x, pos, c):
        h = lin(x)
        c.index_copy_(0, pos, h)
        return 2.0 * h + c.sum(0, keepdim=True)

    mode = "all" if device == "cpu" else "cuda"
    with torch.no_grad(), knobs.scope(graphs=mode, graph_min_saving_us="-inf"):
        opt = trident.optimize(trident.capture(step, torch.randn(1, 16, device=device), torch.tensor([0], device=device)))
        cache.zero_()
        ref_cache = torch.zeros_like(cache)
        for p in range(8):
            x, pos = torch.randn(1, 16, device=device), torch.tensor([p], device=device)
            torch.testing.assert_close(opt(x, pos), reference(x, pos, ref_cache))
            torch.testing.assert_close(cache, ref_cache)
    (stats,) = trident.cache_info(opt).values()
    assert stats["misses"] == 0 and stats["graph_replays"] == 6


def test_capture_changes_no_closed_over_state_and_bakes_none_in():
    """A closed-over scalar counter advanced in place and read through `counter + 1`: capture
    leaves it as it was, and every call advances it and reads its current value."""
    counter = torch.tensor(3.0)
    buf = torch.zeros(4)

    def f(x):
        counter.add_(1)
        buf.index_copy_(0, torch.tensor([0]), x[:1])
        return x * (counter + 1)

    opt = trident.optimize(trident.capture(f, torch.ones(4)))
    assert counter.item() == 3.0 and torch.equal(buf, torch.zeros(4))  # capture ran nothing
    for step in range(3):
        x = torch.randn(4)
        torch.testing.assert_close(opt(x), x * (3.0 + step + 1 + 1))
        assert counter.item() == 3.0 + step + 1 and buf[0].item() == x[0].item()
