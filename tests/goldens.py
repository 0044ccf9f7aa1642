"""The fixed graphs every golden test uses (and tools/print_artifacts.py prints)."""

from __future__ import annotations

import torch

import trident
from tests import kernels as K


def axpy_graph():
    x, y = torch.randn(1000), torch.randn(1000)
    gm = trident.capture(K.axpy, x, y)
    return gm, trident.optimize(gm)


def mixed_graph():
    """Two regions: launches, then an ATen op that cuts, then an in-place launch."""

    def fn(x, y):
        t = K.two_kernels(x, y)
        u = t.sin()
        return K.inplace_mul(u)

    x, y = torch.randn(777), torch.randn(777)
    gm = trident.capture(fn, x, y)
    return gm, trident.optimize(gm)
