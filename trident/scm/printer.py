"""Readable text for the SCM IR (golden-tested; addresses and handles never appear)."""

from __future__ import annotations

import torch

from .. import pdl
from .ir import SCM, AllocStep, AtenStep, LaunchStep, Param, Specialization, TensorFacts, TensorGuard, ValueRef

_DTYPE_SHORT = {
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "b8",
}


def format_dtype(dtype: torch.dtype) -> str:
    return _DTYPE_SHORT.get(dtype, str(dtype).replace("torch.", ""))


def format_facts(f: TensorFacts, exprs: tuple = ()) -> str:
    """`exprs`: (sizes, strides) with SizeExprs where they are symbolic (Note [Symbolic sizes])."""
    sizes, strides = exprs[:2] if exprs else (f.sizes, f.strides)
    return f"{format_dtype(f.dtype)}[{', '.join(map(str, sizes))}] strides=({', '.join(map(str, strides))}) {f.device}"


def format_guard(g: TensorGuard, exprs: tuple = ()) -> str:
    align = {True: " aligned16", False: " unaligned16", None: ""}[g.aligned16]
    if g.residue16 is not None:
        align = f" address%16=={g.residue16}"
    return f"{g.name}: {format_facts(g.facts, exprs)}{align}"


def format_symbols(program) -> str:
    """`s0 = x.shape[0], s1 = x.stride()[0]`: where each size symbol is read."""
    names = [i.name for i in program.inputs]
    return ", ".join(
        f"{n} = {names[b.input]}.{'shape' if b.kind == 'size' else 'stride()'}[{b.dim}]" for n, b in program.symbols.items()
    )


def format_key(key: tuple) -> str:
    parts = []
    for ty, attr in key:
        if ty == "constexpr":
            parts.append(f"constexpr={attr!r}")
        elif attr:
            parts.append(f"{ty}:{attr}")
        else:
            parts.append(ty)
    return "(" + ", ".join(parts) + ")"


def _format_source(src) -> str:
    if isinstance(src, ValueRef):
        return src.name
    if isinstance(src, list):
        return "[" + ", ".join(_format_source(s) for s in src) + "]"
    return repr(src)


def format_param(p: Param) -> str:
    return f"{p.name}={_format_source(p.source)}:{p.ty}"


def format_program(scm: SCM) -> list[str]:
    prog = scm.program
    ins = ", ".join(f"{i.name}{'!' if i.mutated else ''}" for i in prog.inputs)
    lines = [f"scm {prog.name}({ins}) -> ({', '.join(o.name for o in prog.outputs)})"]
    if prog.symbolic:
        lines.append(f"  symbols: {format_symbols(prog)}")
    for step in prog.steps:
        if isinstance(step, AllocStep):
            lines.append(f"  {step.name} = {step.op}  # value {step.slot}")
        elif isinstance(step, AtenStep):
            args = ", ".join(_format_source(a) for a in step.args)
            outs = ", ".join(prog.value_names[o] if o >= 0 else "_" for o in step.outputs)
            once = "  # constant: computed once per device" if step.cached else ""
            lines.append(f"  {outs} = {step.op_name}({args}){once}")
        elif isinstance(step, LaunchStep):
            args = ", ".join(
                f"{k}={v.name if isinstance(v, ValueRef) else repr(v)}" for k, v in step.args.items()
            )
            writes = ", ".join(step.writes)
            grid = ", ".join(map(str, step.grid))
            if step.tuner is not None:
                grid = "autotune: " + " | ".join(", ".join(map(str, g)) for g in step.grids)
            heur = f" heuristics({', '.join(step.heuristics[1])})" if step.heuristics is not None else ""
            lines.append(f"  launch {step.kernel_name}[{grid}]({args}) writes({writes}){heur}")
    return lines


def format_specialization(spec: Specialization, program=None) -> list[str]:
    symbolic = program is not None and program.symbolic
    names = [i.name for i in program.inputs] if program is not None else []
    lines = [f"  specialization {spec.index}:"]
    lines.append("    guards:")
    lines.extend(f"      {format_guard(g, program.input_exprs[g.input] if symbolic else ())}" for g in spec.guards)
    lines.extend(f"      size: {g.describe(names)}" for g in spec.size_guards)
    lines.append("    plan:")
    for a in spec.allocs:
        exprs = (a.sizes_expr, a.strides_expr) if a.dynamic else ()
        lines.append(f"      {a.step.name} = alloc {format_facts(a.facts, exprs)}{' zeroed' if a.step.zero else ''}")
    for v in spec.views.values():
        how = "address only" if v.pointer_only else "native view"
        if v.dynamic:  # Note [Symbolic views]
            delta = v.exprs[4]
            at = f"{delta:+d} elements" if isinstance(delta, int) else f"+ ({delta}) elements"
            lines.append(f"      {v.step.name} = {how}: {v.base.name} {at}, {format_facts(v.facts, v.exprs[2:4])}")
        else:
            lines.append(f"      {v.step.name} = {how}: {v.base.name} {v.delta_bytes:+d} B, {format_facts(v.facts)}")
    for k, b in enumerate(spec.arena):  # Note [Symbolic arena]
        size = f"{b.nbytes} B" if b.nbytes >= 0 else "sized per call"
        above = f"above arena[{', '.join(map(str, b.below))}]" if b.below else "at 0"
        lines.append(f"      arena[{k}] = {program.value_names[b.slot] if program is not None else b.slot}: {size}, {above}")
    for launch in spec.launches:
        lines.append(
            f"      launch {launch.step.kernel_name}[{', '.join(map(str, launch.grid or launch.step.grid))}] "
            f"key={format_key(launch.key)} num_warps={launch.num_warps} shared={launch.shared}"
            + programmatic_mark(launch)
        )
        if launch.step.tuned:
            lines.append(f"        autotuned: {launch.step.tuned}")
        lines.append(f"        params: {', '.join(format_param(p) for p in launch.params)}")
        if launch.aligned_values:
            names = [launch_value_name(spec, launch, i) for i in launch.aligned_values]
            lines.append(f"        runtime check: {', '.join(names)} 16-byte aligned")
    if spec.releases:
        value_names = program_value_names(spec)
        for step_index, slots in spec.releases.items():
            lines.append(f"      after step {step_index}: release {', '.join(value_names.get(s, f'value {s}') for s in slots)}")
    return lines


def programmatic_mark(launch) -> str:
    """Note [Programmatic dependent launch]: how a launch is programmatic, if it is; a user kernel
    launched as its waiting twin (compiled by Trident with ir_override=pdl.TWIN) says so (Note [A
    user kernel made to wait])."""
    if not launch.pdl:
        return ""
    if getattr(getattr(launch.compiled, "metadata", None), "ir_override", None) == pdl.TWIN:
        # Note [Programmatic edges only in graphs]
        return " programmatic, as its waiting twin" + (" (ordinary calls: as written)" if launch.ordinary else "")
    return " programmatic"


def program_value_names(spec: Specialization) -> dict[int, str]:
    """Slot -> a readable name (the step that made it), from the plan's own records."""
    names = {a.step.slot: a.step.name for a in spec.allocs}
    for plan in spec.atens:
        for k, slot in enumerate(plan.step.outputs):
            if slot >= 0:
                names[slot] = plan.step.name if len(plan.step.outputs) == 1 else f"{plan.step.name}[{k}]"
    return names


def launch_value_name(spec: Specialization, launch, slot: int) -> str:
    for p in launch.params:
        if isinstance(p.source, ValueRef) and p.source.kind == "value" and p.source.index == slot:
            return p.source.name
    return f"value {slot}"


def format_scm(scm: SCM) -> str:
    lines = format_program(scm)
    for spec in scm.specializations:
        lines.extend(format_specialization(spec, scm.program))
    return "\n".join(lines) + "\n"
