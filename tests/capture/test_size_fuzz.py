"""Fuzz of symbolic captures (Note [Symbolic sizes]) over input metadata: dtypes, sizes 0, 1, 15,
16, 2**31 - 1, 2**31 and random ones, strides, storage offsets that break the 16-byte alignment.
For every case:
  * servable or not exactly as the symbolic trace's shape guards say (sizes and strides 0 and 1
    are specialized), computed here independently;
  * the specialization the native guards select carries the key Triton's own binder computes for
    the call's arguments (pointers' alignment; n, stride, n // 2, n - 1 as i32 / i64, % 16, == 1);
  * the Python twin of the guards (check_verbose, the size guards' check) selects the same one;
  * on the cases small enough to run, the optimized function equals the unoptimized one.
"""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

import trident
from trident import knobs
from trident.errors import GuardError
from trident.runtime import SCMRuntime
from trident.runtime.scm_module import check_verbose
from trident.scm.guards import first_failure
from trident.scm.specialize import _binder


@triton.jit
def fuzz_kernel(x_ptr, out_ptr, n, stride, half, last, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs * stride, mask=mask, other=0)
    tl.store(out_ptr + offs, v + (offs < half).to(v.dtype) + (offs == last).to(v.dtype), mask=mask)


def fuzz_fn(x):
    n = x.shape[0]
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    fuzz_kernel[(triton.cdiv(n, 64),)](x, out, n, x.stride(0), n // 2, n - 1, BLOCK=64)
    return out


def reference(x):
    n = x.shape[0]
    i = torch.arange(n)
    return x + (i < n // 2).to(x.dtype) + (i == n - 1).to(x.dtype)


DTYPES = [torch.float32, torch.float16, torch.int32, torch.int16]
SPECIAL = [0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4096, 2**31 - 1, 2**31, 2**31 + 15, 2**32 + 16]
RUN_LIMIT = 3000  # elements a case may address to be executed (the CPU runs kernels interpreted)


def _tensor(dtype, n, stride, offset, rng):
    """A tensor of n elements at element `offset` of its storage, `stride` apart; huge ones only
    with stride 0 (one element of storage)."""
    need = offset + (n - 1) * stride + 1 if n else offset + 1
    if need > 1 << 22:
        return None
    base = torch.randint(-50, 50, (need + 8,)).to(dtype)
    return base.as_strided((n,), (stride,), offset)


def _triton_key(x):
    out = torch.empty(max(x.shape[0], 1), dtype=x.dtype)  # fresh: aligned, as the plan's allocation
    n = x.shape[0]
    _, spec, _ = _binder(fuzz_kernel)(x, out, n, x.stride(0), n // 2, n - 1, BLOCK=64)
    return tuple((ty, attr) for ty, attr in spec)


def _python_select(rt, x):
    for spec in rt.scm.specializations:
        if any(check_verbose(g, [x][g.input]) for g in spec.guards):
            continue
        if first_failure(spec.size_guards, [x]) is None:
            return spec.index
    return -1


@pytest.mark.parametrize("example", ["strided", "broadcast"])
def test_random_input_metadata_against_triton_and_eager(example):
    rng = random.Random(11 if example == "strided" else 12)
    cases = servable = ran = 0
    keys = set()
    for dtype in DTYPES:
        if example == "strided":  # stride 3: the stride is a symbol (>= 2, as sizes are)
            x0 = torch.zeros(900, dtype=dtype)[::3]
        else:  # stride 0: static; the size alone is a symbol
            x0 = torch.zeros(1, dtype=dtype).expand(300)
        opt = trident.optimize(trident.capture(fuzz_fn, x0, dynamic=True))
        (rid,) = opt.meta["trident_regions"]
        rt = SCMRuntime.get(rid)
        assert rt.program.symbolic
        for i in range(1300):
            n = rng.choice(SPECIAL) if rng.random() < 0.4 else rng.randrange(0, 5000)
            if example == "strided":
                stride = rng.choice([0, 1, 2, 3, 16, 17]) if n < 1 << 21 else 0
            else:
                stride = 0 if rng.random() < 0.9 else rng.choice([1, 2])
            offset = rng.randrange(0, 8)
            x = _tensor(dtype, n, stride, offset, rng)
            if x is None:
                continue
            cases += 1
            expect = n >= 2 and (stride >= 2 if example == "strided" else stride == 0)
            with knobs.scope(compile_cubin_on_cpu="0"):
                index = rt.probe([x])
                if index < 0:
                    try:
                        rt._on_miss(rid, [x])
                    except GuardError:
                        assert not expect, (dtype, n, stride, offset)
                        assert rt.probe([x]) == -1
                        continue
                    index = rt.probe([x])
            assert expect, (dtype, n, stride, offset, "served though the trace's guards exclude it")
            assert index >= 0
            servable += 1
            spec = rt.scm.specializations[index]
            assert spec.launches[0].key == _triton_key(x), (dtype, n, stride, offset)
            keys.add(spec.launches[0].key)
            assert _python_select(rt, x) == index, (dtype, n, stride, offset)
            span = (n - 1) * stride + 1
            if span <= RUN_LIMIT and n <= RUN_LIMIT and ran < 60 * (DTYPES.index(dtype) + 1):
                torch.testing.assert_close(opt(x), reference(x))
                ran += 1
    ints = {k for key in keys for k in key[2:6]}
    # the integer keys seen: == 1 (folded), % 16, and i64 where sizes pass 2**31 (stride 0 only)
    assert ("constexpr", 1) in ints and ("i32", "D") in ints and ("i32", "") in ints
    if example == "broadcast":
        assert ("i64", "D") in ints or ("i64", "") in ints
    assert cases >= 5000 and servable >= 1000 and ran >= 100, (cases, servable, ran)
