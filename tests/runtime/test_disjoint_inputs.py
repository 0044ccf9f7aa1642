"""Note [Inputs a lowered index write must not overlap]: a lowered index_copy_ / index_put_
between two region inputs raises, like eager, when the caller passes overlapping tensors."""

from __future__ import annotations

import pytest
import torch
import triton

import trident
from tests.kernels import inplace_mul_kernel
from trident import knobs
from trident.runtime import SCMRuntime


def _write_rows(cache, src, idx):
    cache.index_copy_(0, idx, src)
    n = cache.numel()
    inplace_mul_kernel[(triton.cdiv(n, 64),)](cache, n, 2.0, BLOCK=64)
    return cache


def _reference(cache, src, idx):
    cache.index_copy_(0, idx, src)
    cache.mul_(2.0)
    return cache


@pytest.fixture
def opt():
    cache, src, idx = torch.zeros(8, 4), torch.zeros(2, 4), torch.tensor([0, 1])
    with knobs.scope(triton_copies="all"):  # lowered on the CPU too
        gm = trident.optimize(trident.capture(_write_rows, cache, src, idx))
    (rid,) = gm.meta["trident_regions"]
    kernels = [s.kernel_name for s in SCMRuntime.get(rid).program.launches]
    assert "index_copy_kernel" in kernels, kernels  # the index write is a launch, not ATen's
    return gm


def test_distinct_and_disjoint_inputs_run(opt):
    idx = torch.tensor([5, 2])
    cache, src = torch.randn(8, 4), torch.randn(2, 4)
    want = _reference(cache.clone(), src, idx)
    torch.testing.assert_close(opt(cache, src, idx), want)
    # one storage, disjoint bytes: eager accepts it, so does the region
    buf = torch.randn(10, 4)
    cache, src = buf[:8], buf[8:]
    want = _reference(cache.clone(), src.clone(), idx)
    torch.testing.assert_close(opt(cache, src, idx), want)


def test_overlapping_source_raises_like_eager(opt):
    buf = torch.randn(8, 4)
    idx = torch.tensor([0, 1])
    with pytest.raises(RuntimeError, match="unsupported operation"):
        buf.index_copy_(0, idx, buf[4:6])  # eager
    before = buf.clone()
    with pytest.raises(RuntimeError, match=r"writes input 'cache' and reads input 'src' .*overlap in memory"):
        opt(buf, buf[4:6], idx)
    torch.testing.assert_close(buf, before)  # nothing ran
