"""Element-moving kernels that replace ATen copies inside regions (trident/passes/lower_copies.py).

Both kernels walk a flat index over an iteration space of up to 5 dims (sizes0..4, outermost
first; the pass pads with size-1 dims, which Triton folds to constexpr 1) and turn each flat
index into one source and one destination offset through per-dim strides. They move bits, never
values: the pointers are bitcast to the unsigned integer type of the element's width, so every
dtype (bool bytes other than 0/1, NaN payloads, float8, bf16 in the CPU interpreter) is copied
exactly as ATen copies it.

`OFFSETS_64` (constexpr) picks 64-bit index arithmetic; the pass sets it when the element count
or any offset reached may not fit in int32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _bits(ptr):
    """`ptr` reinterpreted as a pointer to the unsigned integer of its element's width."""
    BITS: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth
    if BITS == 64:
        out = ptr.to(tl.pointer_type(tl.uint64), bitcast=True)
    elif BITS == 32:
        out = ptr.to(tl.pointer_type(tl.uint32), bitcast=True)
    elif BITS == 16:
        out = ptr.to(tl.pointer_type(tl.uint16), bitcast=True)
    else:  # 8-bit types and bool (i1, stored as one byte)
        out = ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
    return out


@triton.jit
def _strided_copy(
    src_ptr,
    dst_ptr,
    size0,
    size1,
    size2,
    size3,
    size4,
    src_stride0,
    src_stride1,
    src_stride2,
    src_stride3,
    src_stride4,
    dst_stride0,
    dst_stride1,
    dst_stride2,
    dst_stride3,
    dst_stride4,
    numel,
    DST_CONTIGUOUS: tl.constexpr,
    OFFSETS_64: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """The body of strided_copy_kernel (and of each pair of strided_copy2_kernel): block
    tl.program_id(0) of the iteration space."""
    tl.static_assert(src_ptr.dtype == dst_ptr.dtype, "strided_copy_kernel copies within one dtype")
    pid = tl.program_id(0)
    if OFFSETS_64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    rem = offs
    i4 = rem % size4
    rem = rem // size4
    i3 = rem % size3
    rem = rem // size3
    i2 = rem % size2
    rem = rem // size2
    i1 = rem % size1
    i0 = rem // size1
    src_off = i0 * src_stride0 + i1 * src_stride1 + i2 * src_stride2 + i3 * src_stride3 + i4 * src_stride4
    if DST_CONTIGUOUS:
        dst_off = offs
    else:
        dst_off = i0 * dst_stride0 + i1 * dst_stride1 + i2 * dst_stride2 + i3 * dst_stride3 + i4 * dst_stride4
    src = _bits(src_ptr)
    dst = _bits(dst_ptr)
    value = tl.load(src + src_off, mask=mask)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(dst + dst_off, value, mask=mask)


@triton.jit
def strided_copy_kernel(
    src_ptr,
    dst_ptr,
    size0,
    size1,
    size2,
    size3,
    size4,
    src_stride0,
    src_stride1,
    src_stride2,
    src_stride3,
    src_stride4,
    dst_stride0,
    dst_stride1,
    dst_stride2,
    dst_stride3,
    dst_stride4,
    numel,
    DST_CONTIGUOUS: tl.constexpr,
    OFFSETS_64: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """dst[i] = src[i] for every index i of the iteration space. Source strides may be 0
    (expanded dims). DST_CONTIGUOUS: the destination is dense in iteration order, so its offset
    is the flat index (dst strides unused). PDL: wait for the kernel before first, release the
    next one after the load (Note [Programmatic dependent launch])."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    _strided_copy(
        src_ptr, dst_ptr, size0, size1, size2, size3, size4,
        src_stride0, src_stride1, src_stride2, src_stride3, src_stride4,
        dst_stride0, dst_stride1, dst_stride2, dst_stride3, dst_stride4,
        numel, DST_CONTIGUOUS, OFFSETS_64, BLOCK, PDL,
    )  # fmt: skip


@triton.jit
def strided_copy2_kernel(
    src_ptr_0,
    dst_ptr_0,
    src_ptr_1,
    dst_ptr_1,
    size0,
    size1,
    size2,
    size3,
    size4,
    src_stride0_0,
    src_stride1_0,
    src_stride2_0,
    src_stride3_0,
    src_stride4_0,
    dst_stride0_0,
    dst_stride1_0,
    dst_stride2_0,
    dst_stride3_0,
    dst_stride4_0,
    src_stride0_1,
    src_stride1_1,
    src_stride2_1,
    src_stride3_1,
    src_stride4_1,
    dst_stride0_1,
    dst_stride1_1,
    dst_stride2_1,
    dst_stride3_1,
    dst_stride4_1,
    numel,
    DST_CONTIGUOUS: tl.constexpr,
    OFFSETS_64: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Two independent strided_copy_kernel launches over one iteration space in one launch
    (trident/passes/fuse_copy_launches.py): grid (n, 2, 1), tl.program_id(1) picks the pair
    (pointers and strides with suffix _0 or _1); each pair runs strided_copy_kernel's body."""
    if PDL:
        tl.extra.cuda.gdc_wait()  # before the branch: every program waits first
    if tl.program_id(1) == 0:
        _strided_copy(
            src_ptr_0, dst_ptr_0, size0, size1, size2, size3, size4,
            src_stride0_0, src_stride1_0, src_stride2_0, src_stride3_0, src_stride4_0,
            dst_stride0_0, dst_stride1_0, dst_stride2_0, dst_stride3_0, dst_stride4_0,
            numel, DST_CONTIGUOUS, OFFSETS_64, BLOCK, PDL,
        )  # fmt: skip
    else:
        _strided_copy(
            src_ptr_1, dst_ptr_1, size0, size1, size2, size3, size4,
            src_stride0_1, src_stride1_1, src_stride2_1, src_stride3_1, src_stride4_1,
            dst_stride0_1, dst_stride1_1, dst_stride2_1, dst_stride3_1, dst_stride4_1,
            numel, DST_CONTIGUOUS, OFFSETS_64, BLOCK, PDL,
        )  # fmt: skip


# Note [Out-of-range indices in index_copy_kernel]
# ATen's index_copy_ does not wrap negative indices: an index outside [0, size) is an error --
# an IndexError on the CPU, a device-side assert in eager CUDA (which poisons the CUDA context).
# ATen's index_put_ wraps an index in [-size, 0) by adding size (WRAP_NEGATIVE) and fails alike
# outside [-size, size).
# This kernel cannot raise; it skips such a row instead: nothing is written for it, every other
# row is written. So a lowered index_copy_ / index_put_ gives a different outcome than eager only
# for a call that would have failed in eager, and the pass lowers them only in CUDA graphs by
# default (knob TRIDENT_TRITON_COPIES="cuda"), where the eager outcome is an unrecoverable assert
# anyway; "all" lowers CPU graphs too (tests), where eager would have raised.
# Duplicate indices: which source row lands is unspecified, as for eager CUDA index_copy_ and
# index_put_ (accumulate=False).


@triton.jit
def _index_copy(
    src_ptr,
    dst_ptr,
    index_ptr,
    size0,
    size1,
    size2,
    size3,
    size4,
    src_stride0,
    src_stride1,
    src_stride2,
    src_stride3,
    src_stride4,
    dst_stride0,
    dst_stride1,
    dst_stride2,
    dst_stride3,
    dst_stride4,
    index_stride,
    dim_size,
    numel,
    ATEN_RULES: tl.constexpr,
    WRAP_NEGATIVE: tl.constexpr,
    OFFSETS_64: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    """The body of index_copy_kernel (and of each pair of index_copy2_kernel): block
    tl.program_id(0) of the iteration space."""
    pid = tl.program_id(0)
    if OFFSETS_64:
        pid = pid.to(tl.int64)
    _index_copy_block(
        src_ptr, dst_ptr, index_ptr, 0, pid * BLOCK + tl.arange(0, BLOCK), size0, size1, size2, size3, size4,
        src_stride0, src_stride1, src_stride2, src_stride3, src_stride4,
        dst_stride0, dst_stride1, dst_stride2, dst_stride3, dst_stride4,
        index_stride, dim_size, numel, False, ATEN_RULES, WRAP_NEGATIVE, PDL,
    )  # fmt: skip


@triton.jit
def _index_copy_block(
    src_ptr,
    dst_ptr,
    index_ptr,
    base,
    offs,
    size0,
    size1,
    size2,
    size3,
    size4,
    src_stride0,
    src_stride1,
    src_stride2,
    src_stride3,
    src_stride4,
    dst_stride0,
    dst_stride1,
    dst_stride2,
    dst_stride3,
    dst_stride4,
    index_stride,
    dim_size,
    numel,
    INDEX_OFFSET: tl.constexpr,
    ATEN_RULES: tl.constexpr,
    WRAP_NEGATIVE: tl.constexpr,
    RELEASE: tl.constexpr,
):
    """Elements `offs` (flat indices of the iteration space) of an index copy. Row j's index is
    index[j * index_stride], or base + j when INDEX_OFFSET (the index tensor arange(n) + base,
    never materialized: Note [Cache writes in one program]). RELEASE: release the next kernel
    once loaded (Note [Programmatic dependent launch])."""
    tl.static_assert(src_ptr.dtype == dst_ptr.dtype, "index_copy_kernel: source and self must have one dtype")
    INDEX_TY: tl.constexpr = index_ptr.dtype.element_ty
    # an offset index (arange(n) + counter) is int64 whatever integer type the counter has
    tl.static_assert(INDEX_OFFSET or INDEX_TY == tl.int64 or (INDEX_TY == tl.int32 and not ATEN_RULES),
                     "index must be int64")
    tl.static_assert(not INDEX_OFFSET or INDEX_TY.is_int(), "the index base must be an integer")
    tl.static_assert(not (ATEN_RULES and dst_ptr.dtype.element_ty.is_fp8()), "index_copy_: no float8 kernel in ATen")
    mask = offs < numel
    rem = offs
    i4 = rem % size4
    rem = rem // size4
    i3 = rem % size3
    rem = rem // size3
    i2 = rem % size2
    rem = rem // size2
    i1 = rem % size1
    i0 = rem // size1
    if INDEX_OFFSET:
        idx = base + i0.to(tl.int64)
    else:
        idx = tl.load(index_ptr + i0 * index_stride, mask=mask, other=0).to(tl.int64)
    if WRAP_NEGATIVE:
        idx = tl.where(idx < 0, idx + dim_size, idx)
    ok = mask & (idx >= 0) & (idx < dim_size)
    src_off = i0 * src_stride0 + i1 * src_stride1 + i2 * src_stride2 + i3 * src_stride3 + i4 * src_stride4
    rest = i1 * dst_stride1 + i2 * dst_stride2 + i3 * dst_stride3 + i4 * dst_stride4
    dst_off = idx * dst_stride0 + rest.to(tl.int64)
    src = _bits(src_ptr)
    dst = _bits(dst_ptr)
    value = tl.load(src + src_off, mask=ok)
    if RELEASE:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(dst + dst_off, value, mask=ok)


@triton.jit
def index_copy_kernel(
    src_ptr,
    dst_ptr,
    index_ptr,
    size0,
    size1,
    size2,
    size3,
    size4,
    src_stride0,
    src_stride1,
    src_stride2,
    src_stride3,
    src_stride4,
    dst_stride0,
    dst_stride1,
    dst_stride2,
    dst_stride3,
    dst_stride4,
    index_stride,
    dim_size,
    numel,
    ATEN_RULES: tl.constexpr,
    WRAP_NEGATIVE: tl.constexpr,
    OFFSETS_64: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """index_copy_ of `src` into `dst` along dst's indexed dim. The iteration space is src's:
    dim 0 is the indexed dim (size0 = number of indices), dims 1..4 the others; element
    (j, i1..i4) goes to dst at index[j] * dst_stride0 + i1 * dst_stride1 + ... Source strides may
    be 0 (a broadcast source of index_put_). WRAP_NEGATIVE: an index in [-dim_size, 0) counts from
    the end, as in index_put_ (index_copy_ does not wrap). Rows whose index is then outside
    [0, dim_size) are not written (Note [Out-of-range indices in index_copy_kernel]).
    The index is int64 or int32; source and destination have one dtype. ATEN_RULES refuses, at
    compile time, what ATen's index_copy_ refuses by dtype: an index other than int64, float8
    data (no CPU or CUDA kernel). So a later call bringing such dtypes to a lowered index_copy_
    fails, as eager does, instead of succeeding. (index_put_ takes int32 indices and float8
    data: the pass launches it without ATEN_RULES.) PDL: Note [Programmatic dependent launch]."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    _index_copy(
        src_ptr, dst_ptr, index_ptr, size0, size1, size2, size3, size4,
        src_stride0, src_stride1, src_stride2, src_stride3, src_stride4,
        dst_stride0, dst_stride1, dst_stride2, dst_stride3, dst_stride4,
        index_stride, dim_size, numel, ATEN_RULES, WRAP_NEGATIVE, OFFSETS_64, BLOCK, PDL,
    )  # fmt: skip


@triton.jit
def index_copy2_kernel(
    src_ptr_0,
    dst_ptr_0,
    index_ptr_0,
    src_ptr_1,
    dst_ptr_1,
    index_ptr_1,
    size0,
    size1,
    size2,
    size3,
    size4,
    src_stride0_0,
    src_stride1_0,
    src_stride2_0,
    src_stride3_0,
    src_stride4_0,
    dst_stride0_0,
    dst_stride1_0,
    dst_stride2_0,
    dst_stride3_0,
    dst_stride4_0,
    index_stride_0,
    src_stride0_1,
    src_stride1_1,
    src_stride2_1,
    src_stride3_1,
    src_stride4_1,
    dst_stride0_1,
    dst_stride1_1,
    dst_stride2_1,
    dst_stride3_1,
    dst_stride4_1,
    index_stride_1,
    dim_size,
    numel,
    ATEN_RULES: tl.constexpr,
    WRAP_NEGATIVE: tl.constexpr,
    OFFSETS_64: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Two independent index_copy_kernel launches over one iteration space in one launch
    (trident/passes/fuse_copy_launches.py): grid (n, 2, 1), tl.program_id(1) picks the pair
    (pointers and strides with suffix _0 or _1); each pair runs index_copy_kernel's body."""
    if PDL:
        tl.extra.cuda.gdc_wait()  # before the branch: every program waits first
    if tl.program_id(1) == 0:
        _index_copy(
            src_ptr_0, dst_ptr_0, index_ptr_0, size0, size1, size2, size3, size4,
            src_stride0_0, src_stride1_0, src_stride2_0, src_stride3_0, src_stride4_0,
            dst_stride0_0, dst_stride1_0, dst_stride2_0, dst_stride3_0, dst_stride4_0,
            index_stride_0, dim_size, numel, ATEN_RULES, WRAP_NEGATIVE, OFFSETS_64, BLOCK, PDL,
        )  # fmt: skip
    else:
        _index_copy(
            src_ptr_1, dst_ptr_1, index_ptr_1, size0, size1, size2, size3, size4,
            src_stride0_1, src_stride1_1, src_stride2_1, src_stride3_1, src_stride4_1,
            dst_stride0_1, dst_stride1_1, dst_stride2_1, dst_stride3_1, dst_stride4_1,
            index_stride_1, dim_size, numel, ATEN_RULES, WRAP_NEGATIVE, OFFSETS_64, BLOCK, PDL,
        )  # fmt: skip


# Note [Cache writes in one program]
# A decode step writes each layer's K and V cache rows with index_copy_ at cache_position, and
# Hugging Face's StaticCache computes that position on the device every layer:
#     pos = torch.arange(n) + counter;  counter.add_(n)
#     keys.index_copy_(2, pos, k);  values.index_copy_(2, pos, v)
# -- four launches of a few elements each (~1.3 us apiece on an H200 inside a CUDA graph; each
# ~3 us of host time without one). trident/passes/fuse_cache_writes.py makes them ONE launch
# of cache_write_kernel, which runs the calls in their program order in a single program:
#   1. base = counter (INDEX_OFFSET: the index is arange(n) + base, never materialized; a
#      barrier: every thread has read it before anything is written);
#   2. INCREMENT: counter = base + increment (every thread has read base: a barrier first);
#   3. pair 0's rows, then (PAIRS == 2, after a barrier) pair 1's rows.
# One program and a CTA barrier between the phases give eager's order exactly, so nothing is
# assumed about the tensors: K and V may be one tensor or overlapping views (a later write wins,
# as in eager), the counter may live anywhere. What eager refuses within one call (a source or
# index overlapping the tensor it writes) is refused natively, as for index_copy_kernel (Note
# [Inputs a lowered index write must not overlap]). The single program bounds the size: the
# pass fuses only calls of at most FUSE_MAX_NUMEL elements per pair (a decode step's few
# hundred), so a long prefill keeps its parallel launches.


@triton.jit
def cache_write_kernel(
    src_ptr_0,
    dst_ptr_0,
    src_ptr_1,
    dst_ptr_1,
    index_ptr,
    size0,
    size1,
    size2,
    size3,
    size4,
    src_stride0_0,
    src_stride1_0,
    src_stride2_0,
    src_stride3_0,
    src_stride4_0,
    dst_stride0_0,
    dst_stride1_0,
    dst_stride2_0,
    dst_stride3_0,
    dst_stride4_0,
    src_stride0_1,
    src_stride1_1,
    src_stride2_1,
    src_stride3_1,
    src_stride4_1,
    dst_stride0_1,
    dst_stride1_1,
    dst_stride2_1,
    dst_stride3_1,
    dst_stride4_1,
    index_stride,
    dim_size,
    numel,
    increment,
    PAIRS: tl.constexpr,
    INDEX_OFFSET: tl.constexpr,
    INCREMENT: tl.constexpr,
    ATEN_RULES: tl.constexpr,
    WRAP_NEGATIVE: tl.constexpr,
    OFFSETS_64: tl.constexpr,
    BLOCK: tl.constexpr,
    ITERS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One or two index_copy_kernel calls sharing one index, in order, in one program (grid
    (1, 1, 1)); with INDEX_OFFSET the index is arange(size0) + index[0], and with INCREMENT
    index[0] += increment before the rows are written (Note [Cache writes in one program]).
    PAIRS == 1 ignores the pointers and strides of pair 1. ITERS = cdiv(numel, BLOCK) blocks.
    PDL: wait first and release the next kernel at once (one program: its blocks take no slots
    this program needs; Note [Programmatic dependent launch])."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    base = 0
    if INDEX_OFFSET:
        base = tl.load(index_ptr).to(tl.int64)
        tl.debug_barrier()  # every thread has read the counter before anything is written
    if INCREMENT:
        tl.static_assert(INDEX_OFFSET, "the counter is the index base")
        tl.store(index_ptr, (base + increment).to(index_ptr.dtype.element_ty))
        tl.debug_barrier()
    lanes = tl.arange(0, BLOCK)
    if OFFSETS_64:
        lanes = lanes.to(tl.int64)
    for it in range(ITERS):
        _index_copy_block(
            src_ptr_0, dst_ptr_0, index_ptr, base, it * BLOCK + lanes, size0, size1, size2, size3, size4,
            src_stride0_0, src_stride1_0, src_stride2_0, src_stride3_0, src_stride4_0,
            dst_stride0_0, dst_stride1_0, dst_stride2_0, dst_stride3_0, dst_stride4_0,
            index_stride, dim_size, numel, INDEX_OFFSET, ATEN_RULES, WRAP_NEGATIVE, False,
        )  # fmt: skip
    if PAIRS == 2:
        tl.debug_barrier()
        for it in range(ITERS):
            _index_copy_block(
                src_ptr_1, dst_ptr_1, index_ptr, base, it * BLOCK + lanes, size0, size1, size2, size3, size4,
                src_stride0_1, src_stride1_1, src_stride2_1, src_stride3_1, src_stride4_1,
                dst_stride0_1, dst_stride1_1, dst_stride2_1, dst_stride3_1, dst_stride4_1,
                index_stride, dim_size, numel, INDEX_OFFSET, ATEN_RULES, WRAP_NEGATIVE, False,
            )  # fmt: skip


# what the decode attention's parameters are, in the terms of the model that passes them
_ATTENTION_ROLES = {"k_ptr": "the keys cache", "v_ptr": "the values cache", "new_k_ptr": "the step's new keys",
                    "new_v_ptr": "the step's new values", "q_ptr": "the query", "mask_ptr": "the attention mask",
                    "index_ptr": "the cache position"}


def parameter_role(kernel_name: str, param: str) -> str:
    """A parameter of an index-writing launch as an error names it (its role where the kernel is
    the decode attention writing cache rows; else the parameter's name)."""
    if kernel_name == "decode_attention_split_kernel":
        return _ATTENTION_ROLES.get(param, param)
    return param


def index_write_checks(kernel_name: str, args: dict, writes) -> list[tuple[str, str, bool]]:
    """(written, read, eager) parameters one launch of an index-writing kernel must keep apart
    (Note [Inputs a lowered index write must not overlap]; eager: eager refuses the overlap
    too); [] for other kernels. index_copy_kernel and index_copy2_kernel: each destination
    against every parameter read. cache_write_kernel runs its calls one after another (Note
    [Cache writes in one program]): each destination against its own call's source and, unless
    the index is arange(n) + the counter, the index. decode_attention_split_kernel writing the
    new rows (Note [The cache write inside the attention]): the caches against each other and
    every parameter it reads (its pass proved them no views of the caches; inputs of their own are
    checked here), eager refusing only what index_copy_ refuses (a cache against its own source,
    and the index where it is a tensor)."""
    if kernel_name in ("index_copy_kernel", "index_copy2_kernel"):
        dsts = [w for w in writes if w.startswith("dst_ptr")]
        return [(w, r, True) for w in dsts for r in args if r not in writes]
    if kernel_name == "cache_write_kernel":
        index = [] if args.get("INDEX_OFFSET") else ["index_ptr"]
        return [(f"dst_ptr_{p}", r, True) for p in (0, 1) if f"dst_ptr_{p}" in writes
                for r in [f"src_ptr_{p}", *index]]
    if kernel_name == "decode_attention_split_kernel" and args.get("NEW"):
        read = {"new_k_ptr": ("k_ptr",), "new_v_ptr": ("v_ptr",), "q_ptr": (), "mask_ptr": (),
                "index_ptr": () if args.get("INDEX_OFFSET") else ("k_ptr", "v_ptr")}
        return [("k_ptr", "v_ptr", False)] + [
            (w, r, w in refused) for r, refused in read.items() for w in ("k_ptr", "v_ptr")]
    return []
