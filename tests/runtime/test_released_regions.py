"""Note [Released regions]: a region lives as long as the optimized graph that calls it. Dropped
graphs (a module let go, trident.compile's capture bound, torch._dynamo.reset()) release their
regions: the registry stays bounded, and a released id refuses to run (issue 23: 300 shapes used
to keep 300 regions, and their memory, for good)."""

from __future__ import annotations

import gc

import pytest
import torch

import trident
from tests.kernels import axpy, axpy_ref, two_kernels
from trident import knobs
from trident.runtime import scm_module
from trident.runtime.native import C


def _live() -> int:
    gc.collect()
    return len(scm_module._REGISTRY)


def test_dropped_optimized_graphs_release_their_regions():
    start = _live()
    ids = []
    for n in range(100, 110):
        x, y = torch.randn(n), torch.randn(n)
        with knobs.scope(graphs="all", graph_min_saving_us="-inf"):
            opt = trident.optimize(trident.capture(two_kernels, x, y))
        for _ in range(4):  # graphs recorded and replayed: retired on release
            opt(x, y)
        ids += opt.meta["trident_regions"]
    kept = opt
    del opt
    assert _live() == start + len(kept.meta["trident_regions"])
    with pytest.raises(RuntimeError, match="was released: the optimized graph it belonged to was garbage collected"):
        C.run_native(ids[0], [torch.randn(100), torch.randn(100)])
    x, y = torch.randn(109), torch.randn(109)
    torch.testing.assert_close(kept(x, y), two_kernels(x, y))  # the live one is untouched


def test_trident_compile_over_many_shapes_keeps_the_registry_bounded():
    start = _live()
    f = trident.compile(axpy, dynamic=False)
    for n in range(100, 124):
        x, y = torch.randn(n), torch.randn(n)
        for _ in range(2):
            torch.testing.assert_close(f(x, y), axpy_ref(x, y))
    assert len(f.captures) <= knobs.captures()
    assert _live() - start <= knobs.captures()
    del f
    assert _live() == start


def test_dynamo_reset_releases_the_backends_regions():
    torch._dynamo.reset()
    start = _live()
    g = torch.compile(axpy, backend="trident")
    x, y = torch.randn(100), torch.randn(100)
    for _ in range(3):
        torch.testing.assert_close(g(x, y), axpy_ref(x, y))
    assert _live() > start
    torch._dynamo.reset()
    del g
    assert _live() == start


def test_released_region_slots_are_reused_under_new_ids():
    """Note [Region ids]: the registry holds the regions alive, not every region ever made: a
    released region's slot serves later regions under new ids, and every released id still
    refuses to run (it never reaches the region now in its slot)."""
    from trident.runtime import native

    x, y = torch.randn(100), torch.randn(100)
    gc.collect()
    before = native.table_usage()["region"]["slots"]
    ids = []
    for _ in range(20):
        opt = trident.optimize(trident.capture(two_kernels, x, y))
        ids += opt.meta["trident_regions"]
        torch.testing.assert_close(opt(x, y), two_kernels(x, y))
        del opt
        gc.collect()
    keep = trident.optimize(trident.capture(two_kernels, x, y))
    assert len(set(ids)) == 20 and not set(ids) & set(keep.meta["trident_regions"])
    assert native.table_usage()["region"]["slots"] <= before + 2  # without reuse: + 21
    for old in ids:
        with pytest.raises(RuntimeError, match="was released"):
            C.run_native(old, [x, y])
    torch.testing.assert_close(keep(x, y), two_kernels(x, y))


def _glued(x, y):
    """Operator calls, a view and Triton launches: an entry in each native table."""
    h = torch.sin(x).view(2, -1).t().contiguous().view(-1)
    return two_kernels(h, y) + 1


def test_released_regions_give_their_native_table_slots_back():
    """Note [Recycled table slots]: optimized graphs of ever new shapes made and dropped (a
    server replacing captures) stop growing the native tables: the slots of destroyed regions
    are recycled, graphs built on recycled slots compute what eager computes, and a live graph's
    entries are never taken from it."""
    from trident.runtime import native

    kept_x, kept_y = torch.randn(98), torch.randn(98)
    kept = trident.optimize(trident.capture(_glued, kept_x, kept_y))
    usage = []
    for n in range(200, 260, 2):
        x, y = torch.randn(n), torch.randn(n)
        opt = trident.optimize(trident.capture(_glued, x, y))
        shifted = torch.randn(n + 1)[1:]  # a second specialization
        for a in (x, shifted):
            torch.testing.assert_close(opt(a, y), _glued(a, y))
        del opt
        gc.collect()
        usage.append({k: v["slots"] for k, v in native.table_usage().items()})
    # without recycling every table grows with each new shape (7 aten, 2 alloc ... entries each)
    assert usage[-1] == usage[10], (usage[10], usage[-1])  # (kernels: one per Triton key, both seen by then)
    assert all(usage[-1][t] > 0 for t in ("kernel", "alloc", "aten", "view", "plan")), usage[-1]
    torch.testing.assert_close(kept(kept_x, kept_y), _glued(kept_x, kept_y))


def test_recycling_while_other_threads_plan_and_call():
    """Note [Recycled table slots] under threads: graphs are made, called and dropped on three
    threads (each drop frees slots the next registration on any thread may take) while a fourth
    keeps calling a live graph; every result equals eager's."""
    import threading

    kept_x, kept_y = torch.randn(98), torch.randn(98)
    kept = trident.optimize(trident.capture(_glued, kept_x, kept_y))
    want = _glued(kept_x, kept_y)
    errors, stop = [], threading.Event()

    def churn(base):
        try:
            for n in range(base, base + 24, 2):
                x, y = torch.randn(n), torch.randn(n)
                opt = trident.optimize(trident.capture(_glued, x, y))
                torch.testing.assert_close(opt(x, y), _glued(x, y))
                del opt
                gc.collect()
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    def call():
        try:
            while not stop.is_set():
                torch.testing.assert_close(kept(kept_x, kept_y), want)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(b,)) for b in (300, 400, 500)]
    caller = threading.Thread(target=call)
    caller.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    caller.join()
    assert not errors, errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and device memory: needs a GPU")
def test_dropped_graphs_give_their_device_memory_back_cuda():
    """Note [Released regions] on CUDA: optimized graphs that recorded and replayed CUDA graphs,
    dropped, return the device memory their graphs' private pools and buffers held (to the
    caching allocator: reserved memory can be emptied again), over repeated create/drop cycles."""
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")

    def cycle():
        with knobs.scope(graph_min_saving_us="-inf"):  # a graph even where replays save little
            opt = trident.optimize(trident.capture(two_kernels, x, y))
            for _ in range(6):  # recorded after 2 ordinary calls, then replayed
                torch.testing.assert_close(opt(x, y), two_kernels(x, y))
        stats = trident.cache_info(opt)
        assert sum(v.get("graph_replays", 0) for v in stats.values()) > 0, stats
        del opt

    cycle()  # warm: kernels loaded, the allocator's own blocks made
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base_allocated, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for _ in range(5):
        cycle()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() <= base_allocated
    assert torch.cuda.memory_reserved() <= base_reserved + (2 << 20)
