"""trident.profile(): per-service host time of SCM calls, counted exactly."""

from __future__ import annotations

import functools

import torch

import trident
from tests.decode_model import Config, decode_step, make_caches, make_weights


def test_profile_counts_every_service_call(device):
    cfg = Config(layers=2)
    weights, cos, sin = make_weights(cfg, device)
    caches = make_caches(cfg, device)
    step = functools.partial(decode_step, cfg)
    args = (torch.randn(1, cfg.hidden, device=device), torch.tensor([3], device=device), cos, sin, *caches, *weights)
    # every call runs the host program (graph replay: below); aten::mm stays cuBLAS's and the glue
    # ATen ops (CUDA's defaults measure GEMVs and fuse the glue)
    with trident.knobs.scope(graphs="", decode_matmuls="", fuse_glue=""):
        opt = trident.optimize(trident.capture(step, *args))
    opt(*args)  # compiled and warm: the profile below sees hits only
    (rid,) = opt.meta["trident_regions"]
    rt = trident.runtime.SCMRuntime.get(rid)
    program = rt.program
    # Views only kernels read are never executed (their address is computed in the host program).
    address_only = sum(v.pointer_only for v in rt.scm.specializations[0].views.values())
    with trident.profile() as prof:
        for _ in range(3):
            opt(*args)
    by_kind: dict[str, int] = {}
    for r in prof.rows:
        by_kind[r.kind] = by_kind.get(r.kind, 0) + r.calls
        assert r.ns >= 0
    assert prof.host_calls() == 3 and prof.calls() == 3
    assert by_kind["launch"] == 3 * len(program.launches)
    assert by_kind["alloc"] == 3 * len(program.allocs)
    # Every operator step is either a native view or an operator call (views fall back to one).
    assert by_kind.get("view", 0) + sum(by_kind.get(k, 0) for k in ("gemm", "typed", "boxed", "constant")) >= 3 * (len(program.atens) - address_only)
    names = {r.name for r in prof.grouped()}
    assert "aten::mm" in names and "rmsnorm_kernel" in names, names
    table = prof.table()
    assert table.splitlines()[0].split()[:2] == ["kind", "name"] and "us/step" in table
    # Off again: later calls add nothing.
    before = sum(r.calls for r in prof.rows)
    opt(*args)
    assert sum(row[2] for row in trident.runtime.native.C.profile_report()) == before


def test_profile_counts_graph_replays(device):
    """With graph replay, each call is counted once (kind call); replays under kind graph."""
    cfg = Config(layers=1)
    weights, cos, sin = make_weights(cfg, device)
    caches = make_caches(cfg, device)
    step = functools.partial(decode_step, cfg)
    xs = [torch.randn(1, cfg.hidden, device=device) for _ in range(5)]
    pos = [torch.tensor([p], device=device) for p in range(5)]
    with trident.knobs.scope(graphs="all" if device == "cpu" else "cuda"):
        opt = trident.optimize(trident.capture(step, xs[0], pos[0], cos, sin, *caches, *weights))
    for i in range(2):  # two ordinary calls: recorded after these
        opt(xs[i], pos[i], cos, sin, *caches, *weights)
    with trident.profile() as prof:
        for i in range(2, 5):
            opt(xs[i], pos[i], cos, sin, *caches, *weights)
    by_kind = {r.kind: r.calls for r in prof.grouped() if r.kind in ("call", "graph")}
    assert by_kind == {"call": 3, "graph": 3}
    assert prof.calls() == 3
    assert prof.as_json()[0]["calls_per_step"] == 1.0
