"""Native views (scm/specialize.py plan_views, csrc rt_view) against eager on many random view
chains: the region materializes each chain natively from the planned layout, an operator then
reads it; results must equal eager's. Views only a kernel reads (address-only) are checked on
contiguous slices."""

from __future__ import annotations

import random

import pytest
import torch

import trident
from tests import kernels as K


def _random_chain(rng: random.Random, shape):
    """A list of (name, fn) view ops valid for a tensor of `shape`, applied in order."""
    ops = []
    shape = list(shape)
    for _ in range(rng.randrange(1, 5)):
        kind = rng.choice(["slice", "transpose", "unsqueeze", "select", "expand", "permute", "narrow"])
        nd = len(shape)
        if kind == "slice" and nd:
            d = rng.randrange(nd)
            if shape[d] < 2:
                continue
            start = rng.randrange(shape[d] - 1)
            step = rng.choice([1, 1, 2])
            ops.append(lambda t, d=d, s=start, st=step: t.narrow(d, 0, t.shape[d])[(slice(None),) * d + (slice(s, None, st),)])
            shape[d] = len(range(start, shape[d], step))
        elif kind == "narrow" and nd:
            d = rng.randrange(nd)
            if shape[d] < 2:
                continue
            length = rng.randrange(1, shape[d])
            ops.append(lambda t, d=d, n=length: t.narrow(d, 1, n - 1) if n > 1 else t.narrow(d, 0, 1))
            shape[d] = max(length - 1, 1) if length > 1 else 1
        elif kind == "transpose" and nd >= 2:
            a, b = rng.sample(range(nd), 2)
            ops.append(lambda t, a=a, b=b: t.transpose(a, b))
            shape[a], shape[b] = shape[b], shape[a]
        elif kind == "permute" and nd >= 2:
            perm = list(range(nd))
            rng.shuffle(perm)
            ops.append(lambda t, p=tuple(perm): t.permute(p))
            shape = [shape[i] for i in perm]
        elif kind == "unsqueeze":
            d = rng.randrange(nd + 1)
            ops.append(lambda t, d=d: t.unsqueeze(d))
            shape.insert(d, 1)
        elif kind == "select" and nd >= 2:
            d = rng.randrange(nd)
            i = rng.randrange(shape[d])
            ops.append(lambda t, d=d, i=i: t.select(d, i))
            shape.pop(d)
        elif kind == "expand" and 1 in shape:
            d = shape.index(1)
            new = list(shape)
            new[d] = 3
            ops.append(lambda t, s=tuple(new): t.expand(s))
            shape = new
    return ops


@pytest.mark.parametrize("seed", range(40))
def test_view_chains_match_eager(seed):
    rng = random.Random(seed)
    shape = rng.choice([(6, 8), (4, 5, 6), (2, 3, 4, 5), (64,)])
    chains = [_random_chain(rng, shape) for _ in range(5)]

    def apply(chain, t):
        for op in chain:
            t = op(t)
        return t

    def fn(x, y):
        base = K.axpy(y, y)  # a launch, so this is a region
        outs = [apply(c, x).contiguous() * 1.0 for c in chains]
        return [base] + outs

    x = torch.randn(shape)
    y = torch.randn(1000)
    opt = trident.optimize(trident.capture(fn, x, y))
    assert sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) == 1
    if any(chains):
        assert "native view" in trident.scm_text(opt)
    for _ in range(2):
        x, y = torch.randn(shape), torch.randn(1000)
        got = opt(x, y)
        want = [K.axpy_ref(y, y)] + [apply(c, x).contiguous() * 1.0 for c in chains]
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("start", [0, 1, 4, 7, 16, 100])
def test_address_only_slices(start):
    def fn(x):
        out = torch.empty(256)
        K.axpy_kernel[(2,)](x[start:start + 256], x[start:start + 256], out, 256, 1.0, BLOCK=128)
        return out

    x = torch.randn(512)
    opt = trident.optimize(trident.capture(fn, x))
    assert "address only" in trident.scm_text(opt)
    for _ in range(2):
        x = torch.randn(512)
        torch.testing.assert_close(opt(x), 2 * x[start:start + 256])


@pytest.mark.parametrize("offset", [0, 4, 5])
def test_as_strided_counts_from_its_storage_start(offset):
    """as_strided's storage offset is absolute: on an input that starts `offset` elements into
    its storage it is the operator's (the plan counts from each input's first element)."""

    def fn(x):
        v = torch.as_strided(x, (64,), (1,), 2)
        out = torch.empty(64)
        K.axpy_kernel[(1,)](v, v, out, 64, 1.0, BLOCK=64)
        return out

    opt = trident.optimize(trident.capture(fn, torch.randn(128)))
    for _ in range(2):
        base = torch.randn(256)
        x = base[offset:offset + 128]
        torch.testing.assert_close(opt(x), fn(x))
