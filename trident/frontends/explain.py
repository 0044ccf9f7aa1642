"""Inspection of what the front doors and the pipeline made: `trident.explain`, `trident.cache_info`,
`trident.scm_text` (for an optimized graph, a trident.compile'd function, or a torch.compile
result of the trident backend)."""

from __future__ import annotations

import collections

import torch
from torch._dynamo.utils import counters

from ..optimize import _regions
from ..runtime import SCMRuntime, graphs
from ..runtime.native import C
from ..scm.printer import format_guard, format_scm, format_symbols, programmatic_mark
from .compile import CompiledModule
from .dynamo import graphs_of


def _call_mix(rt: SCMRuntime) -> str:
    """How the region's operator calls run natively (specialization 0)."""
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
    obj = _unwrap(obj)
    captures = getattr(obj, "captures", None)
    if isinstance(captures, dict):
        own = [(f"capture {i}", opt) for i, opt in enumerate(captures.values())]
        inner = getattr(obj, "_dynamo_fn", None)  # Note [Data-dependent calls through Dynamo]
        through = (_captures(inner) or []) if inner is not None else []
        return own + [(f"through torch.compile: {label}", opt) for label, opt in through]
    graphs = _dynamo_graphs(obj)
    if graphs is None:
        return None
    return [(f"graph {i} capture {j}", opt) for i, g in enumerate(graphs) for j, opt in enumerate(g.captures.values())]


def _unwrap(obj):
    """trident.compile's module (CompiledModule): its compiled function."""
    return obj._compiled if isinstance(obj, CompiledModule) else obj


def _dynamo_graphs(obj):
    if isinstance(obj, torch.fx.GraphModule):
        return None
    return graphs_of(obj)


def _dynamo_head(obj) -> "list[str]":
    """explain()'s first lines for a torch.compile result: its graphs and Dynamo's graph breaks."""
    graphs = _dynamo_graphs(obj)
    if graphs is None:
        return []
    lines = [
        f"torch.compile(backend='trident'): {len(graphs)} Dynamo graph(s), "
        f"{sum(len(g.captures) for g in graphs)} capture(s); {sum(g.eager_calls for g in graphs)} call(s) ran eagerly"
    ]
    reasons = [why for g in graphs for why in g.eager_log]
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
    gm = _unwrap(gm)
    captures = _captures(gm)
    if captures is not None:
        head = _dynamo_head(gm)
        if not head:
            head = [f"{len(gm.captures)} capture(s); {getattr(gm, 'eager_calls', 0)} call(s) ran eagerly"]
            if getattr(gm, "_dynamo_fn", None) is not None:  # Note [Data-dependent calls through Dynamo]
                head.append(f"{gm.dynamo_calls} call(s) went through torch.compile(backend='trident'): {gm.dynamo_reason}")
                head.extend(f"  {line}" for line in _dynamo_head(gm._dynamo_fn))
            log = list(getattr(gm, "eager_log", ()))
            if log:  # trident.compile: why each of the latest eager calls ran eagerly
                head.append(f"the latest eager calls ({len(log)}), why each ran eagerly:")
                head.extend(f"  {why}" for why in log)
            checks = getattr(gm, "_checks", None)
            if checks is not None:  # trident.compile (Note [Generated structure checks])
                head.append(
                    f"structure checks: {len(checks)} generated (the hit path checks the argument structure with "
                    "them instead of walking the arguments; TRIDENT_LOG=misses says why a structure got none)"
                )
        return "\n".join(head + [f"{label}:\n{explain(opt)}" for label, opt in captures]) + "\n"
    lines = []
    regions = _regions(gm)
    lines.append(f"{len(regions)} region(s)")
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    call = gm.meta.get("trident_call_guards", [])
    if call:
        lines.append("call guards (checked on every call, Note [One guard table]):")
        lines.extend(f"  {g.describe(placeholders)}" for g in call)
    for rt in regions:
        s = rt.stats()
        lines.append(
            f"{rt.program.name}: {len(rt.program.launches)} launch(es), {len(rt.program.allocs)} allocation(s); "
            f"hits={s['hits']} misses={s['misses']} specializations={s['specializations']}"
        )
        lines.append(f"  operator calls: {_call_mix(rt)}")
        lines.extend(f"  call guard {g.describe([i.name for i in rt.program.inputs])}" for g in rt.guards)
        names = [i.name for i in rt.program.inputs]
        if rt.program.symbolic:
            lines.append(f"  symbolic sizes: {format_symbols(rt.program)} (one specialization per Triton key)")
            lines.extend(f"  size guard {g.describe(names)} (every call)" for g in rt.program.size_guards)
        program_guards = set(map(id, rt.program.size_guards))
        for spec in rt.scm.specializations:
            if spec.index in rt.retired:  # Note [A specialization proves itself]
                lines.append(f"  specialization {spec.index}: retired, its first run failed: {rt.retired[spec.index]}")
                continue
            lines.append(f"  specialization {spec.index}:")
            exprs = rt.program.input_exprs if rt.program.symbolic else None
            lines.extend(f"    guard {format_guard(g, exprs[g.input] if exprs else ())}" for g in spec.guards)
            lines.extend(
                f"    guard {g.describe(names)}" for g in spec.size_guards if id(g) not in program_guards
            )
            for launch in spec.launches:
                extra = f" num_ctas={launch.num_ctas} (clusters: cuLaunchKernelEx)" if launch.num_ctas > 1 else ""
                lines.append(f"    launch {launch.step.kernel_name} key={launch.key}{extra}{programmatic_mark(launch)}")
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
    launches = [launch for rt in regions for spec in rt.scm.specializations for launch in spec.launches]
    marks = [programmatic_mark(launch) for launch in launches]
    if any(marks):  # Note [Programmatic dependent launch]
        twins = sorted({launch.step.kernel_name for launch, m in zip(launches, marks) if "twin" in m})
        lines.append(
            f"programmatic dependent launch: {sum(map(bool, marks))} of {len(launches)} launch(es)"
            + (f"; user kernels as their waiting twins: {', '.join(twins)}" if twins else "")
            + " (in recorded graphs; ordinary calls keep stream order)"
        )
    if gm.meta.get("trident_symbolic"):
        lines.append(
            "captured with symbolic sizes: lower_copies and the fusion passes (residual adds, cache writes, copy "
            "launches) were not run; they plan static layouts (fused glue and decode matmuls: only where every size "
            "is static)"
        )
    fused = gm.meta.get("trident_fused_glue", [])
    if fused:  # Note [Fused glue]
        lines.append(f"fused glue: {len(fused)} group(s) of ATen ops as Inductor-generated kernels:")
        lines.extend(f"  {line}" for line in fused)
    attention = gm.meta.get("trident_attention_choices", [])
    if attention:  # Note [Decode attention by measurement]
        lines.append("decode attention:")
        lines.extend(f"  {line}" for line in attention)
    prefill = gm.meta.get("trident_prefill_attention", [])
    if prefill:  # Note [Prefill attention without per-length plans]
        lines.append("prefill attention (symbolic lengths):")
        counts = collections.Counter(prefill)  # a model's layers repeat one line
        lines.extend(f"  {line}" + (f" (x{counts[line]})" if counts[line] > 1 else "") for line in counts)
    writes = gm.meta.get("trident_cache_writes_apart", [])  # fuse_cache_attention: None where given
    if writes:  # Note [The cache write inside the attention]
        inside = sum(w is None for w in writes)
        lines.append(f"cache writes inside the decode attention: {inside} of {len(writes)} attention(s)")
        lines.extend(f"  one stays a launch of its own: {w}" for w in writes if w is not None)
    choices = gm.meta.get("trident_matmul_choices", [])
    if choices:  # Note [Decode matmuls by measurement]
        lines.append("decode matmuls:")
        lines.extend(f"  {line}" for line in choices)
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
