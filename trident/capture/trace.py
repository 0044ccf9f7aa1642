"""trident.capture: plain Python functions that launch Triton kernels -> FX GraphModule.

Kernels are launched the way users write them (`kernel[grid](...)`, grid a tuple or
`lambda meta: ...`), through `torch.library.wrap_triton`, or inside `torch.library.triton_op`s.
The function is traced with make_fx on fake tensors; while tracing, `kernel[grid]` is routed
through `wrap_triton`, so every launch becomes a `triton_kernel_wrapper_mutation` node and
ATen ops around it become ATen nodes. Nothing runs on a device during capture.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from triton.runtime.jit import KernelInterface

from ..errors import CaptureError
from .host_driver import ensure_triton_driver
from .inline_triton_ops import has_triton_ops, inline_triton_ops


@contextlib.contextmanager
def _launches_as_hops():
    """Route `kernel[grid]` through wrap_triton for the duration of a trace."""
    original = KernelInterface.__getitem__

    def traced_getitem(self, grid):
        return torch.library.wrap_triton(self)[grid]

    KernelInterface.__getitem__ = traced_getitem
    try:
        yield
    finally:
        KernelInterface.__getitem__ = original


def capture(fn: Callable[..., Any], *example_inputs: Any) -> torch.fx.GraphModule:
    """Trace `fn(*example_inputs)` into an FX GraphModule of ATen ops and Triton launches.

    Tensor inputs become placeholders; sizes are those of the examples (static capture).
    Non-tensor inputs are captured as the constants they were: the optimized module checks
    them on every call and raises GuardError if they change.
    """
    ensure_triton_driver()
    if not callable(fn):
        raise CaptureError(f"capture expected a callable, got {type(fn).__name__}")
    try:
        with _launches_as_hops():
            gm = make_fx(fn, tracing_mode="fake")(*example_inputs)
            if has_triton_ops(gm):
                gm = inline_triton_ops(gm, example_inputs)
    except Exception as e:  # make_fx wraps user errors in many types; keep the cause
        raise CaptureError(
            f"could not capture {getattr(fn, '__name__', fn)!r}: {type(e).__name__}: {e}\n"
            "Trident captures functions that launch Triton kernels with kernel[grid](...), "
            "wrap_triton or torch.library.triton_op, plus ATen ops, on tensor inputs."
        ) from e
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    constants = {}
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(value, torch.Tensor):
            constants[i] = value
        node.meta.setdefault("trident_input_index", i)
    gm.meta["trident_constant_inputs"] = constants
    gm.meta["trident_num_inputs"] = len(example_inputs)
    return gm
