"""Note [One capture cache]: one bound and one overflow policy for both front doors (the
backend's side: tests/capture/test_dynamo.py, the TRIDENT_CAPTURES=2 case)."""

from __future__ import annotations

import torch
import triton

import trident
from tests import kernels as K
from trident import knobs


def _axpy(x, y):
    out = torch.empty_like(x)
    K.axpy_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), 2.0, BLOCK=64)
    return out


def test_past_the_bound_new_signatures_run_eagerly():
    """TRIDENT_CAPTURES=2: a trident.compile'd function's third static signature runs eagerly
    (correctly), said in eager_log; the first two keep hitting, none is dropped."""
    with knobs.scope(captures=2):
        compiled = trident.compile(_axpy, dynamic=False)
        for n in (64, 128, 192, 64, 128, 192):
            for _ in range(2):
                x, y = torch.randn(n), torch.randn(n)
                torch.testing.assert_close(compiled(x, y), 2.0 * x + y)
    assert len(compiled.captures) == 2
    assert "past TRIDENT_CAPTURES=2 captures of this function" in compiled.eager_log[-1]
    hits = [v["hits"] for opt in compiled.captures.values() for v in trident.cache_info(opt).values()]
    assert hits == [3, 3]  # 64 and 128: captured at their second call, then hit twice more
    assert compiled.eager_calls == 3 + 3  # the first call of each size, then 192 past the bound three times
