"""Inline torch.library.triton_op calls into the launches they make.

make_fx keeps a triton_op as one opaque custom-op node (torch decomposes them only under
FunctionalTensorMode). Trident needs the launches, so the captured graph is traced once more
with each triton_op node replaced by its Python body, which launches through wrap_triton.
"""

from __future__ import annotations

import torch
from torch._library import custom_ops
from torch._library.triton import triton_ops_to_kernels
from torch.fx.experimental.proxy_tensor import make_fx


def triton_op_body(target):
    """The user function behind a triton_op overload, or None for any other target."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = target._schema.name
    if name not in triton_ops_to_kernels:
        return None
    opdef = custom_ops._maybe_get_opdef(name)
    return None if opdef is None else opdef._abstract_fn


def has_triton_ops(gm: torch.fx.GraphModule) -> bool:
    return any(n.op == "call_function" and triton_op_body(n.target) is not None for n in gm.graph.nodes)


def inline_triton_ops(gm: torch.fx.GraphModule, example_inputs, tracing_mode: str = "fake") -> torch.fx.GraphModule:
    class Inliner(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            body = triton_op_body(target)
            if body is not None:
                return body(*args, **kwargs)
            return super().call_function(target, args, kwargs)

    def run(*args):
        return Inliner(gm).run(*args)

    return make_fx(run, tracing_mode=tracing_mode)(*example_inputs)
