"""Decode attention as Trident's own kernel (Note [Decode attention]).

Note [Decode attention]
~~~~~~~~~~~~~~~~~~~~~~~
Hugging Face's SDPA attention with a mask (every traced decode step has one: the mask cannot be
skipped while tracing) first repeats each key/value head for the query heads that share it
(`repeat_kv`: unsqueeze, expand, a clone of the whole cache, a view), then calls
`scaled_dot_product_attention`, which the trace records as the backend it chose (cuDNN,
memory-efficient, flash, or the CPU flash kernel). On the H200 that is ~42 µs of host time per
layer in a DynamicCache decode step (two clones of the grown cache and cuDNN's call), and device
time spent copying a cache that is only read.

This pass replaces such an attention, when it is a decode shape, by two launches of
trident/kernels/attention.py: a flash-decoding kernel that reads the unrepeated cache in place
(each key/value head once for its G query heads, the cache split over SPLITS programs) and a
kernel combining the pieces (or one of its one-launch forms, where measured faster: Note [Decode
attention by measurement]); the repeat's clones go with it. Conditions (else nothing changes):
no dropout, not causal (a decode step's mask carries causality), at most MAX_QUERY query tokens,
static batch, heads and head size (<= 256), q/k/v of one floating dtype, key and value
[B, Hkv, S, D] contiguous (a DynamicCache's concatenation or a StaticCache's buffer; S may be
symbolic), the mask absent, boolean or floating, with unit stride over keys and static strides
elsewhere. The output keeps the layout the SDPA op gave it. Numerics: fp32 scores and softmax
as the fused SDPA kernels; results equal SDPA's within the dtype's tolerance (tests compare).
Knob TRIDENT_DECODE_ATTENTION: "measured" (default: CUDA, static lengths where measured no
slower, Note [Decode attention by measurement]), "cuda" (CUDA, unmeasured), "all" (CPU too: the
interpreter runs the kernels, for tests), "" (off).

Note [Decode attention by measurement]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
With TRIDENT_DECODE_ATTENTION=measured (the default since the H200 measurement at e3252af), where
the key length is static (a StaticCache) on CUDA, the rewrite is made only when Trident's
kernel (its fastest form, below) is not measurably slower than what it replaces -- the repeat's clones and the
SDPA backend the trace chose, run as the graph has them -- each timed inside a CUDA graph
(Note [Timing a candidate in a graph], median) on stand-ins of the same layouts (a boolean mask
all true, a float mask of zeros); the SDPA path stays when it takes at most `_MARGIN` of the
kernel's time, or when nothing could be timed (a capture of the caller's running: measured
again at the next capture). The choice is remembered per shape for the process and on disk
(`decode-attention` entries, Note [Kept measurements]), and `explain()` lists it with the times.
A symbolic length (a DynamicCache: the length grows every step) is not measured: the kernel is taken, as before
measurement existed (its clones of the grown cache cost eager more each step). The kernel is
timed in each of its forms -- the split and combine kernels; one launch of a program per
key/value head (Note [One pass]), in its blocks of keys and, where the cache is long enough, in
wide ones; where the head has at most COMBINE_ROWS query rows, one launch
whose last program combines (Note [The last split combines]) -- and the fastest is kept (the two
launches on a tie); unmeasured, the two launches are. Each form is timed with a counter's bump
(of 0), as a StaticCache step runs it (the last split combining takes no bump, and so no
write), and a form that cannot run on the device (its tiles too large) is left out.
Without a GPU nothing is timed (tests install a timer with `set_timer`).
"""

from __future__ import annotations

import math
import operator
import sys
from typing import Optional

import torch

from .. import disk_cache, knobs, logs, triton_state
from ..kernels import attention as attention_module
from ..kernels.attention import (
    BLOCK_N,
    SPLITS,
    block_m,
    combine_grid,
    combines_in_split,
    decode_attention,
    decode_attention_combine_kernel,
    decode_attention_split_kernel,
    dot_precision,
    one_pass_block_n,
    one_pass_warps,
    one_pass_wide_block_n,
    workspace_elements,
)
from .common import bound_args, call_counters, emit_launch, known_equal, node_val, stand_in
from . import timing
from .timing import graph_median_us

aten = torch.ops.aten

MAX_QUERY = 16  # query tokens per row block at most (decode, speculative verification)

# SDPA ops a trace records, and the name of each one's mask argument (None: takes no mask)
_SDPA = {
    aten.scaled_dot_product_attention.default: "attn_mask",
    aten._scaled_dot_product_flash_attention_for_cpu.default: "attn_mask",
    aten._scaled_dot_product_cudnn_attention.default: "attn_bias",
    aten._scaled_dot_product_efficient_attention.default: "attn_bias",
    aten._scaled_dot_product_flash_attention.default: None,
}

_VIEWS = (aten._unsafe_view.default, aten.view.default, aten.reshape.default)


def _equal(a, b) -> bool:
    """a == b, guarding on it when sizes are symbolic (the trace's call guard then checks it on
    every call): lengths SDPA requires equal (keys and values, keys and mask) may be distinct
    symbols of a capture (a DynamicCache's keys and values are separate inputs)."""
    if known_equal(a, b):
        return True
    if isinstance(a, torch.SymInt) or isinstance(b, torch.SymInt):
        return bool(a == b)
    return False


def _full_slice(x) -> bool:
    """A slice that keeps every element (what `t[:, :, None]` traces to)."""
    if not (isinstance(x, torch.fx.Node) and x.target == aten.slice.Tensor):
        return False
    v, sv = node_val(x), node_val(x.args[0])
    return (v is not None and sv is not None and v.dim() == sv.dim()
            and all(known_equal(a, b) for a, b in zip(v.shape, sv.shape)))


def _unrepeated(node: torch.fx.Node):
    """(cache node, G, chain of nodes) when `node` is repeat_kv(cache) ([B, Hkv, S, D] ->
    [B, Hkv * G, S, D] through full slices and an unsqueeze at dim 2, expand, clone, view),
    else (node, 1, [])."""
    none = (node, 1, [])
    x = node
    chain = []
    for targets in (_VIEWS, (aten.clone.default,), (aten.expand.default,)):
        if not (isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in targets):
            return none
        chain.append(x)
        x = x.args[0]
    expand = chain[-1]
    unsqueezed = False
    while True:
        if _full_slice(x):
            chain.append(x)
            x = x.args[0]
        elif not unsqueezed and isinstance(x, torch.fx.Node) and x.target == aten.unsqueeze.default and x.args[1] == 2:
            chain.append(x)
            x = x.args[0]
            unsqueezed = True
        else:
            break
    c, e = node_val(x), node_val(expand)
    if not unsqueezed or c is None or e is None or c.dim() != 4 or e.dim() != 5 or type(e.shape[2]) is not int:
        return none
    return x, e.shape[2], chain


def _contiguous(t: torch.Tensor) -> bool:
    b, h, s, d = t.shape
    want = (h * s * d, s * d, d, 1)
    return all(known_equal(a, w) or known_equal(n, 1) for a, w, n in zip(t.stride(), want, t.shape)) and known_equal(
        t.storage_offset(), 0
    )


def _mask_strides(mask: torch.Tensor, lq: int):
    """The mask's strides over batch, head and query (0 where it broadcasts), or None."""
    if mask.dim() != 4:
        return None
    if not (known_equal(mask.stride(3), 1) or known_equal(mask.shape[3], 1)):
        return None
    out = []
    for i in range(3):
        if known_equal(mask.shape[i], 1):
            out.append(0)
        elif type(mask.stride(i)) is int:
            out.append(mask.stride(i))
        else:
            return None
    if not (known_equal(mask.shape[2], lq) or known_equal(mask.shape[2], 1)):
        return None
    return out


def _rewrite(gm, node: torch.fx.Node, mode: str) -> bool:
    mask_name = _SDPA[node.target]
    a = bound_args(node)
    q_node = a["query"]
    q = node_val(q_node)
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or (mode != "all" and q.device.type != "cuda"):
        return False
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if a.get("dropout_p", 0.0) != 0.0 or a.get("is_causal", False):
        return False
    if any(type(v) is not int for v in q.shape) or q.stride(3) != 1 or any(type(v) is not int for v in q.stride()):
        return False
    B, H, LQ, D = q.shape
    if LQ > MAX_QUERY or D > 256 or D < 1:
        return False
    k_node, gk, k_chain = _unrepeated(a["key"])
    v_node, gv, v_chain = _unrepeated(a["value"])
    k, v = node_val(k_node), node_val(v_node)
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)) or k.dim() != 4 or v.dim() != 4:
        return False
    if k.dtype != q.dtype or v.dtype != q.dtype or k.device != q.device or v.device != q.device:
        return False
    hkv = k.shape[1]
    if type(hkv) is not int or hkv == 0 or H % hkv or gk != gv:
        return False
    G = H // hkv
    if G != gk and not (gk == 1 and (G == 1 or a.get("enable_gqa", False))):
        return False  # heads neither repeated by the chain nor grouped by SDPA itself
    if not (known_equal(k.shape[0], B) and known_equal(v.shape[0], B) and known_equal(v.shape[1], hkv)):
        return False
    if not (known_equal(k.shape[3], D) and known_equal(v.shape[3], D) and _equal(k.shape[2], v.shape[2])):
        return False
    if not (_contiguous(k) and _contiguous(v)):
        return False
    mask_node = a.get(mask_name) if mask_name else None
    mask = node_val(mask_node)
    strides = [0, 0, 0]
    if mask_node is not None:
        if not isinstance(mask, torch.Tensor) or not (mask.dtype == torch.bool or mask.is_floating_point()):
            return False
        strides = _mask_strides(mask, LQ)
        if strides is None or not _equal(mask.shape[3], k.shape[2]):
            return False
    scale = a.get("scale")
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    # users: the output (getitem 0 of the tuple-returning ops), nothing else
    tuple_op = node.target is not aten.scaled_dot_product_attention.default
    if tuple_op:
        if not all(u.op == "call_function" and u.target is operator.getitem for u in node.users):
            return False
        if any(u.args[1] != 0 and u.users for u in node.users):
            return False
        outs = [u for u in node.users if u.args[1] == 0]
        out_val = node_val(outs[0]) if outs else None
    else:
        outs = [node]
        out_val = node_val(node)
    if not isinstance(out_val, torch.Tensor) or any(type(s) is not int for s in out_val.stride()):
        return False
    S = k.shape[2]
    form = _kernel_chosen(gm, node, q_node, k_node, v_node, mask_node, k_chain + v_chain, scale, mode)
    if form is None:
        return False
    converted = mask_node  # Note [A boolean mask as given]: the kernel reads the boolean mask itself
    cond = _boolean_mask(mask_node, LQ, k.shape[2])
    if cond is not None:
        mask_node, mask, strides = cond, node_val(cond), _mask_strides(node_val(cond), LQ)
    with gm.graph.inserting_before(node):
        if isinstance(S, torch.SymInt):
            s_arg = gm.graph.call_function(aten.sym_size.int, (k_node, 2))
            s_arg.meta["val"] = S
        else:
            s_arg = S
        out = gm.graph.call_function(
            aten.empty_strided.default, (list(out_val.shape), list(out_val.stride())),
            {"dtype": q.dtype, "device": q.device},
        )
        out.meta["val"] = out_val
        bm, bd = block_m(G * LQ), 1 << (D - 1).bit_length()
        one_pass = form in (_ONE_PASS, _ONE_PASS_WIDE)
        block_n = _block_n(form, S, D, q.element_size(), G * LQ)
        splits = 1 if one_pass else SPLITS
        consts = dict(KV_HEADS=hkv, G=G, LQ=LQ, D=D, BLOCK_M=bm, BLOCK_D=bd, SPLITS=splits)
        out_strides = {"so_b": out_val.stride(0), "so_h": out_val.stride(1), "so_l": out_val.stride(2)}
        if one_pass:  # Note [One pass]: no workspace (the out it writes stands in its place)
            ws, writes_out = out, {"out_ptr": out, **out_strides, "DIRECT": True}
        else:
            ws_val = torch.empty(workspace_elements(B, hkv, G * LQ, D), dtype=torch.float32, device=q.device)
            ws = gm.graph.call_function(aten.empty.memory_format, ([ws_val.numel()],),
                                        {"dtype": torch.float32, "device": q.device})
            ws.meta["val"] = _fake_like(q, ws_val)
            writes_out = {}
        if form == _FUSED:  # Note [The last split combines]
            counts, offset = call_counters(gm, q, B * hkv)
            writes_out = {"out_ptr": out, "count_ptr": counts, **out_strides, "count_offset": offset, "COMBINE": True}
        emit_launch(gm, decode_attention_split_kernel, (B * hkv, splits, 1), {
            "q_ptr": q_node, "k_ptr": k_node, "v_ptr": v_node,
            "mask_ptr": mask_node if mask_node is not None else q_node, "ws_ptr": ws,
            "S": s_arg, "scale": scale,
            "sq_b": q.stride(0), "sq_h": q.stride(1), "sq_l": q.stride(2),
            "sm_b": strides[0], "sm_h": strides[1], "sm_l": strides[2],
            **consts, "BLOCK_N": block_n, **({"num_warps": one_pass_warps(block_n)} if one_pass else {}),
            "HAS_MASK": mask_node is not None, "MASK_BOOL": mask_node is not None and mask.dtype == torch.bool,
            "PRECISION": dot_precision(q.dtype), **writes_out,
        })
        if not writes_out:  # the combine kernel writes it
            emit_launch(gm, decode_attention_combine_kernel, combine_grid(B, hkv, G * LQ), {
                "ws_ptr": ws, "out_ptr": out, **out_strides, **consts,
            })
    for o in outs:
        o.replace_all_uses_with(out)
    if tuple_op:
        for u in list(node.users):
            gm.graph.erase_node(u)
    gm.graph.erase_node(node)
    for n in k_chain + v_chain:  # the repeat's clones and views, where nothing else reads them
        if n.graph is gm.graph and not n.users:
            gm.graph.erase_node(n)
    if converted is not mask_node:  # the conversion (and padding) nothing else reads, with its constants
        dead = [converted]
        while dead:
            x = dead.pop()
            if x.graph is gm.graph and not x.users and x.op == "call_function" and x.target in _CONVERSION:
                dead += [a for a in x.all_input_nodes if a.op == "call_function"]
                gm.graph.erase_node(x)
    return True


# Note [A boolean mask as given]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# SDPA's fused CUDA kernels take an additive mask, so a boolean attn_mask (Hugging Face's, in
# every StaticCache step generate() makes) reaches the trace as where(mask, 0, -inf) before the
# SDPA op (on CUDA's memory-efficient path also padded to a multiple of 8 keys and sliced back,
# then expanded to [B, H, Lq, S]: ATen's preprocess_mask): a kernel per layer. The split kernel reads a boolean mask itself (MASK_BOOL: a key
# kept where True, score + -inf where False: what adding 0 or -inf gives, bit for bit, also for
# a score of +inf or NaN), so the rewrite takes the boolean mask and the where (with its scalar
# constants) goes where nothing else reads it.
_WHERES = (aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
_CONVERSION = {*_WHERES, aten.constant_pad_nd.default, aten.slice.Tensor, aten.expand.default,
               aten.scalar_tensor.default}


def _constant(x) -> Optional[float]:
    """The value of a Python number or of a scalar_tensor node, else None."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target is aten.scalar_tensor.default:
        v = x.args[0] if x.args else None
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return None


def _unexpanded(node):
    """x when `node` is x.expand(...) (SDPA's memory-efficient path expands the mask to [B, H, Lq,
    S]; the kernel broadcasts x's size-1 dims itself), else node."""
    if isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.expand.default:
        x = node.args[0]
        if isinstance(node_val(x), torch.Tensor) and node_val(x).dim() == node_val(node).dim():
            return x
    return node


def _unpadded(node):
    """x when `node` is constant_pad_nd(x, [0, p])[..., :n] with n x's last size (SDPA's memory-
    efficient path pads the mask's key dim to a multiple of 8 and slices it back), else node."""
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is aten.slice.Tensor):
        return node
    args = list(node.args) + [None] * (5 - len(node.args))
    padded, dim, start, end, step = args[:5]
    if not (isinstance(padded, torch.fx.Node) and padded.op == "call_function"
            and padded.target is aten.constant_pad_nd.default):
        return node
    x, pad = padded.args[0], padded.args[1]
    xv = node_val(x)
    if not isinstance(xv, torch.Tensor) or dim not in (-1, xv.dim() - 1) or start not in (None, 0) or step not in (None, 1):
        return node
    if not (isinstance(pad, (list, tuple)) and len(pad) == 2 and pad[0] == 0 and type(pad[1]) is int and pad[1] >= 0):
        return node
    return x if end is not None and known_equal(end, xv.shape[-1]) else node


def _boolean_mask(mask_node, lq: int, length):
    """cond when `mask_node` is where(cond, 0, -inf) (or that padded and sliced back, _unpadded, and
    expanded, _unexpanded) of a boolean cond of the where's own shape whose layout the kernel reads
    (Note [A boolean mask as given]), else None."""
    mask_node = _unpadded(_unexpanded(mask_node))
    if not (isinstance(mask_node, torch.fx.Node) and mask_node.op == "call_function" and mask_node.target in _WHERES):
        return None
    if len(mask_node.args) != 3 or mask_node.kwargs:
        return None
    cond, keep, drop = mask_node.args
    c, m = node_val(cond), node_val(mask_node)
    if not (isinstance(c, torch.Tensor) and isinstance(m, torch.Tensor)) or c.dtype != torch.bool or c.dim() != m.dim():
        return None
    if not all(known_equal(a, b) for a, b in zip(c.shape, m.shape)) or c.device != m.device:
        return None
    if _constant(keep) != 0.0 or _constant(drop) != float("-inf"):
        return None
    if _mask_strides(c, lq) is None or not _equal(c.shape[3], length):
        return None
    return cond


def _fake_like(like: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """`real`'s metadata as a tensor of the same kind as `like` (a fake tensor in a trace)."""
    mode = getattr(like, "fake_mode", None)
    if mode is None:
        return real
    with mode:
        return torch.empty(real.shape, dtype=real.dtype, device=like.device)


def lower_decode_attention(gm: torch.fx.GraphModule) -> int:
    """Rewrite every decode attention the knob allows; returns how many."""
    mode = knobs.decode_attention()
    if not mode:
        return 0
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _SDPA and _rewrite(gm, node, mode):
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


_MARGIN = 0.95
_CHOICES: dict = {}
_timer = None


def set_timer(timer) -> None:
    """Install (or remove, with None) the timer used where no GPU is: `timer(name, shape)` gives
    the microseconds of 'sdpa', 'kernel' (two launches), `_FUSED` (the last split combines),
    `_ONE_PASS` or `_ONE_PASS_WIDE` (Note [One pass]) for `shape` (B, H, Hkv, Lq, S, D, dtype)."""
    global _timer
    _timer = timer
    _CHOICES.clear()


def _kernel_chosen(gm, node, q_node, k_node, v_node, mask_node, chain, scale, mode: str) -> Optional[str]:
    """Note [Decode attention by measurement]: None where the traced path is kept; else the
    kernel's form: "kernel" (split and combine kernels), `_FUSED` (Note [The last split combines]),
    `_ONE_PASS` or `_ONE_PASS_WIDE` (Note [One pass])."""
    q, k = node_val(q_node), node_val(k_node)
    mask = node_val(mask_node)
    S = k.shape[2]
    B, H, LQ, D = q.shape
    can_fuse = combines_in_split(H // k.shape[1] * LQ)
    measured = mode == "measured" if q.device.type == "cuda" else _timer is not None
    if type(S) is not int or not measured:
        return "kernel"  # unmeasured: the two launches (a grown cache's length is not known)
    shape = (B, H, k.shape[1], LQ, S, D, str(q.dtype))
    device = torch.cuda.get_device_name(q.device) if q.device.type == "cuda" else q.device.type
    mask_kind = None if mask is None else (str(mask.dtype), tuple(mask.shape), tuple(mask.stride()))
    key = (str(node.target), shape, mask_kind, device, tuple(q.stride()), _chain_key(chain, node))
    choice = _CHOICES.get(key)
    if choice is None:
        applies_to = (can_fuse, S, D, q.element_size(), H // k.shape[1] * LQ)  # which forms are measured
        disk_key = disk_cache.key_of("decode-attention", key, _chain_key(chain, node),
                                     disk_cache.source_digest(sys.modules[__name__], attention_module, timing))
        choice = disk_cache.load("decode-attention", disk_key, lambda v: (
            isinstance(v, dict) and isinstance(v.get("us"), dict) and isinstance(v.get("kernel"), bool)
            and v.get("form") in _FORMS and all(isinstance(t, (int, float)) for t in v["us"].values())
            and v["form"] in v["us"] and _applies(v["form"], *applies_to)))
        if choice is not None:
            choice = {**choice, "source": disk_cache.where("decode-attention")}
        else:
            if q.device.type == "cuda":
                with triton_state.exclusive():
                    times = _measure_cuda(gm, node, q_node, k_node, v_node, mask_node, chain, scale)
            else:
                times = {"sdpa": _timer("sdpa", shape)}
                times.update({f: _timer(f, shape) for f in _FORMS if _applies(f, *applies_to)})
            # the fastest form of the kernel (the two launches on a tie), then against SDPA;
            # nothing measured (another capture running, a failure): what the graph has stays
            forms = [f for f in _FORMS if f in times]
            form = min(forms, key=lambda f: (times[f], _FORMS.index(f))) if forms else "kernel"
            best = times.get(form)
            kernel = best is not None and not ("sdpa" in times and times["sdpa"] <= _MARGIN * best)
            choice = {"kernel": kernel, "form": form, "us": {k2: round(v, 3) for k2, v in times.items()}}
            if "sdpa" in times and "kernel" in times:
                disk_cache.store("decode-attention", disk_key, choice)
        if choice["us"]:  # a measurement that failed (another capture running) is tried again later
            _CHOICES[key] = choice
    us = ", ".join(f"{k2} {v:.2f} us" for k2, v in sorted(choice["us"].items(), key=lambda kv: kv[1]))
    where = f", from {choice['source']}" if choice.get("source") else ""
    what = f"Trident's flash-decoding kernel{_HOW[choice['form']]}" if choice["kernel"] else f"{node.target} as traced"
    gm.meta.setdefault("trident_attention_choices", []).append(
        f"B={B} H={H} Hkv={k.shape[1]} Lq={LQ} S={S} D={D} {q.dtype}: {what} [measured{where}: {us or 'nothing'}]")
    return choice["form"] if choice["kernel"] else None


_FUSED = "kernel_last_split_combines"  # the measured name of Note [The last split combines]'s form
_ONE_PASS = "kernel_one_pass"  # the measured name of Note [One pass]'s form
_ONE_PASS_WIDE = "kernel_one_pass_wide"  # its wide variant (Note [One pass])
_FORMS = ("kernel", _FUSED, _ONE_PASS, _ONE_PASS_WIDE)  # the kernel's forms, the first kept on a tie
_HOW = {"kernel": " and its combine kernel", _FUSED: " (the last split combines)",
        _ONE_PASS: " in one pass (a program per key/value head, no combine)",
        _ONE_PASS_WIDE: " in one pass of wide key blocks (a program per key/value head, no combine)"}


def _applies(form: str, can_fuse: bool, length: int, head_dim: int, itemsize: int, rows: int) -> bool:
    """Whether `form` is one this Trident measures for the shape (a kept choice naming another,
    from another version's rules, is measured again)."""
    if form == _FUSED:
        return can_fuse
    if form == _ONE_PASS_WIDE:
        return bool(one_pass_wide_block_n(length, head_dim, itemsize, rows))
    return form in _FORMS


def _block_n(form: str, length, head_dim: int, itemsize: int, rows: int) -> int:
    """The split kernel's BLOCK_N in `form` for heads of `rows` query rows (a symbolic `length`
    only in the unmeasured form)."""
    if form == _ONE_PASS:
        return one_pass_block_n(head_dim, itemsize)
    if form == _ONE_PASS_WIDE:
        return one_pass_wide_block_n(length, head_dim, itemsize, rows)
    return BLOCK_N


def _chain_key(chain, node) -> tuple:
    """What the traced path runs besides SDPA: the repeat's ops (none with enable_gqa)."""
    return tuple(str(n.target) for n in chain) + (bool(bound_args(node).get("enable_gqa", False)),)


def _measure_cuda(gm, node, q_node, k_node, v_node, mask_node, chain, scale) -> dict:
    """Median microseconds of the traced path (the repeat's nodes and the SDPA call, as a small
    graph on stand-ins) and of Trident's kernels; empty when they cannot be timed."""
    if torch.cuda.is_current_stream_capturing():
        return {}
    q = node_val(q_node)
    try:
        with torch.cuda.device(q.device):
            g = torch.Generator(device=q.device).manual_seed(0)  # stand-ins drawn on the device
            members = set(chain) | {node}
            order = [n for n in gm.graph.nodes if n in members]
            sub = torch.fx.Graph()
            env, inputs = {}, []
            for n in order:
                for p in n.all_input_nodes:
                    if p not in members and p not in env:
                        env[p] = sub.placeholder(f"in{len(inputs)}")
                        inputs.append(p)
            for n in order:
                env[n] = sub.node_copy(n, lambda x: env[x])
            sub.output(env[node])
            traced = torch.fx.GraphModule(torch.nn.Module(), sub)
            values = []
            for p in inputs:
                v = node_val(p)
                if v is None or not isinstance(v, torch.Tensor) or any(type(x) is not int for x in (*v.shape, *v.stride())):
                    return {}
                value = stand_in(v, g)
                values.append(value.zero_() if p is mask_node and v.is_floating_point() else value)
            by_node = dict(zip(inputs, values))
            qs, ks, vs = by_node[q_node], by_node[k_node], by_node[v_node]
            ms = by_node.get(mask_node)
            times = {"sdpa": graph_median_us(lambda: traced(*values))}
            counts = torch.zeros(qs.shape[0] * ks.shape[1], dtype=torch.int32, device=qs.device)
            counter = (torch.zeros(1, dtype=torch.int64, device=qs.device), 0)  # a bump, as a StaticCache step's
            forms = {"kernel": lambda: decode_attention(qs, ks, vs, ms, scale, combine=False, counter=counter),
                     _ONE_PASS: lambda: decode_attention(qs, ks, vs, ms, scale, counts, one_pass=True, counter=counter)}
            wide = one_pass_wide_block_n(ks.shape[2], ks.shape[3], ks.element_size(),
                                         qs.shape[1] // ks.shape[1] * qs.shape[2])
            if wide:
                forms[_ONE_PASS_WIDE] = lambda: decode_attention(qs, ks, vs, ms, scale, counts, one_pass=True,
                                                                 counter=counter, block_n=wide)
            if combines_in_split(qs.shape[1] // ks.shape[1] * qs.shape[2]):  # takes no write, no bump
                forms[_FUSED] = lambda: decode_attention(qs, ks, vs, ms, scale, counts, combine=True)
            torch.cuda.synchronize(qs.device)  # graph_median_us runs on a stream of its own
    except Exception as e:  # noqa: BLE001 - not measured: the kernel is taken, as without measurement
        logs.lowering.debug("decode attention not measured: %s: %s", type(e).__name__, e)
        return {}
    for name, run in forms.items():  # a form that cannot run here (its tiles too large) is left out
        try:
            with torch.cuda.device(q.device):
                times[name] = graph_median_us(run)
        except Exception as e:  # noqa: BLE001
            logs.lowering.debug("decode attention form %s not measured: %s: %s", name, type(e).__name__, e)
    return times
