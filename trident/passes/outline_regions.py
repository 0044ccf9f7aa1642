"""Replace each region with ONE torch.ops.trident.scm call.

For every region this pass builds the region's RegionProgram (SCM IR: inputs, steps, outputs,
and the region as its own GraphModule), asks `make_scm` for the native SCM serving it, and
rewires the graph: `scm = trident.scm(region_id, [written inputs], [read inputs])`, one
getitem per value the rest of the graph uses.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
from torch._higher_order_ops import triton_kernel_wrap as tkw

from ..errors import UnsupportedError
from ..scm.ir import AllocStep, LaunchStep, RegionInput, RegionProgram, TensorFacts, ValueRef
from .common import ALLOCATION_OPS, is_allocation, is_launch, launch_kernel, launch_kwargs
from .partition_regions import Region


def facts_of(val: torch.Tensor) -> TensorFacts:
    return TensorFacts(val.dtype, val.device, tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride()))


def written_params(node: torch.fx.Node) -> list[str]:
    """Names of the tensor arguments the kernel writes, by torch's own TTIR analysis; every
    tensor argument when the analysis cannot tell (torch makes the same fallback)."""
    kwargs = {k: (v.meta["val"] if isinstance(v, torch.fx.Node) else v) for k, v in node.kwargs["kwargs"].items()}
    try:
        names = tkw.get_mutated_tensors(
            node.kwargs["kernel_idx"], node.kwargs["constant_args_idx"], kwargs, node.kwargs["tma_descriptor_metadata"]
        )
    except Exception:
        names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    return sorted(set(names))


def region_program(region: Region) -> tuple[RegionProgram, list[torch.fx.Node], list[torch.fx.Node]]:
    """SCM IR for one region, plus its input nodes (in program order) and output nodes."""
    members = set(region.nodes)
    inputs: list[torch.fx.Node] = []
    writes_by_node: dict[torch.fx.Node, list[str]] = {}
    written_inputs: set[torch.fx.Node] = set()
    for node in region.nodes:
        for inp in node.all_input_nodes:
            if inp not in members and inp not in inputs:
                if not isinstance(inp.meta.get("val"), torch.Tensor):
                    raise UnsupportedError(f"region input {inp.name} is not a tensor")
                inputs.append(inp)
        if is_launch(node):
            writes = written_params(node)
            writes_by_node[node] = writes
            kw = node.kwargs["kwargs"]
            written_inputs.update(kw[w] for w in writes if kw[w] not in members)
    # Written inputs first: the op's schema lists them as Tensor(a!)[].
    inputs = [n for n in inputs if n in written_inputs] + [n for n in inputs if n not in written_inputs]
    outputs = [n for n in region.nodes if any(u not in members for u in n.users) and n.meta.get("val") is not None]
    if any(not is_allocation(n) for n in outputs):
        raise UnsupportedError("only allocations may leave a region")

    refs: dict[torch.fx.Node, ValueRef] = {n: ValueRef("input", i, n.name) for i, n in enumerate(inputs)}
    steps = []
    alloc_count = 0
    for node in region.nodes:
        if is_allocation(node):
            out_idx = outputs.index(node) if node in outputs else None
            steps.append(AllocStep(node.name, str(node.target), ALLOCATION_OPS[node.target], out_idx))
            refs[node] = ValueRef("alloc", alloc_count, node.name)
            alloc_count += 1
        else:
            kernel = launch_kernel(node)
            args = {k: (refs[v] if isinstance(v, torch.fx.Node) else v) for k, v in launch_kwargs(node).items()}
            steps.append(
                LaunchStep(node.name, kernel, kernel.fn.__name__, tuple(node.kwargs["grid"][0]), args, tuple(writes_by_node[node]))
            )

    # The region as its own GraphModule: fake propagation and the op's fake kernel run it.
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in inputs:
        p = graph.placeholder(n.name)
        p.meta["val"] = n.meta["val"]
        env[n] = p
    for node in region.nodes:
        env[node] = graph.node_copy(node, lambda x: env[x])
    graph.output(tuple(env[n] for n in outputs))
    sub = torch.fx.GraphModule(torch.nn.Module(), graph)

    program = RegionProgram(
        name=region.name,
        inputs=[RegionInput(n.name, n in written_inputs) for n in inputs],
        steps=steps,
        outputs=[n.name for n in outputs],
        graph_module=sub,
        captured_inputs=[facts_of(n.meta["val"]) for n in inputs],
    )
    return program, inputs, outputs


def outline_regions(
    gm: torch.fx.GraphModule, regions: list[Region], make_scm: Callable[[RegionProgram], int]
) -> list[int]:
    region_ids = []
    for region in regions:
        program, inputs, outputs = region_program(region)
        rid = make_scm(program)
        region_ids.append(rid)
        mutated = [n for n, i in zip(inputs, program.inputs) if i.mutated]
        reads = [n for n, i in zip(inputs, program.inputs) if not i.mutated]
        first = region.nodes[0]
        with gm.graph.inserting_before(first):
            call = gm.graph.call_function(torch.ops.trident.scm.default, (rid, mutated, reads))
            call.meta["val"] = [n.meta["val"] for n in outputs]
            call.meta["trident_region"] = program.name
            for i, out in enumerate(outputs):
                item = gm.graph.call_function(operator.getitem, (call, i))
                item.meta["val"] = out.meta["val"]
                out.replace_all_uses_with(item)
        for node in reversed(region.nodes):
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()
    return region_ids
