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
