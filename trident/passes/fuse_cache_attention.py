"""A StaticCache write and the decode attention reading it -> the attention's launches alone
(Note [The cache write inside the attention] in trident/kernels/attention.py).

After fuse_cache_writes, a layer of a StaticCache decode step has

    launch cache_write_kernel(src_ptr_0=k, dst_ptr_0=keys, src_ptr_1=v, dst_ptr_1=values,
                              index_ptr=counter or pos, ...)       # + counter += n
    ...
    launch decode_attention_split_kernel(q, k_ptr=keys, v_ptr=values, mask, ws, ...)
    launch decode_attention_combine_kernel(ws, out, ...)

and this pass gives the write to the split kernel (NEW rows) and the counter's bump to the
combine kernel -- or both to the one launch of Note [One pass], whose last program to arrive
bumps the counter -- and removes the cache_write launch: a launch and a kernel boundary fewer
per layer. What must hold (else nothing changes):
  * the write is one cache_write_kernel launch of two pairs whose destinations are the
    attention's keys and values (two distinct nodes), index dim 2 of [B, Hkv, S, D] caches
    (S > 1, D > 1: the dim is then told by its stride and size), sources [B, Hkv, n, D] of the
    cache's dtype with static strides, n <= MAX_NEW; the split kernel is the two-launch form
    (Note [The last split combines] has no second kernel for the bump), or the one-pass form
    (Note [One pass]: its programs write their own head's rows, the last to arrive bumps);
  * the keys and values are graph inputs themselves (placeholders or attributes), and the
    sources, the index (or counter), the query and the mask are each either a graph input
    itself or a fresh result of the graph, no view of an input (their alias roots, Note [CSE
    under mutation], with every input a root of its own: alias_roots(inputs_apart=True)): no program
    then reads what another writes, unless two inputs overlap at run time, which each call
    checks natively (DisjointInputs; trident/kernels/copy.py index_write_checks: the caches
    against each other and every input the kernel reads);
  * every node between the write and the combine launch (the one-pass launch), the split launch
    aside, reads no graph input nor what the caches or the bumped counter may be, and writes no
    graph input nor what the write or the attention reads or writes: moving the write to the
    split launch and the bump to the combine launch then reads and writes what the original
    order did.
"""

from __future__ import annotations

import torch
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

from .. import knobs, logs
from ..kernels.attention import decode_attention_combine_kernel, decode_attention_split_kernel, new_block
from ..kernels.copy import cache_write_kernel
from .common import call_counters, is_launch, moves_no_data, node_val
from .cse import WRITES_ANYTHING, alias_roots, written_nodes

APART = "trident_cache_writes_apart"  # gm.meta: per decode attention, why its cache write stays apart (None: it does not)
MAX_NEW = 16  # new rows per call the split kernel writes at most (decode; speculative verification)


def _kernel(node):
    return kernel_side_table.get_kernel(node.kwargs["kernel_idx"]) if is_launch(node) else None


def _static(t) -> bool:
    return isinstance(t, torch.Tensor) and all(type(v) is int for v in (*t.shape, *t.stride()))


def _pairs(write: dict, keys, values):
    """{'k': pair, 'v': pair} of the write's pairs by destination, or None."""
    by_dst = {write["dst_ptr_0"]: 0, write["dst_ptr_1"]: 1}
    if keys is values or set(by_dst) != {keys, values}:
        return None
    return {"k": by_dst[keys], "v": by_dst[values]}


def _geometry_ok(write: dict, pairs: dict, keys: torch.Tensor) -> bool:
    """The write copies sources [B, Hkv, n, D] into rows of dim 2 of the caches."""
    B, H, S, D = keys.shape
    n = write["size0"]
    if not (type(n) is int and 1 <= n <= MAX_NEW and S > 1 and D > 1):
        return False
    if write["dim_size"] != S or write["numel"] != B * H * n * D:
        return False
    for name in ("k", "v"):
        p = pairs[name]
        src = node_val(write[f"src_ptr_{p}"])
        if not _static(src) or src.dtype != keys.dtype or tuple(src.shape) != (B, H, n, D):
            return False
        if write[f"dst_stride0_{p}"] != D or write[f"src_stride0_{p}"] != src.stride(2):
            return False
    return True


def _roots_of(roots: dict, nodes) -> frozenset:
    out = frozenset()
    for n in nodes:
        if isinstance(n, torch.fx.Node):
            out |= roots.get(n, frozenset())
    return out


def _is_input(node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op in ("placeholder", "get_attr")


def _window_blocker(write_node, split, combine, roots, inputs, caches, touched, bumped):
    """The first node strictly between the write and the combine launch, the split launch aside,
    that does not commute with the write (and the bump), or None: see the module docstring."""
    node = write_node.next
    while node is not combine:
        if node is not split and not moves_no_data(node):
            written = written_nodes(node)
            if written is WRITES_ANYTHING or _roots_of(roots, written) & (touched | inputs):
                return node
            if _roots_of(roots, node.all_input_nodes) & (caches | bumped | inputs):
                return node
        node = node.next
    return None


def _fuse(gm, split, order, roots) -> "str | None":
    """Give the write before `split` to it; None when done, else why not."""
    a = split.kwargs["kwargs"]
    if a.get("COMBINE") or a.get("NEW"):
        return "the split kernel combines (no combine kernel to bump the counter)"
    keys, values, ws = a["k_ptr"], a["v_ptr"], a["ws_ptr"]
    if a.get("DIRECT"):  # Note [One pass]: the window ends at the one launch
        combine = split
    else:
        combine = next((u for u in ws.users if _kernel(u) is decode_attention_combine_kernel
                        and order[u] > order[split]), None)
    if combine is None:
        return "no combine launch after it"
    # the nearest cache write before the split launch that writes these caches
    write_node = split.prev
    while write_node.op not in ("placeholder", "root") and not (
            _kernel(write_node) is cache_write_kernel
            and {write_node.kwargs["kwargs"]["dst_ptr_0"], write_node.kwargs["kwargs"]["dst_ptr_1"]} & {keys, values}):
        write_node = write_node.prev
    if _kernel(write_node) is not cache_write_kernel:
        return "no cache write of its keys or values before it"
    w = write_node.kwargs["kwargs"]
    if w.get("PAIRS") != 2 or kernel_side_table.get_constant_args(write_node.kwargs["constant_args_idx"]):
        return f"{write_node.name} writes one cache, or takes constant arguments"
    pairs = _pairs(w, keys, values)
    k_val = node_val(keys)
    if pairs is None or not _static(k_val) or not _geometry_ok(w, pairs, k_val):
        return f"{write_node.name} writes other tensors or rows than the attention's keys and values"
    if not (_is_input(keys) and _is_input(values)):
        return "the keys or values are views made in the graph (only whole inputs are checked apart at run time)"
    index = w["index_ptr"]
    srcs = [w[f"src_ptr_{pairs['k']}"], w[f"src_ptr_{pairs['v']}"]]
    inputs = frozenset(n for n in gm.graph.nodes if _is_input(n))
    caches = _roots_of(roots, [keys, values])
    for p in [*srcs, index, a["q_ptr"], a["mask_ptr"]]:
        r = _roots_of(roots, [p])
        if r & caches or (r & inputs and not _is_input(p)):
            return f"{p.name} may be a view of the caches (a view of a graph input)"
    touched = caches | _roots_of(roots, [*srcs, index])
    bumped = _roots_of(roots, [index]) if w["INCREMENT"] else frozenset()
    blocker = _window_blocker(write_node, split, combine, roots, inputs, caches, touched, bumped)
    if blocker is not None:
        what = _kernel(blocker).fn.__name__ if is_launch(blocker) else str(blocker.target)
        return f"{blocker.name} ({what}) between it and the attention may read or write what it does"
    new_k, new_v = (node_val(s) for s in srcs)
    n = w["size0"]
    fused = dict(a)
    fused.update(
        new_k_ptr=srcs[0], new_v_ptr=srcs[1], index_ptr=index,
        snk_b=new_k.stride(0), snk_h=new_k.stride(1), snk_l=new_k.stride(2), snk_d=new_k.stride(3),
        snv_b=new_v.stride(0), snv_h=new_v.stride(1), snv_l=new_v.stride(2), snv_d=new_v.stride(3),
        index_stride=0 if w["INDEX_OFFSET"] else w["index_stride"],
        NEW=n, NEW_BLOCK=new_block(n), INDEX_OFFSET=bool(w["INDEX_OFFSET"]), WRAP_NEGATIVE=bool(w["WRAP_NEGATIVE"]),
    )
    unknown = set(fused) - set(decode_attention_split_kernel.arg_names) - {"num_warps"}  # a launch option
    assert not unknown, unknown
    if w["INCREMENT"] and combine is split:  # Note [One pass]: the last program to arrive bumps it
        counts, offset = call_counters(gm, node_val(a["q_ptr"]), 1)
        fused.update(counter_ptr=index, increment=w["increment"], INCREMENT=True, count_ptr=counts,
                     count_offset=offset)
    split.kwargs = {**split.kwargs, "kwargs": fused}
    if w["INCREMENT"] and combine is not split:
        c = dict(combine.kwargs["kwargs"], counter_ptr=index, increment=w["increment"], INCREMENT=True)
        combine.kwargs = {**combine.kwargs, "kwargs": c}
    gm.graph.erase_node(write_node)
    return None


def fuse_cache_attention(gm: torch.fx.GraphModule) -> int:
    """Give every StaticCache write the module docstring describes to its decode attention;
    returns how many (none with TRIDENT_CACHE_ATTENTION off)."""
    if not knobs.cache_attention():
        return 0
    splits = [n for n in gm.graph.nodes if _kernel(n) is decode_attention_split_kernel]
    if not splits or not any(_kernel(n) is cache_write_kernel for n in gm.graph.nodes):
        return 0
    count = 0
    for split in splits:
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        why = _fuse(gm, split, order, alias_roots(gm, inputs_apart=True))
        gm.meta.setdefault(APART, []).append(why)  # None: given to the attention
        if why is None:
            count += 1
        else:
            logs.lowering.debug("the cache write stays apart from %s: %s", split.name, why)
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
