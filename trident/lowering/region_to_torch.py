"""Stage 1 of the lowering: a region's FX graph -> torch-mlir's torch dialect.

torch-mlir's FX importer works with value semantics, so each Triton launch is imported as a
registered placeholder op, `trident::triton_launch(int launch, Tensor[] reads, Tensor[]
writes) -> Tensor[]`, returning the new values of the tensors the kernel writes (the way
triton_kernel_wrapper_functional does). The function returns the region's outputs followed by
the final values of the inputs it writes.

Note [Steps by location]
The importer does not map FX nodes to torch-dialect ops one to one: besides constants and list
plumbing, it converts arguments where the Python value and the schema disagree -- a scalar
passed for a Tensor (`out.add_(1)` is aten.add_.Tensor(out, 1)) becomes
`torch.prim.NumToTensor.Scalar`, a bool passed for a Scalar/int/float (`torch.full(s, True)`)
`torch.aten.Int.bool`/`Float.bool` -- and it may rename an op (aten.add.Tensor with a scalar ->
add.Scalar, lift_fresh_copy -> clone, as_strided -> index) or drop it (_assert_async). So steps
are not recognised by op name: every node of the functional graph carries a location naming
the SCM step it is (file "trident-step:<node>", line = step index + 1), or line 0 for plumbing
(placeholders, getitem, output), and the importer gives every op it makes for a node,
conversions included, that node's location. `op_step` reads it back; scm_to_llvm checks that
each step comes out once, in the SCM program's order. Nodes the importer would drop are kept
out of regions (passes/importable.py `import_reason`, a cut explain() shows).
"""

from __future__ import annotations

import operator

import torch
from torch_mlir import ir
from torch_mlir.dialects import torch as torch_d
from torch_mlir.extras.fx_importer import FxImporter

from ..passes.common import inplace_root
from ..scm.ir import RegionProgram
from ..scm.sizes import evaluate_size
from .sizes_to_torch import SIZE_FILE, expand

LAUNCH_OP_NAME = "torch.trident.triton_launch"
STEP_FILE_PREFIX = "trident-step:"  # Note [Steps by location]


def _locate(node: torch.fx.Node, step: int | None, name: str) -> None:
    """Note [Steps by location]: the importer turns a node's stack trace into its location."""
    line = 0 if step is None else step + 1
    node.meta["stack_trace"] = f'File "{STEP_FILE_PREFIX}{name}", line {line}, in region\n'


def op_step(op) -> int | None:
    """The index of the SCM step an imported op belongs to, None for plumbing (Note [Steps by
    location]). Raises when the op carries no Trident location."""
    loc = op.location
    if isinstance(loc, ir.FileLineColLoc) and loc.filename == SIZE_FILE:
        return None  # size arithmetic (Note [Sizes through the torch dialect]): no step
    if not isinstance(loc, ir.FileLineColLoc) or not loc.filename.startswith(STEP_FILE_PREFIX):
        raise ValueError(f"op {op.name} has no Trident step location: {loc}")
    return loc.start_line - 1 if loc.start_line > 0 else None


def _is_size_read(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and (
        node.target in (torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int) or node.target is evaluate_size
    )


def _size_node(g: torch.fx.Graph, node: torch.fx.Node, current):
    """The copy of a size read in the functional graph: the read itself, or an outlined
    `evaluate_size` expanded back into integer operators (an int when constant)."""
    if node.target is torch.ops.aten.sym_size.int or node.target is torch.ops.aten.sym_stride.int:
        new = g.node_copy(node, lambda x: current[x])
        if not isinstance(new.meta.get("val"), (int, torch.SymInt)):  # its type: !torch.int
            fake = new.args[0].meta["val"]
            new.meta["val"] = (fake.shape if node.target is torch.ops.aten.sym_size.int else fake.stride())[node.args[1]]
        _locate(new, None, node.name)
        return new
    expr, names, *values = node.args
    env = dict(zip(names, [current[v] if isinstance(v, torch.fx.Node) else v for v in values]))
    return expand(g, expr.expr, env.__getitem__)


def functional_region_graph(program: RegionProgram) -> torch.fx.Graph:
    src = program.graph_module.graph
    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    current: dict[torch.fx.Node, torch.fx.Node] = {}  # latest value of each tensor
    placeholders = []
    launch_index = 0
    step_index = 0
    outputs = None

    def located(node: torch.fx.Node, name: str) -> None:
        nonlocal step_index
        step = program.steps[step_index]
        assert step.name == name, f"node {name} is not step {step_index} ({step.name}) of {program.name}"
        _locate(node, step_index, name)
        step_index += 1

    for node in src.nodes:
        if node.op == "placeholder":
            p = g.placeholder(node.name)
            p.meta["val"] = node.meta["val"]
            _locate(p, None, node.name)
            env[node] = current[node] = p
            placeholders.append(node)
        elif _is_size_read(node):
            # Note [Sizes through the torch dialect]: the region computes its sizes from its
            # inputs' (torch.aten.size.int and integer operators), as the host program does.
            current[node] = _size_node(g, node, current)
        elif node.op == "output":
            outputs = node.args[0]
        elif node.target is torch.ops.higher_order.triton_kernel_wrapper_mutation:
            step = program.launches[launch_index]
            kw = node.kwargs["kwargs"]
            tensors = {k: v for k, v in kw.items() if isinstance(v, torch.fx.Node) and not _is_size_read(v)}
            writes = [k for k in tensors if k in step.writes]
            reads = [k for k in tensors if k not in step.writes]
            call = g.call_function(
                torch.ops.trident.triton_launch.default,
                (launch_index, [current[tensors[k]] for k in reads], [current[tensors[k]] for k in writes]),
            )
            call.meta["val"] = [tensors[k].meta["val"] for k in writes]
            located(call, node.name)
            for j, k in enumerate(writes):
                item = g.call_function(operator.getitem, (call, j))
                item.meta["val"] = tensors[k].meta["val"]
                _locate(item, None, item.name)
                current[tensors[k]] = item
            launch_index += 1
        else:
            new = g.node_copy(node, lambda x: current[x])
            env[node] = current[node] = new
            if node.target is operator.getitem:
                _locate(new, None, node.name)
            else:
                located(new, node.name)
            root = inplace_root(node)
            if root is not None:  # later reads of the written tensor see the op's result
                current[root] = new
    assert step_index == len(program.steps), f"{program.name}: {step_index} of {len(program.steps)} steps in the graph"
    mutated = [p for p, i in zip(placeholders, program.inputs) if i.mutated]
    out = g.output(tuple(current[o] for o in outputs) + tuple(current[p] for p in mutated))
    _locate(out, None, "output")
    return g


def import_region(program: RegionProgram, context: ir.Context) -> ir.Module:
    torch_d.register_dialect(context)
    importer = FxImporter(context=context)
    # An owning module: torch-mlir rewrites aten.as_strided to aten.index on index tensors it
    # registers as the module's buffers.
    graph = torch.fx.GraphModule(torch.nn.Module(), functional_region_graph(program)).graph
    importer.import_stateless_graph(graph, func_name=program.name)
    return importer.module
