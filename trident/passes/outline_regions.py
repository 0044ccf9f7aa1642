"""Replace each region with ONE torch.ops.trident.scm call.

For every region this pass builds the region's RegionProgram (SCM IR: inputs, steps, value
table, outputs, and the region as its own GraphModule), asks `make_scm` for the native SCM
serving it, and rewires the graph: `scm = trident.scm(region_id, [written inputs], [read
inputs])`, one getitem per value the rest of the graph uses.

Note [Values leaving a region]
The op returns fresh tensors only: a result may not alias an input (opcheck, functionalization)
nor another result. So for each value used after the region:
  * the result of an in-place op is its written argument: later uses are redirected to that
    argument (a region input, which the op lists as written, or a value that leaves itself);
  * a view (of an input or of another leaving value) is recomputed after the call from the
    values it views -- a real view, with the aliasing eager has;
  * anything else leaves as a result of the op.
A size read outside from a value of the region (a symbolic trace's `sym_numel(out)` for the next
launch's grid) that only the region itself reads does not make the value leave: it is computed
from the region's inputs instead (the value's size is an expression of theirs), so a temporary
stays a temporary -- in the arena, released early -- as in a static capture. A size also read
elsewhere (returned, used by an operator or region after) reads the region's result.
"""

from __future__ import annotations

import inspect
import operator
from typing import Callable

import sympy
import torch
from torch._higher_order_ops import triton_kernel_wrap as tkw
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.numbers import int_oo
from triton.runtime.jit import JITFunction

from .. import disk_cache, knobs, logs
from ..errors import UnsupportedError
from ..scm import sizes as S
from ..scm.guards import FactEquals, SizeRelation
from ..scm.ir import DEFAULT, AllocStep, AtenStep, LaunchStep, RegionInput, RegionProgram, TensorFacts, ValueRef
from ..scm.refs import kernel_ref, op_name
from .common import (
    ALLOCATION_OPS,
    inplace_root,
    is_allocation,
    is_launch,
    is_size_node,
    size_hint,
    is_view_op,
    launch_kernel,
    launch_kwargs,
    launch_tuner,
    written_args,
)
from .partition_regions import Region


def _storage(node: torch.fx.Node):
    val = node.meta.get("val")
    return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None


def _same_argument(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, (torch.fx.Node, torch.Tensor)) or type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:
        return False


# torch's analysis of what a launch writes compiles the kernel to TTIR (~10 ms); a decode step
# launches a few kernels many times with the same argument types and constants, so the answer
# is kept per (kernel, constant arguments, each argument's dtype or scalar value): what the TTIR
# depends on (shapes and addresses do not reach it). The kernel object is held in the key, so its
# id cannot be reused while the entry lives.
_WRITTEN: dict = {}


def _analysis_key(node: torch.fx.Node, kwargs: dict):
    try:
        kernel = tkw.kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
        constants = tkw.kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])
        parts = []
        for name, value in sorted({**constants, **kwargs}.items()):
            if isinstance(value, torch.Tensor):
                parts.append((name, "tensor", str(value.dtype), value.dim()))
            elif value is None or isinstance(value, (bool, int, float, str)):
                parts.append((name, type(value).__name__, value))
            else:
                parts.append((name, type(value).__name__, repr(value)))
        return (id(kernel), kernel, tuple(parts), repr(node.kwargs["tma_descriptor_metadata"]))
    except Exception:  # an argument that does not key: analyse this launch alone
        return None


def _analysed_kwargs(node: torch.fx.Node, kwargs: dict) -> dict:
    """The arguments torch's analysis of what a launch writes is run with: for a plain
    @triton.jit kernel, `kwargs` and the defaults of the parameters the launch leaves out (the
    analysis wants every parameter: it refuses a launch relying on a default, and its fallback
    marks every tensor written); for Trident's own kernels, PDL off -- the grid dependency
    instructions touch no tensor, and torch's analysis refuses their inline PTX (Note
    [Programmatic dependent launch])."""
    kernel = tkw.kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
    if not isinstance(kernel, JITFunction):
        return kwargs
    constants = tkw.kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])
    missing = {p.name: p.default for p in kernel.params
               if p.name not in kwargs and p.name not in constants and p.default is not inspect.Parameter.empty}
    if kwargs.get("PDL") and kernel.fn.__module__.startswith("trident.kernels."):
        missing["PDL"] = False
        if kwargs.get("PREFETCH"):  # Note [Weights ahead of the wait]: inline PTX too, writing nothing
            missing["PREFETCH"] = 0
    return {**kwargs, **missing} if missing else kwargs


def _glue_writes(kwargs: dict) -> list[str]:
    """What a launch of an Inductor-generated glue kernel (Note [Fused glue]) writes: Inductor
    names the buffers a kernel only reads `in_ptr<k>`; every other tensor argument (`out_ptr`,
    `in_out_ptr`, workspaces) is taken as written. Not torch's TTIR analysis: with PDL the kernels
    hold inline PTX it refuses, and Inductor's naming says as much."""
    return [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and not k.startswith("in_ptr")]


def written_params(node: torch.fx.Node) -> list[str]:
    """Names of the tensor arguments the kernel writes, by torch's own TTIR analysis; every
    tensor argument when the analysis cannot tell (torch makes the same fallback). The answer
    is kept in node.meta (the analysis compiles to TTIR) while the launch's arguments stay the
    same (the same nodes, equal constants)."""
    args = [node.kwargs[k] for k in ("kernel_idx", "constant_args_idx", "tma_descriptor_metadata")]
    args += [x for item in node.kwargs["kwargs"].items() for x in item]
    cached = node.meta.get("trident_written_params")
    if cached is not None and len(cached[0]) == len(args) and all(map(_same_argument, cached[0], args)):
        return list(cached[1])
    kwargs = {k: (v.meta["val"] if isinstance(v, torch.fx.Node) else v) for k, v in node.kwargs["kwargs"].items()}
    if node.meta.get("glue_kernel") is not None:
        names = tuple(sorted(_glue_writes(kwargs)))
        node.meta["trident_written_params"] = (args, names)
        return list(names)
    kwargs = _analysed_kwargs(node, kwargs)
    key = _analysis_key(node, kwargs)
    names = _WRITTEN.get(key) if key is not None else None
    if names is None:
        tensors = {k for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        # Note [Cached analyses]: by the kernel's stable key in TRIDENT_CACHE_DIR
        stored_key = disk_cache.key_of(kernel_ref(key[1]).key, key[2], key[3]) if key is not None else None
        if stored_key is not None:
            names = disk_cache.load("written", stored_key, lambda v: isinstance(v, list) and set(v) <= tensors)
        if names is None:
            try:
                with logs.torch_analysis_quiet() as failed:  # Note [torch's launch analysis, quietly]
                    names = tkw.get_mutated_tensors(
                        node.kwargs["kernel_idx"], node.kwargs["constant_args_idx"], kwargs,
                        node.kwargs["tma_descriptor_metadata"],
                    )
                if stored_key is not None and not failed:  # the analysis' own answer, not torch's fallback
                    disk_cache.store("written", stored_key, sorted(set(names)))
            except Exception:
                names = list(tensors)
        names = tuple(sorted(set(names)))
        if key is not None:
            _WRITTEN[key] = names
    node.meta["trident_written_params"] = (args, names)
    return list(names)


def _holds_node(value, depth: int = 0) -> bool:
    if isinstance(value, torch.fx.Node):
        return True
    if depth < 3 and isinstance(value, (list, tuple)):
        return any(_holds_node(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return any(_holds_node(v, depth + 1) for v in value.values())
    return False


def _drop_node_references(meta: dict) -> None:
    """A region's own graph keeps no pass annotation that names nodes of the graph it was cut
    from: the region outlives that graph only while it is called (Note [Released regions]), and
    such a reference would keep the optimized graph, and so the region, alive for good."""
    for key in [k for k, v in meta.items() if _holds_node(v)]:
        del meta[key]


def _size_for_region(node: torch.fx.Node, members: set) -> bool:
    """A symbolic size node only the region reads (directly or through other size nodes): the
    region computes it from its inputs, so the values it reads need not leave the region. A size
    also read elsewhere (returned, used by an operator outside, by another region) keeps reading
    the region's result."""
    val = node.meta.get("val")
    # a data-dependent value (.item(), .tolist(): an unbacked symbol) is no size a region computes
    if not (is_size_node(node) and isinstance(val, torch.SymInt) and not free_unbacked_symbols(val)
            and isinstance(S.size_of(val), S.SizeExpr)):
        return False
    return all(u in members or _size_for_region(u, members) for u in node.users)


def _outside_sizes(region: Region) -> list[torch.fx.Node]:
    """Size nodes outside the region that read one of its values and that only the region reads
    (Note [Values leaving a region])."""
    members = set(region.nodes)
    found: dict[torch.fx.Node, None] = {}
    for n in region.nodes:
        for u in n.users:
            if u not in members and _size_for_region(u, members):
                found[u] = None
    return list(found)


def _leaving_values(region: Region) -> tuple[list[torch.fx.Node], dict, list[torch.fx.Node]]:
    """Note [Values leaving a region]: (results, redirects, views recomputed after the call)."""
    members = set(region.nodes)
    order = {n: i for i, n in enumerate(region.nodes)}
    work = [n for n in region.nodes if any(u not in members and not _size_for_region(u, members) for u in n.users)]
    results: list[torch.fx.Node] = []
    redirects: dict[torch.fx.Node, torch.fx.Node] = {}
    views: list[torch.fx.Node] = []
    seen = set()
    while work:
        n = work.pop(0)
        if n in seen:
            continue
        seen.add(n)
        root = inplace_root(n)
        if root is not None:
            redirects[n] = root
            if root in members:
                work.append(root)
            continue
        if is_view_op(n):
            views.append(n)
            work.extend(a for a in n.all_input_nodes if a in members)
            continue
        if n.target is operator.getitem or is_allocation(n) or isinstance(n.meta.get("val"), torch.Tensor):
            results.append(n)
            continue
        raise UnsupportedError(f"value {n.name} leaves region {region.name} but is not a tensor")
    inputs_storage = {_storage(a) for n in region.nodes for a in n.all_input_nodes if a not in members}
    result_storages = {}
    for r in results:
        st = _storage(r)
        if st in inputs_storage or st in result_storages:
            raise UnsupportedError(
                f"value {r.name} leaving region {region.name} aliases "
                f"{'an input' if st in inputs_storage else result_storages[st]} and is not a view"
            )
        result_storages[st] = r.name
    results.sort(key=order.get)
    views.sort(key=order.get)
    return results, redirects, views


def _bind_schema_args(node: torch.fx.Node) -> list:
    schema = node.target._schema
    bound = []
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            bound.append(node.args[i])
        elif arg.name in node.kwargs:
            bound.append(node.kwargs[arg.name])
        else:
            bound.append(DEFAULT)
    return bound


# Note [Constant operator calls]
# An operator call that reads no region value and is deterministic (arange, scalar_tensor,
# full, ...) gives the same tensors on every call. When nothing writes those tensors (no
# kernel, no in-place operator, no view of them) and they do not leave the region, the SCM
# computes them once per device and reuses them: the host program skips the dispatcher for
# them on every later call.
def _mark_constant_calls(steps, outputs, refs, region):
    def refs_in(a):
        if isinstance(a, ValueRef):
            return [a]
        if isinstance(a, list):
            return [x for x in a if isinstance(x, ValueRef)]
        return []

    written: set[int] = set()
    viewed: set[int] = set()
    for step in steps:
        if isinstance(step, LaunchStep):
            written |= {
                v.index for k, v in step.args.items() if k in step.writes and isinstance(v, ValueRef) and v.kind == "value"
            }
        elif isinstance(step, AtenStep):
            schema = step.op._schema
            for arg, value in zip(schema.arguments, step.args):
                if arg.alias_info is not None:
                    target = viewed if not arg.alias_info.is_write else written
                    target |= {r.index for r in refs_in(value) if r.kind == "value"}
    leaving = {o.index for o in outputs}
    marked = []
    for step in steps:
        if isinstance(step, AtenStep):
            op = step.op
            constant = (
                op.namespace == "aten"
                and torch.Tag.nondeterministic_seeded not in op.tags
                and not any(a.alias_info is not None for a in op._schema.arguments)
                and not any(refs_in(a) for a in step.args)
                and not S.has_symbols(list(step.args))  # its result depends on the sizes
                and not any(o >= 0 and (o in written or o in viewed or o in leaving) for o in step.outputs)
            )
            if constant:
                step = AtenStep(step.name, step.op_name, step.args, step.outputs, cached=True)
        marked.append(step)
    return marked


def _symbols_of(val) -> set:
    if isinstance(val, (list, tuple)):
        return set().union(*map(_symbols_of, val)) if val else set()
    if isinstance(val, torch.Tensor):
        return set().union(*(_symbols_of(s) for s in (*val.shape, *val.stride(), val.storage_offset())))
    if isinstance(val, torch.SymInt):
        return {str(x) for x in val.node.expr.free_symbols}
    return set()


def _bare_symbols(val: torch.Tensor) -> set:
    return {str(s.node.expr) for s in (*val.shape, *val.stride())
            if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol}


def _size_sources(region: Region, inputs: list, size_nodes: list) -> list:
    """Graph inputs the region reads sizes from only: a region cut from a longer run (Note
    [Pieces of a symbolic region]) may compute with a size (the KV length of the attention mask)
    that only a tensor it does not read carries. Such a tensor becomes an input of the region
    that the host program reads the size of, nothing else. Inputs of which only sizes are read
    anywhere (carriers of ints, Note [Ints no input carries]) are never taken."""
    needed = set().union(*(_symbols_of(n.meta.get("val")) for n in [*region.nodes, *size_nodes]))
    bound = set().union(*(_bare_symbols(n.meta["val"]) for n in inputs)) if inputs else set()
    missing = needed - bound
    extra = []
    if not missing:
        return extra
    for node in region.nodes[0].graph.nodes:
        if not missing:
            break
        val = node.meta.get("val")
        if node.op != "placeholder" or not isinstance(val, torch.Tensor) or node in inputs:
            continue
        if all(is_size_node(u) for u in node.users):
            continue
        binds = _bare_symbols(val) & missing
        if binds:
            extra.append(node)
            missing -= binds
    return extra


def region_program(region: Region):
    """SCM IR for one region, plus its input nodes (in program order), its result nodes, and
    the redirects and views of Note [Values leaving a region]."""
    members = set(region.nodes)
    results, redirects, views = _leaving_values(region)
    inputs: list[torch.fx.Node] = []
    size_nodes: list[torch.fx.Node] = []  # sizes computed outside (Note [Symbolic sizes])
    for node in region.nodes:
        for inp in node.all_input_nodes:
            if is_size_node(inp):
                if not isinstance(inp.meta.get("val"), torch.SymInt):
                    raise UnsupportedError(f"region reads {inp.name}, a {type(inp.meta['val']).__name__}: only integer sizes")
                if inp not in size_nodes:
                    size_nodes.append(inp)
                continue
            if inp not in members and inp not in inputs:
                if not isinstance(inp.meta.get("val"), torch.Tensor):
                    raise UnsupportedError(f"region input {inp.name} is not a tensor")
                inputs.append(inp)

    inputs += _size_sources(region, inputs, size_nodes)

    # Which inputs get written: by kernels (torch's TTIR analysis) or by operators (schema
    # alias annotations), directly or through a view (same storage).
    storage_to_input = {_storage(n): n for n in inputs}
    writes_by_node: dict[torch.fx.Node, list[str]] = {}
    written_inputs: set[torch.fx.Node] = set()
    for node in region.nodes:
        if is_launch(node):
            writes = written_params(node)
            writes_by_node[node] = writes
            targets = [node.kwargs["kwargs"][w] for w in writes]
        else:
            targets = written_args(node)
        for t in targets:
            inp = storage_to_input.get(_storage(t))
            if inp is not None:
                written_inputs.add(inp)
    inputs = [n for n in inputs if n in written_inputs] + [n for n in inputs if n not in written_inputs]

    refs: dict[torch.fx.Node, object] = {n: ValueRef("input", i, n.name) for i, n in enumerate(inputs)}
    value_names: list[str] = []

    def new_value(name: str) -> ValueRef:
        value_names.append(name)
        return ValueRef("value", len(value_names) - 1, name)

    def to_arg(v):
        if isinstance(v, torch.fx.Node):
            if v in size_nodes:
                return S.size_of(v.meta["val"])
            return refs[v]
        if isinstance(v, (list, tuple)):
            return [to_arg(x) for x in v]
        return v

    steps = []
    for node in region.nodes:
        if is_allocation(node):
            ref = new_value(node.name)
            steps.append(AllocStep(node.name, str(node.target), ALLOCATION_OPS[node.target], ref.index))
            refs[node] = ref
        elif is_launch(node):
            kernel = launch_kernel(node)
            args = {k: to_arg(v) for k, v in launch_kwargs(node).items()}
            tuner = launch_tuner(node)
            grids = tuple(tuple(to_arg(x) for x in g) for g in node.kwargs["grid"]) if tuner is not None else ()
            steps.append(
                LaunchStep(
                    node.name, kernel_ref(kernel), kernel.fn.__name__, tuple(to_arg(x) for x in node.kwargs["grid"][0]),
                    args, tuple(writes_by_node[node]), tuner=None if tuner is None else kernel_ref(tuner), grids=grids,
                    heuristics=_heuristics_ref(node.meta.get("trident_heuristics")),
                )
            )
        elif node.target is operator.getitem:
            refs[node] = refs[node.args[0]][node.args[1]]
        else:
            val = node.meta.get("val")
            if not node.target._schema.returns:  # e.g. _foreach_mul_: no value, only its effect
                outs = []
                refs[node] = None
            elif isinstance(val, (tuple, list)):
                outs = [new_value(f"{node.name}[{k}]") if isinstance(v, torch.Tensor) else None for k, v in enumerate(val)]
                refs[node] = outs
            else:
                outs = [new_value(node.name)]
                refs[node] = outs[0]
            args = tuple(to_arg(a) for a in _bind_schema_args(node))
            slots = tuple(-1 if o is None else o.index for o in outs)
            steps.append(AtenStep(node.name, op_name(node.target), args, slots))

    if knobs.native_path("constants"):
        steps = _mark_constant_calls(steps, [refs[n] for n in results], refs, region)

    # The region as its own GraphModule: fake propagation and the op's fake kernel run it.
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in inputs:
        p = graph.placeholder(n.name)
        p.meta["val"] = n.meta["val"]
        env[n] = p
    symbolic = _symbolic_facts(inputs, steps, value_names, region, refs, size_nodes)
    for u in _outside_sizes(region):
        missing = S.size_of(u.meta["val"]).symbols - symbolic[0].keys()
        if missing:
            raise UnsupportedError(f"size {u.name} read from the region depends on {', '.join(sorted(missing))}, "
                                   "which is no size or stride of a region input")
    for n in size_nodes:  # each size read from the inputs it is bound to, then evaluated
        env[n] = _size_node(graph, S.size_of(n.meta["val"]), symbolic[0], [env[i] for i in inputs])
    for node in region.nodes:
        env[node] = graph.node_copy(node, lambda x: env[x])
        _drop_node_references(env[node].meta)
    graph.output(tuple(env[n] for n in results))
    # its Python code is generated only if something calls it (planning reads only its graph;
    # generating the code of a 16-layer region costs ~30 ms of a warm start)
    sub = _LazyGraphModule(torch.nn.Module(), graph)

    program = RegionProgram(
        name=region.name,
        inputs=[RegionInput(n.name, n in written_inputs) for n in inputs],
        steps=steps,
        outputs=[refs[n] for n in results],
        value_names=value_names,
        graph_module=sub,
        captured_inputs=[_hinted_facts(n.meta["val"]) for n in inputs],
    )
    if symbolic[0]:
        program.symbols, program.input_exprs, program.value_exprs, program.size_guards = symbolic
    return program, inputs, results, redirects, views


def _hinted_facts(val: torch.Tensor) -> TensorFacts:
    return TensorFacts(val.dtype, val.device, tuple(size_hint(s) for s in val.shape), tuple(size_hint(s) for s in val.stride()))


def _layout_exprs(val: torch.Tensor) -> tuple:
    return (
        tuple(S.size_of(s) for s in val.shape),
        tuple(S.size_of(s) for s in val.stride()),
        S.size_of(val.storage_offset()),
    )


def _symbolic_facts(inputs, steps, value_names, region, refs, size_nodes) -> tuple:
    """Note [Symbolic sizes]: (symbol bindings, per input (sizes, strides), per value slot
    (sizes, strides, offset), the program's size guards), or ({}, [], [], []) when no size of the
    region is symbolic. Raises UnsupportedError for a size the host program cannot compute."""
    vals = [n.meta["val"] for n in inputs]
    input_exprs = [_layout_exprs(v)[:2] for v in vals]
    by_name = {}
    for node in region.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            by_name[node.name] = val
        elif isinstance(val, (list, tuple)):
            for k, v in enumerate(val):
                if isinstance(v, torch.Tensor):
                    by_name[f"{node.name}[{k}]"] = v
    value_exprs = [_layout_exprs(by_name[name]) for name in value_names]
    used = [x for st in steps for x in _step_sizes(st)]
    if not size_nodes and not any(S.has_symbols(e) for e in input_exprs + value_exprs):
        return {}, [], [], []
    symbols: dict[str, S.Binding] = {}
    for kind, k in (("size", 0), ("stride", 1)):  # a size binds a symbol before a stride does
        for i, exprs in enumerate(input_exprs):
            for d, e in enumerate(exprs[k]):
                if isinstance(e, S.SizeExpr) and len(e.symbols) == 1 and e.expr.is_Symbol and str(e) not in symbols:
                    symbols[str(e)] = S.Binding(i, kind, d)
    everything = [e for ex in input_exprs + value_exprs for part in ex for e in (part if isinstance(part, tuple) else (part,))]
    for e in everything + used:
        if isinstance(e, S.SizeExpr):
            S.check_native(e.expr)
            missing = e.symbols - symbols.keys()
            if missing:
                raise UnsupportedError(
                    f"size {e} depends on {', '.join(sorted(missing))}, which is no size or stride of a region input"
                )
    guards: list = []
    for i, (node, exprs) in enumerate(zip(inputs, input_exprs)):
        for kind, k in (("size", 0), ("stride", 1)):
            for d, e in enumerate(exprs[k]):
                if isinstance(e, S.SizeExpr) and symbols.get(str(e)) != S.Binding(i, kind, d):
                    guards.append(FactEquals(i, node.name, kind, d, e, symbols))
    shape_env = next((s.node.shape_env for v in vals for s in tuple(v.shape) + tuple(v.stride()) if isinstance(s, torch.SymInt)), None)
    if shape_env is not None:
        guards += _shape_guards(shape_env, symbols)
    return symbols, input_exprs, value_exprs, guards


def _shape_guards(shape_env, symbols: dict) -> list:
    """The shape environment's guards and value ranges over the region's symbols."""
    out = []
    seen = set()
    for g in shape_env.guards:
        expr = shape_env.replace(g.expr)
        if expr is sympy.true or expr in seen:
            continue
        names = {s.name for s in expr.free_symbols}
        if not names & symbols.keys():
            continue  # about tensors this region does not read
        if names - symbols.keys():
            continue  # relates to sizes of other inputs: the graph's TracedShapes call guard checks it
        try:
            S.check_native(expr)
        except UnsupportedError:
            continue  # no native form (a bitwise or): checked by the graph's TracedShapes call guard
        seen.add(expr)
        out.append(SizeRelation(S.SizeExpr(expr), symbols, "shape guard"))
    for name in symbols:
        sym = next((s for s in shape_env.var_to_range if getattr(s, "name", None) == name), None)
        if sym is None:
            continue
        vr = shape_env.var_to_range[sym]
        if vr.lower not in (-int_oo, -sympy.oo) and vr.lower is not None:
            out.append(SizeRelation(S.SizeExpr(sympy.Ge(sym, int(vr.lower))), symbols, "range"))
        if vr.upper not in (int_oo, sympy.oo) and vr.upper is not None:
            out.append(SizeRelation(S.SizeExpr(sympy.Le(sym, int(vr.upper))), symbols, "range"))
    return out


def _step_sizes(step) -> list:
    if isinstance(step, LaunchStep):
        return list(S.expressions_in((step.grid, step.grids, step.args)))
    if isinstance(step, AtenStep):
        return list(S.expressions_in(step.args))
    return []


def _size_node(graph: torch.fx.Graph, size, symbols: dict, placeholders: list) -> torch.fx.Node:
    """A node of the region's own graph computing `size` from the region's inputs."""
    if not isinstance(size, S.SizeExpr):
        return size
    names = sorted(size.symbols)
    reads = []
    for name in names:
        b = symbols[name]
        op = torch.ops.aten.sym_size.int if b.kind == "size" else torch.ops.aten.sym_stride.int
        reads.append(graph.call_function(op, (placeholders[b.input], b.dim)))
    return graph.call_function(S.evaluate_size, (size, tuple(names), *reads))


_TENSOR_SIZE_OPS = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
                    torch.ops.aten.sym_storage_offset.default)


def read_sizes_from_inputs(gm: torch.fx.GraphModule) -> None:
    """Every size read from a tensor the graph computes (`sym_size(view, 0)`) that is an
    expression of sizes and strides of the graph's inputs is read from those inputs instead.
    A size read from a value ties the value to whoever reads the size: with regions cut into
    pieces (Note [Pieces of a symbolic region]) the same size feeds several pieces, and the value
    would have to leave its piece for it; read from the inputs it ties nothing."""
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]
    symbols: dict = {}
    for i, n in enumerate(inputs):
        val = n.meta["val"]
        for kind, seq in (("size", tuple(val.shape)), ("stride", tuple(val.stride()))):
            for d, v in enumerate(seq):
                if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
                    symbols.setdefault(str(v.node.expr), S.Binding(i, kind, d))
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _TENSOR_SIZE_OPS or not node.args:
            continue
        src = node.args[0]
        if not isinstance(src, torch.fx.Node) or src.op == "placeholder":
            continue
        size = S.size_of(node.meta.get("val"))
        if not isinstance(size, S.SizeExpr) or not size.symbols <= symbols.keys():
            continue
        with gm.graph.inserting_before(node):
            new = _arithmetic(gm.graph, size.expr, symbols, inputs)
        if new is None:
            continue  # an expression with no plain arithmetic form: it keeps reading the value
        new.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)


def _arithmetic(graph: torch.fx.Graph, expr, symbols: dict, inputs: list):
    """FX nodes computing a size expression (symbols, integers, +, *, //) from the inputs'
    sizes and strides, or None for any other form."""
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        b = symbols[str(expr)]
        t = inputs[b.input].meta["val"]
        op = torch.ops.aten.sym_size.int if b.kind == "size" else torch.ops.aten.sym_stride.int
        read = graph.call_function(op, (inputs[b.input], b.dim))
        read.meta["val"] = t.shape[b.dim] if b.kind == "size" else t.stride()[b.dim]
        return read
    ops = {sympy.Add: operator.add, sympy.Mul: operator.mul, FloorDiv: operator.floordiv}
    fn = next((f for k, f in ops.items() if isinstance(expr, k)), None)
    if fn is None:
        return None
    parts = [_arithmetic(graph, a, symbols, inputs) for a in expr.args]
    if any(p is None for p in parts):
        return None
    out = parts[0]
    for p in parts[1:]:
        val = fn(out.meta["val"] if isinstance(out, torch.fx.Node) else out,
                 p.meta["val"] if isinstance(p, torch.fx.Node) else p)
        out = graph.call_function(fn, (out, p))
        out.meta["val"] = val
    return out


def _order_sizes(graph: torch.fx.Graph) -> None:
    """A size read outside a region from one of its values (sym_size of a view the region made)
    stood among the region's nodes; it now reads that value's getitem after the region's call:
    each such size node moves after what it reads (size nodes are pure, and only they sat
    inside a region's run of nodes)."""
    moved = True
    while moved:
        moved = False
        order = {n: i for i, n in enumerate(graph.nodes)}
        for node in list(graph.nodes):
            if not is_size_node(node):
                continue
            last = max(node.all_input_nodes, key=order.get, default=None)
            if last is not None and order[last] > order[node]:
                last.append(node)
                moved = True
                break


def _heuristics_ref(tagged):
    """(the Heuristics by stable key, its captured values) of a launch made through
    @triton.heuristics (Note [Stable keys])."""
    if tagged is None:
        return None
    h, values = tagged
    return kernel_ref(h), values


def outline_regions(
    gm: torch.fx.GraphModule, regions: list[Region], make_scm: Callable[[RegionProgram], int]
) -> tuple[list[int], list[tuple[str, str]]]:
    """Returns the ids of the SCMs made, and (node, reason) for regions left as they were."""
    region_ids = []
    skipped = []
    for region in regions:
        try:
            program, inputs, results, redirects, views = region_program(region)
        except UnsupportedError as e:
            skipped.append((region.nodes[0].name, f"region not outlined: {e}"))
            continue
        rid = make_scm(program)
        region_ids.append(rid)
        members = set(region.nodes)
        mutated = [n for n, i in zip(inputs, program.inputs) if i.mutated]
        reads = [n for n, i in zip(inputs, program.inputs) if not i.mutated]
        last = region.nodes[-1]
        outside: dict[torch.fx.Node, torch.fx.Node] = {}
        with gm.graph.inserting_after(last):
            call = gm.graph.call_function(torch.ops.trident.scm.default, (rid, mutated, reads))
        call.meta["val"] = [n.meta["val"] for n in results]
        call.meta["trident_region"] = program.name
        cursor = call
        for i, out in enumerate(results):
            with gm.graph.inserting_after(cursor):
                item = gm.graph.call_function(operator.getitem, (call, i))
            item.meta["val"] = out.meta["val"]
            outside[out] = item
            cursor = item

        def resolve(n: torch.fx.Node, redirects=redirects, outside=outside, members=members) -> torch.fx.Node:
            while n in redirects:
                n = redirects[n]
            return outside.get(n, n) if n in members else n

        for v in views:  # recomputed after the call, from what they view
            with gm.graph.inserting_after(cursor):
                copy = gm.graph.node_copy(v, resolve)
            outside[v] = copy
            cursor = copy
        for u in _outside_sizes(region):  # recomputed from the region's inputs
            with gm.graph.inserting_before(u):
                size = _size_node(gm.graph, S.size_of(u.meta["val"]), program.symbols, inputs)
            size.meta["val"] = u.meta["val"]
            for read in size.all_input_nodes:
                if "val" not in read.meta:
                    read.meta["val"] = read.args[0].meta["val"].shape[read.args[1]] if read.target is \
                        torch.ops.aten.sym_size.int else read.args[0].meta["val"].stride()[read.args[1]]
            u.replace_all_uses_with(size)
            gm.graph.erase_node(u)
        for node in region.nodes:
            target = resolve(node)
            if target is node:
                continue
            for user in list(node.users):
                if user not in members and user is not target:
                    user.replace_input_with(node, target)
        for node in reversed(region.nodes):
            gm.graph.erase_node(node)
    for node in reversed(list(gm.graph.nodes)):  # sizes only regions read: the host computes them
        if is_size_node(node) and not node.users:
            gm.graph.erase_node(node)
    _order_sizes(gm.graph)
    gm.graph.lint()
    gm.recompile()
    return region_ids, skipped
