"""The fixed graphs every golden test uses (and tools/print_artifacts.py prints)."""

from __future__ import annotations

import torch

import trident
from tests import kernels as K


def axpy_graph():
    x, y = torch.randn(1000), torch.randn(1000)
    gm = trident.capture(K.axpy, x, y)
    return gm, trident.optimize(gm)


def python_scale(t: torch.Tensor) -> torch.Tensor:
    """A Python callable in the graph: no schema, so it cuts the region."""
    return t * 0.5


def mixed_graph():
    """Launches and ATen ops in one region, a Python callable that cuts, an in-place launch
    on the cut's result in a second region."""

    def fn(x, y):
        t = K.two_kernels(x, y)
        u = t.sin()
        return K.inplace_mul(u)

    x, y = torch.randn(777), torch.randn(777)
    gm = trident.capture(fn, x, y)
    sin = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.sin.default)
    with gm.graph.inserting_after(sin):
        cut = gm.graph.call_function(python_scale, (sin,))
    cut.meta["val"] = sin.meta["val"]
    for user in list(sin.users):
        if user is not cut:
            user.replace_input_with(sin, cut)
    gm.recompile()
    return gm, trident.optimize(gm)


def tuned_graph():
    """An autotuned launch (first config: no GPU to time on) feeding a heuristics launch."""
    K.tuned_scale_kernel.cache.clear()

    def fn(x):
        return K.heuristic_double(K.tuned_scale(x))

    x = torch.randn(777)
    gm = trident.capture(fn, x)
    return gm, trident.optimize(gm)
