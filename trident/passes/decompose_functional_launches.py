"""triton_kernel_wrapper_functional -> clone + triton_kernel_wrapper_mutation.

Functionalized graphs (AOT autograd, torch.compile) carry launches in functional form: the
HOP clones the tensors the kernel writes and returns the clones. Trident's regions work on the
mutation form, so the clones become explicit aten.clone nodes and the launch mutates them.
"""

from __future__ import annotations

import operator

import torch

from .common import is_functional_launch
from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_mutation


def decompose_functional_launches(gm: torch.fx.GraphModule) -> int:
    count = 0
    for node in list(gm.graph.nodes):
        if not is_functional_launch(node):
            continue
        kw = dict(node.kwargs)
        to_clone = set(kw.pop("tensors_to_clone"))
        kwargs = dict(kw["kwargs"])
        clones = {}
        with gm.graph.inserting_before(node):
            for name in sorted(to_clone):
                src = kwargs[name]
                clone = gm.graph.call_function(torch.ops.aten.clone.default, (src,))
                if "val" in src.meta:
                    clone.meta["val"] = src.meta["val"].clone()
                clones[name] = clone
                kwargs[name] = clone
            kw["kwargs"] = kwargs
            launch = gm.graph.call_function(triton_kernel_wrapper_mutation, (), kw)
            launch.meta["val"] = None
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(clones[user.args[1]])
                gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
