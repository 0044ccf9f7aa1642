"""trident.optimize and the inspection helpers over optimized graphs."""

from __future__ import annotations

import contextlib
import operator
import re
import weakref

import sympy
import torch
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.utils import _pytree as pytree
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.printers import PythonPrinter

from . import knobs, logs
from .capture import data_dependent, ensure_triton_driver
from .errors import GuardError, OperatorError, TridentError, UnsupportedError
from .passes import (
    decompose_functional_launches,
    drop_unused_projections,
    eliminate_common_subexpressions,
    outline_regions,
    partition_regions,
    sink_allocations,
)
from .passes.choose_matmuls import choose_matmuls
from .passes.decode_attention import lower_decode_attention
from .passes.fuse_cache_attention import fuse_cache_attention
from .passes.fuse_cache_writes import fuse_cache_writes
from .passes.fuse_copy_launches import fuse_copy_launches
from .passes.fuse_glue import fuse_glue
from .passes.fuse_residual_adds import fuse_residual_adds
from .passes.lower_copies import lower_copies
from .passes.outline_regions import read_sizes_from_inputs
from .passes.partition_regions import split_symbolic_regions
from .passes.prefill_attention import prefill_attention
from .runtime import SCMRuntime, native
from .runtime.native import C
from .scm.guards import ConstantInput, GuardList, KernelGlobal, SameTensor, TracedShapes, TracedValue, first_failure
from .scm.ir import RegionProgram
from .scm.sizes import SizeExpr, size_of


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


# A get_attr line of generated code: `name = self._param_constant3`.
_ATTR_LINE = re.compile(r"^(?P<indent>[ \t]+)(?P<name>\w+) = self\.(?P<target>[A-Za-z_]\w*)$", re.M)


def _direct_forward(gm: torch.fx.GraphModule):
    """gm's forward with each trident.scm call made through trident._C.scm_call, which runs the
    op's kernel directly when the dispatcher would only select it (csrc/module.cpp, Note [Direct
    call of the SCM]) and calls the op otherwise. The graph, and gm.code, keep the op.

    Note [Constants bound once]: the tensors the graph closes over (`self._param_constantN`,
    get_attr nodes) are bound into the forward's globals when it is made, not looked up on every
    call: the graph keeps the tensor it captured (Note [Closed-over tensors]), and each lookup
    goes through nn.Module.__getattr__ (~0.5-0.8 us; a 24-layer decoder reads ~290 of them per
    step). In-place updates of those tensors are seen as before: the very tensor is bound."""
    code = gm.graph.python_code(root_module="self")
    namespace = dict(code.globals)

    def bind(m: re.Match) -> str:
        value = getattr(gm, m["target"], None)
        if not isinstance(value, torch.Tensor):
            return m[0]  # a submodule or anything else: looked up as before
        name = f"_trident_const_{m['target']}"
        namespace[name] = value
        return f"{m['indent']}{m['name']} = {name}"

    src = _ATTR_LINE.sub(bind, code.src).replace(_SCM_OP_TEXT, "trident_scm_call(")
    namespace["trident_scm_call"] = C.scm_call_fast
    exec(compile(src, f"<trident forward of {type(gm).__name__}>", "exec"), namespace)
    return namespace["forward"]


_REGION_FAILED = re.compile(r"trident: region '(?P<region>[^']*)' failed: (?P<op>[\w:.]+) failed: (?P<msg>.*)", re.S)


def operator_error(e: BaseException) -> "OperatorError | None":
    """The OperatorError for an operator that failed inside a region (the native runtime says
    `trident: region 'r' failed: aten::addmm failed: <the operator's message>`): the operator's
    message first, as eager gives it, then where it ran; None for any other error."""
    m = _REGION_FAILED.match(str(e))
    if m is None:
        return None
    msg = m.group("msg").strip()
    return OperatorError(f"{msg} (in Trident region {m.group('region')!r}, operator {m.group('op')})",
                         region=m.group("region"), operator=m.group("op"))


_STORAGE = re.compile(r"trident: input (?P<i>\d+) of region '(?P<region>[^']*)' (?P<rest>(addresses|is a meta) .*)", re.S)


def _storage_error(e: BaseException, gm) -> "GuardError | None":
    """Note [Inputs with too little storage] (and meta tensors) in the caller's names: the
    region's input index becomes the input's name; nothing of the region ran."""
    m = _STORAGE.match(str(e))
    if m is None:
        return None
    name = f"#{m.group('i')}"
    for rt in _regions(gm):
        if rt.program.name == m.group("region"):
            name = repr(rt.program.inputs[int(m.group("i"))].name)
    return GuardError(f"input {name} of region {m.group('region')!r} {m.group('rest').strip()}",
                      region=m.group("region"))


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
        if kwargs:
            raise TridentError(
                f"an optimized graph takes its inputs by position only ({', '.join(names)}), got keyword "
                f"argument(s) {', '.join(map(repr, kwargs))}: call it as opt({', '.join(names)}), or use "
                "trident.compile(fn), which takes keywords"
            )
        if len(args) != n_inputs:
            raise TridentError(
                f"optimized graph expected {n_inputs} positional inputs ({', '.join(names)}), got {len(args)}"
            )
        if guards:
            failed = first_failure(guards, args)
            if failed is not None:
                # nothing ran: a front door may serve the call otherwise
                error = GuardError(failed.failure(args, names), before_effects=True,
                                   traced_value=isinstance(failed, TracedValue))
                raise error
        try:
            return direct(self, *args)
        except TridentError:
            raise
        except Exception as e:
            # Type checks cost nothing on the hot path: a non-tensor input fails in the graph
            # (or the op's argument parser), and is named here.
            diagnose(args)
            failed = operator_error(e) or _storage_error(e, self)
            if failed is not None:
                raise failed from e
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
    guards += gm.meta.get("trident_traced_values", ())  # Note [Values a trace specializes]: after the shapes
    return guards


def traced_shapes(gm: torch.fx.GraphModule) -> TracedShapes:
    """Note [Symbolic sizes]: every assumption of the symbolic trace about the graph's inputs, as
    one call guard: the shape environment's guards and value ranges, each input's static sizes and
    strides, and each size or stride the trace tied to a symbol another fact binds. Regions check
    what they rely on natively; this covers the rest (Python code between regions, expressions
    with no native form). A guard over a symbol no input fact binds (a data-dependent size)
    makes the symbolic graph unusable: UnsupportedError."""
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
    try:
        with logs.torch_analysis_quiet():  # Note [torch's launch analysis, quietly]
            return _optimize(gm)
    except TridentError:
        raise
    except Exception as e:
        if not data_dependent(e):
            raise
        # a size only the data gives (a region input sized by nonzero) where a pass needs a
        # number: refused like a capture that decides on data (Note [Data-dependent calls
        # through Dynamo]), never torch's exception out of a front door
        raise UnsupportedError(
            f"Trident needs a value only the data gives to plan this graph ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})", data_dependent=True) from e


def _optimize(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    new = _copy_graph_module(gm)
    symbolic = gm.meta.get("trident_shape_env") is not None
    with _one_recompile(new):
        decompose_functional_launches(new)
        lower_decode_attention(new)  # Note [Decode attention]: before CSE and lower_copies see repeat_kv
        if symbolic:
            prefill_attention(new)  # Note [Prefill attention without per-length plans]
        drop_unused_projections(new)
        cse_removed = eliminate_common_subexpressions(new)
        if not symbolic:
            # These passes plan with static layouts (grids of the kernels they emit, byte spans);
            # a symbolic capture keeps the ops they would rewrite (Note [Symbolic sizes]).
            fuse_residual_adds(new)
            lower_copies(new)  # after CSE (it merges equal clones), before allocations sink
            fuse_cache_writes(new)  # before fuse_copy_launches pairs the same writes
            fuse_cache_attention(new)  # Note [The cache write inside the attention]
            fuse_copy_launches(new)
        choose_matmuls(new)  # Note [Decode matmuls by measurement]: after residual adds folded into them
        fuse_glue(new)  # Note [Fused glue]: the glue left between launches (static-sized values only)
        sink_allocations(new)
        pieces = symbolic and _graphs_may_record(new)  # Note [Pieces of a symbolic region]
        if pieces:
            read_sizes_from_inputs(new)
        part = partition_regions(new)
        if pieces:
            part.regions = split_symbolic_regions(part.regions)
        region_ids, skipped = outline_regions(new, part.regions, _make_scm)
        _lend_handoffs(new)
    new.meta["trident_regions"] = region_ids
    # Note [Released regions]: the regions live as long as the graph that calls them
    weakref.finalize(new, SCMRuntime.release, tuple(region_ids)).atexit = False
    new.meta["trident_cuts"] = part.cuts + skipped
    new.meta["trident_cse_removed"] = cse_removed
    new.meta["trident_symbolic"] = symbolic
    new.meta["trident_retry_region"] = _retry_region(new) if symbolic else None
    _install_input_checks(new)
    return new


def _lend_handoffs(gm: torch.fx.GraphModule) -> None:
    """Tells each region which of its outputs only later regions of this graph read, so that its
    graph replays lend them instead of copying them out (Note [Lent outputs]). A value returned,
    read by any other node, or used whole (not through getitem) is copied out as before."""
    if not knobs.graph_lend():
        return
    scm = torch.ops.trident.scm.default
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = set(output.all_input_nodes)
    lends = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not scm:
            continue
        region = node.args[0]
        lend = [_COPIED] * len(SCMRuntime.get(region).program.outputs)
        if not all(u.op == "call_function" and u.target is operator.getitem for u in node.users):
            continue
        for item in node.users:
            if (item not in returned and bool(item.users)
                    and all(c.op == "call_function" and c.target is scm for c in item.users)):
                lend[item.args[1]] = _HANDOFF
        if any(lend):
            lends[region] = lend
            native.C.set_lent_outputs(region, lend)
    gm.meta["trident_lend"] = lends


# How a region output may be lent (graphs::Lend in trident/csrc/graph_replay.h).
_COPIED, _HANDOFF, _CARRIED = 0, 1, 2


def lend_carried(gm: torch.fx.GraphModule, positions) -> int:
    """Note [Carried state in rotation]: the graph outputs at `positions` are state the caller
    stores over one of the graph's inputs and passes back on its next call; the regions that make
    them lend them from their graphs (held by the caller until then) instead of copying them out.
    Call it before the graph's first call. An output that is not directly a region's output (a
    view, an input passed through) is copied as before. Returns how many outputs are lent."""
    if not knobs.graph_lend() or not positions or "trident_lend" not in gm.meta:
        return 0
    scm = torch.ops.trident.scm.default
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = pytree.tree_leaves(output.args[0])
    lends = gm.meta["trident_lend"]
    changed, count = set(), 0
    for pos in positions:
        node = values[pos] if 0 <= pos < len(values) else None
        if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is operator.getitem):
            continue
        region_call = node.args[0]
        if not (isinstance(region_call, torch.fx.Node) and region_call.target is scm):
            continue
        region = region_call.args[0]
        lend = lends.setdefault(region, [_COPIED] * len(SCMRuntime.get(region).program.outputs))
        lend[node.args[1]] = _CARRIED
        changed.add(region)
        count += 1
    for region in changed:
        native.C.set_lent_outputs(region, lends[region])
    return count


def _graphs_may_record(gm: torch.fx.GraphModule) -> bool:
    """Whether TRIDENT_GRAPHS lets regions of this graph record graphs: 'all', or 'cuda' with a
    CUDA input."""
    mode = knobs.graphs()
    if mode == "all":
        return True
    return bool(mode) and any(
        isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_cuda
        for n in gm.graph.nodes if n.op in ("placeholder", "get_attr")
    )


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
