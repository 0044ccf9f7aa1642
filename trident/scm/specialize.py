"""Build one Specialization of a RegionProgram for concrete input facts.

Everything Triton decides per call is decided here once, by Triton itself:
  * the specialization key of every launch comes from the kernel's own binder
    (`JITFunction.create_binder` -> native_specialize_impl), fed with stand-ins that carry the
    real dtypes and the real pointer alignment;
  * the compiled kernel comes from `JITFunction.warmup` with those same arguments, so the
    cubin, its parameter list (constexprs and value-1 ints folded away) and its launch
    metadata are exactly what `kernel[grid](...)` would have used.
Allocation layouts come from fake-tensor propagation of the region's FX graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import weakref
from typing import Optional, Sequence

import sympy
import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._sympy import functions as F
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from .. import knobs, logs, pdl, triton_state
from ..errors import UnsupportedError
from ..layout import span
from . import sizes as S
from . import tuning
from .guards import IntegerKey, SizeRelation
from .ir import (
    DEFAULT,
    AllocPlan,
    ArenaBuffer,
    AtenPlan,
    AtenStep,
    LaunchPlan,
    LaunchStep,
    Param,
    RegionProgram,
    Specialization,
    TensorFacts,
    TensorGuard,
    ValueRef,
    ViewPlan,
)
from .refs import load_compiled, register_compiled, signature_mismatch
from .sizes import INT_KEY_CODES


class PointerStandIn:
    """What Triton's specializer sees of a tensor argument: its dtype and its address.
    Only the address modulo 16 matters, so a stand-in keeps `data_ptr() % 16` of the tensor."""

    def __init__(self, dtype: torch.dtype, aligned16: bool):
        self.dtype = dtype
        self._ptr = 0 if aligned16 else 4

    def data_ptr(self) -> int:
        return self._ptr


def _device_scope(device: torch.device):
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def propagate_values(
    program: RegionProgram, inputs: Sequence[TensorFacts], residues: Sequence[int]
) -> tuple[list[TensorFacts], list[int], list[Optional[int]], list[int], set[int]]:
    """For inputs with these facts and addresses (% 16): every region value's layout, its
    address % 16, the input whose storage it views (None for fresh storage), its storage
    offset, and the value slots whose storage a region output shares (they leave the region).

    The layouts depend on the inputs' facts alone, not on their addresses: they are computed
    once per set of facts (Note [Layouts per input facts]) and a specialization that differs
    only in alignment reuses them."""
    key = tuple(inputs)
    memo = program.layouts
    layouts = memo.pop(key, None)
    if layouts is None and program.symbolic and program.value_exprs:
        layouts = _symbolic_layouts(program, inputs)
    if layouts is None:
        layouts = _fake_layouts(program, inputs)
    memo[key] = layouts  # most recently used last
    while len(memo) > _LAYOUTS_KEPT:
        del memo[next(iter(memo))]
    facts, offsets, roots, offset_bytes, escaping, storage_ids = layouts
    value_residues = [
        b % 16 if root is None else (residues[root] + b) % 16  # fresh storage: allocators align to >= 16 bytes
        for root, b in zip(roots, offset_bytes)
    ]  # input storages start at offset 0 here
    return list(facts), value_residues, list(roots), list(offsets), set(escaping), list(storage_ids)


# Note [Layouts per input facts]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Propagating fake tensors through a region is most of a specialization's planning (a 24-layer
# decode region: ~0.2 s of 0.22 s), and what it yields -- each value's layout, the input storage
# it views, its storage offset -- is a function of the inputs' facts (dtype, device, sizes,
# strides). The common miss of a static region changes only an address's alignment (a hidden
# state 4 bytes off a 16-byte boundary): it reuses the propagation of the facts it shares with
# an earlier specialization, and only the residues are recomputed. A few sets are kept per
# region (least recently used dropped).
# A symbolic region knows its values' layouts as expressions of its inputs' sizes and strides
# (RegionProgram.value_exprs, exact under the trace's shape guards that every served call
# satisfies): for new sizes with the dtypes, devices and ranks of facts already propagated, the
# layouts are those expressions evaluated, and which storage each value shares (the aliasing
# the traced ops make, the same at every size the trace admits) comes from the earlier
# propagation (tests/scm/test_layouts.py checks both against fake propagation on many sizes).
_LAYOUTS_KEPT = 8


def _symbolic_layouts(program: RegionProgram, inputs: Sequence[TensorFacts]) -> Optional[tuple]:
    """The layouts of a symbolic region's values for `inputs`, from its expressions and an
    earlier propagation of facts of the same dtypes, devices and ranks; None when there is none."""
    shape = [(f.dtype, f.device, len(f.sizes)) for f in inputs]
    template = next(
        (v for k, v in reversed(program.layouts.items()) if [(f.dtype, f.device, len(f.sizes)) for f in k] == shape),
        None,
    )
    if template is None:
        return None
    env = size_environment(program, inputs)
    old_facts, _, roots, _, escaping, storage_ids = template
    # The expressions count a view's offset in its input's storage as traced; propagation counts
    # it from the input's first element (inputs start at offset 0 there): the traced input's own
    # offset comes off.
    # offset comes off. An input traced with a symbolic offset of its own (a view passed as the
    # example) has a symbol no size binds: it cancels in the difference, taken before evaluating.
    base = [S.size_of(n.meta["val"].storage_offset()) for n in program.graph_module.graph.nodes
            if n.op == "placeholder"]
    facts, offsets, offset_bytes = [], [], []
    for old, root, (sizes, strides, offset) in zip(old_facts, roots, program.value_exprs):
        f = TensorFacts(old.dtype, old.device, tuple(S.concrete(sizes, env)), tuple(S.concrete(strides, env)))
        facts.append(f)
        offsets.append(int(S.concrete(S.difference(offset, base[root] if root is not None else 0), env)))
        offset_bytes.append(offsets[-1] * f.dtype.itemsize)
    return tuple(facts), tuple(offsets), roots, tuple(offset_bytes), escaping, storage_ids


def _fake_layouts(program: RegionProgram, inputs: Sequence[TensorFacts]) -> tuple:
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:
        fakes = [torch.empty_strided(f.sizes, f.strides, dtype=f.dtype, device=f.device) for f in inputs]
    values: dict[str, object] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n.name] = out
            return out

    with mode:
        Recorder(program.graph_module).run(*fakes)
    storage_of_input = {StorageWeakRef(f.untyped_storage()): i for i, f in enumerate(fakes)}
    facts, offsets, roots, offset_bytes, storages = [], [], [], [], []
    for name in program.value_names:
        base, _, k = name.partition("[")
        val = values[base] if not k else values[base][int(k[:-1])]
        facts.append(TensorFacts.of(val))
        offsets.append(val.storage_offset())
        roots.append(storage_of_input.get(StorageWeakRef(val.untyped_storage())))
        offset_bytes.append(val.storage_offset() * val.element_size())
        storages.append(StorageWeakRef(val.untyped_storage()))
    leaving = {storages[o.index] for o in program.outputs}
    escaping = frozenset(i for i, st in enumerate(storages) if st in leaving)
    ids: dict[StorageWeakRef, int] = {}
    storage_ids = tuple(ids.setdefault(st, len(ids)) for st in storages)
    return tuple(facts), tuple(offsets), tuple(roots), tuple(offset_bytes), escaping, storage_ids


_triton_seconds = threading.local()  # this thread's time in Triton's compiler (kernel.warmup)


def triton_compile_seconds() -> float:
    """Seconds this thread has spent in Triton's compiler (JITFunction.warmup) while planning
    specializations: the miss-cost split's Triton share (runtime/scm_module.py)."""
    return getattr(_triton_seconds, "total", 0.0)


_BINDERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # JITFunction -> {target: binder}


def _binder(kernel):
    """Triton's binder for `kernel` on the current target: the function `kernel[grid](...)` runs
    to bind arguments and compute the specialization key, built the way `JITFunction.create_binder`
    builds it (`create_function_from_signature` over the kernel's signature and parameters, for
    the target's backend) instead of read out of the private `device_caches` tuples."""
    target = triton.runtime.driver.active.get_current_target()
    per_target = _BINDERS.setdefault(kernel, {})
    binder = per_target.get(target)
    if binder is None:
        binder = per_target[target] = create_function_from_signature(kernel.signature, kernel.params, make_backend(target))
    return binder


def _memo_launch_plan(program: RegionProgram, step: LaunchStep, input_facts, input_residues, value_facts,
                      value_residues, device, compile_kernel) -> LaunchPlan:
    """_launch_plan, reused when the launch's arguments have the facts (dtype, layout, address
    residue) of an earlier specialization's: a miss on one input's alignment re-plans only the
    launches that read it (Note [Layouts per input facts] does the same for propagation). A
    launch plan is data (Note [Stable keys]), so a copy of the earlier one is this one."""
    facts = []
    for name, value in step.args.items():
        if isinstance(value, ValueRef):
            f, r = (input_facts, input_residues) if value.kind == "input" else (value_facts, value_residues)
            facts.append((name, f[value.index], r[value.index]))
    key = (step.name, device, compile_kernel, tuple(facts))
    plan = program.launch_plans.get(key)
    if plan is None:
        plan = program.launch_plans[key] = _launch_plan(
            step, input_facts, input_residues, value_facts, value_residues, device, compile_kernel
        )
    return dataclasses.replace(plan)


def _launch_plan(
    step: LaunchStep,
    input_facts: Sequence[TensorFacts],
    input_residues: Sequence[int],
    value_facts: Sequence[TensorFacts],
    value_residues: Sequence[int],
    device: torch.device,
    compile_kernel: bool,
) -> LaunchPlan:
    if step.tuner is not None or step.heuristics is not None:
        # Note [Autotuned launches]: heuristics re-checked, one config for this specialization.
        stand_ins = {}
        for name, value in step.args.items():
            if isinstance(value, ValueRef):
                facts, residues = (input_facts, input_residues) if value.kind == "input" else (value_facts, value_residues)
                stand_ins[name] = facts[value.index].allocate(residues[value.index], zero=True)
            else:
                stand_ins[name] = value
        if step.heuristics is not None:
            tuning.check_heuristics(step, stand_ins)
        if step.tuner is not None:
            step = tuning.tuned_step(step, *tuning.choose(step, stand_ins, device))
    call_args = {}
    for name, value in step.args.items():
        if isinstance(value, ValueRef):
            if value.kind == "input":
                call_args[name] = PointerStandIn(input_facts[value.index].dtype, input_residues[value.index] == 0)
            else:
                call_args[name] = PointerStandIn(value_facts[value.index].dtype, value_residues[value.index] == 0)
        else:
            call_args[name] = value
    return plan_launch(step, call_args, device, compile_kernel)


def plan_launch(
    step: LaunchStep, call_args: dict, device: torch.device, compile_kernel: bool, binary: Optional[tuple] = None,
    ordinary: Optional[tuple] = None,
) -> LaunchPlan:
    """The plan of one launch (a tuned step: its config's) given what Triton's specializer sees of
    each argument (`PointerStandIn`s for tensors): Triton's key from its own binder, the
    compiled kernel (JITFunction.warmup, when `compile_kernel`), the parameters it receives.
    `binary`: (Triton's hash, kernel name) of the kernel a plan record says it compiled to, read
    from Triton's cache instead of compiling (refs.load_compiled) when it is there; `ordinary`:
    the same of the user's own kernel where that is a waiting twin (Note [Programmatic edges only
    in graphs])."""
    kernel = step.fn
    with _device_scope(device):
        binder = _binder(kernel)
        try:
            _, specialization, _ = binder(**call_args)
        except TypeError as e:
            raise UnsupportedError(f"launch of {step.kernel_name}: {e}") from e
        except KeyError as e:  # Triton's type table has no entry for a tensor's dtype
            dtypes = {
                name: str(a.dtype).replace("torch.", "")
                for name, a in call_args.items()
                if isinstance(a, PointerStandIn)
            }
            raise UnsupportedError(
                f"launch of {step.kernel_name}: Triton has no pointer type for dtype {e.args[0]!r} "
                f"(tensor arguments: {', '.join(f'{k}: {v}' for k, v in dtypes.items())}); "
                "eager kernel[grid] would fail the same way"
            ) from e
        t0 = time.perf_counter()
        compiled = None
        if compile_kernel and binary is not None:
            compiled = load_compiled(*binary)
            warps = step.args.get("num_warps", 4)  # Triton's default on CUDA
            why = None if compiled is None else signature_mismatch(
                compiled, kernel, list(zip([p.name for p in kernel.params], specialization)),
                warps if isinstance(warps, int) else None)
            if why is not None:  # a record names a kernel that is not this launch's: Triton compiles it
                logs.misses.warning("launch of %s: the kernel its record names (Triton hash %s) is not its "
                                    "specialization: %s; compiling it", step.kernel_name, binary[0], why)
                compiled = None
        if compile_kernel and compiled is None:
            compiled = kernel.warmup(grid=step.grid, **call_args)
        own = None  # Note [Programmatic edges only in graphs]: the user's kernel, where a twin is launched
        if compiled is not None and _twinnable(step, compiled, device):
            own, compiled = compiled, _twin(step, call_args, compiled)
        if own is compiled:
            own = None
        programmatic = _programmatic(step, compiled)
        if own is None and programmatic and getattr(compiled.metadata, "ir_override", None) == pdl.TWIN:
            # a restored record's twin: the user's kernel by the record's hash, else as Triton compiles it
            own = load_compiled(*ordinary) if ordinary is not None else None
            if own is None or signature_mismatch(own, kernel, list(zip([p.name for p in kernel.params], specialization)),
                                                 compiled.metadata.num_warps) is not None:
                own = kernel.warmup(grid=step.grid, **call_args)
        _triton_seconds.total = getattr(_triton_seconds, "total", 0.0) + time.perf_counter() - t0
    key = tuple((ty, attr) for ty, attr in specialization)
    # Parameters the compiled kernel receives: Triton drops every constexpr (declared ones and
    # folded value-1 ints / None) from the signature.
    param_names = [p.name for p in kernel.params]
    params: list[Param] = []
    constexprs = {}
    aligned_values = []
    for pname, (ty, attr) in zip(param_names, key):
        value = step.args.get(pname, kernel.params[param_names.index(pname)].default)
        if ty == "constexpr":
            constexprs[pname] = attr
            continue
        if isinstance(ty, tuple):
            raise UnsupportedError(f"launch of {step.kernel_name}: tuple parameter {pname!r}")
        if isinstance(value, ValueRef) and value.kind == "value" and attr == "D":
            aligned_values.append(value.index)
        params.append(Param(pname, ty, value))
    meta = compiled.metadata if compiled is not None else None
    num_warps = meta.num_warps if meta else step.args.get("num_warps", 4)
    return LaunchPlan(
        step=step,
        key=key,
        params=params,
        constexprs=constexprs,
        num_warps=num_warps,
        num_ctas=meta.num_ctas if meta else 1,
        shared=meta.shared if meta else 0,
        aligned_values=tuple(sorted(set(aligned_values))),
        binary=None if compiled is None else register_compiled(compiled),
        cooperative=bool(getattr(meta, "launch_cooperative_grid", False)),
        pdl=programmatic,
        ordinary=register_compiled(own) if own is not None and programmatic else None,
    )


def _twinnable(step: LaunchStep, compiled, device) -> bool:
    """Whether a launch's kernel is to be launched as its twin that waits first (Note [A user
    kernel made to wait]): wanted on `device`, not compiled with launch_pdl, no grid dependency
    instruction of its own (Trident's kernels with PDL on hold theirs), not a cooperative launch,
    no ir_override of the launch's own."""
    meta = compiled.metadata
    return (pdl.twins_wanted(device) and not getattr(meta, "launch_pdl", False)
            and not getattr(meta, "launch_cooperative_grid", False) and "ir_override" not in step.args
            and not pdl.holds_grid_dependency(compiled.asm.get("ptx") or ""))


def _twin(step: LaunchStep, call_args: dict, compiled):
    """The kernel of `compiled`'s launch compiled once more by Triton with launch_pdl=True,
    ir_override=pdl.TWIN and the grid dependency instructions first (Note [A user kernel made to
    wait]); `compiled` itself where that fails or the result does not provably wait first."""
    try:
        with pdl.twin_compilation():
            twin = step.fn.warmup(grid=step.grid, **{**call_args, "launch_pdl": True, "ir_override": pdl.TWIN})
    except Exception as e:  # ptxas or Triton refusing the twin: the kernel keeps ordinary ordering
        logs.misses.warning("launch of %s: its waiting twin did not compile (%s: %s); it keeps ordinary ordering",
                            step.kernel_name, type(e).__name__, e)
        return compiled
    if twin is not None and pdl.waits_before_memory(twin.asm.get("ptx") or ""):
        return twin
    logs.misses.info("launch of %s: its twin (Triton hash %s) does not provably wait first; it keeps ordinary "
                     "ordering", step.kernel_name, getattr(twin, "hash", None))
    return compiled


def _programmatic(step: LaunchStep, compiled) -> bool:
    """Whether the launch gets programmatic stream serialization (Note [Programmatic dependent
    launch]): the launch asked for launch_pdl itself (the user's promise, as Triton launches it),
    or PDL is enabled (TRIDENT_PDL, CUDA 12.3+) and its kernel's PTX waits before touching global
    memory -- a twin (launch_pdl in its metadata, not in the launch's arguments) included, proven
    again wherever a plan record names it."""
    if compiled is None:
        return False
    if getattr(compiled.metadata, "launch_pdl", False) and step.args.get("launch_pdl"):
        return True
    return pdl.enabled() and pdl.waits_before_memory(compiled.asm.get("ptx") or "")


def build_specialization(
    program: RegionProgram,
    inputs: Sequence[TensorFacts],
    residues: Sequence[int],
    index: int,
    compile_kernels: bool = True,
) -> Specialization:
    # Triton's binder, compiler and autotuner read triton.language: not while an interpreted
    # launch has it patched (Note [Triton's interpreter state]).
    with triton_state.exclusive():
        return _build_specialization(program, inputs, residues, index, compile_kernels)


def _build_specialization(
    program: RegionProgram,
    inputs: Sequence[TensorFacts],
    residues: Sequence[int],
    index: int,
    compile_kernels: bool,
) -> Specialization:
    value_facts, value_residues, roots, value_offsets, escaping, storage_ids = propagate_values(
        program, inputs, residues
    )
    launched = {
        v.index for step in program.launches for v in step.args.values() if isinstance(v, ValueRef) and v.kind == "value"
    }
    launched_inputs = {
        v.index for step in program.launches for v in step.args.values() if isinstance(v, ValueRef) and v.kind == "input"
    }
    # A 0-dim CPU tensor next to CUDA tensors is a scalar to ATen (as in eager), not a device.
    devices = {
        f.device for i, f in enumerate(inputs) if f.sizes or f.device.type != "cpu" or i in launched_inputs
    } | {value_facts[a.slot].device for a in program.allocs}
    devices |= {value_facts[i].device for i in launched}
    if len(devices) > 1:
        raise UnsupportedError(
            f"region {program.name} mixes devices {sorted(map(str, devices))}; one region runs on one device"
        )
    device = devices.pop() if devices else torch.device("cpu")
    steps = program.launches
    if compile_kernels:
        steps = logs.progress(steps, f"trident {program.name}: compiling kernels")
    env = size_environment(program, inputs)
    size_guards = list(program.size_guards)
    launches = []
    for step in steps:
        if env:
            concrete_step = _concrete_step(step, env)
            plan = _launch_plan(concrete_step, inputs, residues, value_facts, value_residues, device, compile_kernels)
            size_guards += _symbolic_launch(program, step, plan, env)
        else:
            plan = _memo_launch_plan(program, step, inputs, residues, value_facts, value_residues, device, compile_kernels)
        launches.append(plan)
    # A guard pins an input's alignment when some launch specializes on it: as aligned or not
    # when the input itself is passed, exactly (address % 16) when a view of it is. (Triton's
    # KernelParam flags say whether a parameter specializes: do_not_specialize and
    # do_not_specialize_on_alignment parameters get the same key at any address.)
    aligned: dict[int, bool] = {}
    exact: dict[int, int] = {}
    for plan in launches:
        kparams = {q.name: q for q in plan.step.fn.params}
        for p in plan.params:
            kp = kparams[p.name]
            if not isinstance(p.source, ValueRef) or kp.do_not_specialize or kp.do_not_specialize_on_alignment:
                continue
            if p.source.kind == "input":
                aligned[p.source.index] = residues[p.source.index] == 0
                continue
            if roots[p.source.index] is not None:
                exact[roots[p.source.index]] = residues[roots[p.source.index]]
            if program.symbolic:
                size_guards += _alignment_guard(program, p.source, roots, residues, value_facts, value_residues)
    guards = [
        TensorGuard(i, inp.name, inputs[i], None if i in exact else aligned.get(i), exact.get(i),
                    *_free_dims(program, i))
        for i, inp in enumerate(program.inputs)
    ]
    allocs = [AllocPlan(step, value_facts[step.slot]) for step in program.allocs]
    for plan in allocs:
        plan.sizes_expr, plan.strides_expr = _alloc_exprs(program, plan.step.slot)
    arena = plan_arena(program, allocs, escaping, storage_ids) if knobs.native_path("arena") else []
    atens = [AtenPlan(step) for step in program.atens]
    views = _memo_views(program, inputs, value_facts, value_offsets, roots) if knobs.native_path("views") else {}
    releases = plan_releases(program, allocs, roots, escaping, storage_ids) if knobs.native_path("release") else {}
    size_guards = unique_size_guards(size_guards)
    return Specialization(index, guards, allocs, launches, atens, value_facts, views, releases, size_guards, arena)


def _alignment_guard(program, ref: ValueRef, roots, residues, value_facts, value_residues) -> list:
    """Note [Symbolic views]: a kernel argument viewing a storage at an offset that depends on
    sizes (`x[-1]`: (rows - 1) * cols elements in) is 16-byte aligned at some sizes and not at
    others, and Triton's key says which: the specialization assumes what it saw, as a size guard
    (another specialization is built where it does not hold). The storage's own start is pinned
    (an input's address % 16 by its tensor guard; a fresh storage is 16-byte aligned)."""
    _, _, offset = program.value_exprs[ref.index]
    root = roots[ref.index]
    # bytes from the storage's start (storage offsets count elements of each tensor's own dtype)
    item = value_facts[ref.index].dtype.itemsize
    nbytes = S.scaled(offset, item)
    if root is not None:
        placeholder = [n for n in program.graph_module.graph.nodes if n.op == "placeholder"][root]
        nbytes = S.difference(nbytes, S.scaled(_traced_offset(program, root), placeholder.meta["val"].dtype.itemsize))
    if not S.is_symbolic(nbytes):
        return []
    start = residues[root] if root is not None else 0
    rem = F.PythonMod(start + nbytes.expr, 16)
    aligned = value_residues[ref.index] == 0
    rel = sympy.Eq(rem, 0) if aligned else sympy.Ne(rem, 0)
    if rel in (sympy.true, sympy.false):
        return []
    what = f"alignment: {program.value_names[ref.index]} is {'' if aligned else 'not '}16-byte aligned"
    return [SizeRelation(S.SizeExpr(rel), program.symbols, what)]


def _traced_offset(program: RegionProgram, i: int):
    """The storage offset input `i` had in the trace (value offsets count from its storage's start)."""
    placeholders = [n for n in program.graph_module.graph.nodes if n.op == "placeholder"]
    return S.size_of(placeholders[i].meta["val"].storage_offset())


def unique_size_guards(size_guards: list) -> list:
    """One check per distinct condition (two launches keyed on one size), in order."""
    unique = {}
    for g in size_guards:
        unique.setdefault((type(g).__name__, str(getattr(g, "expr", g)), getattr(g, "code", None),
                           getattr(g, "input", None), getattr(g, "kind", None), getattr(g, "dim", None)), g)
    return list(unique.values())


# -- Note [Symbolic sizes] ---------------------------------------------------------------------

def size_environment(program: RegionProgram, inputs: Sequence[TensorFacts]) -> dict:
    """The value of each of the program's size symbols for inputs with these facts ({} when the
    program is static)."""
    env = {}
    for name, b in program.symbols.items():
        f = inputs[b.input]
        env[name] = (f.sizes if b.kind == "size" else f.strides)[b.dim]
    return env


def _concrete_step(step: LaunchStep, env: dict) -> LaunchStep:
    return dataclasses.replace(
        step, grid=S.concrete(step.grid, env), grids=S.concrete(step.grids, env),
        args={k: S.concrete(v, env) for k, v in step.args.items()},
    )


def _free_dims(program: RegionProgram, i: int) -> tuple:
    if not program.symbolic:
        return (), ()
    sizes, strides = program.input_exprs[i]
    return (tuple(d for d, e in enumerate(sizes) if S.is_symbolic(e)),
            tuple(d for d, e in enumerate(strides) if S.is_symbolic(e)))


def _alloc_exprs(program: RegionProgram, slot: int) -> tuple:
    if not program.symbolic:
        return (), ()
    sizes, strides, _ = program.value_exprs[slot]
    if not S.has_symbols(sizes) and not S.has_symbols(strides):
        return (), ()
    return tuple(sizes), tuple(strides)


def _symbolic_launch(program: RegionProgram, step: LaunchStep, plan: LaunchPlan, env: dict) -> list:
    """Makes `plan` (built for the sizes `env`) serve every size with the same Triton key: its
    grid and integer parameters become the step's expressions, and the guards it needs are
    returned -- Triton's key of each integer argument computed from sizes (IntegerKey), and a
    pinned value (SizeRelation Eq) for each size an autotuner, a heuristic or a constexpr saw."""
    symbols = program.symbols
    used = set()
    for e in S.expressions_in((step.grid, step.grids, step.args)):
        used |= e.symbols
    if not used:
        return []
    if step.tuner is not None or step.heuristics is not None:
        # Python chose the config (or computed the heuristic values) from the sizes: they are
        # pinned, as Triton's autotuner re-tunes for each new value of its key.
        why = "autotune" if step.tuner is not None else "heuristic"
        return [
            SizeRelation(S.SizeExpr(sympy.Eq(sympy.Symbol(n, integer=True, positive=True), env[n])), symbols,
                         f"{why}: {step.kernel_name} was tuned for it")
            for n in sorted(used)
        ]
    plan.step = step
    plan.grid = step.grid
    plan.params = [
        Param(p.name, p.ty, step.args[p.name]) if S.is_symbolic(step.args.get(p.name)) else p for p in plan.params
    ]

    declared = {p.name: p for p in step.fn.params}
    guards = []
    for pname, (ty, attr) in zip([p.name for p in step.fn.params], plan.key):
        expr = step.args.get(pname)
        if not S.is_symbolic(expr):
            continue
        what = f"{step.kernel_name}({pname})"
        code = None if declared[pname].is_constexpr else INT_KEY_CODES.get((ty, attr))
        if code is None:  # a constexpr (or a type without a key code) computed from sizes: pinned
            value = expr.evaluate(env)
            guards.append(SizeRelation(S.SizeExpr(sympy.Eq(expr.expr, value)), symbols, f"constexpr {what}"))
        else:
            guards.append(IntegerKey(expr, code, attr is not None, what, symbols))
    return guards


ARENA_ALIGN = 256


def _value_refs(value) -> list[ValueRef]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in items if isinstance(v, ValueRef) and v.kind == "value"]


def storage_last_uses(program: RegionProgram, storage_ids: Sequence[int]) -> dict[int, int]:
    """Per storage: the index of the last step that reads or writes any value living in it
    (an operator argument, a kernel argument, a view's base). Kept per storage assignment
    (the arena and the releases ask for the same one)."""
    key = tuple(storage_ids)
    known = program.last_uses.get(key)
    if known is not None:
        return known
    last: dict[int, int] = {}
    for i, step in enumerate(program.steps):
        args = step.args.values() if isinstance(step, LaunchStep) else getattr(step, "args", ())
        for a in args:
            for ref in _value_refs(a):
                last[storage_ids[ref.index]] = i
        for slot in getattr(step, "outputs", ()):
            if slot >= 0:  # a result living in an existing storage (a view, an in-place result)
                last[storage_ids[slot]] = max(last.get(storage_ids[slot], i), i)
    program.last_uses[key] = last
    return last


def plan_arena(
    program: RegionProgram, allocs: Sequence[AllocPlan], escaping: set[int], storage_ids: Sequence[int]
) -> list[ArenaBuffer]:
    """Note [Allocation arena] (trident/csrc/scm_runtime.cpp): byte offsets in one per-call
    arena for the allocations whose storage no region output shares. Buffers whose lifetimes
    (allocation step .. last step touching their storage) do not overlap share bytes: the steps
    run in order on one stream, so a buffer's bytes are free once the last step using it has
    been issued. Greedy first fit, largest buffers first. With fixed sizes the offsets are set on
    the plans (arena_offset) and [] is returned; when some buffer's size depends on the input
    sizes, the placement becomes a table (Note [Symbolic arena]) that is returned."""
    step_of = {id(step): i for i, step in enumerate(program.steps)}
    last = storage_last_uses(program, storage_ids)
    inside = []
    for plan in allocs:
        f = plan.facts
        if plan.step.slot in escaping or f.device.type not in ("cpu", "cuda"):
            continue
        nbytes = arena_bytes(f.sizes, f.strides, f.dtype.itemsize)
        if nbytes == 0 and not plan.dynamic:
            continue
        begin = step_of[id(plan.step)]
        end = max(last.get(storage_ids[plan.step.slot], begin), begin)
        inside.append((plan, begin, end, nbytes))
    if len(inside) < 2:
        return []  # one buffer: its own allocation costs the same and needs no slicing
    offsets, size = first_fit([(begin, end, nbytes) for _, begin, end, nbytes in inside])
    if not any(plan.dynamic for plan, *_ in inside):
        for (plan, *_), offset in zip(inside, offsets):
            plan.arena_offset = offset
            plan.arena_bytes = size
        return []
    order = symbolic_arena([(begin, end, nbytes) for _, begin, end, nbytes in inside], offsets)
    table = []
    for k, i in enumerate(order.order):
        plan, *_, nbytes = inside[i]
        plan.arena_slot = k
        table.append(ArenaBuffer(plan.step.slot, -1 if plan.dynamic else nbytes, order.below[k]))
    return table


def first_fit(buffers: Sequence[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Offsets for buffers (first step, last step, bytes) such that two live at a common step
    never share bytes, and the arena's size: greedy first fit, largest buffers first."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, nbytes, begin, end)
    size = 0
    offsets = [0] * len(buffers)
    for i in sorted(range(len(buffers)), key=lambda i: (-buffers[i][2], buffers[i][0])):
        begin, end, nbytes = buffers[i]
        busy = sorted((o, o + n) for o, n, b, e in placed if b <= end and begin <= e)
        offset = 0
        for lo, hi in busy:
            if offset + nbytes <= lo:
                break
            offset = max(offset, hi)
        offsets[i] = offset
        placed.append((offset, nbytes, begin, end))
        size = max(size, offset + nbytes)
    return offsets, size


def arena_bytes(sizes: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    """Bytes a buffer of this layout takes in the arena (its span, rounded up to ARENA_ALIGN);
    scm_runtime.cpp `arena_extent` computes the same natively."""
    return (span(sizes, strides) * itemsize + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN


# Note [Symbolic arena]
# ~~~~~~~~~~~~~~~~~~~~~
# When a buffer's size depends on the input sizes, fixed offsets cannot serve every size. The
# placement made for this specialization's sizes (first fit above) gives an ORDER instead: the
# buffers sorted by their offset there (buffers of no bytes at these sizes last). On every call
# the runtime places them in that order, each at the highest end of the buffers it must not
# overlap -- those live at the same time and earlier in the order (ArenaBuffer.below) --, with
# its bytes computed from the sizes and strides the host program computed for its allocation
# (scm_runtime.cpp: `place_arena`). Any two buffers live at once are then ordered, the later
# one starting at or above the earlier one's end, whatever the sizes: the placement is valid by
# construction. At the planning sizes no offset exceeds the first-fit one (by induction over the
# order), so the arena is no larger there. Only the nearest of the buffers below are kept: if
# q is below b and p below q, q's end is at or above p's (q starts at or above p's end), so p
# cannot raise b's offset. tests/scm/test_arena_order.py checks the placement on random
# lifetimes and sizes against an overlap oracle.
@dataclasses.dataclass(frozen=True)
class ArenaOrder:
    order: tuple[int, ...]  # buffer indices in placement order
    below: tuple[tuple[int, ...], ...]  # per position in the order: the positions it is placed above


def symbolic_arena(buffers: Sequence[tuple[int, int, int]], offsets: Sequence[int]) -> ArenaOrder:
    """The placement order of buffers (first step, last step, bytes at the planning sizes) that
    `first_fit` placed at `offsets`, and what each is placed above (Note [Symbolic arena])."""
    order = sorted(range(len(buffers)), key=lambda i: (buffers[i][2] == 0, offsets[i], buffers[i][0], i))
    below_sets: list[set[int]] = []
    below = []
    for k, i in enumerate(order):
        begin, end, _ = buffers[i]
        overlapping = [j for j in range(k) if buffers[order[j]][0] <= end and begin <= buffers[order[j]][1]]
        kept, covered = [], set()
        for j in reversed(overlapping):  # nearest first: what they cover cannot raise the offset
            if j not in covered:
                kept.append(j)
                covered |= below_sets[j]
        below_sets.append(set(overlapping))
        below.append(tuple(sorted(kept)))
    return ArenaOrder(tuple(order), tuple(below))


def place_arena(below: Sequence[Sequence[int]], nbytes: Sequence[int]) -> tuple[list[int], int]:
    """The offsets and the arena size for buffers of these byte sizes, in placement order, each
    placed above `below[k]` (the Python twin of scm_runtime.cpp `place_arena`)."""
    offsets: list[int] = []
    total = 0
    for k, n in enumerate(nbytes):
        offset = max((offsets[j] + nbytes[j] for j in below[k]), default=0)
        offsets.append(offset)
        total = max(total, offset + n)
    return offsets, total


def plan_releases(
    program: RegionProgram,
    allocs: Sequence[AllocPlan],
    roots: Sequence[Optional[int]],
    escaping: set[int],
    storage_ids: Sequence[int],
) -> dict[int, tuple[int, ...]]:
    """Note [Early release]: the value table holds every allocation and operator result until the
    call returns, where eager frees each tensor after its last use; so after the last step that
    touches a storage (storage_last_uses: arguments, kernel arguments, views' bases -- an
    address-only view's uses count for its base, which shares its storage), every value slot
    living in it is dropped. Only fresh storages (not an input's) that no output shares and that
    are not slices of the call's arena (freeing those frees nothing) are released. Dropping a
    slot after its storage's last use is safe whatever ATen does at run time: no later step reads
    that slot, and work already issued on the stream is ordered before any reuse of the bytes by
    the caching allocator."""
    last = storage_last_uses(program, storage_ids)
    in_arena = {storage_ids[p.step.slot] for p in allocs if p.arena_offset >= 0 or p.arena_slot >= 0}
    releases: dict[int, list[int]] = {}
    for slot, sid in enumerate(storage_ids):
        if roots[slot] is not None or slot in escaping or sid in in_arena or sid not in last:
            continue
        releases.setdefault(last[sid], []).append(slot)
    return {i: tuple(slots) for i, slots in sorted(releases.items())}


# Operators whose result always aliases their first argument though the schema does not say so.
_UNANNOTATED_VIEWS = {"aten::_unsafe_view"}


def _is_view_step(step: AtenStep) -> bool:
    rets = step.op._schema.returns
    if step.op._schema.name in _UNANNOTATED_VIEWS:
        return True
    return len(rets) == 1 and rets[0].alias_info is not None and not rets[0].alias_info.is_write


# Note [Symbolic views]
# ~~~~~~~~~~~~~~~~~~~~~
# In a symbolic region a view's layout (and its base's) are expressions of the input sizes
# (RegionProgram.value_exprs). The native view then takes them from the size program: the host
# program computes the base's expected sizes and strides, the view's sizes and strides and its
# offset from the base on every call, and rt_view checks the base against them and builds the
# view without dispatch (the operator, with its own size arguments from the same run, when the
# base differs). A view only kernels read stays an address (base + delta bytes) when the delta
# does not depend on sizes; with a symbolic delta it is materialized.
def view_exprs(program: RegionProgram, step: AtenStep, base: ValueRef) -> tuple:
    """(base sizes, base strides, sizes, strides, offset delta) of a view step as ints and
    SizeExprs; () when none depends on sizes."""
    if not program.symbolic:
        return ()
    sizes, strides, offset = program.value_exprs[step.outputs[0]]
    if base.kind == "input":
        bsizes, bstrides = program.input_exprs[base.index]
        boffset = _traced_offset(program, base.index)
    else:
        bsizes, bstrides, boffset = program.value_exprs[base.index]
    delta = S.difference(offset, boffset)
    exprs = (tuple(bsizes), tuple(bstrides), tuple(sizes), tuple(strides), delta)
    return exprs if S.has_symbols(exprs) else ()


def _memo_views(program, inputs, value_facts, value_offsets, roots) -> dict:
    """plan_views, kept per set of input facts (the layouts it reads are a function of them: Note
    [Layouts per input facts]); an alignment miss reuses it. The plans are not mutated after."""
    key = tuple(inputs)
    views = program.view_plans.pop(key, None)
    if views is None:
        views = plan_views(program, inputs, value_facts, value_offsets, roots)
    program.view_plans[key] = views  # most recently used last
    while len(program.view_plans) > _LAYOUTS_KEPT:
        del program.view_plans[next(iter(program.view_plans))]
    return dict(views)


def _absolute_offset(step: AtenStep) -> bool:
    """as_strided with a storage offset: the offset counts from its storage's start, not from the
    base's first element."""
    return step.op._schema.name in _ABSOLUTE_OFFSET and len(step.args) > 3 and step.args[3] is not None \
        and step.args[3] is not DEFAULT


_ABSOLUTE_OFFSET = {"aten::as_strided"}


def plan_views(program, inputs, value_facts, value_offsets, roots) -> dict:
    """Native views (single-result view operators on one base of the same dtype), and which
    of them only kernels read (pointer_only). A view placed at an absolute storage offset
    (as_strided) of an input's storage is the operator's: planning counts offsets from each
    input's first element (an input's own storage offset is no fact the plan keeps)."""
    candidates = {}
    for step in program.atens:
        base = step.args[0] if step.args else None
        if not (_is_view_step(step) and isinstance(base, ValueRef) and len(step.outputs) == 1 and step.outputs[0] >= 0):
            continue
        root = base.index if base.kind == "input" else roots[base.index]
        if root is not None and _absolute_offset(step):
            continue
        out = step.outputs[0]
        if base.kind == "input":
            base_facts, base_offset = inputs[base.index], 0
        else:
            base_facts, base_offset = value_facts[base.index], value_offsets[base.index]
        facts = value_facts[out]
        if facts.dtype != base_facts.dtype or facts.device != base_facts.device:
            continue
        delta = value_offsets[out] - base_offset
        exprs = view_exprs(program, step, base)
        candidates[step.name] = (step, base, base_facts, facts, delta, delta * facts.dtype.itemsize, exprs)
    # A value needs a tensor when an operator reads it, when it leaves the region, or when a
    # view of it needs a tensor; kernels only need its address -- a fixed delta from its base's
    # (Note [Symbolic views]: a view whose delta depends on sizes is materialized).
    needs_tensor = {o.index for o in program.outputs}
    address_only = set()
    for step in reversed(program.steps):
        if isinstance(step, AtenStep):
            c = candidates.get(step.name)
            if c is not None and step.outputs[0] not in needs_tensor and not (c[6] and S.is_symbolic(c[6][4])):
                address_only.add(step.name)
                continue  # a pointer-only view: its base need not be a tensor on its account
            for a in step.args:
                for ref in (a if isinstance(a, list) else [a]):
                    if isinstance(ref, ValueRef) and ref.kind == "value":
                        needs_tensor.add(ref.index)
    return {
        name: ViewPlan(step, base, bf, f, delta, dbytes, name in address_only, exprs)
        for name, (step, base, bf, f, delta, dbytes, exprs) in candidates.items()
    }

