"""Layout arithmetic on (sizes, strides) in elements, shared by the passes, the planner and the
guards. torch's own helpers are used where they exist: `dtype.itemsize`,
`torch._prims_common.make_contiguous_strides_for`, `Tensor.is_contiguous`; what torch offers only
on tensors (overlap, density) is here on plain sizes and strides, which the planner has before
any tensor exists."""

from __future__ import annotations

from typing import Sequence

import torch
from torch._prims_common import make_contiguous_strides_for


def max_offset(sizes: Sequence[int], strides: Sequence[int]) -> int:
    """The largest element offset the layout reaches (strides are non-negative in torch)."""
    return sum((sz - 1) * st for sz, st in zip(sizes, strides))


def span(sizes: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from the first to the last one the layout addresses (0 when empty)."""
    if not all(sizes):
        return 0
    return max_offset(sizes, strides) + 1


def span_bytes(t: torch.Tensor) -> int:
    """Bytes from t's first element to the end of its last (0 when empty): what native code
    compares (span_bytes in trident/csrc/scm_runtime.cpp)."""
    return span(t.shape, t.stride()) * t.dtype.itemsize


def non_overlapping(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Provably no two indices reach one element (sufficient, not necessary: a layout it cannot
    prove is treated as overlapping)."""
    dims = sorted((st, sz) for sz, st in zip(sizes, strides) if sz > 1)
    reach = 0  # largest offset reachable with the dims so far
    for st, sz in dims:
        if st <= reach:
            return False
        reach += st * (sz - 1)
    return True


def dense(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Non-overlapping and dense (torch's is_non_overlapping_and_dense on plain sizes): some
    order of the dims is contiguous, size-1 dims aside."""
    expected = 1
    for st, sz in sorted((st, sz) for sz, st in zip(sizes, strides) if sz != 1):
        if st != expected:
            return False
        expected *= sz
    return True


def contiguous(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Row-major contiguous, size-1 dims' strides ignored (as Tensor.is_contiguous)."""
    want = make_contiguous_strides_for(tuple(sizes)) if sizes else ()
    return all(sz == 1 or st == w for sz, st, w in zip(sizes, strides, want))
