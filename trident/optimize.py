"""trident.optimize and the inspection helpers over optimized graphs."""

from __future__ import annotations

import contextlib

import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

from .capture import ensure_triton_driver
from .errors import GuardError, TridentError, UnsupportedError
from .passes import (
    decompose_functional_launches,
    drop_unused_projections,
    eliminate_common_subexpressions,
    outline_regions,
    partition_regions,
    sink_allocations,
)
from .passes.fuse_cache_writes import fuse_cache_writes
from .passes.fuse_copy_launches import fuse_copy_launches
from .passes.fuse_residual_adds import fuse_residual_adds
from .passes.lower_copies import lower_copies
from .runtime import SCMRuntime, graphs
from .scm.guards import ConstantInput, GuardList, KernelGlobal, SameTensor, TracedShapes, describe, first_failure
from .scm.ir import RegionProgram
from .scm.printer import format_guard, format_scm, format_symbols


def _copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy to optimize (the caller's module stays as it is). Its Python code is generated
    once, when it is first called or its code is read (torch's lazy graph module), not for the
    copy and again after the passes."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    new = _LazyGraphModule(gm, graph)
    new.meta.update(gm.meta)
    return new


@contextlib.contextmanager
def _one_recompile(gm: torch.fx.GraphModule):
    """Each pass recompiles the module it changed, so that it can be used alone; within the
    pipeline the module is recompiled once, at the end. A recompile generates the Python of the
    whole graph (~25 ms for a 16-layer decode step on the CPU machine, eight of them per optimize
    before): no pass reads the module's code, only its graph."""
    gm.recompile = _no_recompile  # shadows GraphModule.recompile on this instance only
    try:
        yield
    finally:
        del gm.recompile
        gm.recompile()


def _no_recompile():
    return None


def _make_scm(program: RegionProgram) -> int:
    rt = SCMRuntime(program)
    # Specialize ahead for the captured input facts with aligned pointers (what fresh tensors
    # have); other alignments, dtypes or devices are compiled on their first miss. With
    # TRIDENT_CACHE_DIR, the specializations an earlier process built come back from there.
    if not rt.restore_cached():
        rt.add_specialization(program.captured_inputs, [0] * len(program.inputs))
    return rt.region_id


_SCM_OP_TEXT = "torch.ops.trident.scm.default("


def _direct_forward(gm: torch.fx.GraphModule):
    """gm's forward with each trident.scm call made through trident._C.scm_call, which runs the
    op's kernel directly when the dispatcher would only select it (csrc/module.cpp, Note [Direct
    call of the SCM]) and calls the op otherwise. The graph, and gm.code, keep the op."""
    from .runtime.native import C

    code = gm.graph.python_code(root_module="self")
    src = code.src.replace(_SCM_OP_TEXT, "trident_scm_call(")
    namespace = dict(code.globals)
    namespace["trident_scm_call"] = C.scm_call_fast
    exec(compile(src, f"<trident forward of {type(gm).__name__}>", "exec"), namespace)
    return namespace["forward"]


def _install_input_checks(gm: torch.fx.GraphModule) -> None:
    """Replace the module's __call__ with a check of arity, tensor-ness and captured constants,
    then the direct forward (per-instance class, so other modules are untouched)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = [n.name for n in placeholders]
    tensor_positions = [i for i, n in enumerate(placeholders) if isinstance(n.meta.get("val"), torch.Tensor)]
    n_inputs = len(placeholders)
    direct = _direct_forward(gm)

    def diagnose(args) -> None:
        for i in tensor_positions:
            if not isinstance(args[i], torch.Tensor):
                raise TridentError(
                    f"input {names[i]!r} (position {i}) expected a Tensor, got {type(args[i]).__name__}"
                )
            if args[i].layout != torch.strided:
                raise TridentError(
                    f"input {names[i]!r} (position {i}) expected a strided (dense) tensor as captured, got layout "
                    f"{args[i].layout}; Triton kernels take dense memory: pass .to_dense()"
                )

    guards = call_guards(gm)
    gm.meta["trident_call_guards"] = guards

    def checked_call(self, *args, **kwargs):
        if kwargs or len(args) != n_inputs:
            raise TridentError(
                f"optimized graph expected {n_inputs} positional inputs ({', '.join(names)}), "
                f"got {len(args)} positional and {len(kwargs)} keyword"
            )
        if guards:
            failed = first_failure(guards, args)
            if failed is not None:
                # nothing ran: a front door may serve the call otherwise
                error = GuardError(failed.failure(args, names), before_effects=True)
                raise error
        try:
            return direct(self, *args)
        except TridentError:
            raise
        except Exception:
            # Type checks cost nothing on the hot path: a non-tensor input fails in the graph
            # (or the op's argument parser), and is named here.
            diagnose(args)
            raise

    type(gm).__call__ = checked_call



def call_guards(gm: torch.fx.GraphModule) -> list:
    """The graph-level call guards (Note [One guard table]): captured constants, inputs that were
    one tensor, the globals the regions' kernels read."""
    guards = GuardList(ConstantInput(i, v) for i, v in dict(gm.meta.get("trident_constant_inputs", {})).items())
    guards += [SameTensor(i, j) for i, j in gm.meta.get("trident_same_inputs", ())]
    guards += [KernelGlobal(kernel, name, value, held) for kernel, name, held, value in _kernel_globals(gm)]
    if gm.meta.get("trident_shape_env") is not None:
        guards.append(traced_shapes(gm))
    return guards


def traced_shapes(gm: torch.fx.GraphModule) -> TracedShapes:
    """Note [Symbolic sizes]: every assumption of the symbolic trace about the graph's inputs, as
    one call guard: the shape environment's guards and value ranges, each input's static sizes and
    strides, and each size or stride the trace tied to a symbol another fact binds. Regions check
    what they rely on natively; this covers the rest (Python code between regions, expressions
    with no native form). A guard over a symbol no input fact binds (a data-dependent size)
    makes the symbolic graph unusable: UnsupportedError."""
    import sympy
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.printers import PythonPrinter

    from .scm.sizes import SizeExpr, size_of

    shape_env = gm.meta["trident_shape_env"]
    printer = PythonPrinter()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = [n.name for n in placeholders]
    tensors = [(i, n.meta["val"]) for i, n in enumerate(placeholders) if isinstance(n.meta.get("val"), torch.Tensor)]
    sources: dict = {}
    facts = []
    for kind in ("size", "stride"):
        for i, val in tensors:
            for d, v in enumerate(val.shape if kind == "size" else val.stride()):
                e = size_of(v)
                if isinstance(e, SizeExpr) and e.expr.is_Symbol and str(e) not in sources:
                    sources[str(e)] = (i, kind, d)
                else:
                    facts.append((i, kind, d, e))
    conditions = []

    def text(e) -> str:
        if isinstance(e, SizeExpr):
            missing = e.symbols - sources.keys()
            if missing:
                raise UnsupportedError(
                    f"the symbolic trace assumes {e}, over {', '.join(sorted(missing))}, which no input's size binds"
                )
            return printer.doprint(e.expr)
        return str(int(e))

    for i, kind, d, e in facts:
        fact = f"{names[i]}.{'shape' if kind == 'size' else 'stride()'}[{d}]"
        conditions.append((f"args[{i}].{'size' if kind == 'size' else 'stride'}({d}) == {text(e)}", f"{fact} == {e}"))
    seen = set()
    for g in shape_env.guards:
        expr = shape_env.replace(g.expr)
        if expr is sympy.true or expr in seen:
            continue
        seen.add(expr)
        conditions.append((text(SizeExpr(expr)), str(expr)))
    for name in sources:
        sym = next((x for x in shape_env.var_to_range if getattr(x, "name", None) == name), None)
        if sym is None:
            continue
        vr = shape_env.var_to_range[sym]
        if vr.lower not in (-int_oo, -sympy.oo):
            conditions.append((f"{name} >= {int(vr.lower)}", f"{name} >= {int(vr.lower)}"))
        if vr.upper not in (int_oo, sympy.oo):
            conditions.append((f"{name} <= {int(vr.upper)}", f"{name} <= {int(vr.upper)}"))
    return TracedShapes(
        tuple(conditions), tuple((n, *src) for n, src in sources.items()), tuple((i, val.dim()) for i, val in tensors)
    )


def _kernel_globals(gm: torch.fx.GraphModule) -> list:
    """(kernel name, name, globals dict, value) of every Python global a region's kernel (or a
    function it calls) reads: Triton's `used_global_vals`, which `kernel[grid]` checks before
    every launch (`JITFunction.run`), checked on every call of the optimized module the same way.
    Computing the kernel's cache key fills them in (Triton's DependenciesFinder)."""
    out = []
    seen = set()
    for rt in _regions(gm):
        for step in rt.program.launches:
            kernels = [step.fn] + [getattr(step.autotuner, "fn", None)]
            for kernel in kernels:
                if kernel is None or id(kernel) in seen or not hasattr(kernel, "used_global_vals"):
                    continue
                seen.add(id(kernel))
                try:
                    kernel.cache_key  # noqa: B018 - fills used_global_vals
                except Exception:
                    continue
                for (name, _), (value, held) in kernel.used_global_vals.items():
                    out.append((step.kernel_name, name, held, value))
    return out


def optimize(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every region of Triton launches (and the allocations feeding them) with ONE
    torch.ops.trident.scm call. Returns a new GraphModule; `gm` is left unchanged."""
    ensure_triton_driver()
    new = _copy_graph_module(gm)
    symbolic = gm.meta.get("trident_shape_env") is not None
    with _one_recompile(new):
        decompose_functional_launches(new)
        drop_unused_projections(new)
        cse_removed = eliminate_common_subexpressions(new)
        if not symbolic:
            # These passes plan with static layouts (grids of the kernels they emit, byte spans);
            # a symbolic capture keeps the ops they would rewrite (Note [Symbolic sizes]).
            fuse_residual_adds(new)
            lower_copies(new)  # after CSE (it merges equal clones), before allocations sink
            fuse_cache_writes(new)  # before fuse_copy_launches pairs the same writes
            fuse_copy_launches(new)
        sink_allocations(new)
        part = partition_regions(new)
        region_ids, skipped = outline_regions(new, part.regions, _make_scm)
    new.meta["trident_regions"] = region_ids
    new.meta["trident_cuts"] = part.cuts + skipped
    new.meta["trident_cse_removed"] = cse_removed
    new.meta["trident_symbolic"] = symbolic
    new.meta["trident_retry_region"] = _retry_region(new) if symbolic else None
    _install_input_checks(new)
    return new


def _retry_region(gm: torch.fx.GraphModule):
    """The first region's name when nothing before its call has an effect (a launch, an in-place
    or out= operator, another region): a GuardError it raises on a miss (Note [Symbolic sizes]:
    sizes its capture cannot serve) leaves the call without effects, so trident.compile may serve
    the call by another capture instead."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.trident.scm.default:
            return SCMRuntime.get(node.args[0]).program.name
        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator):
            return None
        schema = getattr(target, "_schema", None)
        if schema is not None and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            return None
    return None


def _regions(gm: torch.fx.GraphModule) -> list[SCMRuntime]:
    if "trident_regions" not in getattr(gm, "meta", {}):
        raise TridentError(
            f"expected what trident.optimize, trident.compile or torch.compile(backend='trident') returned, "
            f"got {type(gm).__name__}"
        )
    return [SCMRuntime.get(r) for r in gm.meta["trident_regions"]]


def _call_mix(rt: SCMRuntime) -> str:
    """How the region's operator calls run natively (specialization 0)."""
    from .runtime.native import C

    atens = rt.program.atens
    if not rt.scm.specializations:
        return f"{len(atens)}"
    views = rt.scm.specializations[0].views
    address = sum(v.pointer_only for v in views.values())
    native_views = len(views) - address
    rest = [s for s in atens if s.name not in views]
    constants = sum(s.cached for s in rest)
    typed = sum(
        not s.cached and C.aten_is_typed(rt.region_id, rt._aten_handles[s.name]) for s in rest
    )
    boxed = len(rest) - constants - typed
    return (
        f"{len(atens)} = {address} address-only views + {native_views} native views + {constants} constants "
        f"+ {typed} typed calls + {boxed} boxed calls"
    )


def _captures(obj) -> "list[tuple[str, torch.fx.GraphModule]] | None":
    """The optimized graphs behind a front door (trident.compile's function, a torch.compile
    graph of the trident backend), labelled by their signature; None for an optimized graph."""
    captures = getattr(obj, "captures", None)
    if isinstance(captures, dict):
        return [(f"capture {i}", opt) for i, opt in enumerate(captures.values())]
    graphs = _dynamo_graphs(obj)
    if graphs is None:
        return None
    return [(f"graph {i} capture {j}", opt) for i, g in enumerate(graphs) for j, opt in enumerate(g.captures.values())]


def _dynamo_graphs(obj):
    if isinstance(obj, torch.fx.GraphModule):
        return None
    from .frontends.dynamo import graphs_of

    return graphs_of(obj)


def _dynamo_head(obj) -> "list[str]":
    """explain()'s first lines for a torch.compile result: its graphs and Dynamo's graph breaks."""
    graphs = _dynamo_graphs(obj)
    if graphs is None:
        return []
    from torch._dynamo.utils import counters

    lines = [
        f"torch.compile(backend='trident'): {len(graphs)} Dynamo graph(s), "
        f"{sum(len(g.captures) for g in graphs)} capture(s); {sum(g.eager_calls for g in graphs)} call(s) ran eagerly"
    ]
    reasons = [g.eager_reason for g in graphs if g.eager_reason]
    if reasons:
        lines.append(f"last eager call: {reasons[-1]}")
    breaks = dict(counters.get("graph_break", {}))
    if breaks:
        lines.append(f"graph breaks Dynamo recorded in this process ({sum(breaks.values())}):")
        lines.extend(f"  {n}x {reason.splitlines()[0]}" for reason, n in breaks.items())
    return lines


def cache_info(gm) -> dict[str, dict]:
    """Per region: hits, misses, specializations (ints), and the last miss reason. For
    trident.compile's function: per capture, its regions."""
    captures = _captures(gm)
    if captures is not None:
        return {label: cache_info(opt) for label, opt in captures}
    return {rt.program.name: rt.stats() for rt in _regions(gm)}


def explain(gm) -> str:
    """What each region does and why; for trident.compile's function (or a graph the
    torch.compile backend made) every capture's, after how calls were served."""
    captures = _captures(gm)
    if captures is not None:
        head = _dynamo_head(gm)
        if not head:
            head = [f"{len(captures)} capture(s); {getattr(gm, 'eager_calls', 0)} call(s) ran eagerly"]
            reason = getattr(gm, "eager_reason", None)
            if reason:
                head.append(f"last eager call: {reason}")
        return "\n".join(head + [f"{label}:\n{explain(opt)}" for label, opt in captures]) + "\n"
    lines = []
    regions = _regions(gm)
    lines.append(f"{len(regions)} region(s)")
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    call = gm.meta.get("trident_call_guards", [])
    if call:
        lines.append("call guards (checked on every call, Note [One guard table]):")
        lines.extend(f"  {describe(g, placeholders)}" for g in call)
    for rt in regions:
        s = rt.stats()
        lines.append(
            f"{rt.program.name}: {len(rt.program.launches)} launch(es), {len(rt.program.allocs)} allocation(s); "
            f"hits={s['hits']} misses={s['misses']} specializations={s['specializations']}"
        )
        lines.append(f"  operator calls: {_call_mix(rt)}")
        lines.extend(f"  call guard {describe(g, [i.name for i in rt.program.inputs])}" for g in rt.guards)
        names = [i.name for i in rt.program.inputs]
        if rt.program.symbolic:
            lines.append(f"  symbolic sizes: {format_symbols(rt.program)} (one specialization per Triton key)")
            lines.extend(f"  size guard {describe(g, names)} (every call)" for g in rt.program.size_guards)
        program_guards = set(map(id, rt.program.size_guards))
        for spec in rt.scm.specializations:
            lines.append(f"  specialization {spec.index}:")
            exprs = rt.program.input_exprs if rt.program.symbolic else None
            lines.extend(f"    guard {format_guard(g, exprs[g.input] if exprs else ())}" for g in spec.guards)
            lines.extend(
                f"    guard {describe(g, names)}" for g in spec.size_guards if id(g) not in program_guards
            )
            for launch in spec.launches:
                extra = f" num_ctas={launch.num_ctas} (clusters: cuLaunchKernelEx)" if launch.num_ctas > 1 else ""
                lines.append(f"    launch {launch.step.kernel_name} key={launch.key}{extra}")
                if launch.step.tuned:
                    lines.append(f"      autotuned: {launch.step.tuned}")
            if spec.index < len(rt.host_plans) and spec.index < len(rt.build_costs):  # Note [Host plans]
                plan, cost = rt.host_plans[spec.index], rt.build_costs[spec.index]
                how = (
                    "its host program restored from TRIDENT_CACHE_DIR"
                    if cost.get("native_restored")
                    else f"host MLIR {cost.get('host_mlir_s', 0) * 1e3:.1f} ms + LLVM {cost.get('llvm_s', 0) * 1e3:.1f} ms"
                )
                lines.append(
                    f"    host plan: {len(plan.ops)} op(s), {len(plan.sizes)} computed size(s); built in plan "
                    f"{cost.get('plan_s', 0) * 1e3:.1f} ms + {how} (Triton {cost.get('triton_s', 0) * 1e3:.1f} ms)"
                )
            in_arena = [a for a in spec.allocs if a.arena_offset >= 0]
            if in_arena:
                lines.append(
                    f"    arena: {len(in_arena)} of {len(spec.allocs)} allocation(s) in one buffer of "
                    f"{in_arena[0].arena_bytes} bytes per call"
                )
            elif spec.arena:  # Note [Symbolic arena]
                fixed = sum(b.nbytes >= 0 for b in spec.arena)
                lines.append(
                    f"    arena: {len(spec.arena)} of {len(spec.allocs)} allocation(s) in one buffer placed per call "
                    f"for the sizes ({len(spec.arena) - fixed} sized by them, {fixed} fixed)"
                )
        devices = [g.facts.device for spec in rt.scm.specializations for g in spec.guards]
        names = [i.name for i in rt.program.inputs]
        lines.extend("  " + line for line in graphs.describe(rt.region_id, names, rt.graph_reason, devices))
        if s["last_miss_reason"]:
            lines.append(f"  last miss: {s['last_miss_reason']}")
    if gm.meta.get("trident_symbolic"):
        lines.append(
            "captured with symbolic sizes: lower_copies and the fusion passes (residual adds, cache writes, copy "
            "launches) were not run; they plan static layouts"
        )
    removed = gm.meta.get("trident_cse_removed", 0)
    if removed:
        lines.append(f"common subexpressions removed: {removed} node(s)")
    for op, why in gm.meta.get("trident_boxed_custom_ops", {}).items():  # Note [Inlining custom ops]
        lines.append(f"custom op {op} stays a boxed call: {why}")
    cuts = gm.meta.get("trident_cuts", [])
    if cuts:
        lines.append("cuts:")
        lines.extend(f"  {node}: {why}" for node, why in cuts)
    return "\n".join(lines) + "\n"


def scm_text(gm: torch.fx.GraphModule) -> str:
    """The printed SCM IR of every region."""
    return "".join(format_scm(rt.scm) for rt in _regions(gm))
