"""ATen copies -> Trident's own Triton kernels: clone, copy_, slice_scatter, select_scatter,
index_copy(_), index_put(_).

Inside a region, an ATen copy costs a dispatcher call plus TensorIterator setup on every call
(on an H200: ~8.4 us per clone, ~7.5 us per index_copy_ in a decode step), while a Triton launch
from the SCM's host program costs ~3.4 us and an allocation ~1 us. This pass rewrites those
calls into `triton_kernel_wrapper_mutation` launches of trident/kernels/copy.py, so the rest of
the pipeline (specialization, guards, native launch, the CPU interpreter path) treats them like
user kernels:

  clone(x)                      -> out = empty_like(x, <the clone's memory format>)
                                   launch strided_copy_kernel(src=x, dst=out)
  copy_(dst, src)               -> launch strided_copy_kernel(src, dst) (src broadcast to dst
                                   through stride-0 dims; the node's users read `dst`)
  slice_scatter(self, src, d, start, end, step)
                                -> the clone above of self, then strided_copy_kernel from src
                                   into out.slice(d, start, end, step) (a view node)
  select_scatter(self, src, d, i)  likewise, into out.select(d, i)
  index_copy_(self, d, i, src)  -> launch index_copy_kernel(src, dst=self, index=i)
                                   (the node's users read `self`: index_copy_ returns self)
  index_copy(self, d, i, src)   -> the clone above of self, then index_copy_kernel into it
  index_put_(self, [None]*d + [i], v)  (accumulate=False; the `cache[:, :, pos] = v` of a
                                   KV-cache write) -> index_copy_kernel along d with v broadcast
                                   to the indexed shape and negative indices wrapped
  index_put(self, ...)          -> the clone above of self, then that launch into it

Shapes are static: sizes, strides and dtypes come from node.meta["val"]. Anything unusual stays
an ATen call: symbolic sizes, non-strided tensors, dtypes outside _DTYPES (complex, ...), lazily
negated views (torch._neg_view), zero elements, an iteration space of more than 5 dims after merging, dtype changes, a non-1-D or
non-integer index, a destination that may overlap itself, a destination sharing storage with
its source or index (and, for copy_, a destination and source that are both views of graph
inputs: Note [Aliasing graph inputs]), index_put_ with accumulate=True or with anything but
one index tensor after leading Nones, a source that does not broadcast (copy_, index_put_) or
does not have the slice's shape (the scatters), a scatter whose self keeps a layout
empty_like would not give (Note [Scatter results]), and index_copy / index_put while
deterministic algorithms are on (when the pass runs).

Which graphs: knob TRIDENT_TRITON_COPIES -- "cuda" (default) rewrites copies of CUDA tensors
only, "all" every device (the CPU runs the kernels through the interpreter launcher; tests), ""
none. CUDA only by default because of Note [Out-of-range indices in index_copy_kernel]: where
eager fails on an out-of-range index (an IndexError on the CPU, a device-side assert on CUDA),
the kernel skips the row.

Note [Aliasing graph inputs]
The storage checks see the captured graph: two inputs are distinct storages there, though a
caller may pass views of one tensor. index_copy_ and index_put_ are lowered anyway: a caller
passing one tensor as both the cache and the source (or index) gets an error from eager (ATen's
overlap check) and an unspecified result from the lowered call. copy_ is not: eager copies
between views of one storage that do not overlap (cache[:, 1].copy_(cache[:, 0])) and, for some
layouts it cannot check, between ones that do, so a copy_ whose destination and source are both
views of graph inputs stays with ATen; one whose source (or destination) the graph computes is
lowered, since a fresh result shares no storage with an input.

Note [Scatter results]
ATen's slice_scatter / select_scatter clone self preserving its strides *and storage*: the
result is a view, at self's storage offset, of a copy of self's whole storage (unless self
overlaps itself: then a plain clone). The pass lowers them only when the captured result is
dense at offset 0 with the strides empty_like(self) gives (self dense at offset 0, or
overlapping itself), and allocates just those elements. A later call with self at another
storage offset, or a view of a larger storage, gets the same sizes, strides and values as
eager, but offset 0 in a storage of its own size.
"""

from __future__ import annotations

import math

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import knobs
from ..layout import dense, max_offset, non_overlapping
from ..layout import contiguous as contiguous_layout
from ..kernels.copy import index_copy_kernel, strided_copy_kernel
from .common import bound_args, emit_launch, node_val

aten = torch.ops.aten

MAX_DIMS = 5
LOWERED_COPY = "trident_lowered_copy"  # node.meta key of the launches this pass emits
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


def _static_tensor(t) -> bool:
    """A strided tensor with concrete sizes, strides and offset, of a dtype the kernels move."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.dtype not in _DTYPES:
        return False
    if t.is_neg() or t.is_conj():  # lazily negated views: a copy materializes the negation
        return False
    return all(type(v) is int for v in (*t.shape, *t.stride(), t.storage_offset()))


def _device_allowed(t: torch.Tensor, mode: str) -> bool:
    return mode == "all" or t.device.type == "cuda"


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


def _lane_reach(sizes, strides, grid_end: int) -> int:
    """1 + the largest offset any lane computes, masked-off lanes of the last block included
    (their outermost coordinate runs past sizes[0]); int32 arithmetic must hold it."""
    inner = math.prod(sizes[1:])
    return max_offset([-(-grid_end // inner), *sizes[1:]], strides) + 1


def _block(numel: int) -> int:
    return min(1024, max(16, 1 << (numel - 1).bit_length()))


def _launch(gm, kernel, grid, kwargs) -> torch.fx.Node:
    node = emit_launch(gm, kernel, grid, kwargs)
    node.meta[LOWERED_COPY] = True  # trident/passes/fuse_copy_launches.py merges only these
    return node


def _storage(t: torch.Tensor):
    return StorageWeakRef(t.untyped_storage())


# ---- clone -------------------------------------------------------------------------------


def _copy_plan(src: torch.Tensor, dst: torch.Tensor):
    """Kernel arguments (besides the pointers) copying src into a non-overlapping dst of the
    same shape, walking dst in its memory order; None when it does not fit MAX_DIMS."""
    return _strided_plan(dst.shape, src.stride(), dst.stride())


def _strided_plan(shape, src_strides, dst_strides):
    """(grid, kernel arguments besides the pointers) for strided_copy_kernel over `shape`: src
    read through src_strides (0 where broadcast), written to a non-overlapping destination
    through dst_strides, walked in the destination's memory order; None beyond MAX_DIMS."""
    order = sorted(range(len(shape)), key=lambda k: -dst_strides[k])
    sizes = [shape[k] for k in order]
    sizes, (src_st, dst_st) = _coalesce(sizes, [src_strides[k] for k in order], [dst_strides[k] for k in order])
    if len(sizes) > MAX_DIMS:
        return None
    numel = math.prod(shape)
    contiguous = contiguous_layout(sizes, dst_st)
    sizes, (src_st, dst_st) = _pad(sizes, [src_st, dst_st], MAX_DIMS)
    block = _block(numel)
    grid_end = -(-numel // block) * block
    big = max(grid_end, _lane_reach(sizes, src_st, grid_end), _lane_reach(sizes, dst_st, grid_end)) > _INT32_MAX
    kwargs = {f"size{k}": sizes[k] for k in range(MAX_DIMS)}
    kwargs.update({f"src_stride{k}": src_st[k] for k in range(MAX_DIMS)})
    kwargs.update({f"dst_stride{k}": (1 if contiguous else dst_st[k]) for k in range(MAX_DIMS)})  # 1: unused
    kwargs.update(numel=numel, DST_CONTIGUOUS=contiguous, OFFSETS_64=big, BLOCK=block)
    return (-(-numel // block), 1, 1), kwargs


def _broadcast_strides(src: torch.Tensor, shape):
    """src's strides for reading it over `shape` as ATen broadcasts it (ranks aligned on the
    right; stride 0 for the dims src lacks or has as 1 where shape does not), or None where src
    does not broadcast to shape. Like copy_ and index_put_, src may not have more dims."""
    lead = len(shape) - src.dim()
    if lead < 0:
        return None
    strides = []
    for k, n in enumerate(shape):
        j = k - lead
        if j < 0:
            strides.append(0)
        elif src.shape[j] == n:
            strides.append(src.stride(j))
        elif src.shape[j] == 1:
            strides.append(0)
        else:
            return None
    return strides


_MEMORY_FORMATS = (None, torch.preserve_format, torch.contiguous_format, torch.channels_last, torch.channels_last_3d)


def _clone_layout_ok(src, out, memory_format) -> bool:
    """A clone the copy kernel can serve: same dtype, shape and device, and a dense result
    (what empty_like gives for every memory format), walked in its memory order."""
    if not _static_tensor(src) or not _static_tensor(out) or memory_format not in _MEMORY_FORMATS:
        return False
    if out.dtype != src.dtype or out.shape != src.shape or out.device != src.device or out.numel() == 0:
        return False
    return out.storage_offset() == 0 and dense(out.shape, out.stride())


def _fresh_like_ok(self_: torch.Tensor, out: torch.Tensor) -> bool:
    """A functional op's result (index_copy, index_put, the scatters) the pass can allocate as
    empty_like(self) and fill: the clone conditions, and exactly empty_like's strides (which the
    fake result has for a clone of self; Note [Scatter results] for the scatters)."""
    if not _clone_layout_ok(self_, out, torch.preserve_format):
        return False
    meta = torch.empty_strided(self_.shape, self_.stride(), dtype=self_.dtype, device="meta")
    return torch.empty_like(meta, memory_format=torch.preserve_format).stride() == out.stride()


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
    out = node_val(node)
    if not _clone_layout_ok(node_val(src), out, memory_format) or not _device_allowed(out, mode):
        return False
    with gm.graph.inserting_before(node):
        alloc = _emit_clone(gm, src, out, memory_format)
    if alloc is None:
        return False
    node.replace_all_uses_with(alloc)
    gm.graph.erase_node(node)
    return True


# ---- copy_ and the scatters -----------------------------------------------------------------


def _input_storages(gm) -> set:
    return {
        _storage(v)
        for n in gm.graph.find_nodes(op="placeholder")
        if isinstance(v := n.meta.get("val"), torch.Tensor) and v.layout == torch.strided
    }


def _lower_copy_(gm, node: torch.fx.Node, mode: str) -> bool:
    """copy_(dst, src): one strided copy; src broadcasts to dst through stride-0 dims."""
    a = bound_args(node)
    dst_node, src_node = a.get("self"), a.get("src")
    if not (isinstance(dst_node, torch.fx.Node) and isinstance(src_node, torch.fx.Node)):
        return False
    dst, src = node_val(dst_node), node_val(src_node)
    if not (_static_tensor(dst) and _static_tensor(src)) or not _device_allowed(dst, mode):
        return False
    if src.dtype != dst.dtype or src.device != dst.device or dst.numel() == 0:
        return False
    if not non_overlapping(dst.shape, dst.stride()):
        return False  # eager refuses to write one element twice
    src_strides = _broadcast_strides(src, dst.shape)
    if src_strides is None:
        return False
    inputs = _input_storages(gm)
    if _storage(dst) == _storage(src) or (_storage(dst) in inputs and _storage(src) in inputs):
        return False  # may overlap: Note [Aliasing graph inputs]
    plan = _strided_plan(dst.shape, src_strides, dst.stride())
    if plan is None:
        return False
    grid, kwargs = plan
    with gm.graph.inserting_before(node):
        _launch(gm, strided_copy_kernel, grid, {"src_ptr": src_node, "dst_ptr": dst_node, **kwargs})
    node.replace_all_uses_with(dst_node)  # copy_ returns dst
    gm.graph.erase_node(node)
    return True


def _lower_scatter(gm, node: torch.fx.Node, mode: str, view_op, view_arg_names) -> bool:
    """slice_scatter / select_scatter: the clone of self, then src copied into the view
    `view_op(result, *view args)` of the result (ATen's own steps)."""
    a = bound_args(node)
    self_node, src_node = a.get("self"), a.get("src")
    if not (isinstance(self_node, torch.fx.Node) and isinstance(src_node, torch.fx.Node)):
        return False
    self_, src, out = node_val(self_node), node_val(src_node), node_val(node)
    if not _fresh_like_ok(self_, out) or not _device_allowed(out, mode):
        return False
    if not _static_tensor(src) or src.dtype != out.dtype or src.device != out.device or src.numel() == 0:
        return False
    view_args = tuple(a.get(k) for k in view_arg_names)
    if not all(v is None or type(v) is int for v in view_args):
        return False
    view_val = view_op(out, *view_args)
    if view_val.shape != src.shape:
        return False  # eager refuses
    plan = _strided_plan(view_val.shape, src.stride(), view_val.stride())
    if plan is None or _copy_plan(self_, out) is None:
        return False
    grid, kwargs = plan
    with gm.graph.inserting_before(node):
        alloc = _emit_clone(gm, self_node, out, torch.preserve_format)
        view = gm.graph.call_function(view_op, (alloc, *view_args))
        view.meta["val"] = view_val
        _launch(gm, strided_copy_kernel, grid, {"src_ptr": src_node, "dst_ptr": view, **kwargs})
    node.replace_all_uses_with(alloc)
    gm.graph.erase_node(node)
    return True


def _lower_slice_scatter(gm, node: torch.fx.Node, mode: str) -> bool:
    return _lower_scatter(gm, node, mode, aten.slice.Tensor, ("dim", "start", "end", "step"))


def _lower_select_scatter(gm, node: torch.fx.Node, mode: str) -> bool:
    return _lower_scatter(gm, node, mode, aten.select.int, ("dim", "index"))


# ---- index_copy and index_put ------------------------------------------------------------


def _index_ok(index, dtypes) -> bool:
    if not isinstance(index, torch.Tensor) or index.layout != torch.strided or index.dtype not in dtypes:
        return False
    return index.dim() == 1 and all(type(v) is int for v in (*index.shape, *index.stride(), index.storage_offset()))


def _rows_ok(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> bool:
    """What index_copy_ and index_put_ both need besides shapes and dtypes."""
    if not (dst.device == src.device == index.device):
        return False
    if not non_overlapping(dst.shape, dst.stride()):
        return False
    if _storage(dst) in (_storage(src), _storage(index)):
        return False
    # Eager's deterministic index_copy_ / index_put_ order duplicate indices; the kernel does not.
    return not torch.are_deterministic_algorithms_enabled()


def _rows_plan(dst: torch.Tensor, d: int, index: torch.Tensor, shape, src_strides, *, aten_rules, wrap_negative):
    """(grid, kernel arguments besides the pointers) for index_copy_kernel: the iteration space
    `shape` (shape[d] == index.numel(), the other sizes dst's), read through src_strides, its
    row j written to dst's row index[j] along d; None when it does not fit MAX_DIMS."""
    rank = dst.dim()
    rest = [k for k in range(rank) if k != d]
    sizes, (src_st, dst_st) = _coalesce(
        [shape[k] for k in rest], [src_strides[k] for k in rest], [dst.stride(k) for k in rest]
    )
    if len(sizes) > MAX_DIMS - 1:
        return None
    sizes, (src_st, dst_st) = _pad(sizes, [src_st, dst_st], MAX_DIMS - 1)
    sizes = [shape[d]] + sizes
    src_st = [src_strides[d]] + src_st
    dst_st = [dst.stride(d)] + dst_st
    numel = math.prod(shape)
    block = _block(numel)
    grid_end = -(-numel // block) * block
    dst_reach = max_offset(dst.shape, dst.stride()) + 1  # through the index, in-range rows only
    src_reach = _lane_reach(sizes, src_st, grid_end)
    index_reach = _lane_reach(sizes, [index.stride(0), 0, 0, 0, 0], grid_end)
    big = max(grid_end, dst_reach, src_reach, index_reach) > _INT32_MAX
    kwargs = {f"size{k}": sizes[k] for k in range(MAX_DIMS)}
    kwargs.update({f"src_stride{k}": src_st[k] for k in range(MAX_DIMS)})
    kwargs.update({f"dst_stride{k}": dst_st[k] for k in range(MAX_DIMS)})
    kwargs.update(
        index_stride=index.stride(0),
        dim_size=dst.shape[d],
        numel=numel,
        ATEN_RULES=aten_rules,
        WRAP_NEGATIVE=wrap_negative,
        OFFSETS_64=big,
        BLOCK=block,
    )
    return (-(-numel // block), 1, 1), kwargs


def _index_copy_plan(dst: torch.Tensor, dim, index: torch.Tensor, src: torch.Tensor):
    """(dim, grid, kernel arguments besides the pointers) for index_copy_(dst, dim, index, src),
    or None when the call is left to ATen."""
    if not (_static_tensor(dst) and _static_tensor(src) and _index_ok(index, (torch.int64,))):
        return None
    rank = dst.dim()
    if type(dim) is not int or rank == 0 or not -rank <= dim < rank:
        return None
    d = dim % rank
    if src.dtype != dst.dtype or src.dim() != rank or dst.dtype not in _INDEX_COPY_DTYPES:
        return None
    if src.shape[d] != index.numel() or any(src.shape[k] != dst.shape[k] for k in range(rank) if k != d):
        return None
    if src.numel() == 0 or not _rows_ok(dst, index, src):
        return None
    plan = _rows_plan(dst, d, index, src.shape, src.stride(), aten_rules=True, wrap_negative=False)
    return None if plan is None else (d, *plan)


# index_put_ takes int32 as well as int64 indices (byte and bool ones are masks: left to ATen).
_INDEX_PUT_INDEX_DTYPES = (torch.int64, torch.int32)


def _index_put_plan(dst: torch.Tensor, indices, values: torch.Tensor, accumulate):
    """(dim, grid, kernel arguments besides the pointers) for index_put_(dst, indices, values,
    accumulate) with accumulate=False and one 1-D index tensor, after Nones only (dst[:, :, i] =
    values), or None when the call is left to ATen. `indices` holds tensors and Nones."""
    if accumulate is not False or not isinstance(indices, (list, tuple)) or not _static_tensor(dst):
        return None
    given = [k for k, i in enumerate(indices) if i is not None]
    if len(given) != 1 or len(indices) > dst.dim():
        return None
    d = given[0]
    index = indices[d]
    if not _static_tensor(values) or not _index_ok(index, _INDEX_PUT_INDEX_DTYPES) or values.dtype != dst.dtype:
        return None
    shape = list(dst.shape)
    shape[d] = index.numel()  # the indexed shape values broadcasts to
    src_strides = _broadcast_strides(values, shape)
    if src_strides is None or math.prod(shape) == 0 or not _rows_ok(dst, index, values):
        return None
    plan = _rows_plan(dst, d, index, shape, src_strides, aten_rules=False, wrap_negative=True)
    return None if plan is None else (d, *plan)


def _emit_rows(gm, dst, index, source, plan) -> None:
    _, grid, kwargs = plan
    _launch(gm, index_copy_kernel, grid, {"src_ptr": source, "dst_ptr": dst, "index_ptr": index, **kwargs})


def _index_copy_operands(node):
    """(self, index, source nodes, plan function of self's layout), or None."""
    a = bound_args(node)
    self_node, index, source = a.get("self"), a.get("index"), a.get("source")
    if not all(isinstance(x, torch.fx.Node) for x in (self_node, index, source)):
        return None
    dim, index_val, source_val = a.get("dim"), node_val(index), node_val(source)
    return self_node, index, source, lambda dst: _index_copy_plan(dst, dim, index_val, source_val)


def _index_put_operands(node):
    """(self, the index node, values nodes, plan function of self's layout), or None."""
    a = bound_args(node)
    self_node, indices, values = a.get("self"), a.get("indices"), a.get("values")
    if not (isinstance(self_node, torch.fx.Node) and isinstance(values, torch.fx.Node)):
        return None
    if not isinstance(indices, (list, tuple)) or not all(i is None or isinstance(i, torch.fx.Node) for i in indices):
        return None
    index_vals = [None if i is None else node_val(i) for i in indices]
    if any(i is not None and not isinstance(v, torch.Tensor) for i, v in zip(indices, index_vals)):
        return None
    given = [i for i in indices if i is not None]
    if len(given) != 1:
        return None
    values_val, accumulate = node_val(values), a.get("accumulate")
    return self_node, given[0], values, lambda dst: _index_put_plan(dst, index_vals, values_val, accumulate)


def _lower_rows_(operands):
    """index_copy_ / index_put_: one index_copy_kernel launch into self, which the node's users
    then read (both return self)."""

    def lower(gm, node: torch.fx.Node, mode: str) -> bool:
        ops = operands(node)
        if ops is None:
            return False
        self_node, index, source, plan_for = ops
        dst = node_val(self_node)
        plan = plan_for(dst)
        if plan is None or not _device_allowed(dst, mode):
            return False
        with gm.graph.inserting_before(node):
            _emit_rows(gm, self_node, index, source, plan)
        node.replace_all_uses_with(self_node)
        gm.graph.erase_node(node)
        return True

    return lower


def _lower_rows(operands):
    """Functional index_copy / index_put: eager clones self (preserving its format), then
    writes the rows into the clone."""

    def lower(gm, node: torch.fx.Node, mode: str) -> bool:
        ops = operands(node)
        if ops is None:
            return False
        self_node, index, source, plan_for = ops
        out = node_val(node)
        if not _fresh_like_ok(node_val(self_node), out) or not _device_allowed(out, mode):
            return False
        plan = plan_for(out)
        if plan is None or _copy_plan(node_val(self_node), out) is None:
            return False
        with gm.graph.inserting_before(node):
            alloc = _emit_clone(gm, self_node, out, torch.preserve_format)
            _emit_rows(gm, alloc, index, source, plan)
        node.replace_all_uses_with(alloc)
        gm.graph.erase_node(node)
        return True

    return lower


_LOWERINGS = {
    aten.clone.default: _lower_clone,
    aten.copy_.default: _lower_copy_,
    aten.slice_scatter.default: _lower_slice_scatter,
    aten.select_scatter.default: _lower_select_scatter,
    aten.index_copy_.default: _lower_rows_(_index_copy_operands),
    aten.index_copy.default: _lower_rows(_index_copy_operands),
    aten.index_put_.default: _lower_rows_(_index_put_operands),
    aten.index_put.default: _lower_rows(_index_put_operands),
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
