"""Note [Symbolic arena]: the placement order made at one set of sizes serves every other one.

For random buffer lifetimes and sizes: the order `symbolic_arena` derives from a first-fit
placement, placed again (`place_arena`, and the native twin run_plan uses) for other byte sizes,
never gives two buffers live at a common step overlapping bytes; at the planning sizes no offset
exceeds first fit's; the native placement equals the Python twin, and the native span of a
layout equals `arena_bytes`."""

from __future__ import annotations

import random

import pytest

from trident.runtime import native
from trident.scm.specialize import ARENA_ALIGN, arena_bytes, first_fit, place_arena, symbolic_arena


def _random_buffers(rng: random.Random, n: int, steps: int) -> list[tuple[int, int, int]]:
    out = []
    for _ in range(n):
        begin = rng.randrange(steps)
        end = min(steps - 1, begin + rng.choice([0, 1, 2, 5, steps]))
        nbytes = rng.choice([0, 256, 512, 1024, 4096, 256 * rng.randrange(1, 64)])
        out.append((begin, end, nbytes))
    return out


def _check_disjoint(buffers, offsets):
    for i, (b1, e1, n1) in enumerate(buffers):
        for j, (b2, e2, n2) in enumerate(buffers[:i]):
            if b1 <= e2 and b2 <= e1 and n1 and n2:  # live at a common step, both with bytes
                o1, o2 = offsets[i], offsets[j]
                assert o1 + n1 <= o2 or o2 + n2 <= o1, (i, j, buffers, offsets)


def _native_place(below, nbytes):
    """The native placement of fixed-size buffers (every byte size passed as a fixed size)."""
    table = [(-1, 0, 1, n, list(b)) for n, b in zip(nbytes, below)]
    return native.C.place_arena(table, [])


@pytest.mark.parametrize("seed", range(60))
def test_placement_order_serves_every_size(seed):
    rng = random.Random(seed)
    buffers = _random_buffers(rng, rng.randrange(2, 40), rng.randrange(2, 30))
    offsets, size = first_fit(buffers)
    _check_disjoint(buffers, offsets)
    order = symbolic_arena(buffers, offsets)
    assert sorted(order.order) == list(range(len(buffers)))

    def placed(nbytes_by_buffer):
        nbytes = [nbytes_by_buffer[i] for i in order.order]
        got, total = place_arena(order.below, nbytes)
        native_got, native_total = _native_place(order.below, nbytes)
        assert (list(native_got), native_total) == (got, total)
        by_buffer = [0] * len(buffers)
        for k, i in enumerate(order.order):
            by_buffer[i] = got[k]
        return by_buffer, total

    # at the planning sizes: valid and never above first fit
    again, total = placed([n for _, _, n in buffers])
    _check_disjoint(buffers, again)
    assert all(a <= o for a, o, (_, _, n) in zip(again, offsets, buffers) if n), (again, offsets)
    assert total <= size
    # at other sizes (including buffers empty at the planning sizes): valid
    for _ in range(20):
        resized = [(b, e, ARENA_ALIGN * rng.randrange(0, 200)) for b, e, _ in buffers]
        got, total = placed([n for _, _, n in resized])
        _check_disjoint(resized, got)
        assert total >= max((o + n for o, (_, _, n) in zip(got, resized)), default=0)
        assert all(o % ARENA_ALIGN == 0 for o in got)


def test_only_nearest_buffers_below_are_kept():
    # three buffers live together: the top one need only look at the middle one
    buffers = [(0, 5, 1024), (0, 5, 512), (0, 5, 256)]
    offsets, _ = first_fit(buffers)
    order = symbolic_arena(buffers, offsets)
    assert order.below == ((), (0,), (1,))


@pytest.mark.parametrize("seed", range(20))
def test_native_span_equals_python(seed):
    rng = random.Random(seed)
    for _ in range(200):
        rank = rng.randrange(0, 5)
        sizes = [rng.choice([0, 1, 2, 3, 15, 16, 17, 1000]) for _ in range(rank)]
        strides = [rng.choice([0, 1, 2, 16, 4096]) for _ in range(rank)]
        item = rng.choice([1, 2, 4, 8])
        table = [(0, rank, item, 0, [])]
        _, total = native.C.place_arena(table, sizes + strides)
        assert total == arena_bytes(sizes, strides, item), (sizes, strides, item)


@pytest.mark.parametrize(
    "sizes, strides, what",
    [([-1], [1], "negative"), ([3], [-2], "negative"), ([2**62, 4], [4, 2**62], "2\\*\\*63")],
)
def test_native_span_refuses_bad_layouts(sizes, strides, what):
    with pytest.raises(RuntimeError, match=what):
        native.C.place_arena([(0, len(sizes), 4, 0, [])], sizes + strides)
    with pytest.raises(RuntimeError, match="beyond"):
        native.C.place_arena([(3, 1, 4, 0, [])], [1, 1])
