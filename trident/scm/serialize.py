"""Specializations as plain data: what a plan is without the live objects behind it.

Note [A closed plan]
~~~~~~~~~~~~~~~~~~~~
A `Specialization` holds no live objects, in memory too: kernels, autotuners and heuristics are
`KernelRef`s, operators their names, compiled kernels Triton's hashes (Note [Stable keys],
scm/refs.py), and native handles live in the runtime's tables (RegionTables), so a
specialization pickles as it is. As a record it is closed the same way: steps are named by the program's step names, a tuned launch by its config's index, a
kernel by Triton's key (the key is what Triton's own binder computes for the recorded argument
facts: restoring re-derives it and refuses the record when it differs, e.g. after a Triton
upgrade), tensors by facts (dtype and device as strings, sizes, strides), Python scalars by
tagged JSON values (floats as hex: exact). Native handles are runtime state and are not part of
it: `SCMRuntime.install_specialization` binds them. What planning computed -- value facts,
guards, the arena, views, early releases, the autotuner's choice -- is restored as recorded, so
restoring costs Triton's key and (cached) compile per launch, not propagation or benchmarks.

`specialization_to_data` / `specialization_from_data` round-trip: the restored specialization
prints (scm/printer.py) and lowers to exactly the host program of the original
(tests/scm/test_serialize.py). TRIDENT_DUMP_DIR writes each specialization's record as
`<region>.<id>.spec<k>.json`. This is the record the persistent cache (issue 11) stores.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import triton.language as tl

from .. import triton_state
from ..errors import TridentError
from . import tuning
from .guards import SizeRelation
from .ir import (
    AllocPlan,
    ArenaBuffer,
    AtenPlan,
    RegionProgram,
    Specialization,
    TensorFacts,
    TensorGuard,
    ValueRef,
    ViewPlan,
)
from .refs import triton_environment
from .sizes import from_text
from .specialize import (
    PointerStandIn,
    _alloc_exprs,
    _concrete_step,
    _symbolic_launch,
    plan_launch,
    size_environment,
    unique_size_guards,
    view_exprs,
)

FORMAT = 1


class SerializationError(TridentError):
    """A specialization that cannot be written as data, or a record that does not fit."""


def _enc(v: Any) -> Any:
    if isinstance(v, ValueRef):
        return {"ref": [v.kind, v.index, v.name]}
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": v}
    if isinstance(v, float):
        return {"float": v.hex()}
    if isinstance(v, str):
        return {"str": v}
    if v is None:
        return {"none": True}
    if isinstance(v, (tuple, list)):
        return {"tuple": [_enc(x) for x in v]}
    if isinstance(v, torch.dtype):
        return {"torch_dtype": str(v).removeprefix("torch.")}

    if isinstance(v, tl.constexpr):
        return {"constexpr": _enc(v.value)}
    if isinstance(v, tl.dtype):
        return {"tl_dtype": v.name}
    raise SerializationError(f"cannot write a {type(v).__name__} ({v!r}) as plan data")


def _dec(d: Any) -> Any:
    (tag, v), = d.items()
    if tag == "ref":
        return ValueRef(v[0], int(v[1]), v[2])
    if tag in ("bool", "int", "str"):
        return v
    if tag == "float":
        return float.fromhex(v)
    if tag == "none":
        return None
    if tag == "tuple":
        return tuple(_dec(x) for x in v)
    if tag == "torch_dtype":
        return getattr(torch, v)

    if tag == "constexpr":
        return tl.constexpr(_dec(v))
    if tag == "tl_dtype":
        return tl.dtype(v)
    raise SerializationError(f"unknown plan value tag {tag!r}")


def _facts(f: TensorFacts) -> dict:
    return {"dtype": str(f.dtype).removeprefix("torch."), "device": str(f.device), "sizes": list(f.sizes),
            "strides": list(f.strides)}


def _facts_back(d: dict) -> TensorFacts:
    return TensorFacts(getattr(torch, d["dtype"]), torch.device(d["device"]), tuple(d["sizes"]), tuple(d["strides"]))


def _program_steps(program: RegionProgram) -> list[str]:
    return [s.name for s in program.steps]


def specialization_to_data(program: RegionProgram, spec: Specialization) -> dict:
    """The closed record of `spec` (Note [A closed plan]); JSON-serializable."""
    devices = {str(g.facts.device) for g in spec.guards} | {str(f.device) for f in spec.value_facts}
    triton_env = triton_environment()
    return {
        "format": FORMAT,
        "program": program.name,
        "steps": _program_steps(program),
        "index": spec.index,
        "devices": sorted(devices),
        "guards": [
            {"input": g.input, "name": g.name, "facts": _facts(g.facts), "aligned16": g.aligned16,
             "residue16": g.residue16, "free_sizes": list(g.free_sizes), "free_strides": list(g.free_strides)}
            for g in spec.guards
        ],
        # Note [Symbolic sizes]: what the specialization assumes of the sizes (re-derived on
        # restore from the program and the kernels' keys, and checked against this)
        "size_guards": [g.record() for g in spec.size_guards],
        "value_facts": [_facts(f) for f in spec.value_facts],
        "allocs": [{"step": a.step.name, "arena_offset": a.arena_offset, "arena_bytes": a.arena_bytes,
                    "arena_slot": a.arena_slot} for a in spec.allocs],
        # Note [Symbolic arena]: the placement order (value slot, fixed bytes or -1, placed above)
        "arena": [[b.slot, b.nbytes, list(b.below)] for b in spec.arena],
        "atens": [a.step.name for a in spec.atens],
        "views": {
            name: {"base": _enc(v.base), "base_facts": _facts(v.base_facts), "facts": _facts(v.facts),
                   "offset_delta": v.offset_delta, "delta_bytes": v.delta_bytes, "pointer_only": v.pointer_only}
            for name, v in spec.views.items()
        },
        "releases": {str(k): list(v) for k, v in spec.releases.items()},
        "launches": [
            {"step": p.step.name, "config": p.step.config, "tuned": p.step.tuned, "key": _enc(p.key),
             "num_warps": p.num_warps, "num_ctas": p.num_ctas, "shared": p.shared,
             "kernel": p.compiled.name if p.compiled is not None else p.step.kernel_name,
             "kernel_hash": p.binary, "ordinary_hash": p.ordinary, "triton_env": triton_env}
            for p in spec.launches
        ],
    }


def specialization_from_data(program: RegionProgram, data: dict, compile_kernels: bool) -> Specialization:
    """The specialization a record describes, for `program` (its steps by name). Launches get
    Triton's key again from the recorded argument facts and, with `compile_kernels`, their
    kernels (Triton's cache serves those it compiled before); a record for another program,
    format or Triton key raises SerializationError."""
    if data.get("format") != FORMAT:
        raise SerializationError(f"plan record format {data.get('format')!r}, expected {FORMAT}")
    if data.get("steps") != _program_steps(program):
        raise SerializationError(f"plan record is for another program than {program.name} (its steps differ)")
    with triton_state.exclusive():
        return _from_data(program, data, compile_kernels)


def _from_data(program: RegionProgram, data: dict, compile_kernels: bool) -> Specialization:
    guards = [
        TensorGuard(g["input"], g["name"], _facts_back(g["facts"]), g["aligned16"], g["residue16"],
                    tuple(g.get("free_sizes", ())), tuple(g.get("free_strides", ())))
        for g in data["guards"]
    ]
    env = size_environment(program, [g.facts for g in guards])
    size_guards = list(program.size_guards)
    value_facts = [_facts_back(f) for f in data["value_facts"]]
    allocs_by_name = {s.name: s for s in program.allocs}
    atens_by_name = {s.name: s for s in program.atens}
    launches_by_name = {s.name: s for s in program.launches}
    allocs = [
        AllocPlan(allocs_by_name[a["step"]], value_facts[allocs_by_name[a["step"]].slot], arena_offset=a["arena_offset"],
                  arena_bytes=a["arena_bytes"], arena_slot=a.get("arena_slot", -1))
        for a in data["allocs"]
    ]
    arena = [ArenaBuffer(slot, nbytes, tuple(below)) for slot, nbytes, below in data.get("arena", [])]
    atens = [AtenPlan(atens_by_name[name]) for name in data["atens"]]
    views = {
        name: ViewPlan(atens_by_name[name], _dec(v["base"]), _facts_back(v["base_facts"]), _facts_back(v["facts"]),
                       v["offset_delta"], v["delta_bytes"], v["pointer_only"],
                       view_exprs(program, atens_by_name[name], _dec(v["base"])))
        for name, v in data["views"].items()
    }
    releases = {int(k): tuple(v) for k, v in data["releases"].items()}
    devices = [torch.device(d) for d in data["devices"] if d != "cpu"] or [torch.device("cpu")]
    device = devices[0]
    launches = []
    triton_env = triton_environment()
    for item in data["launches"]:
        symbolic_step = step = launches_by_name[item["step"]]
        if env:
            step = _concrete_step(step, env)
        if item["config"] >= 0:
            step = dataclasses.replace(tuning.tuned_step(step, item["config"], ""), tuned=item["tuned"])
        key = _dec(item["key"])
        names = [p.name for p in step.fn.params]
        attrs = dict(zip(names, key))
        call_args = {}
        for name, value in step.args.items():
            if isinstance(value, ValueRef):
                facts = guards[value.index].facts if value.kind == "input" else value_facts[value.index]
                ty_attr = attrs.get(name)
                call_args[name] = PointerStandIn(facts.dtype, ty_attr is not None and ty_attr[1] == "D")
            else:
                call_args[name] = value
        # the kernel Triton compiled for the record, from its cache by hash, while the settings
        # Triton keys compiles by are the same (else Triton's compile decides)
        binary = ordinary = None
        if item.get("kernel_hash") and item.get("triton_env") == triton_env:
            binary = (item["kernel_hash"], item["kernel"])
            if item.get("ordinary_hash"):  # Note [Programmatic edges only in graphs]
                ordinary = (item["ordinary_hash"], item["kernel"])
        plan = plan_launch(step, call_args, device, compile_kernels, binary, ordinary)
        if plan.key != key:
            raise SerializationError(
                f"launch {step.name} ({step.kernel_name}): Triton's key is now {plan.key}, the record has {key}"
            )
        if env:
            size_guards += _symbolic_launch(program, symbolic_step, plan, env)
        launches.append(plan)
    for plan in allocs:
        plan.sizes_expr, plan.strides_expr = _alloc_exprs(program, plan.step.slot)
    # the alignment the kernels saw of views at offsets computed from sizes (Note [Symbolic
    # views]): from the record, as planning derived it from the layouts it does not keep
    size_guards += [
        SizeRelation(from_text(g["expr"]), program.symbols, g["why"])
        for g in data.get("size_guards", []) if g.get("kind") == "size_relation" and g["why"].startswith("alignment:")
    ]
    size_guards = unique_size_guards(size_guards)
    if [g.record() for g in size_guards] != data.get("size_guards", []):
        raise SerializationError(f"{program.name}: the record's size guards differ from those its program gives now")
    return Specialization(data["index"], guards, allocs, launches, atens, value_facts, views, releases, size_guards,
                          arena)
