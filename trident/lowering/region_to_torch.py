"""Stage 1 of the lowering: a region's FX graph -> torch-mlir's torch dialect.

torch-mlir's FX importer works with value semantics, so each Triton launch is imported as a
registered placeholder op, `trident::triton_launch(int launch, Tensor[] reads, Tensor[]
writes) -> Tensor[]`, returning the new values of the tensors the kernel writes (the way
triton_kernel_wrapper_functional does). The function returns the region's outputs followed by
the final values of the inputs it writes.
"""

from __future__ import annotations

import operator

import torch
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_importer import FxImporter

from ..scm.ir import RegionProgram

LAUNCH_OP_NAME = "torch.trident.triton_launch"


def functional_region_graph(program: RegionProgram) -> torch.fx.Graph:
    src = program.graph_module.graph
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    current: dict[torch.fx.Node, torch.fx.Node] = {}  # latest value of each tensor
    placeholders = []
    launch_index = 0
    outputs = None
    for node in src.nodes:
        if node.op == "placeholder":
            p = g.placeholder(node.name)
            p.meta["val"] = node.meta["val"]
            env[node] = current[node] = p
            placeholders.append(node)
        elif node.op == "output":
            outputs = node.args[0]
        elif node.target is torch.ops.higher_order.triton_kernel_wrapper_mutation:
            step = program.launches[launch_index]
            kw = node.kwargs["kwargs"]
            tensors = {k: v for k, v in kw.items() if isinstance(v, torch.fx.Node)}
            writes = [k for k in tensors if k in step.writes]
            reads = [k for k in tensors if k not in step.writes]
            call = g.call_function(
                torch.ops.trident.triton_launch.default,
                (launch_index, [current[tensors[k]] for k in reads], [current[tensors[k]] for k in writes]),
            )
            call.meta["val"] = [tensors[k].meta["val"] for k in writes]
            for j, k in enumerate(writes):
                item = g.call_function(operator.getitem, (call, j))
                item.meta["val"] = tensors[k].meta["val"]
                current[tensors[k]] = item
            launch_index += 1
        else:
            new = g.node_copy(node, lambda x: current[x])
            env[node] = current[node] = new
    mutated = [p for p, i in zip(placeholders, program.inputs) if i.mutated]
    g.output(tuple(current[o] for o in outputs) + tuple(current[p] for p in mutated))
    return g


def import_region(program: RegionProgram, context: ir.Context) -> ir.Module:
    torch_d.register_dialect(context)
    importer = FxImporter(context=context)
    importer.import_stateless_graph(functional_region_graph(program), func_name=program.name)
    return importer.module
