"""What the passes agree on: which nodes are Triton launches and which are allocations."""

from __future__ import annotations

import torch
from torch._higher_order_ops.triton_kernel_wrap import (
    kernel_side_table,
    triton_kernel_wrapper_functional,
    triton_kernel_wrapper_mutation,
)

aten = torch.ops.aten

# Allocations a region may absorb: they have no data inputs, only shapes and options.
ALLOCATION_OPS = {
    aten.empty.memory_format: False,
    aten.empty_like.default: False,
    aten.empty_strided.default: False,
    aten.new_empty.default: False,
    aten.zeros.default: True,
    aten.zeros_like.default: True,
    aten.new_zeros.default: True,
}


def is_launch(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is triton_kernel_wrapper_mutation


def is_functional_launch(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is triton_kernel_wrapper_functional


def is_allocation(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in ALLOCATION_OPS


def resolve_kernel(kernel):
    """(JITFunction, launch options) behind a side-table kernel, or (kernel, None) when it is
    something Trident does not unwrap. torch wraps a kernel launched with num_warps=/num_stages=
    in a one-config Autotuner; that config's options are the launch's options."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return kernel, {}
    if isinstance(kernel, Autotuner) and len(kernel.configs) == 1 and isinstance(kernel.fn, JITFunction):
        config = kernel.configs[0]
        plain = not (
            kernel.user_defined_pre_hook
            or kernel.user_defined_post_hook
            or kernel.reset_to_zero
            or kernel.restore_value
            or kernel.early_config_prune
            or config.pre_hook
        )
        if plain:
            return kernel.fn, config.all_kwargs()
    return kernel, None


def launch_kernel(node: torch.fx.Node):
    return resolve_kernel(kernel_side_table.get_kernel(node.kwargs["kernel_idx"]))[0]


def launch_kwargs(node: torch.fx.Node) -> dict:
    """All kernel arguments of a launch node: graph kwargs, the side table's constants and the
    launch options (num_warps, ...)."""
    _, options = resolve_kernel(kernel_side_table.get_kernel(node.kwargs["kernel_idx"]))
    constants = kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])
    return {**(options or {}), **constants, **node.kwargs["kwargs"]}
