"""What the passes agree on: which nodes are Triton launches and which are allocations."""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch._higher_order_ops.triton_kernel_wrap import (
    kernel_side_table,
    triton_kernel_wrapper_functional,
    triton_kernel_wrapper_mutation,
)
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from .. import pdl
from ..kernels import gemv

aten = torch.ops.aten

# Allocations a region may absorb: they have no data inputs, only shapes and options.
ALLOCATION_OPS = {
    aten.empty.memory_format: False,
    aten.empty_like.default: False,
    aten.empty_strided.default: False,
    aten.new_empty.default: False,
    aten.zeros.default: True,
    aten.zeros_like.default: True,
    aten.new_zeros.default: True,
}


def is_launch(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is triton_kernel_wrapper_mutation


def is_functional_launch(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is triton_kernel_wrapper_functional


def is_allocation(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target in ALLOCATION_OPS


_CONSTANT_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
# Ops whose output shape or value depends on data: they end a region (the host program is
# planned per specialization, before any data is seen).
_DATA_DEPENDENT_TAGS = {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape}


def _returns_supported(schema) -> bool:
    """Tensors, lists of tensors, and plain scalars (e.g. the max_q/max_k ints flash attention
    returns): scalar results are not kept, so a later node that reads one ends the region."""
    for r in schema.returns:
        t = r.type
        if isinstance(t, torch.OptionalType):
            t = t.getElementType()
        if isinstance(t, (torch.TensorType, torch.IntType, torch.FloatType, torch.BoolType, torch.SymIntType)):
            continue
        if isinstance(t, torch.ListType) and isinstance(t.getElementType(), torch.TensorType):
            continue
        return False
    return True


def is_size_node(node: torch.fx.Node) -> bool:
    """A node of a symbolic trace computing a size (sym_size, sym_numel, s0 + 63, ...): its value
    is a SymInt. Regions do not contain such nodes: they read their values as SizeExprs (Note
    [Symbolic sizes])."""
    return node.op == "call_function" and isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat))


def _arg_reason(value) -> str | None:
    if isinstance(value, torch.fx.Node):
        val = value.meta.get("val")
        if isinstance(val, torch.SymInt):
            return None  # a size: the host program computes it (Note [Symbolic sizes])
        if not isinstance(val, torch.Tensor):
            return f"argument {value.name} is a traced non-tensor value ({type(val).__name__}); only tensors and integer sizes are"
        return None
    if isinstance(value, (list, tuple)):
        for v in value:
            why = _arg_reason(v)
            if why:
                return why
        return None
    if isinstance(value, _CONSTANT_TYPES):
        return None
    return f"argument of type {type(value).__name__} has no native form"


def operator_call_reason(node: torch.fx.Node) -> str | None:
    """Why an operator node cannot be called from the SCM's native host, or None when it can."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return f"{getattr(target, '__name__', target)} is a Python callable, not an operator with a schema"
    if target.namespace == "trident" and target is not torch.ops.trident.residual_mm.default:
        return "a Trident op"
    if _DATA_DEPENDENT_TAGS & set(target.tags) or target is torch.ops.aten._local_scalar_dense.default:
        return f"{target}: data-dependent output (needs the data before the plan can go on)"
    if not _returns_supported(target._schema):
        return f"{target}: returns a value with no native form"
    for a in list(node.args) + list(node.kwargs.values()):
        why = _arg_reason(a)
        if why:
            return f"{target}: {why}"
    return None


def is_view_op(node: torch.fx.Node) -> bool:
    """Its result aliases an input without writing it (view, slice, transpose, ...)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    rets = node.target._schema.returns
    return bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write


# Results that alias an argument without saying so in the schema.
UNANNOTATED_VIEWS = {aten._unsafe_view.default}


def moves_no_data(node: torch.fx.Node) -> bool:
    """Reads and writes no tensor data: a view, a fresh allocation, or the name of a module
    attribute (get_attr). The fusion passes move launches and products past such nodes."""
    if node.op == "get_attr":
        return True
    if node.op != "call_function":
        return False
    return is_view_op(node) or node.target in UNANNOTATED_VIEWS or node.target in ALLOCATION_OPS


def inplace_root(node: torch.fx.Node):
    """For an in-place/out= op, the argument node its result aliases (and writes), else None."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    schema = node.target._schema
    rets = schema.returns
    if not rets or rets[0].alias_info is None or not rets[0].alias_info.is_write:
        return None
    want = set(rets[0].alias_info.before_set)
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write and set(arg.alias_info.before_set) & want:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            return value if isinstance(value, torch.fx.Node) else None
    return None


def written_args(node: torch.fx.Node) -> list:
    """Argument nodes an operator writes, per its schema's alias annotations."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return []
    out = []
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            out += [v for v in values if isinstance(v, torch.fx.Node)]
    return out


def resolve_kernel(kernel):
    """(JITFunction, launch options) behind a side-table kernel, or (kernel, None) when it is
    something Trident does not unwrap. torch wraps a kernel launched with num_warps=/num_stages=
    in a one-config Autotuner; that config's options are the launch's options."""
    if isinstance(kernel, JITFunction):
        return kernel, {}
    if isinstance(kernel, Autotuner) and len(kernel.configs) == 1 and isinstance(kernel.fn, JITFunction):
        config = kernel.configs[0]
        plain = not (
            kernel.user_defined_pre_hook
            or kernel.user_defined_post_hook
            or kernel.reset_to_zero
            or kernel.restore_value
            or kernel.early_config_prune
            or config.pre_hook
        )
        if plain:
            return kernel.fn, config.all_kwargs()
    return kernel, None


def tunable(kernel) -> bool:
    """Whether `kernel` is a multi-config @triton.autotune Trident tunes itself (Note [Autotuned
    launches]): over a plain @triton.jit function (torch's tracer has already folded heuristics
    below the autotuner into the configs), no config with a pre_hook (Python before every launch)."""
    return (
        isinstance(kernel, Autotuner)
        and len(kernel.configs) > 1
        and isinstance(kernel.fn, JITFunction)
        and not any(c.pre_hook for c in kernel.configs)
    )


def launch_kernel(node: torch.fx.Node):
    kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
    if tunable(kernel):
        return kernel.fn
    return resolve_kernel(kernel)[0]


def launch_tuner(node: torch.fx.Node):
    """The Autotuner of a tunable launch, else None."""
    kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
    return kernel if tunable(kernel) else None


def launch_kwargs(node: torch.fx.Node) -> dict:
    """All kernel arguments of a launch node: graph kwargs, the side table's constants and the
    launch options (num_warps, ...)."""
    _, options = resolve_kernel(kernel_side_table.get_kernel(node.kwargs["kernel_idx"]))
    constants = kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"])
    return {**(options or {}), **constants, **node.kwargs["kwargs"]}


def known_equal(a, b) -> bool:
    """a == b where it holds for every size a symbolic capture admits, without adding a guard."""
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return bool(statically_known_true(a == b))
    return a == b


def size_hint(v) -> int:
    """The example's value of a size (never a guard: int() of a SymInt would specialize it)."""
    if isinstance(v, torch.SymInt):
        node = v.node
        if node.hint is not None:
            return int(node.hint)
        return int(node.shape_env.size_hint(node.expr))  # torch 2.11 and 2.13 both have these
    return int(v)


def node_val(x):
    """The traced value of a node (its meta "val"); None for anything else."""
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def bound_args(node: torch.fx.Node) -> dict:
    """An ATen node's arguments by schema name, defaults filled in."""
    schema = node.target._schema
    bound = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def emit_launch(gm: torch.fx.GraphModule, kernel, grid, kwargs: dict) -> torch.fx.Node:
    """A launch of one of Trident's own kernels (trident/kernels/) at the graph's insertion point:
    `kernel[grid](**kwargs)`, tensors and constexprs alike in kwargs. A kernel taking the
    constexpr `PDL` (default False) gets PDL=True where its tensors' device wants it, unless
    kwargs set it (Note [Programmatic dependent launch])."""
    if "PDL" in kernel.arg_names and "PDL" not in kwargs:
        devices = {v.device for a in kwargs.values() if isinstance(v := node_val(a), torch.Tensor)}
        if len(devices) == 1 and pdl.wanted(device := devices.pop()):
            kwargs = {**kwargs, "PDL": True}
            if "PREFETCH" in kernel.arg_names and device.type == "cuda":  # Note [Weights ahead of the wait]
                kwargs["PREFETCH"] = gemv.prefetch_for(grid, kwargs)
    node = gm.graph.call_function(
        triton_kernel_wrapper_mutation,
        (),
        {
            "kernel_idx": kernel_side_table.add_kernel(kernel),
            "constant_args_idx": kernel_side_table.add_constant_args({}),
            "grid": [grid],
            "tma_descriptor_metadata": {},
            "kwargs": kwargs,
        },
    )
    node.meta["val"] = None
    return node


_CALL_COUNTERS = "trident_call_counters"  # node.meta: the graph's per-call counters allocation


def call_counters(gm: torch.fx.GraphModule, like: torch.Tensor, n: int):
    """`n` int32 counters of launches whose programs count their arrivals (Note [The last program
    reduces], Note [The last split combines], Note [One pass]), from ONE zeros allocation per call
    and device that every such launch of the graph shares (one fill kernel per call, not one per
    launch or per pass: each launch puts its counters back to 0, and a call never sees another
    call's counts, whatever stream runs it), made at the graph's start and grown as launches take
    counters; (its node, the offset of the `n` counters in it)."""
    node = next((x for x in gm.graph.nodes if x.meta.get(_CALL_COUNTERS) and x.kwargs["device"] == like.device), None)
    if node is None:
        first = next(x for x in gm.graph.nodes if x.op != "placeholder")
        with gm.graph.inserting_before(first):
            node = gm.graph.call_function(aten.zeros.default, ([0],), {"dtype": torch.int32, "device": like.device})
        node.meta[_CALL_COUNTERS] = True
    offset = node.args[0][0]
    node.args = ([offset + n],)
    node.meta["val"] = like.new_zeros((offset + n,), dtype=torch.int32)  # like's kind: fake in a trace
    return node, offset


def stand_in(v, g: torch.Generator) -> torch.Tensor:
    """A real tensor of v's sizes, strides, storage offset, dtype and device, for timing an
    implementation on it: floating values in [-1, 1) from `g`, integers 0, a boolean mask all
    true. Drawn where v lives when `g` is a generator of v's device type (a measurement's weights
    and their copies are up to ~0.5 GB each: drawn on the host in fp32, converted and copied,
    they took ~12 s of a Llama-1B first call on an H100 host), else on the host from a generator
    of `g`'s seed, and copied. `g` is the caller's own: the program's random streams are left
    alone."""
    span = v.storage_offset() + sum((n - 1) * st for n, st in zip(v.shape, v.stride())) + 1
    here = g.device.type == v.device.type
    where = v.device if here else torch.device("cpu")
    if v.dtype == torch.bool:
        base = torch.ones(span, dtype=torch.bool, device=where)
    elif not (v.is_floating_point() or v.is_complex()):
        base = torch.zeros(span, dtype=v.dtype, device=where)
    else:  # drawn in the dtype where uniform_ has one (no fp32 copy of a bf16 weight), else in fp32
        drawn = v.dtype if v.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) else torch.float32
        gen = g if here else torch.Generator().manual_seed(g.initial_seed())
        base = torch.empty(span, dtype=drawn, device=where).uniform_(-1, 1, generator=gen).to(v.dtype)
    return base.to(v.device).as_strided(tuple(v.shape), tuple(v.stride()), v.storage_offset())
