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
from triton.runtime.autotuner import Heuristics
from triton.runtime.jit import JITFunction, KernelInterface

from ..errors import CaptureError
from ..scm.tuning import HeuristicFailed, heuristic_values
from .host_driver import ensure_triton_driver
from .inline_triton_ops import has_triton_ops, inline_triton_ops


@contextlib.contextmanager
def _launches_as_hops(log: list):
    """Route `kernel[grid]` through wrap_triton for the duration of a trace. A @triton.heuristics
    kernel (which wrap_triton does not take) has its values computed here, the way
    `Heuristics.run` computes them, and its inner kernel launched with them; `log` gets
    (inner kernel, heuristics, values) per such launch, in launch order."""
    original = KernelInterface.__getitem__

    def traced_getitem(self, grid):
        if isinstance(self, Heuristics):
            return _heuristics_launcher(self, grid, traced_getitem, log)
        return torch.library.wrap_triton(self)[grid]

    KernelInterface.__getitem__ = traced_getitem
    try:
        yield
    finally:
        KernelInterface.__getitem__ = original


def _heuristics_launcher(h, grid, getitem, log: list):
    def launch(*args, **kwargs):
        try:
            values = heuristic_values(h, {**dict(zip(h.arg_names, args)), **kwargs})
        except HeuristicFailed as e:
            cause = e.__cause__
            raise CaptureError(
                f"@triton.heuristics value {e.name!r} of {_kernel_name(h)} could not be computed at capture "
                f"({type(cause).__name__}: {cause}). Trident computes heuristics once, from the dtypes, sizes, strides "
                "and scalar arguments of the launch (tensor data and addresses are not available while tracing)."
            ) from cause
        log.append((h.fn, h, dict(values)))
        return getitem(h.fn, grid)(*args, **kwargs, **values)

    return launch


def _kernel_name(kernel) -> str:
    while not isinstance(kernel, JITFunction) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))


def _tag_heuristics(gm: torch.fx.GraphModule, log: list) -> None:
    """Mark each launch node made through @triton.heuristics with the Heuristics object and
    the values baked into it (Note [Autotuned launches]: re-checked per specialization)."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    pending = list(log)
    for node in gm.graph.nodes:
        if node.op != "call_function" or "kernel_idx" not in node.kwargs or not pending:
            continue
        kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
        inner, h, values = pending[0]
        if kernel is inner or getattr(kernel, "fn", None) is inner:
            node.meta["trident_heuristics"] = (h, values)
            pending.pop(0)


def capture(fn: Callable[..., Any], *example_inputs: Any) -> torch.fx.GraphModule:
    """Trace `fn(*example_inputs)` into an FX GraphModule of ATen ops and Triton launches.

    Tensor inputs become placeholders; sizes are those of the examples (static capture).
    Non-tensor inputs are captured as the constants they were: the optimized module checks
    them on every call and raises GuardError if they change.
    """
    ensure_triton_driver()
    if not callable(fn):
        raise CaptureError(f"capture expected a callable, got {type(fn).__name__}")
    log: list = []
    try:
        with _launches_as_hops(log):
            gm = make_fx(fn, tracing_mode="fake")(*example_inputs)
            if has_triton_ops(gm):
                log.clear()  # the graph of the second trace is the one kept
                gm = inline_triton_ops(gm, example_inputs)
        _tag_heuristics(gm, log)
    except CaptureError:
        raise
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
    # One tensor passed in two positions is traced as one value: the graph reads only one of
    # the placeholders, so later calls must pass one tensor there too (Dynamo guards the same).
    same = []
    for i, value in enumerate(example_inputs):
        if isinstance(value, torch.Tensor):
            first = next((j for j in range(i) if example_inputs[j] is value), None)
            if first is not None:
                same.append((i, first))
    gm.meta["trident_same_inputs"] = same
    gm.meta["trident_num_inputs"] = len(example_inputs)
    return gm
