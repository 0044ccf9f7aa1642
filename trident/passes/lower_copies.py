"""aten.clone / aten.index_copy_ / aten.index_copy -> Trident's own Triton kernels.

Inside a region, an ATen copy costs a dispatcher call plus TensorIterator setup on every call
(on an H200: ~8.4 us per clone, ~7.5 us per index_copy_ in a decode step), while a Triton launch
from the SCM's host program costs ~3.4 us and an allocation ~1 us. This pass rewrites those
calls into `triton_kernel_wrapper_mutation` launches of trident/kernels/copy.py, so the rest of
the pipeline (specialization, guards, native launch, the CPU interpreter path) treats them like
user kernels:

  clone(x)                      -> out = empty_like(x, <the clone's memory format>)
                                   launch strided_copy_kernel(src=x, dst=out)
  index_copy_(self, d, i, src)  -> launch index_copy_kernel(src, dst=self, index=i)
                                   (the node's users read `self`: index_copy_ returns self)
  index_copy(self, d, i, src)   -> the clone above of self, then index_copy_kernel into it

Shapes are static: sizes, strides and dtypes come from node.meta["val"]. Anything unusual stays
an ATen call: symbolic sizes, non-strided tensors, dtypes outside _DTYPES (complex, ...), lazily
negated views (torch._neg_view), zero elements, an iteration space of more than 5 dims after merging, dtype changes, a non-1-D or
non-int64 index, a self that may overlap itself or shares storage with its source or index,
and index_copy while deterministic algorithms are on (when the pass runs).

Which graphs: knob TRIDENT_TRITON_COPIES -- "cuda" (default) rewrites copies of CUDA tensors
only, "all" every device (the CPU runs the kernels through the interpreter launcher; tests), ""
none. CUDA only by default because of Note [Out-of-range indices in index_copy_kernel]: where
eager fails on an out-of-range index (an IndexError on the CPU, a device-side assert on CUDA),
the kernel skips the row.

Note [Aliasing graph inputs]
The storage checks see the captured graph: two inputs are distinct storages there. A caller
passing one tensor as both the cache and the source of an index_copy_ gets an error from eager
(ATen's overlap check) and an unspecified result from the lowered call.
"""

from __future__ import annotations

import math

import torch
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_mutation
from torch.multiprocessing.reductions import StorageWeakRef

from .. import knobs
from ..kernels.copy import index_copy_kernel, strided_copy_kernel

aten = torch.ops.aten

MAX_DIMS = 5
_INT32_MAX = 2**31 - 1
# Same-dtype copies move bits; these are the dtypes Triton has pointer types for and the
# region's torch-mlir import takes (it has no uint16/32/64).
_DTYPES = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
}
# ATen's CUDA index_copy_ has no float8 kernel: eager raises, so the pass leaves it.
_INDEX_COPY_DTYPES = _DTYPES - {torch.float8_e4m3fn, torch.float8_e5m2}


def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def _static_tensor(t) -> bool:
    """A strided tensor with concrete sizes, strides and offset, of a dtype the kernels move."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.dtype not in _DTYPES:
        return False
    if t.is_neg() or t.is_conj():  # lazily negated views: a copy materializes the negation
        return False
    return all(type(v) is int for v in (*t.shape, *t.stride(), t.storage_offset()))


def _device_allowed(t: torch.Tensor, mode: str) -> bool:
    return mode == "all" or t.device.type == "cuda"


def _non_overlapping(sizes, strides) -> bool:
    """Provably no two indices reach one element (sufficient, not necessary: a layout it cannot
    prove stays with ATen, whose own check then decides)."""
    dims = sorted((st, sz) for sz, st in zip(sizes, strides) if sz > 1)
    reach = 0  # largest offset reachable with the dims so far
    for st, sz in dims:
        if st <= reach:
            return False
        reach += st * (sz - 1)
    return True


def _dense(sizes, strides) -> bool:
    """Non-overlapping and dense: some order of the dims is contiguous (size-1 dims aside)."""
    expected = 1
    for st, sz in sorted((st, sz) for sz, st in zip(sizes, strides) if sz != 1):
        if st != expected:
            return False
        expected *= sz
    return True


def _is_contiguous(sizes, strides) -> bool:
    expected = 1
    for sz, st in reversed(list(zip(sizes, strides))):
        if sz != 1 and st != expected:
            return False
        expected *= sz
    return True


def _coalesce(sizes, *stride_lists):
    """Drop size-1 dims and merge neighbours that step through memory as one dim in every
    stride list (outer stride == inner stride * inner size). Returns (sizes, stride lists)."""
    out_sizes: list[int] = []
    out_strides: list[list[int]] = [[] for _ in stride_lists]
    for k, sz in enumerate(sizes):
        if sz == 1:
            continue
        if out_sizes and all(s[-1] == lst[k] * sz for s, lst in zip(out_strides, stride_lists)):
            out_sizes[-1] *= sz
            for s, lst in zip(out_strides, stride_lists):
                s[-1] = lst[k]
            continue
        out_sizes.append(sz)
        for s, lst in zip(out_strides, stride_lists):
            s.append(lst[k])
    return out_sizes, out_strides


def _pad(sizes, stride_lists, rank):
    """Pad at the outer end to `rank` dims of size 1 (stride 1: Triton folds both to constexprs)."""
    n = rank - len(sizes)
    return [1] * n + list(sizes), [[1] * n + list(s) for s in stride_lists]


def _max_offset(sizes, strides) -> int:
    return sum((sz - 1) * st for sz, st in zip(sizes, strides))


def _lane_reach(sizes, strides, grid_end: int) -> int:
    """1 + the largest offset any lane computes, masked-off lanes of the last block included
    (their outermost coordinate runs past sizes[0]); int32 arithmetic must hold it."""
    inner = math.prod(sizes[1:])
    return _max_offset([-(-grid_end // inner), *sizes[1:]], strides) + 1


def _block(numel: int) -> int:
    return min(1024, max(16, 1 << (numel - 1).bit_length()))


def _launch(gm, kernel, grid, kwargs) -> torch.fx.Node:
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


# ---- clone -------------------------------------------------------------------------------


def _copy_plan(src: torch.Tensor, dst: torch.Tensor):
    """Kernel arguments (besides the pointers) copying src into a non-overlapping, dense dst of
    the same shape, walking dst in its memory order; None when it does not fit MAX_DIMS."""
    order = sorted(range(dst.dim()), key=lambda k: -dst.stride(k))
    sizes = [dst.shape[k] for k in order]
    sizes, (src_st, dst_st) = _coalesce(sizes, [src.stride(k) for k in order], [dst.stride(k) for k in order])
    if len(sizes) > MAX_DIMS:
        return None
    numel = dst.numel()
    contiguous = _is_contiguous(sizes, dst_st)
    sizes, (src_st, dst_st) = _pad(sizes, [src_st, dst_st], MAX_DIMS)
    block = _block(numel)
    grid_end = -(-numel // block) * block
    big = max(grid_end, _lane_reach(sizes, src_st, grid_end), _lane_reach(sizes, dst_st, grid_end)) > _INT32_MAX
    kwargs = {f"size{k}": sizes[k] for k in range(MAX_DIMS)}
    kwargs.update({f"src_stride{k}": src_st[k] for k in range(MAX_DIMS)})
    kwargs.update({f"dst_stride{k}": (1 if contiguous else dst_st[k]) for k in range(MAX_DIMS)})  # 1: unused
    kwargs.update(numel=numel, DST_CONTIGUOUS=contiguous, OFFSETS_64=big, BLOCK=block)
    return (-(-numel // block), 1, 1), kwargs


_MEMORY_FORMATS = (None, torch.preserve_format, torch.contiguous_format, torch.channels_last, torch.channels_last_3d)


def _clone_layout_ok(src, out, memory_format) -> bool:
    """A clone the copy kernel can serve: same dtype, shape and device, and a dense result
    (what empty_like gives for every memory format), walked in its memory order."""
    if not _static_tensor(src) or not _static_tensor(out) or memory_format not in _MEMORY_FORMATS:
        return False
    if out.dtype != src.dtype or out.shape != src.shape or out.device != src.device or out.numel() == 0:
        return False
    return out.storage_offset() == 0 and _dense(out.shape, out.stride())


def _allocation(gm, src_node: torch.fx.Node, out: torch.Tensor, memory_format) -> torch.fx.Node:
    """The clone's own allocation: ATen's clone is empty_like(self, memory_format) + copy_.
    Being empty_like, it follows the source when a later call brings another dtype or device
    (sizes and strides are guarded; the kernels' stride arguments stay valid)."""
    node = gm.graph.call_function(
        aten.empty_like.default, (src_node,), {"memory_format": memory_format or torch.preserve_format}
    )
    node.meta["val"] = out
    return node


def _emit_clone(gm, src_node: torch.fx.Node, out: torch.Tensor, memory_format):
    """Allocation + copy launch for a clone of src_node with result layout `out`; None when
    the copy does not fit the kernel."""
    plan = _copy_plan(src_node.meta["val"], out)
    if plan is None:
        return None
    grid, kwargs = plan
    alloc = _allocation(gm, src_node, out, memory_format)
    _launch(gm, strided_copy_kernel, grid, {"src_ptr": src_node, "dst_ptr": alloc, **kwargs})
    return alloc


def _lower_clone(gm, node: torch.fx.Node, mode: str) -> bool:
    src = node.args[0]
    memory_format = node.kwargs.get("memory_format", node.args[1] if len(node.args) > 1 else None)
    out = _val(node)
    if not _clone_layout_ok(_val(src), out, memory_format) or not _device_allowed(out, mode):
        return False
    with gm.graph.inserting_before(node):
        alloc = _emit_clone(gm, src, out, memory_format)
    if alloc is None:
        return False
    node.replace_all_uses_with(alloc)
    gm.graph.erase_node(node)
    return True


# ---- index_copy ----------------------------------------------------------------------------


def _bind(node: torch.fx.Node) -> dict:
    schema = node.target._schema
    bound = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
    return bound


def _storage(t: torch.Tensor):
    return StorageWeakRef(t.untyped_storage())


def _index_copy_plan(dst: torch.Tensor, dim, index: torch.Tensor, src: torch.Tensor):
    """(dim, grid, kernel arguments besides the pointers) for index_copy_(dst, dim, index, src),
    or None when the call is left to ATen."""
    if not (_static_tensor(dst) and _static_tensor(src) and isinstance(index, torch.Tensor)):
        return None
    if index.layout != torch.strided or not all(type(v) is int for v in (*index.shape, *index.stride())):
        return None
    rank = dst.dim()
    if type(dim) is not int or rank == 0 or not -rank <= dim < rank:
        return None
    d = dim % rank
    if index.dtype != torch.int64 or index.dim() != 1 or src.dtype != dst.dtype or src.dim() != rank:
        return None
    if dst.dtype not in _INDEX_COPY_DTYPES:
        return None
    if src.shape[d] != index.numel() or any(src.shape[k] != dst.shape[k] for k in range(rank) if k != d):
        return None
    if src.numel() == 0 or not (dst.device == src.device == index.device):
        return None
    if not _non_overlapping(dst.shape, dst.stride()):
        return None
    if _storage(dst) in (_storage(src), _storage(index)):
        return None
    if torch.are_deterministic_algorithms_enabled():
        return None  # eager's deterministic index_copy_ orders duplicate indices; the kernel does not
    rest = [k for k in range(rank) if k != d]
    sizes, (src_st, dst_st) = _coalesce(
        [src.shape[k] for k in rest], [src.stride(k) for k in rest], [dst.stride(k) for k in rest]
    )
    if len(sizes) > MAX_DIMS - 1:
        return None
    sizes, (src_st, dst_st) = _pad(sizes, [src_st, dst_st], MAX_DIMS - 1)
    sizes = [src.shape[d]] + sizes
    src_st = [src.stride(d)] + src_st
    dst_st = [dst.stride(d)] + dst_st
    numel = src.numel()
    block = _block(numel)
    grid_end = -(-numel // block) * block
    dst_reach = _max_offset(dst.shape, dst.stride()) + 1  # through the index, in-range rows only
    src_reach = _lane_reach(sizes, src_st, grid_end)
    index_reach = _lane_reach(sizes, [index.stride(0), 0, 0, 0, 0], grid_end)
    big = max(grid_end, dst_reach, src_reach, index_reach) > _INT32_MAX
    kwargs = {f"size{k}": sizes[k] for k in range(MAX_DIMS)}
    kwargs.update({f"src_stride{k}": src_st[k] for k in range(MAX_DIMS)})
    kwargs.update({f"dst_stride{k}": dst_st[k] for k in range(MAX_DIMS)})
    kwargs.update(
        index_stride=index.stride(0), dim_size=dst.shape[d], numel=numel, ATEN_RULES=True, OFFSETS_64=big, BLOCK=block
    )
    return d, (-(-numel // block), 1, 1), kwargs


def _emit_index_copy(gm, dst, index, source, plan) -> None:
    _, grid, kwargs = plan
    _launch(gm, index_copy_kernel, grid, {"src_ptr": source, "dst_ptr": dst, "index_ptr": index, **kwargs})


def _lower_index_copy_(gm, node: torch.fx.Node, mode: str) -> bool:
    a = _bind(node)
    self_node, index, source = a.get("self"), a.get("index"), a.get("source")
    if not all(isinstance(x, torch.fx.Node) for x in (self_node, index, source)):
        return False
    dst = _val(self_node)
    plan = _index_copy_plan(dst, a.get("dim"), _val(index), _val(source))
    if plan is None or not _device_allowed(dst, mode):
        return False
    with gm.graph.inserting_before(node):
        _emit_index_copy(gm, self_node, index, source, plan)
    node.replace_all_uses_with(self_node)  # index_copy_ returns self
    gm.graph.erase_node(node)
    return True


def _lower_index_copy(gm, node: torch.fx.Node, mode: str) -> bool:
    """Functional index_copy: eager clones self (preserving its format), then index_copy_."""
    a = _bind(node)
    self_node, index, source = a.get("self"), a.get("index"), a.get("source")
    if not all(isinstance(x, torch.fx.Node) for x in (self_node, index, source)):
        return False
    out = _val(node)
    if not _clone_layout_ok(_val(self_node), out, torch.preserve_format) or not _device_allowed(out, mode):
        return False
    plan = _index_copy_plan(out, a.get("dim"), _val(index), _val(source))
    if plan is None or _copy_plan(_val(self_node), out) is None:
        return False
    with gm.graph.inserting_before(node):
        alloc = _emit_clone(gm, self_node, out, torch.preserve_format)
        _emit_index_copy(gm, alloc, index, source, plan)
    node.replace_all_uses_with(alloc)
    gm.graph.erase_node(node)
    return True


_LOWERINGS = {
    aten.clone.default: _lower_clone,
    aten.index_copy_.default: _lower_index_copy_,
    aten.index_copy.default: _lower_index_copy,
}


def lower_copies(gm: torch.fx.GraphModule) -> int:
    """Rewrite the copies the knob selects; returns how many ATen calls were replaced."""
    mode = knobs.triton_copies()
    if not mode:
        return 0
    count = 0
    for node in list(gm.graph.nodes):
        lower = _LOWERINGS.get(node.target) if node.op == "call_function" else None
        if lower is not None and lower(gm, node, mode):
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
