"""Note [Loop variables under the interpreter]: a kernel that calls a method of its loop variable
(`i.to(tl.int64)`, as flash-linear-attention's chunk kernels do) runs on the CPU as compiled,
eagerly and captured; static_range loops keep constexpr variables."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import trident


@triton.jit
def _chunk_prefix_kernel(x_ptr, out_ptr, n_chunks, CHUNK: tl.constexpr):
    """out's chunk i = the sum of x's chunks 0..i, plus i (counted by a loop bounded by i), plus
    3 (from a static loop whose variable must stay a constexpr: it sizes an arange)."""
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    extra = 0.0
    for s in tl.static_range(1, 3):
        extra += tl.sum(tl.full([CHUNK * s], 1.0, tl.float32)) / (CHUNK * s) * s
    for i in range(n_chunks):
        i64 = i.to(tl.int64)  # an int of the interpreter has no .to: the loop variable must be a tensor
        offs = i64 * CHUNK + tl.arange(0, CHUNK)
        acc += tl.load(x_ptr + offs)
        count = 0.0
        for _ in tl.range(0, i):
            count += 1.0
        tl.store(out_ptr + offs, acc + count + extra)


CHUNK = 16


def _prefix(x):
    out = torch.empty_like(x)
    _chunk_prefix_kernel[(1,)](x, out, x.numel() // CHUNK, CHUNK=CHUNK)
    return out


def _reference(x):
    parts = x.view(-1, CHUNK).cumsum(0)
    return (parts + torch.arange(parts.shape[0], dtype=x.dtype, device=x.device)[:, None] + 3.0).reshape(-1)


def test_loop_variables_are_tensors_eagerly_and_captured(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5 * 16, generator=g).to(device)
    torch.testing.assert_close(_prefix(x), _reference(x))  # the user's own launch
    opt = trident.optimize(trident.capture(_prefix, x))  # the region's launch (native runtime, interpreted)
    torch.testing.assert_close(opt(x.neg()), _reference(x.neg()))
    compiled = trident.compile(_prefix)  # new sizes: new loop bounds
    for n in (5, 7, 7, 9):
        y = torch.randn(n * 16, generator=g).to(device)
        torch.testing.assert_close(compiled(y), _reference(y))
    assert compiled.captures


@triton.jit
def _count_kernel(out_ptr, n):
    total = tl.zeros([1], dtype=tl.int64)
    for i in range(n):
        total += i.to(tl.int64)
    tl.store(out_ptr + tl.arange(0, 1), total)


@pytest.mark.skipif(torch.cuda.is_available(), reason="eager launches on CPU tensors need Trident's host-only driver")
def test_a_rewrite_made_without_the_rule_is_not_reused():
    """Triton keeps one rewritten function per kernel for the process: one made by Triton's own
    interpreter first (as under TRITON_INTERPRET=1) lacks the rule, and Trident does not reuse it."""
    from triton.runtime import interpreter as interp

    interp.InterpretedFunction(_count_kernel.fn).rewrite()  # Triton's own rewrite, cached by Triton
    out = torch.zeros(1, dtype=torch.int64)
    _count_kernel[(1,)](out, 5)  # on the CPU: through Trident's host-only driver
    assert out.item() == 10


@triton.jit
def _tiled_copy_kernel(x_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    """Liger-Kernel's MoE gather indexes its tiles so: a static tile index times a constexpr plus
    an arange, then `.to(...)` -- a tensor only where BLOCK is the bare value Triton's executor
    passes (a tl.constexpr wrapper makes the sum a constexpr holding a tensor, with no `.to`)."""
    for t in tl.static_range(triton.cdiv(N, BLOCK)):
        idx = (t * BLOCK + tl.arange(0, BLOCK)).to(tl.uint32)
        tl.store(out_ptr + idx, tl.load(x_ptr + idx, mask=idx < N) * 2.0, mask=idx < N)


def _tiled_copy(x):
    out = torch.empty_like(x)
    _tiled_copy_kernel[(1,)](x, out, N=x.numel(), BLOCK=16)
    return out


def test_constexpr_arguments_are_bare_values_as_tritons_executor_passes(device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(40, generator=g).to(device)
    torch.testing.assert_close(_tiled_copy(x), x * 2)  # the user's own launch
    opt = trident.optimize(trident.capture(_tiled_copy, x))  # the region's launch (interpreted on the CPU)
    y = torch.randn(40, generator=g).to(device)
    torch.testing.assert_close(opt(y), y * 2)
