"""Symbolic sizes (Note [Symbolic sizes]): one capture, one SCM, every size; a new specialization
only where Triton would compile a new binary (its key changes) or a Python decision saw the size
(autotune, heuristics), each counted against Triton's own specializer."""

from __future__ import annotations

import re

import pytest
import torch
import triton
import triton.language as tl
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

import trident
from trident.errors import GuardError
from tests import kernels as K


def triton_int_key(n: int):
    return native_specialize_impl(BaseBackend, n, False, True, True)


def test_sizes_1000_to_1099_need_only_tritons_specializations(device):
    x0 = torch.randn(1000, device=device)
    opt = trident.optimize(trident.capture(K.two_kernels, x0, torch.randn(1000, device=device), dynamic=True))
    keys = set()
    for n in range(1000, 1100):
        x, y = torch.randn(n, device=device), torch.randn(n, device=device)
        torch.testing.assert_close(opt(x, y), K.two_kernels_ref(x, y))
        keys.add(triton_int_key(n))
    (info,) = trident.cache_info(opt).values()
    # the only integer argument is n = x.numel(): i32 with and without 'D' (% 16 == 0)
    assert len(keys) == 2
    assert info["specializations"] == len(keys), info
    assert info["misses"] == len(keys) - 1
    assert info["hits"] == 100 - info["misses"]


def test_autotuned_kernel_with_a_meta_grid_over_several_sizes(device):
    x0 = torch.randn(300, device=device)
    opt = trident.optimize(trident.capture(K.tuned_scale, x0, dynamic=True))
    sizes = [300, 301, 300, 1024, 77, 301]
    for n in sizes:
        x = torch.randn(n, device=device)
        torch.testing.assert_close(opt(x), 3.0 * x)
    (info,) = trident.cache_info(opt).values()
    # the autotuner keys on n: each new n is tuned (pinned by a guard, as Triton re-tunes)
    assert info["specializations"] == len(set(sizes))
    text = trident.explain(opt)
    assert "autotune: tuned_scale_kernel was tuned for it" in text


def test_two_dimensional_strides_and_grids(device):
    x0 = torch.randn(40, 70, device=device)
    opt = trident.optimize(trident.capture(K.scale_rows, x0, dynamic=True))
    for rows, cols in [(40, 70), (3, 5), (129, 31), (16, 64)]:
        x = torch.randn(rows, cols, device=device)
        torch.testing.assert_close(opt(x), K.scale_rows_ref(x))
    # a transposed input: its strides are not the contiguous ones the trace tied to the sizes
    xt = torch.randn(70, 40, device=device).t()
    with pytest.raises(GuardError, match="stride"):
        opt(xt)


@triton.jit
def _rowsum_kernel(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(v, axis=0))


def reshaped_rowsum(x):
    rows = x.numel() // 16
    y = x.reshape(rows, 16) * 2.0  # an operator with a size argument computed from x
    out = torch.empty(rows, device=x.device, dtype=x.dtype)
    _rowsum_kernel[(rows,)](y, out, 16, BLOCK=16)
    return out + 1.0


def test_size_arguments_of_operators_and_factories(device):
    opt = trident.optimize(trident.capture(reshaped_rowsum, torch.randn(64, device=device), dynamic=True))
    for n in (64, 160, 32, 4096):
        x = torch.randn(n, device=device)
        torch.testing.assert_close(opt(x), (x.reshape(-1, 16) * 2.0).sum(1) + 1.0)
    (info,) = trident.cache_info(opt).values()
    assert info["specializations"] == 1, info  # no integer kernel argument depends on the size


def test_unservable_sizes_say_what_was_assumed(device):
    opt = trident.optimize(trident.capture(K.two_kernels, torch.randn(100, device=device),
                                           torch.randn(100, device=device), dynamic=True))
    with pytest.raises(GuardError, match=r"assuming s\d+ >= 2 \(s\d+ = x.shape\[0\] = 1\)"):
        opt(torch.randn(1, device=device), torch.randn(1, device=device))
    x = torch.randn(17, device=device)
    torch.testing.assert_close(opt(x, x.clone()), K.two_kernels_ref(x, x))


def broadcast_add(x, y):
    z = x + y  # the program ties the sizes: a guard
    return K.axpy(z, z)


def test_sizes_the_program_ties_are_guarded_and_others_are_free(device):
    # two inputs of one size in the example are two symbols (no duck sizing): y may differ
    opt = trident.optimize(trident.capture(K.two_kernels, torch.randn(100, device=device),
                                           torch.randn(100, device=device), dynamic=True))
    x, y = torch.randn(5, device=device), torch.randn(6, device=device)
    torch.testing.assert_close(opt(x, y), K.two_kernels_ref(x, y[:5]))  # as eager: n = x.numel()
    opt = trident.optimize(trident.capture(broadcast_add, torch.randn(100, device=device),
                                           torch.randn(100, device=device), dynamic=True))
    x, y = torch.randn(40, device=device), torch.randn(40, device=device)
    torch.testing.assert_close(opt(x, y), 3.5 * (x + y))
    with pytest.raises(GuardError, match=r"y"):
        opt(torch.randn(5, device=device), torch.randn(6, device=device))


def test_printed_plan_shows_the_expressions():
    opt = trident.optimize(trident.capture(K.two_kernels, torch.randn(1000), torch.randn(1000), dynamic=True))
    text = trident.scm_text(opt)
    assert "symbols: s" in text and "= x.shape[0]" in text
    assert "//64), 1, 1]" in text and "n=s" in text
    assert "size: Triton key of axpy_kernel(n)" in text
    explained = trident.explain(opt)
    assert "symbolic sizes:" in explained and "(range)" in explained


@pytest.mark.parametrize("bound", ["count", "bytes"])
def test_graphs_per_shape_least_recently_used_go_first(bound, device):
    """A symbolic region records one graph per shape (Note [Graph bound]); past TRIDENT_GRAPH_LIMIT
    live graphs (or TRIDENT_GRAPH_BYTES on CUDA, where graphs hold memory) the least recently
    used goes, and explain() says the bound was reached. On the CPU graphs are emulated."""
    from trident import knobs
    from trident.runtime.native import C

    if bound == "bytes" and device != "cuda":
        pytest.skip("emulated graphs hold no device memory")
    limits = dict(graph_limit="2") if bound == "count" else dict(graph_limit="16", graph_bytes="1")
    with knobs.scope(graphs="all", graph_min_saving_us="-inf", **limits):  # record even where it does not pay
        opt = trident.optimize(trident.capture(K.two_kernels, torch.randn(100, device=device),
                                               torch.randn(100, device=device), dynamic=True))
    (rid,) = opt.meta["trident_regions"]
    sizes = [100, 100, 100, 200, 200, 200, 100, 300, 300, 300, 100]
    for n in sizes:
        x, y = torch.randn(n, device=device), torch.randn(n, device=device)
        torch.testing.assert_close(opt(x, y), K.two_kernels_ref(x, y))
    st = C.graph_stats(rid)
    live = [g for g in st["graphs"] if not g["retired"]]
    if bound == "count":
        # graphs for 100, 200 (limit 2); 100 replays (most recent use), then 300 evicts 200
        assert len(st["graphs"]) == 3 and st["evicted"] == 1 and len(live) == 2
        assert [g["evicted"] for g in st["graphs"]] == [False, True, False]
    else:  # every graph holds more than 1 byte: only the newest stays
        assert len(live) == 1 and st["evicted"] == len(st["graphs"]) - 1
    assert "bound reached" in trident.explain(opt)


@triton.jit
def _normalize_rows_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + tl.program_id(0) * n + offs, mask=m, other=0.0)
    tl.store(out_ptr + tl.program_id(0) * n + offs, x / tl.sum(x, axis=0), mask=m)


def normalize_rows(x):
    rows, n = x.shape
    out = torch.empty_like(x)
    _normalize_rows_kernel[(rows,)](x, out, n, BLOCK=triton.next_power_of_2(n))  # a constexpr from a size
    return out


def test_a_constexpr_computed_from_a_size_is_guarded(device):
    """triton.next_power_of_2(n) on a symbolic n: the trace guards its value (bitwise ors, no
    native form); the graph's TracedShapes call guard checks it in Python, so a size that would
    need another BLOCK raises GuardError (never a wrong result) and trident.compile captures it
    statically instead."""
    opt = trident.optimize(trident.capture(normalize_rows, torch.rand(4, 100, device=device), dynamic=True))
    for shape in [(4, 100), (7, 100), (3, 120), (2, 65)]:  # BLOCK 128 serves n in 65..128
        x = torch.rand(*shape, device=device)
        torch.testing.assert_close(opt(x), x / x.sum(1, keepdim=True))
    with pytest.raises(GuardError, match=r"s\d+ = x.shape\[1\] = 200"):
        opt(torch.rand(5, 200, device=device))
    compiled = trident.compile(normalize_rows)
    for shape in [(4, 100), (4, 100), (7, 100), (5, 200), (5, 200), (3, 64)]:
        x = torch.rand(*shape, device=device)
        torch.testing.assert_close(compiled(x), x / x.sum(1, keepdim=True))


def test_bad_inputs_to_a_symbolic_capture_are_named():
    opt = trident.optimize(trident.capture(K.two_kernels, torch.randn(100), torch.randn(100), dynamic=True))
    with pytest.raises(GuardError, match=r"input 'y' \(position 1\): expected rank 1 as traced, got rank 2"):
        opt(torch.randn(10), torch.randn(10, 2))
    with pytest.raises(GuardError, match=r"input 'x' \(position 0\): expected a Tensor, got int"):
        opt(3, torch.randn(10))
    with pytest.raises(GuardError, match=r"x.shape\[0\] = 0"):
        opt(torch.randn(0), torch.randn(0))
    x, y = torch.randn(10), torch.randn(10)  # and a good call after the refused ones
    torch.testing.assert_close(opt(x, y), K.two_kernels_ref(x, y))


def temporaries(x, y):
    """Four temporaries whose sizes follow x's (three of them live together) and one of fixed
    size: every one is a slice of the call's arena, placed per call (Note [Symbolic arena])."""
    a = K.axpy(x, y)
    b = K.axpy(a, x)
    wide = K.axpy(torch.cat([b, a]), torch.cat([a, b]))  # twice x's size
    c = K.axpy(b, a)
    fixed = K.axpy(torch.ones(40, device=x.device), torch.ones(40, device=x.device))
    return K.axpy(c, wide[: x.shape[0]]) + fixed.sum()


def test_temporaries_of_symbolic_sizes_share_one_arena(device):
    opt = trident.optimize(trident.capture(temporaries, torch.randn(1000, device=device),
                                           torch.randn(1000, device=device), dynamic=True))
    line = next(ln.strip() for ln in trident.explain(opt).splitlines() if ln.strip().startswith("arena:"))
    assert "placed per call for the sizes" in line and "1 fixed" in line, line
    text = trident.scm_text(opt)
    assert "sized per call, above arena[" in text, text
    # the grids' sym_numel(a), sym_numel(b), ... read outside the region do not make the
    # temporaries leave it (Note [Values leaving a region]): one result, six arena buffers
    assert re.match(r"scm region\d+\(x, y\) -> \(\w+\)$", text.splitlines()[0]), text.splitlines()[0]
    assert "arena: 6 of 6 allocation(s)" in line, line
    for n in [1000, 1001, 3000, 17, 1000, 64, 5000, 2]:  # growing and shrinking, through one plan
        x, y = torch.randn(n, device=device), torch.randn(n, device=device)
        torch.testing.assert_close(opt(x, y), temporaries(x, y))
    (info,) = trident.cache_info(opt).values()
    assert info["specializations"] <= 4, info  # Triton's keys of n (% 16, == 1), never per size


def last_rows(x):
    """Views whose offset depends on sizes (the last row, a narrowed middle) read by kernels,
    and a reshaped view an operator reads: native views with their layouts from the size program
    (Note [Symbolic views])."""
    last = x[-1]  # offset (rows - 1) * cols
    middle = x.narrow(0, 1, x.shape[0] - 2)
    flat = middle.reshape(-1)
    return K.axpy(last, x[0]), K.axpy(flat, flat) * 2.0, middle.t().sum(1)


def test_views_whose_layout_depends_on_sizes_are_native(device):
    opt = trident.optimize(trident.capture(last_rows, torch.randn(6, 32, device=device), dynamic=True))
    explained = trident.explain(opt)
    native_views = int(re.search(r"(\d+) native views", explained).group(1))
    assert native_views >= 3, explained
    assert re.search(r"select = native view: x \+ \(\d*\*?\(?s\d+", trident.scm_text(opt)) or \
        "native view: x + (" in trident.scm_text(opt), trident.scm_text(opt)
    for rows, cols in [(6, 32), (9, 32), (4, 100), (40, 7), (6, 32)]:
        x = torch.randn(rows, cols, device=device)
        for got, want in zip(opt(x), last_rows(x)):
            torch.testing.assert_close(got, want)
        if device == "cpu":  # (on CUDA a graph may replay: no services run)
            # built natively at these sizes: the host read the layouts rt_view expected (a
            # mismatch would fall back to the operators, counted under their own names)
            with trident.profile() as prof:
                opt(x)
            counted = {r.name: r.calls for r in prof.rows}
            assert counted.get("native view") == 3, counted
            assert not [n for n in counted if n.startswith(("aten::select", "aten::slice", "aten::t"))], counted
    # a base not laid out as planned (a transposed input is refused by the guards before that)
    with pytest.raises(GuardError, match="stride"):
        opt(torch.randn(32, 6, device=device).t())


def doubled_with_its_size(x, y):
    a = K.axpy(x, y)
    b = torch.cat([a, a])
    return K.axpy(b, b), b.shape[0]  # b's size is also returned: read from the region's result


def test_a_size_of_a_region_value_read_outside_it(device):
    """Note [Values leaving a region]: a size only the region reads is computed from its inputs
    (the value stays a temporary); one the caller also gets keeps reading the region's result."""
    opt = trident.optimize(trident.capture(doubled_with_its_size, torch.randn(100, device=device),
                                           torch.randn(100, device=device), dynamic=True))
    for n in (100, 37, 256):
        x, y = torch.randn(n, device=device), torch.randn(n, device=device)
        out, size = opt(x, y)
        want, want_size = doubled_with_its_size(x, y)
        torch.testing.assert_close(out, want)
        assert size == want_size == 2 * n


def test_kernels_read_views_at_size_dependent_offsets_of_misaligned_inputs(device):
    """The alignment guard of a view at an offset computed from sizes counts the input's own
    address % 16: inputs 0-3 elements off a 16-byte boundary, many shapes, all served correctly."""
    opt = trident.optimize(trident.capture(last_rows, torch.randn(6, 32, device=device), dynamic=True))
    for shift in range(4):
        for rows, cols in [(4, 8), (5, 12), (7, 32), (9, 5)]:
            base = torch.randn(rows * cols + 8, device=device)
            start = (shift - base.data_ptr() // 4) % 4
            x = base[start:start + rows * cols].view(rows, cols)
            for got, want in zip(opt(x), last_rows(x)):
                torch.testing.assert_close(got, want)


def test_a_view_with_an_offset_as_the_example_serves_other_alignments():
    """A symbolic capture whose example input is a view at a storage offset (its offset a symbol
    of its own): later calls at other offsets -- other alignments, so new specializations --
    are served (the offset symbol cancels in the layouts' relative offsets; it raised KeyError)."""
    from tests import kernels as K

    base = torch.randn(1000)
    x0, y0 = base[3:503], torch.randn(500)
    opt = trident.optimize(trident.capture(K.axpy, x0, y0, dynamic=True))
    torch.testing.assert_close(opt(x0, y0), K.axpy_ref(x0, y0))
    for off in (0, 1, 4, 5, 3):
        x, y = base[off:off + 400], torch.randn(400)
        torch.testing.assert_close(opt(x, y), K.axpy_ref(x, y))
