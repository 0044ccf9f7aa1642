"""The native guards against Triton's own specializer (native_specialize_impl), the original
they reimplement, on well over 1000 generated cases each:
  * pointers: for every dtype Triton accepts and every element offset 0..15 (every reachable
    byte residue mod 16), the specialization the generated host code selects carries exactly
    the key Triton computes for that tensor;
  * integers: the host program's integer-key relation (sizes.int_key_condition, lowered through
    the torch dialect as every size guard is) holds for exactly the code of Triton's key, on
    boundary and random values, specialized and do_not_specialize.
"""

from __future__ import annotations

import random

import pytest
import sympy
import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

import trident
from tests import kernels as K
from tests.lowering.test_sizes_to_torch import _compile, _program
from trident import knobs
from trident.runtime import SCMRuntime
from trident.scm.sizes import INT_KEY_CODES, SizeExpr, int_key_condition

TRITON_DTYPES = [
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.int8, torch.int16, torch.int32, torch.int64,
    torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.bool,
    torch.float8_e4m3fn, torch.float8_e5m2,
]
N = 64


def triton_key(value, specialize=True, align=True):
    return native_specialize_impl(BaseBackend, value, False, specialize, align)


def copy_fn(x):
    out = torch.empty(N, dtype=torch.float32)
    K.int_ops_kernel[(1,)](x, out, N, 0, 1, False, BLOCK=N)
    return out


def test_pointer_keys_match_triton_for_every_dtype_and_offset():
    with knobs.scope(compile_cubin_on_cpu="0"):  # keys only: no cubins needed here
        opt = trident.optimize(trident.capture(copy_fn, torch.zeros(N)))
        (rid,) = opt.meta["trident_regions"]
        rt = SCMRuntime.get(rid)
        captured = rt.program.captured_inputs[0]
        for dt in TRITON_DTYPES:
            facts = type(captured)(dt, captured.device, captured.sizes, captured.strides)
            for aligned in (True, False):
                if dt == torch.float32 and aligned:
                    continue  # the captured specialization
                rt.add_specialization([facts], [0 if aligned else 4])
    rng = random.Random(1)
    cases = 0
    for dt in TRITON_DTYPES:
        for _ in range(5):  # fresh storages, so base addresses vary too
            base = torch.zeros(N + 16 + rng.randrange(0, 8), dtype=torch.uint8 if dt == torch.bool else dt)
            base = base.view(dt) if dt == torch.bool else base
            for offset in range(16):
                x = base[offset:offset + N]
                want = triton_key(x)
                index = rt.probe([x])
                assert index >= 0, (dt, offset)
                spec = rt.scm.specializations[index]
                got = spec.launches[0].key[0]
                assert got == want, (dt, offset, x.data_ptr() % 16, got, want)
                cases += 1
    assert cases >= 1000


def test_dtype_without_specialization_misses():
    opt = trident.optimize(trident.capture(copy_fn, torch.zeros(N)))
    (rid,) = opt.meta["trident_regions"]
    assert SCMRuntime.get(rid).probe([torch.zeros(N, dtype=torch.float16)]) == -1
    assert SCMRuntime.get(rid).probe([torch.zeros(N)]) == 0


@pytest.fixture(scope="module")
def int_key_fns():
    """(code, specialize) -> native `holds(v)`: the relation "the key of v is code" as the host
    program checks an IntegerKey guard, v being size 0 of a region input."""
    v = sympy.Symbol("s0", integer=True)  # no sign assumed: keys of negative values too
    cases = [(code, spec) for code in INT_KEY_CODES.values() for spec in (True, False)]
    fns, engine, _ = _compile(_program(), [SizeExpr(int_key_condition(v, code, spec)) for code, spec in cases])
    yield {case: (lambda x, f=f: f(x, 1, 1, 1, 1, 1)) for case, f in zip(cases, fns)}, engine


def _int_cases():
    edges = [0, 1, -1, 2, 15, 16, 17, 31, 32, 33, 2**31 - 1, 2**31, 2**31 + 1, -(2**31), -(2**31) - 1,
             2**32, 2**32 + 16, 2**63 - 1, 2**63 - 16, -(2**63), -(2**63) + 1, -16, -17, 1024, 4096]
    rng = random.Random(2)
    values = list(edges)
    for bits in (4, 8, 16, 31, 32, 40, 62, 63):
        for _ in range(80):
            v = rng.randrange(-(2**bits), 2**bits)
            values += [v, v * 16]
    values = [v for v in values if -(2**63) <= v < 2**63]
    return values


def test_int_keys_match_triton(int_key_fns):
    holds, _ = int_key_fns
    values = _int_cases()
    assert len(values) >= 1000
    for v in values:
        for spec in (True, False):
            want = INT_KEY_CODES[triton_key(v, spec)]
            got = [code for code in INT_KEY_CODES.values() if holds[(code, spec)](v)]
            assert got == [want], (v, spec, got, want)


def test_do_not_specialize_leaves_alignment_unguarded():
    """do_not_specialize_on_alignment: Triton keys x_ptr the same at any offset, so the SCM
    has no alignment guard for it and a misaligned input is a hit, not a miss."""
    opt = trident.optimize(trident.capture(K.unspecialized, torch.randn(64)))
    (rid,) = opt.meta["trident_regions"]
    rt = SCMRuntime.get(rid)
    (spec,) = rt.scm.specializations
    assert spec.guards[0].aligned16 is None
    assert spec.launches[0].key[:3] == (("*fp32", ""), ("*fp32", "D"), ("i32", None))
    for offset in range(16):
        x = torch.randn(80)[offset:offset + 64]
        assert triton_key(x, align=False) == spec.launches[0].key[0]
        torch.testing.assert_close(opt(x), x * 2)
    s = trident.cache_info(opt)[rt.program.name]
    assert (s["hits"], s["misses"], s["specializations"]) == (16, 0, 1)
