"""A 2-layer decode step (own Triton kernels + ATen matmuls, attention, cache writes, views)
optimizes to exactly ONE trident.scm node; results and cache contents equal eager over several
positions; the caches are mutated in place, as eager mutates them."""

from __future__ import annotations

import functools

import pytest
import torch

import trident
from tests.decode_model import Config, decode_step, decode_step_reference, make_caches, make_weights


@pytest.mark.parametrize("batch", [1, 3])
def test_decode_step_is_one_region_and_matches_eager(device, batch):
    cfg = Config()
    weights, cos, sin = make_weights(cfg, device)
    step = functools.partial(decode_step, cfg)
    x0 = torch.randn(batch, cfg.hidden, device=device)
    pos0 = torch.tensor([0], device=device)
    gm = trident.capture(step, x0, pos0, cos, sin, *make_caches(cfg, device, batch=batch), *weights)
    opt = trident.optimize(gm)
    calls = [n for n in opt.graph.nodes if n.op == "call_function"]
    scm = [n for n in calls if n.target is torch.ops.trident.scm.default]
    assert len(scm) == 1, opt.code
    assert all(n.target is torch.ops.trident.scm.default or "getitem" in str(n.target) for n in calls), opt.code

    caches = make_caches(cfg, device, batch=batch)
    ref_caches = make_caches(cfg, device, batch=batch)
    for p in range(6):
        x = torch.randn(batch, cfg.hidden, device=device)
        pos = torch.tensor([p], device=device)
        got = opt(x, pos, cos, sin, *caches, *weights)
        want = decode_step_reference(cfg, x.clone(), pos, cos, sin, *ref_caches, *weights)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        for c, r in zip(caches, ref_caches):
            torch.testing.assert_close(c, r, rtol=1e-4, atol=1e-4)
    (stats,) = trident.cache_info(opt).values()
    assert stats["misses"] == 0 and stats["hits"] == 6 and stats["specializations"] == 1
