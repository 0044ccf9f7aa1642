"""Prefill attention on a backend that plans nothing per length (Note [Prefill attention without per-length plans]).

Note [Prefill attention without per-length plans]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A trace records `scaled_dot_product_attention` as the backend torch chose for the example; on
an H100 or H200 with a mask that is cuDNN's (`_scaled_dot_product_cudnn_attention`, its boolean
mask already made a bias of 0 / -65504 by torch's SDPA). cuDNN builds an execution graph for each
new shape, kept in a process-wide cache: a prompt length new to the process costs that planning.
Measured on an H100 at 0bf8375 (results/bench_dynamic_pdl_profile_0bf8375.json,
tools/probe_sdpa_prefill.py): a new prompt length took trident.compile ~53 ms on Llama-1B + Liger,
~42 ms of it in `aten::_cudnn_attention_forward`; Llama-1B's prefill attention alone over a
512-position StaticCache, 16 layer calls of a new length: cuDNN 38-43 ms, the memory-efficient
backend 0.7 ms; warm, 38.6-40.3 us against 38.5-44.3 us a call, the results the same within
bf16's rounding.

A capture whose query length is symbolic serves every prompt length, and a chat's prompts seldom
repeat one (a symbolic key length, a DynamicCache's, is new at every step): this pass makes such a
cuDNN attention the memory-efficient op, given what torch's SDPA gives that backend: the same bias,
expanded to [B, H, L, S] (preprocess_mask). Conditions (else the node stays as traced): the knob's
device (CUDA by default), a symbolic query or key length, no dropout, no debug mask, only the
output read (the log-sum-exp is laid out differently by the two), as many key/value heads as query
heads, query, keys and values contiguous over the head size and at multiples of 8 elements, a bias
absent or of the query's dtype, four-dimensional, broadcast only over dimensions of static size,
with every stride but the last a multiple of 8 elements and the last 1 (the kernel's alignment)
or else a static key length, where it is padded and sliced back as torch's preprocess_mask does
(through zeros, a slice_scatter and a slice, which keep the symbolic sizes symbolic; torch pads a
symbolic key length by a symbolic amount: that bias stays with cuDNN), and the memory-efficient
output laid out as cuDNN's. No rewrite may add a guard to the capture (tests check). At planning, on CUDA, both ops run on stand-ins of the example's sizes and
must agree within the dtype's tolerance (a backend that refuses the shapes or differs keeps
cuDNN; `explain()` says which and why; the check runs once per layout, not per layer). Static
lengths keep cuDNN: it plans them once.
Knob TRIDENT_PREFILL_ATTENTION: "cuda" (default), "all" (any device: the check is the tests'),
"" (off). Measured with it on an H100 at 05bed9c (tools/bench_dynamic.py, Llama-1B + Liger over a
StaticCache, results/bench_dynamic_prefill_attention_05bed9c.json): a new prompt length 10-33 ms
against 52-74 with cuDNN kept, a length seen before 4.73 ms against 5.18 (medians).
"""

from __future__ import annotations

import operator
from typing import Callable, Optional

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .. import knobs, logs
from .common import bound_args, known_equal, node_val, size_hint, stand_in

aten = torch.ops.aten

CUDNN = aten._scaled_dot_product_cudnn_attention.default
EFFICIENT = aten._scaled_dot_product_efficient_attention.default
ALIGN = 8  # elements: the memory-efficient kernel's bias strides and pointers (torch's preprocess_mask)

_check: Optional[Callable] = None  # tests stand in for the GPU's check (set_check)
_CHECKED: dict = {}  # the GPU check's answer per example layout (a model's layers share one)


def set_check(fn: Optional[Callable]) -> None:
    """Install `fn(q, k, v, bias, is_causal, scale, pad, sizes) -> Optional[str]` (the values of
    the trace, the bias's padding and expand sizes; a reason when the memory-efficient op must not
    replace cuDNN's) in place of running both on stand-ins; None puts the GPU's check back."""
    global _check
    _check = fn
    _CHECKED.clear()


def _multiple(s) -> bool:
    return bool(statically_known_true(s % ALIGN == 0)) if isinstance(s, torch.SymInt) else s % ALIGN == 0


class _Example:
    """A traced value's metadata at the example's sizes, as stand_in reads it."""

    def __init__(self, v: torch.Tensor, device: torch.device):
        self.shape = tuple(size_hint(s) for s in v.shape)
        self._stride = tuple(size_hint(s) for s in v.stride())
        self._offset = size_hint(v.storage_offset())
        self.dtype, self.device = v.dtype, device

    def stride(self):
        return self._stride

    def storage_offset(self):
        return self._offset

    def is_floating_point(self):
        return self.dtype.is_floating_point

    def is_complex(self):
        return self.dtype.is_complex

    def key(self) -> tuple:
        return self.shape, self._stride, self._offset, self.dtype


def _padded_bias(bias: torch.Tensor, pad: int) -> torch.Tensor:
    """The bias padded by `pad` keys and sliced back to its own length (its rows then start at
    multiples of 8 elements), as torch's pad_bias makes it, through ops that keep symbolic sizes
    symbolic: zeros of the padded shape, the bias scattered into them, a slice. constant_pad_nd
    would not do: its fake propagation reads the sizes as ints, fixing a symbolic prompt length."""
    length = bias.shape[-1]
    zeros = bias.new_zeros((*bias.shape[:-1], length + pad))
    return aten.slice.Tensor(aten.slice_scatter.default(zeros, bias, -1, 0, length), -1, 0, length)


def _efficient_bias(bias: Optional[torch.Tensor], pad: int, sizes) -> Optional[torch.Tensor]:
    """The bias as the memory-efficient op takes it (torch's preprocess_mask): padded where `pad`,
    expanded to `sizes` (-1: the size it has). The same ops the rewritten graph runs."""
    if bias is None:
        return None
    if pad:
        bias = _padded_bias(bias, pad)
    return bias.expand(*sizes) if any(s != -1 for s in sizes) else bias


def _gpu_check(q, k, v, bias, is_causal, scale, pad=0, sizes=(-1, -1, -1, -1)) -> Optional[str]:
    """Both ops on stand-ins of the example's sizes, on q's device, cuDNN's on the bias as traced,
    the memory-efficient one on it as the rewrite gives it; a reason when they do not agree.
    Answered once per layout (a model's layers repeat one)."""
    if q.device.type != "cuda":
        return f"not checked on {q.device}"
    if torch.cuda.is_current_stream_capturing():  # planned while a CUDA graph records: checked at the next plan
        return "not checked while a CUDA graph records"
    examples = [_Example(t, q.device) if t is not None else None for t in (q, k, v, bias)]
    key = (*(e.key() if e is not None else None for e in examples), is_causal, scale, pad, tuple(sizes), q.device)
    if key in _CHECKED:
        return _CHECKED[key]
    why = None
    try:
        with torch.cuda.device(q.device):
            g = torch.Generator(device=q.device).manual_seed(0)
            qs, ks, vs, bs = (stand_in(e, g) if e is not None else None for e in examples)
            want = CUDNN(qs, ks, vs, bs, False, 0.0, is_causal, False, scale=scale)[0]
            got = EFFICIENT(qs, ks, vs, _efficient_bias(bs, pad, [size_hint(x) for x in sizes]), False, 0.0, is_causal,
                            scale=scale)[0]
            tol = 2e-2 if q.dtype in (torch.bfloat16, torch.float16) else 2e-4
            torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    except Exception as e:  # noqa: BLE001 - a backend refusing the shapes, or a difference: cuDNN stays
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    _CHECKED[key] = why
    return why


def _why_not(node: torch.fx.Node, mode: str):
    """(None, (pad, expand sizes)) when `node` may become the memory-efficient op, else (reason,
    None), the reason "" for nothing to say: the bias is padded by `pad` keys where its strides
    are not aligned (only a static key length: torch pads a symbolic one by a symbolic amount,
    which this pass does not build)."""
    args = bound_args(node)
    q, k, v, bias = (node_val(args.get(n)) for n in ("query", "key", "value", "attn_bias"))
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return "", None  # not a shape this pass knows (no traced value): left as traced, silently
    if (mode == "cuda" and q.device.type != "cuda") or not (
            isinstance(q.shape[2], torch.SymInt) or isinstance(k.shape[2], torch.SymInt)):
        return "", None  # another device than the knob's, or static lengths (cuDNN plans them once)
    if args.get("dropout_p", 0.0) != 0.0 or args.get("return_debug_mask", False):
        return "dropout or a debug mask", None
    if not all(u.op == "call_function" and u.target is operator.getitem for u in node.users) or any(
            u.args[1] != 0 and u.users for u in node.users):
        return "more than its output is read", None
    if not (known_equal(q.shape[1], k.shape[1]) and known_equal(k.shape[1], v.shape[1])):
        return "key/value heads not known to equal the query's (the memory-efficient op takes equal heads)", None
    if not all(known_equal(t.stride(-1), 1) and _multiple(t.storage_offset()) for t in (q, k, v)):
        return f"a query, key or value not contiguous over its head size or not at a multiple of {ALIGN} elements", None
    sizes, pad = [-1] * 4, 0
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.dim() != 4 or bias.dtype != q.dtype:
            return "a bias not four-dimensional in the query's dtype", None
        if not known_equal(bias.shape[-1], k.shape[2]):
            return "a bias broadcast over the keys", None
        if not (known_equal(bias.stride(-1), 1) and all(_multiple(s) for s in bias.stride()[:-1])
                and _multiple(bias.storage_offset())):
            if type(bias.shape[-1]) is not int:
                return f"a bias of a symbolic key length whose rows are not at multiples of {ALIGN} elements", None
            pad = ALIGN - bias.shape[-1] % ALIGN  # as torch's pad_bias: its rows start at multiples of 8
        target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        for i, (have, want) in enumerate(zip(bias.shape, target)):
            if known_equal(have, want):
                continue
            if known_equal(have, 1) and type(want) is int:
                sizes[i] = want
            else:
                return "a bias broadcast over a symbolic size", None
    return None, (pad, sizes)


def prefill_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrite every cuDNN attention of a symbolic length the knob allows; returns how many."""
    mode = knobs.prefill_attention()
    if not mode:
        return 0
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not CUDNN:
            continue
        why, plan = _why_not(node, mode)
        if why == "":
            continue
        args = bound_args(node)
        q, k = node_val(args["query"]), node_val(args["key"])
        shape = f"B={q.shape[0]} H={q.shape[1]} L={q.shape[2]} S={k.shape[2]} D={q.shape[3]} {q.dtype}"
        if why is None:
            why = (_check or _gpu_check)(q, k, node_val(args["value"]), node_val(args.get("attn_bias")),
                                         bool(args.get("is_causal", False)), args.get("scale"), *plan)
        if why is None:
            why = _rewrite(gm, node, args, *plan)
        if why is None:
            count += 1
            line = f"{shape}: memory-efficient SDPA in place of cuDNN's (no plan per new length)"
        else:
            logs.lowering.debug("prefill attention %s stays cuDNN's: %s", shape, why)
            line = f"{shape}: cuDNN's as traced ({why})"
        gm.meta.setdefault("trident_prefill_attention", []).append(line)
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _guards(*values) -> int:
    """How many guards the shape environment of `values`' symbolic sizes holds (0: none)."""
    for v in values:
        for s in (*v.shape, *v.stride()) if isinstance(v, torch.Tensor) else ():
            if isinstance(s, torch.SymInt):
                return len(s.node.shape_env.guards)
    return 0


def _size_arg(gm: torch.fx.GraphModule, tensor_node: torch.fx.Node, dim: int, size):
    """`size` as an argument of a new node: the int, or a sym_size node of `tensor_node`."""
    if not isinstance(size, torch.SymInt):
        return size
    n = gm.graph.call_function(aten.sym_size.int, (tensor_node, dim))
    n.meta["val"] = size
    return n


def _rewrite(gm: torch.fx.GraphModule, node: torch.fx.Node, args: dict, pad: int, sizes) -> Optional[str]:
    """`node` as the memory-efficient op; a reason (and the graph unchanged) where it cannot be."""
    q_node, k_node, v_node, b_node = args["query"], args["key"], args["value"], args.get("attn_bias")
    q, k, v, bias = (node_val(n) for n in (q_node, k_node, v_node, b_node))
    causal, scale = bool(args.get("is_causal", False)), args.get("scale")
    before = _guards(q, k, v, bias)
    try:
        b_val = _efficient_bias(bias, pad, sizes)
        val = EFFICIENT(q, k, v, b_val, False, 0.0, causal, scale=scale)
    except Exception as e:  # noqa: BLE001 - fake propagation refuses: cuDNN stays
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if _guards(q, k, v, bias) != before:  # never expected (the tests check): the capture has lost a symbol
        logs.lowering.warning("prefill attention %s: fake propagation guarded a symbolic size", node.name)
        return "fake propagation guarded a symbolic size"
    outs = [u for u in node.users if u.args[1] == 0]
    for out in outs:
        traced = node_val(out)
        if traced is not None and not (all(known_equal(a, b) for a, b in zip(val[0].shape, traced.shape))
                                       and all(known_equal(a, b) for a, b in zip(val[0].stride(), traced.stride()))):
            return "the memory-efficient output is laid out otherwise"
    with gm.graph.inserting_before(node):
        b_new = b_node
        if bias is not None and pad:
            shape = [_size_arg(gm, b_node, i, s) for i, s in enumerate(bias.shape[:-1])] + [bias.shape[-1] + pad]
            zeros = gm.graph.call_function(aten.new_zeros.default, (b_node, shape))
            zeros.meta["val"] = bias.new_zeros((*bias.shape[:-1], bias.shape[-1] + pad))
            scattered = gm.graph.call_function(aten.slice_scatter.default, (zeros, b_node, -1, 0, bias.shape[-1]))
            scattered.meta["val"] = aten.slice_scatter.default(zeros.meta["val"], bias, -1, 0, bias.shape[-1])
            b_new = gm.graph.call_function(aten.slice.Tensor, (scattered, -1, 0, bias.shape[-1]))
            b_new.meta["val"] = aten.slice.Tensor(scattered.meta["val"], -1, 0, bias.shape[-1])
        if bias is not None and any(s != -1 for s in sizes):
            expanded = gm.graph.call_function(aten.expand.default, (b_new, sizes))
            expanded.meta["val"] = b_val
            b_new = expanded
        new = gm.graph.call_function(EFFICIENT, (q_node, k_node, v_node, b_new, False),
                                     {"dropout_p": 0.0, "is_causal": causal, "scale": scale})
        new.meta["val"] = val
        item = gm.graph.call_function(operator.getitem, (new, 0))
        item.meta.update(outs[0].meta if outs else {})
        item.meta["val"] = val[0]
    for out in outs:
        out.replace_all_uses_with(item)
    for u in list(node.users):
        gm.graph.erase_node(u)
    gm.graph.erase_node(node)
    return None
