"""partition_regions: which runs of nodes become regions."""

from __future__ import annotations

import torch

import trident
from trident.passes.partition_regions import partition_regions


def _regions(fn, *example):
    part = partition_regions(trident.capture(fn, *example))
    return [[n.target for n in r.nodes] for r in part.regions]


def test_operator_calls_without_launches_make_a_region():
    """A model of ATen ops alone (HF's plain Llama) gets a region: its host work runs natively."""
    (region,) = _regions(lambda x, w: torch.relu(x @ w) * 2, torch.randn(4, 8), torch.randn(8, 8))
    assert torch.ops.aten.mm.default in region and torch.ops.aten.relu.default in region
    opt = trident.optimize(trident.capture(lambda x, w: torch.relu(x @ w) * 2, torch.randn(4, 8), torch.randn(8, 8)))
    assert sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) == 1
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(opt(x, w), torch.relu(x @ w) * 2)


def test_one_operator_or_factories_alone_stay_outside():
    assert _regions(lambda x: x.sin(), torch.randn(3)) == []
    # reads no tensor from outside: the dispatcher could not tell which device it runs on
    assert _regions(lambda n: torch.arange(5) * 2 + n, 3) == []
