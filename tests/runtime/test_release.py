"""Note [Early release]: values leave the value table after the last step touching their
storage, so a region's peak memory follows eager's instead of holding every temporary."""

from __future__ import annotations

import pytest
import torch
import triton

import trident
from tests.kernels import axpy_kernel
from trident import knobs
from trident.runtime import SCMRuntime
from trident.scm.printer import program_value_names


def _axpy(x, y, out, alpha):
    n = x.numel()
    axpy_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, alpha, BLOCK=1024)
    return out


def chain(x):
    y = _axpy(x, x, torch.empty_like(x), 1.0)  # 2x        (dead after the mul)
    z = torch.mul(y, 2.0)  # 4x, an operator result        (dead after the next launch)
    return _axpy(z, z, torch.empty_like(x), 1.0)  # 8x, the output


def _optimized(x, **knob_values):
    with knobs.scope(graphs="", **knob_values):
        return trident.optimize(trident.capture(chain, x))


def _releases(opt):
    (rid,) = opt.meta["trident_regions"]
    (spec,) = SCMRuntime.get(rid).scm.specializations
    names = program_value_names(spec)
    return {step: sorted(names[s] for s in slots) for step, slots in spec.releases.items()}


def test_release_plan_drops_temporaries_after_their_last_use():
    x = torch.randn(4096)
    opt = _optimized(x)
    # steps: 0 empty_like, 1 launch, 2 mul, 3 empty_like_1, 4 launch; the output is never released
    assert _releases(opt) == {2: ["empty_like"], 4: ["mul"]}
    torch.testing.assert_close(opt(x), 8.0 * x)
    off = _optimized(x, native_paths="views,constants,typed,gemm,arena")
    assert _releases(off) == {}
    torch.testing.assert_close(off(x), 8.0 * x)


@pytest.mark.cuda
def test_peak_memory_follows_eager():
    x = torch.randn(16 << 20, device="cuda")  # 64 MiB
    mib = 1 << 20

    def peak(fn):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn(x)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) // mib, out

    with_release, out = peak(_optimized(x))
    without, out_off = peak(_optimized(x, native_paths="views,constants,typed,gemm,arena"))
    torch.testing.assert_close(out, 8.0 * x)
    torch.testing.assert_close(out_off, 8.0 * x)
    # above x: y and z live together, then y is freed before w: 2 buffers at the peak, not 3
    assert with_release <= 2 * 64 + 2 and without >= 3 * 64, (with_release, without)
