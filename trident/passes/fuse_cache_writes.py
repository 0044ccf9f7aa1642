"""A KV-cache update -> one launch of cache_write_kernel (Note [Cache writes in one program]).

Hugging Face's StaticCache.update, per layer and decode step, traces to

    pos = aten.add.Tensor(aten.arange(n), counter)      # counter: a 1-element int64 tensor
    aten.add_.Tensor(counter, n)                         # optional
    launch index_copy_kernel(src=k, dst=keys,   index=pos)   (lower_copies' index_copy_)
    launch index_copy_kernel(src=v, dst=values, index=pos)

and this pass replaces the four with one launch at the place of the last: cache_write_kernel
reads the counter, bumps it, and writes both pairs' rows at counter + j, in that order, in one
program. Also fused: two index writes through one index tensor the graph has (a cache_position
argument), without the counter steps.

What must hold (else nothing changes):
  * the writes are lower_copies' index_copy_kernel launches (node.meta[LOWERED_COPY]), one or
    two, with equal shared arguments (sizes, dim_size, numel, every constexpr): only pointers
    and strides differ; and each copies at most FUSE_MAX_NUMEL elements (one program does it);
  * pos is arange(n) (int64, start 0, step 1) plus a 1-element int64 tensor on pos's device
    (pos stays for its other users, if any: cache_position, computed once by the model and
    merged by CSE with layer 0's, feeds the rotary embedding and the mask); the bump, if any,
    is an add_ of a Python int (alpha 1) on that same tensor (the same node: CSE has merged
    the reads of one attribute), between pos and the first write, and nothing uses its result;
  * from pos to the bump (or the first write) no node writes what may alias the counter, pos
    or any graph input (which the counter may be at run time), views of them included (the
    alias roots of Note [CSE under mutation]; launches by torch's TTIR analysis, operators by
    their schemas): the counter then holds pos's base up to the bump, and pos is its value;
  * every other node from the bump (or the first write) to the last write only makes views or
    allocations, or names a module attribute (get_attr): no data is read or written there, so
    bumping the counter and writing the rows later, all at the last write's place, reads and
    writes what the original order read and wrote.
The kernel keeps eager's order among the fused calls (Note [Cache writes in one program]), so
nothing is assumed about where the tensors live.
"""

from __future__ import annotations

import torch
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_mutation

from ..kernels.copy import cache_write_kernel, index_copy_kernel
from .common import is_launch, moves_no_data
from .lower_copies import LOWERED_COPY
from .cse import GRAPH_INPUTS, WRITES_ANYTHING, alias_roots, written_nodes

aten = torch.ops.aten

FUSE_MAX_NUMEL = 16384  # elements per pair one program copies (a decode step: a few hundred)
_ARANGES = (aten.arange.default, aten.arange.start, aten.arange.start_step)
_BUMPS = (aten.add_.Tensor, aten.add_.Scalar)
_SHARED = ("size0", "size1", "size2", "size3", "size4", "dim_size", "numel",
           "ATEN_RULES", "WRAP_NEGATIVE", "OFFSETS_64")  # fmt: skip


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _index_write(node: torch.fx.Node):
    """The kwargs of a lower_copies index_copy_kernel launch, or None."""
    if not is_launch(node) or not node.meta.get(LOWERED_COPY) or node.users:
        return None
    if kernel_side_table.get_kernel(node.kwargs["kernel_idx"]) is not index_copy_kernel:
        return None
    if kernel_side_table.get_constant_args(node.kwargs["constant_args_idx"]):
        return None
    grid = node.kwargs["grid"]
    if len(grid) != 1 or tuple(grid[0])[1:] != (1, 1):
        return None
    kw = node.kwargs["kwargs"]
    if not isinstance(kw.get("numel"), int) or kw["numel"] > FUSE_MAX_NUMEL:
        return None
    return kw


def _arange_n(node) -> "int | None":
    """n when `node` is arange(n) as int64 from 0 by 1, else None."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function" or node.target not in _ARANGES:
        return None
    v = _val(node)
    if not isinstance(v, torch.Tensor) or v.dtype != torch.int64 or v.dim() != 1 or type(v.shape[0]) is not int:
        return None
    args = list(node.args)
    if node.target is aten.arange.default:
        start, end, step = 0, args[0] if args else None, 1
    else:
        start, end = (args + [None, None])[:2]
        step = args[2] if node.target is aten.arange.start_step and len(args) > 2 else node.kwargs.get("step", 1)
    if type(start) is not int or start != 0 or type(step) is not int or step != 1 or type(end) is not int:
        return None
    return end if end == v.shape[0] else None


def _offset_index(pos: torch.fx.Node):
    """The counter node when `pos` is arange(n) + counter (Note in the module docstring), else None."""
    if pos.op != "call_function" or pos.target is not aten.add.Tensor or len(pos.args) != 2:
        return None
    if pos.kwargs.get("alpha", 1) != 1:
        return None
    a, b = pos.args
    counter = b if _arange_n(a) is not None else a if _arange_n(b) is not None else None
    c, p = _val(counter), _val(pos)
    if not isinstance(c, torch.Tensor) or not isinstance(p, torch.Tensor):
        return None
    if c.layout != torch.strided or c.dtype != torch.int64 or c.dim() > 1 or c.numel() != 1:
        return None
    if c.device != p.device or p.dtype != torch.int64 or p.dim() != 1:
        return None
    return counter


def _bump(node: torch.fx.Node, counter) -> "int | None":
    """m when `node` is counter.add_(m) (a Python int, alpha 1) whose result nothing uses."""
    if node.op != "call_function" or node.target not in _BUMPS or node.users or len(node.args) != 2:
        return None
    if node.args[0] is not counter or node.kwargs.get("alpha", 1) != 1:
        return None
    m = node.args[1]
    return m if type(m) is int and -(2**63) <= m < 2**63 else None


def _shared_match(kws: list) -> bool:
    first = kws[0]
    for kw in kws[1:]:
        if kw.keys() != first.keys():
            return False
        for name in _SHARED:
            if type(kw[name]) is not type(first[name]) or kw[name] != first[name]:
                return False
    return all(not isinstance(kw[name], torch.fx.Node) for kw in kws for name in _SHARED)


def _fuse(gm, pos: torch.fx.Node) -> "set | None":
    """Fuse the writes through index `pos`; returns the nodes erased, or None."""
    writes = [u for u in pos.users if (kw := _index_write(u)) is not None and kw["index_ptr"] is pos]
    if not 1 <= len(writes) <= 2:
        return None
    kws = [w.kwargs["kwargs"] for w in writes]
    if any(sum(v is pos for v in kw.values()) != 1 for kw in kws):
        return None
    if not _shared_match(kws):
        return None
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    writes.sort(key=order.__getitem__)
    kws = [w.kwargs["kwargs"] for w in writes]
    counter = _offset_index(pos)
    if counter is None and len(writes) == 1:
        return None  # one write through an index tensor: nothing to save
    # From pos to the bump (or the first write): nothing writes the counter or a graph input
    # (which may be the counter at run time); from there to the last write: the writes and
    # inert nodes only.
    bump, increment = None, 0
    node = writes[0].next
    if counter is not None:
        roots = alias_roots(gm)  # views, in-place results and getitems share their source's roots
        guarded = roots[counter] | roots[pos] | {GRAPH_INPUTS}
        node = pos.next
        while node is not writes[0] and (m := _bump(node, counter)) is None:
            written = written_nodes(node)
            if written is WRITES_ANYTHING or any(roots.get(w, frozenset()) & guarded for w in written):
                return None
            node = node.next
        if node is not writes[0]:
            bump, increment, node = node, m, node.next
    while node is not writes[-1]:
        if node not in writes and not moves_no_data(node):
            return None
        node = node.next
    pairs = [kws[0], kws[-1]]
    fused_kwargs = {"src_ptr_0": pairs[0]["src_ptr"], "dst_ptr_0": pairs[0]["dst_ptr"],
                    "src_ptr_1": pairs[1]["src_ptr"], "dst_ptr_1": pairs[1]["dst_ptr"],
                    "index_ptr": pos if counter is None else counter}  # fmt: skip
    for k in range(5):
        fused_kwargs[f"size{k}"] = kws[0][f"size{k}"]
    for pair, kw in enumerate(pairs):
        for k in range(5):
            fused_kwargs[f"src_stride{k}_{pair}"] = kw[f"src_stride{k}"]
        for k in range(5):
            fused_kwargs[f"dst_stride{k}_{pair}"] = kw[f"dst_stride{k}"]
    fused_kwargs.update(
        index_stride=kws[0]["index_stride"],
        dim_size=kws[0]["dim_size"],
        numel=kws[0]["numel"],
        increment=increment,
        PAIRS=len(writes),
        INDEX_OFFSET=counter is not None,
        INCREMENT=bump is not None,
        ATEN_RULES=kws[0]["ATEN_RULES"],
        WRAP_NEGATIVE=kws[0]["WRAP_NEGATIVE"],
        OFFSETS_64=kws[0]["OFFSETS_64"],
        BLOCK=kws[0]["BLOCK"],
        ITERS=-(-kws[0]["numel"] // kws[0]["BLOCK"]),
    )
    if kws[0].get("PDL"):
        fused_kwargs["PDL"] = True
    assert set(fused_kwargs) | {"PDL"} == set(cache_write_kernel.arg_names), set(fused_kwargs) ^ set(cache_write_kernel.arg_names)
    with gm.graph.inserting_before(writes[-1]):
        fused = gm.graph.call_function(
            triton_kernel_wrapper_mutation,
            (),
            {
                "kernel_idx": kernel_side_table.add_kernel(cache_write_kernel),
                "constant_args_idx": kernel_side_table.add_constant_args({}),
                "grid": [(1, 1, 1)],
                "tma_descriptor_metadata": {},
                "kwargs": {k: fused_kwargs[k] for k in cache_write_kernel.arg_names if k in fused_kwargs},
            },
        )
    fused.meta["val"] = None
    fused.meta.update({k: v for k, v in writes[-1].meta.items() if k not in ("val", LOWERED_COPY)})
    erased = set(writes)
    for w in writes:
        gm.graph.erase_node(w)
    if bump is not None:
        target = bump.args[0]
        gm.graph.erase_node(bump)
        erased.add(bump)
        if isinstance(target, torch.fx.Node) and target.op == "get_attr" and not target.users:
            gm.graph.erase_node(target)
            erased.add(target)
    if counter is not None and not pos.users:
        operands = [a for a in pos.args if isinstance(a, torch.fx.Node)]
        gm.graph.erase_node(pos)
        erased.add(pos)
        for a in operands:  # the arange, unless something else reads it
            if a.op == "call_function" and a.target in _ARANGES and not a.users:
                gm.graph.erase_node(a)
                erased.add(a)
    return erased


def fuse_cache_writes(gm: torch.fx.GraphModule) -> int:
    """Fuse every KV-cache update the module docstring describes; returns how many."""
    count, erased = 0, set()
    for node in list(gm.graph.nodes):
        if node in erased or not any(_index_write(u) is not None for u in node.users):
            continue
        done = _fuse(gm, node)
        if done is not None:
            erased |= done
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
