"""Inline Python custom ops (torch.library.custom_op, torch.library.triton_op) into the launches
and ATen ops their implementations make.

make_fx keeps such an op as one opaque node (its registered fake gives the node's metadata), which
the optimized graph would call boxed, through Python, on every call. Trident needs the launches,
so the captured graph is traced once more with each such node replaced by the implementation the
dispatcher would run (Note [Inlining custom ops]).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
from torch._library import custom_ops
from torch._library import utils as library_utils
from torch._library.triton import triton_ops_to_kernels
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, get_proxy_mode, make_fx
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils import _pytree as pytree

# Note [Inlining custom ops]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# A node calling an operator defined in Python with torch.library.custom_op (triton_op is one) is
# replaced by the implementation the dispatcher would run for it: the kernel registered for the
# device type of its tensor arguments (or of its `device` argument), else the default one. The
# implementation runs under the same make_fx mode (fake or symbolic sizes) with `kernel[grid]`
# routed through wrap_triton, so its launches become launch nodes, its ATen ops ATen nodes and its
# in-place writes (a kernel storing into `out`, a copy_) mutations of the graph's values, as if the
# caller had written the body inline: the optimized graph runs them natively, with no boxed call.
# The node stays as it was -- one boxed call -- and explain() says why, when:
#   - the op's name is in KEEP_BOXED (the user's choice);
#   - no implementation is registered for the device;
#   - the implementation cannot be traced: it raises on fake tensors (.item(), .tolist(),
#     .numpy(), data_ptr(), a Python side effect), or it reads a tensor's value on the host (with
#     symbolic sizes .item() makes an unbacked symbol instead of raising: a _local_scalar_dense
#     node appears);
#   - what it produced disagrees with the op's registered fake: the number of outputs, a dtype,
#     device, size or stride (of a dimension longer than 1). Sizes are compared as expressions
#     and must be provably equal: a fake that says 8 where the trace says s0 is wrong for other
#     sizes, and torch.compile would trust it (triton_ops are their own fake: not compared);
#   - an output aliases an input or another output, which the dispatcher refuses eagerly.
# A failure leaves half a body traced (its nodes, the mutations make_fx tracked), so the graph is
# traced again from the start with that op boxed: one more trace per op that stays boxed. An op
# the implementation calls is inlined in the next round, up to _MAX_DEPTH levels of nesting.
# Operators of torch's own namespaces or defined in torch's modules are left as they are.

KEEP_BOXED: set[str] = set()
"""Qualified names ("mylib::qmm") of custom ops capture keeps as one boxed call instead of
inlining their implementation (Note [Inlining custom ops]); explain() lists them. Add to it
before capturing: `trident.capture.inline_triton_ops.KEEP_BOXED.add("mylib::qmm")`."""

_MAX_DEPTH = 8
_TORCH_NAMESPACES = frozenset(
    {
        "aten",
        "prims",
        "prim",
        "trident",
        "_c10d_functional",
        "c10d_functional",
        "_c10d_functional_autograd",
        "_dtensor",
        "higher_order",
        "inductor",
        "quantized",
        "_quantized",
        "streams",
        "rngprims",
        "debugprims",
    }
)
_HOST_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)


def custom_op_def(target) -> Optional[custom_ops.CustomOpDef]:
    """The CustomOpDef of a Python custom op outside torch's own namespaces, else None."""
    if not isinstance(target, torch._ops.OpOverload) or target.namespace in _TORCH_NAMESPACES:
        return None
    name = target._schema.name
    opdef = custom_ops._maybe_get_opdef(name)
    if opdef is None:
        return None
    if name not in triton_ops_to_kernels and getattr(opdef._init_fn, "__module__", "").split(".")[0] == "torch":
        return None  # one of torch's own (a triton_op's _init_fn is torch's wrapper of the user's)
    return opdef


def _implementation(opdef: custom_ops.CustomOpDef, args, kwargs) -> Optional[Callable]:
    """What the dispatcher runs for these arguments: the kernel registered for their device
    type, else the default one (None: there is none, and the op fails eagerly too). A triton_op's
    kernels run its function with wrap_triton off (eager launches); its fake is that function."""
    if opdef._qualname in triton_ops_to_kernels:
        return opdef._abstract_fn
    leaves = pytree.tree_leaves((args, kwargs))
    device = next((a.device for a in leaves if isinstance(a, torch.Tensor)), None)
    if device is None:
        device = next((a for a in leaves if isinstance(a, torch.device)), None)
    fns = opdef._backend_fns
    if device is not None and device.type in fns:
        return fns[device.type]
    return fns.get(None)


class _KeepBoxed(Exception):
    def __init__(self, op: str, reason: str):
        super().__init__(f"{op}: {reason}")
        self.op, self.reason = op, reason


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _traced_call(target, opdef: custom_ops.CustomOpDef, impl: Callable, args, kwargs):
    """Run `impl` under the trace in progress; raise _KeepBoxed where it cannot replace the op."""
    name = opdef._qualname
    mode = get_proxy_mode()
    graph = mode.tracer.graph if mode is not None else None
    last = graph._root.prev if graph is not None else None
    try:
        got = impl(*args, **kwargs)
    except Exception as e:
        raise _KeepBoxed(name, f"its implementation cannot be traced ({_short(e)})") from e
    node = last.next if last is not None else None
    while node is not None and node is not graph._root:
        if node.target in _HOST_READS:
            raise _KeepBoxed(
                name,
                "its implementation cannot be traced (it reads a tensor's value on the host: "
                ".item(), .tolist() or a Python number from a tensor)",
            )
        node = node.next
    if len(target._schema.returns) > 1 and isinstance(got, list):
        got = tuple(got)  # what the dispatcher makes of a list
    if name not in triton_ops_to_kernels:  # a triton_op is its own fake
        with disable_proxy_modes_tracing():
            expected = target(*args, **kwargs)  # the registered fake, under the trace's fake mode
        problem = _fake_disagreement(expected, got)
        if problem is not None:
            raise _KeepBoxed(name, f"its registered fake disagrees with its implementation's trace: {problem}")
    if not (target._schema._is_view_op() or getattr(opdef, "_is_inplace", False) or getattr(opdef, "_is_out", False)):
        try:
            library_utils._c_check_aliasing_constraint(name, args, kwargs, got)
        except RuntimeError:
            raise _KeepBoxed(
                name,
                "an output of its implementation aliases an input or another output "
                "(the dispatcher refuses this eagerly)",
            ) from None
    return got


def _equal(a, b) -> bool:
    return statically_known_true(a == b) if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt) else a == b


def _sizes(values) -> str:
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"


def _fake_disagreement(expected, got) -> Optional[str]:
    """Where the fake's outputs and the trace's differ, in words (expected: the fake's), or None."""
    want, have = pytree.tree_leaves(expected), pytree.tree_leaves(got)
    if len(want) != len(have):
        return f"expected {len(want)} output(s) from the fake, got {len(have)} from the trace"
    for i, (e, g) in enumerate(zip(want, have)):
        where = f"output {i}"
        if isinstance(e, torch.Tensor) != isinstance(g, torch.Tensor):
            return f"{where}: expected {type(e).__name__} from the fake, got {type(g).__name__} from the trace"
        if not isinstance(e, torch.Tensor):
            if not (type(e) is type(g) or {type(e), type(g)} <= {int, torch.SymInt}) or not _equal(e, g):
                return f"{where}: expected {e!r} from the fake, got {g!r} from the trace"
            continue
        for what, a, b in (("dtype", e.dtype, g.dtype), ("device", e.device, g.device)):
            if a != b:
                return f"{where}: expected {what} {a} from the fake, got {b} from the trace"
        if e.dim() != g.dim() or not all(_equal(a, b) for a, b in zip(e.shape, g.shape)):
            return f"{where}: expected shape {_sizes(e.shape)} from the fake, got {_sizes(g.shape)} from the trace"
        if not all(statically_known_true(s == 1) or _equal(a, b) for s, a, b in zip(e.shape, e.stride(), g.stride())):
            return (
                f"{where}: expected strides {_sizes(e.stride())} from the fake, got {_sizes(g.stride())} from the trace"
            )
    return None


class _Inliner(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, boxed: dict[str, str]):
        super().__init__(gm)
        self.extra_traceback = False
        self.boxed = boxed

    def call_function(self, target, args, kwargs):
        opdef = custom_op_def(target)
        if opdef is None or opdef._qualname in self.boxed or opdef._qualname in KEEP_BOXED:
            return super().call_function(target, args, kwargs)
        impl = _implementation(opdef, args, kwargs)
        if impl is None:
            self.boxed[opdef._qualname] = "no implementation is registered for the device of its arguments"
            return super().call_function(target, args, kwargs)
        return _traced_call(target, opdef, impl, args, kwargs)


def _to_inline(node: torch.fx.Node, boxed: dict[str, str]) -> bool:
    if node.op != "call_function":
        return False
    opdef = custom_op_def(node.target)
    return opdef is not None and opdef._qualname not in boxed and opdef._qualname not in KEEP_BOXED


def _run_inlined(gm: torch.fx.GraphModule, boxed: dict[str, str], *args):
    return _Inliner(gm, boxed).run(*args)


def inline_custom_ops(
    gm: torch.fx.GraphModule,
    example_inputs,
    tracing_mode: str = "fake",
    log: Optional[list] = None,
) -> torch.fx.GraphModule:
    """`gm` traced again (under `tracing_mode`, on `example_inputs`) with its Python custom ops
    replaced by their implementations (Note [Inlining custom ops]); `gm` itself when it has none.
    `log`, what the trace of `gm` logged (capture's heuristics launches), ends up holding what
    the trace of the result logged. The result's meta["trident_boxed_custom_ops"] maps each
    custom op it still calls to why."""
    log = [] if log is None else log
    kept = list(log)
    boxed: dict[str, str] = {}
    depth = 0
    while depth < _MAX_DEPTH and any(_to_inline(n, boxed) for n in gm.graph.nodes):
        log.clear()
        try:
            traced = make_fx(
                functools.partial(_run_inlined, gm, boxed), tracing_mode=tracing_mode, _allow_non_fake_inputs=True
            )(*example_inputs)
        except _KeepBoxed as e:  # trace again from the start with the op boxed
            boxed[e.op] = e.reason
            continue
        gm, depth, kept = traced, depth + 1, list(log)
    log[:] = kept
    reasons = {}
    for node in gm.graph.nodes:
        opdef = custom_op_def(node.target) if node.op == "call_function" else None
        if opdef is not None and opdef._qualname not in reasons:
            name = opdef._qualname
            reasons[name] = boxed.get(name) or (
                "listed in trident.capture.inline_triton_ops.KEEP_BOXED"
                if name in KEEP_BOXED
                else f"custom ops nested more than {_MAX_DEPTH} deep are not inlined"
            )
    gm.meta["trident_boxed_custom_ops"] = reasons
    return gm
