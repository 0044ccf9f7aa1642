"""trident/passes/fuse_glue.py (Note [Fused glue]): groups of ATen glue between launches become
Inductor-generated Triton kernels, launched like user kernels; on the CPU through Triton's
interpreter (TRIDENT_FUSE_GLUE=all). Each fused program is compared with eager on the same
inputs, over random chains, shapes and dtypes; and the cases where moving a group would change
what it reads or what aliases what are left as they were."""

from __future__ import annotations

import logging
import random

import expecttest
import pytest
import torch
import torch.nn.functional as F

import trident
from tests import kernels as K
from tests.conftest import normalize
from trident import knobs
from trident.passes import inductor_glue
from trident.passes.fuse_glue import fuse_glue
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

aten = torch.ops.aten
_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device machine)")


def _launches(gm):
    """Names of the kernels the regions of an optimized module launch, in order."""
    from trident.runtime import SCMRuntime

    return [s.kernel_name for rid in gm.meta["trident_regions"] for s in SCMRuntime.get(rid).program.launches]


def _rms(x, y, w):
    """A launch, then an RMSNorm in ATen (cast, pow, mean, add, rsqrt, mul, mul), then a launch."""
    a = K.axpy(x, y)
    h = a.view(4, 64).float()
    v = h.pow(2).mean(-1, keepdim=True)
    n = (w * (h * torch.rsqrt(v + 1e-6))).reshape(-1)
    return K.axpy(n, x), n


def _args(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype) for s in ((256,), (256,), (64,))]


def test_rmsnorm_between_launches_is_one_generated_kernel_equal_to_eager():
    args = _args()
    want = _rms(*args)
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(_rms, *args))
    names = _launches(opt)
    assert names[0] == names[-1] == "axpy_kernel" and len(names) == 3, names
    assert names[1].startswith("triton_") and "fused" in names[1], names
    text = trident.explain(opt)
    assert "fused glue: 1 group(s) of ATen ops as Inductor-generated kernels:" in text, text
    assert "6 ops (add, mean, mul, pow, rsqrt) at " in text and f"-> 1 kernel(s) {names[1]}" in text
    for got, ref in zip(opt(*args), want):
        torch.testing.assert_close(got, ref)
    other = _args(seed=1)  # a later call with other values: the same kernels, eager's results
    for got, ref in zip(opt(*other), _rms(*other)):
        torch.testing.assert_close(got, ref)


def _rope(x, y, cos, sin):
    """HF's rotary embedding between two launches: `q * cos` and `rotate_half(q) * sin` start
    from views of a launch's output (no group) and meet at their add."""
    q = K.axpy(x, y).view(1, 4, 1, 64)
    rot = torch.cat((-q[..., 32:], q[..., :32]), -1)
    out = q * cos + rot * sin
    return K.axpy(out.reshape(-1), x), out


def _rope_args(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(256, generator=g), torch.randn(256, generator=g), torch.randn(1, 1, 1, 64, generator=g),
            torch.randn(1, 1, 1, 64, generator=g)]


def test_chains_that_meet_become_one_kernel_equal_to_eager():
    """Note [Groups joined where they meet]: the two chains of a rotary embedding, started apart
    and met at their add, are one group and one generated kernel (they were two), eager's values
    for the capture's inputs and fresh ones."""
    args = _rope_args()
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(_rope, *args))
    names = _launches(opt)
    assert len(names) == 3 and names[0] == names[-1] == "axpy_kernel", names
    assert "5 ops (add, cat, mul, neg) at " in trident.explain(opt), trident.explain(opt)
    for a in (args, _rope_args(seed=1)):
        for got, ref in zip(opt(*a), _rope(*a)):
            torch.testing.assert_close(got, ref)


def _met_through_a_broadcast(x, y, pos):
    """Two groups (positions: one element; key indices: 64) that meet at a compare broadcasting
    the first over the second, as HF's causal mask does."""
    a = K.axpy(x, y)
    p = (pos + 1).view(1, 1)  # group 1 (with the view)
    k = (a[:64] * 2 + 1).view(1, 64)  # group 2
    mask = k <= p
    return K.axpy(x, y), mask, p * 3 - 1


def test_groups_met_through_a_broadcast_stay_apart():
    """Groups a node reads over different iteration spaces are not merged (Inductor would make as
    many kernels of the merged group, or more); the program equals eager."""
    from trident.passes import fuse_glue as FG

    g = torch.Generator().manual_seed(0)
    args = [torch.randn(256, generator=g), torch.randn(256, generator=g), torch.tensor([5.0])]
    gm = trident.capture(_met_through_a_broadcast, *args)
    groups = FG._groups(gm, "all")
    computing = [[n.target for n in grp if n.target not in FG._VIEWS] for grp in groups]
    assert aten.le.Tensor not in [op for grp in computing for op in grp if len(grp) == 1], computing
    assert not any(aten.le.Tensor in grp and aten.mul.Tensor in grp and len(grp) > 3 for grp in computing), computing
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(gm)
    for got, ref in zip(opt(*args), _met_through_a_broadcast(*args)):
        torch.testing.assert_close(got, ref)


def _met_around_a_product(x, y, w):
    """Group 1's value goes through a matrix product (no glue, no write) into group 2, and a node
    reads both; a later node reads group 2's value and the product."""
    a = K.axpy(x, y).view(4, 64)
    g1 = torch.sigmoid(a) * 2  # group 1
    m = g1 @ w  # outside both
    g2 = torch.tanh(m) + 1  # group 2
    out = g1 * g2  # reads both over one iteration space: joins group 2
    last = out * 3 + m  # reads group 2 and the product (which depends on group 1 only)
    return K.axpy(last.reshape(-1), x), last


def test_groups_a_path_leaves_are_not_merged():
    """Note [Groups joined where they meet]: where a path from one group to the other passes
    through an outside node (here a product), they are not merged -- merged, the product would
    depend on the merged group, and a later node reading the product could no longer join it
    (`_trim` then splits the merged group at the product, and the later node stays apart). The
    program equals eager."""
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(256, generator=g), torch.randn(256, generator=g), torch.randn(64, 64, generator=g)]
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(_met_around_a_product, *args))
    names = _launches(opt)
    assert len(names) == 4 and names[0] == names[-1] == "axpy_kernel", names
    text = trident.explain(opt)
    assert "2 ops (mul, sigmoid) at " in text and "5 ops (add, mul, tanh) at " in text, text
    for got, ref in zip(opt(*args), _met_around_a_product(*args)):
        torch.testing.assert_close(got, ref)


def _met_beside_a_product(x, y, w):
    """A node reads group 1, group 2 and a product of group 2's value (outside both)."""
    a = K.axpy(x, y).view(4, 64)
    g1 = torch.sigmoid(a) * 2  # group 1
    g2 = torch.tanh(a) + 1  # group 2
    out = torch.addcmul(g1, g2, g2 @ w)  # joins group 1; group 2 reaches it through the product too
    return K.axpy(out.reshape(-1), x), out


def test_groups_the_joining_node_reaches_through_an_outside_node_are_not_merged():
    """Note [Groups joined where they meet]: the node's own outside inputs count -- group 2 feeds
    it through a product too, so group 2 stays apart and group 1 stays whole."""
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(256, generator=g), torch.randn(256, generator=g), torch.randn(64, 64, generator=g)]
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(_met_beside_a_product, *args))
    text = trident.explain(opt)
    assert "3 ops (addcmul, mul, sigmoid) at " in text and "2 ops (add, tanh) at " in text, text
    for got, ref in zip(opt(*args), _met_beside_a_product(*args)):
        torch.testing.assert_close(got, ref)


def test_off_by_default_and_off_leaves_the_glue():
    args = _args()
    opt = trident.optimize(trident.capture(_rms, *args))
    assert _launches(opt) == ["axpy_kernel", "axpy_kernel"]
    with knobs.scope(fuse_glue=""):
        assert _launches(trident.optimize(trident.capture(_rms, *args))) == ["axpy_kernel", "axpy_kernel"]


def test_cuda_mode_leaves_cpu_tensors():
    args = _args()
    with knobs.scope(fuse_glue="cuda"):
        assert _launches(trident.optimize(trident.capture(_rms, *args))) == ["axpy_kernel", "axpy_kernel"]


# One step of a random glue chain: (name, fn(value, other) -> value). `other` has the value's
# shape or broadcasts over its rows.
_STEPS = [
    ("add", lambda v, o: v + o),
    ("mul", lambda v, o: v * o),
    ("sub_scalar", lambda v, o: v - 0.5),
    ("sigmoid", lambda v, o: torch.sigmoid(v)),
    ("silu_mul", lambda v, o: F.silu(v) * o),
    ("tanh", lambda v, o: torch.tanh(v)),
    ("neg_abs", lambda v, o: -v.abs()),
    ("exp_clamped", lambda v, o: torch.exp(v.clamp(-4, 4))),
    ("rsqrt", lambda v, o: torch.rsqrt(v.abs() + 1.0)),
    ("to_fp32_and_back", lambda v, o: (v.float() * 1.5).to(v.dtype)),
    ("mean_keepdim", lambda v, o: v - v.mean(-1, keepdim=True)),
    ("sum_keepdim", lambda v, o: v / (v.abs().sum(-1, keepdim=True) + 1.0)),
    ("amax_keepdim", lambda v, o: v - v.amax(-1, keepdim=True)),
    ("softmax", lambda v, o: torch.softmax(v.float(), -1).to(v.dtype)),
    ("where", lambda v, o: torch.where(v > 0, v, o)),
    ("rotate_half", lambda v, o: torch.cat((-v[..., v.shape[-1] // 2:], v[..., : v.shape[-1] // 2]), -1)
     if v.shape[-1] % 2 == 0 else v * 2),
    ("transpose_back", lambda v, o: (v.t() * 2).t()),
]


def _chain(steps, rows, cols):
    def fn(x, y, other):
        v = K.axpy(x, y).view(rows, cols)  # a launch before the glue
        for _, step in steps:
            v = step(v, other)
        out = v.contiguous().view(-1)
        return K.axpy(out, out), v  # a launch after it, and the glue's own result

    return fn


def test_random_chains_equal_eager():
    """Random chains of 2-5 glue steps over random shapes, fp32 and fp16, between two launches:
    the fused program equals eager (fp16: within its rounding), for the capture's inputs and
    fresh ones; most chains are fused into fewer kernels than the ops they replace."""
    rng = random.Random(0)
    fused_chains = 0
    trials = 14
    for trial in range(trials):
        dtype = torch.float32 if trial % 3 else torch.float16
        rows, cols = rng.choice([1, 2, 3, 5]), rng.choice([1, 7, 16, 33, 64, 130])
        steps = [rng.choice(_STEPS) for _ in range(rng.randint(2, 5))]
        fn = _chain(steps, rows, cols)
        g = torch.Generator().manual_seed(trial)
        n = rows * cols
        other = torch.randn((rows, cols) if trial % 2 else (cols,), generator=g).to(dtype)
        args = [torch.randn(n, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype), other]
        with knobs.scope(fuse_glue="all"):
            opt = trident.optimize(trident.capture(fn, *[a.clone() for a in args]))
        names = _launches(opt)
        fused_chains += any(name.startswith("triton_") for name in names)
        tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.float16 else dict(rtol=1e-5, atol=1e-5)
        for call_args in (args, [a.neg() for a in args]):
            for got, ref in zip(opt(*call_args), fn(*call_args)):
                torch.testing.assert_close(got, ref, **tol, msg=lambda m: f"{[s[0] for s in steps]} "
                                           f"{rows}x{cols} {dtype}: {m}")
    assert fused_chains >= trials // 2, fused_chains


def test_an_in_place_write_between_glue_ops_is_not_crossed():
    """x is read by glue before and after an in-place write to it: the reads stay on their side."""

    def fn(x, y):
        a = K.axpy(x, y)
        b = (a * 2).sigmoid()
        a.mul_(3)  # a write: the glue after it reads the new a
        c = (a + b).exp()
        return K.axpy(c, c)

    args = _args()[:2]
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(fn, *args))
    torch.testing.assert_close(opt(*args), fn(*args))


def test_a_reader_of_a_glue_value_midway_keeps_its_input():
    """A matrix product (not glue, writes nothing) reads a value of the glue group before the
    group's last op: the group stops before that reader (or it would read a value not yet
    computed), and the glue after it is fused on its own."""

    def fn(x, y):
        a = K.axpy(x, y)
        h = (a * 2).tanh()
        m = h.view(16, 16) @ h.view(16, 16)  # reads h
        g = ((h + 1).sigmoid() * 3).exp()  # glue that depends on h only: same group, after the reader
        return m, g

    args = _args()[:2]
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(fn, *args))
    assert sum(name.startswith("triton_") for name in _launches(opt)) == 2, _launches(opt)
    for got, ref in zip(opt(*args), fn(*args)):
        torch.testing.assert_close(got, ref)


def test_aliased_outputs_stay_aliased():
    """The glue returns h and a view of h; a launch then writes through the view in place: the
    write shows in h, as in eager."""

    def fn(x, y):
        a = K.axpy(x, y)
        h = (a * 2).sigmoid() + 1
        v = h.view(16, 16)
        K.inplace_mul(v.view(-1))
        return h, v

    args = _args()[:2]
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(fn, *args))
    h, v = opt(*args)
    want_h, want_v = fn(*args)
    torch.testing.assert_close(h, want_h)
    torch.testing.assert_close(v, want_v)


def test_a_group_inductor_cannot_lower_is_left_as_it_was(monkeypatch, caplog):
    def fail(sub, inputs):
        raise inductor_glue.GlueLoweringError("no lowering for this op")

    monkeypatch.setattr("trident.passes.fuse_glue.lower", fail)
    args = _args()
    with knobs.scope(fuse_glue="all"), caplog.at_level(logging.DEBUG, logger="trident.lowering"):
        opt = trident.optimize(trident.capture(_rms, *args))
    assert _launches(opt) == ["axpy_kernel", "axpy_kernel"]
    assert "left unfused" in caplog.text and "no lowering for this op" in caplog.text
    for got, ref in zip(opt(*args), _rms(*args)):
        torch.testing.assert_close(got, ref)


def test_equal_groups_are_lowered_once(monkeypatch):
    """Layers with the same glue (same ops, same layouts) share one lowering."""
    calls = []
    real = inductor_glue._lower
    monkeypatch.setattr(inductor_glue, "_lower", lambda *a: calls.append(1) or real(*a))
    inductor_glue.clear_cache()

    def two_layers(x, y, w):
        a, _ = _rms(x, y, w)
        b, _ = _rms(a, y, w)
        return b

    args = _args()
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(two_layers, *args))
    assert sum(name.startswith("triton_") for name in _launches(opt)) == 2
    assert len(calls) == 1
    torch.testing.assert_close(opt(*args), two_layers(*args))


def test_lowering_leaves_no_cuda_patch_behind():
    """On a machine without CUDA the lowering answers for an sm_90 device only while it runs."""
    from torch._inductor.runtime.hints import DeviceProperties

    def state():  # as stored: a classmethod must come back as the classmethod object itself
        return (vars(DeviceProperties)["create"], torch.cuda.get_device_capability,
                hasattr(torch._C, "_cuda_getCurrentRawStream"))

    before = state()
    inductor_glue.clear_cache()
    with knobs.scope(fuse_glue="all"):
        trident.optimize(trident.capture(_rms, *_args()))
    after = state()
    assert all(a is b for a, b in zip(before, after)), (before, after)
    assert isinstance(vars(DeviceProperties)["create"], classmethod)


@pytest.mark.parametrize("case", ["dead", "offset_slice", "select", "expand", "cat_of_reductions"])
def test_groups_that_end_in_views_or_feed_nothing(case):
    """A group nothing reads (capture keeps dead code), results that are an offset slice, a
    select or an expand of the fused value (they stay ATen views of it), and a cat of reductions
    (Inductor writes each piece through a strided view, which regions cannot import: left as it
    was): each optimizes and equals eager (review of the pass, 2026-12-03)."""

    def fn(x, y):
        a = K.axpy(x, y)
        h = (a.view(16, 16) * 2).sigmoid()
        if case == "dead":
            (a * 3).exp().tanh()  # read by nothing
            return K.axpy(a, a)
        if case == "offset_slice":
            return h[2:, 3:]
        if case == "select":
            return (h + 1).exp()[3]
        if case == "expand":
            return (h.sum(-1, keepdim=True) * 2).expand(16, 4)
        return torch.cat([h.sum(-1), h.amax(-1), (h * 2).mean(-1)])

    args = _args()[:2]
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(fn, *args))
    got, want = opt(*args), fn(*args)
    torch.testing.assert_close(got, want)
    assert (got.shape, got.stride()) == (want.shape, want.stride())


class TestFusedGraph(expecttest.TestCase):
    def test_the_pass_output_reads_as_launches(self):
        """The graph after the pass (before regions are outlined): the glue became one launch of
        Inductor's kernel writing a new buffer; the user's launches are as they were."""
        args = _args()
        gm = trident.capture(_rms, *args)
        with knobs.scope(fuse_glue="all"):
            assert fuse_glue(gm) == 1
        (kernel,) = [kernel_side_table.get_kernel(n.kwargs["kernel_idx"]) for n in gm.graph.nodes
                     if n.op == "call_function" and "in_ptr0" in n.kwargs.get("kwargs", {})]
        assert kernel.__name__.startswith("triton_per_fused")
        self.assertExpectedInline(normalize(gm.code.strip()), """\
def forward(self, x, y, w):
    empty_like = torch.ops.aten.empty_like.default(x, pin_memory = False)
    triton_kernel_wrapper_mutation_proxy = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(2, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'x_ptr': x, 'y_ptr': y, 'out_ptr': empty_like, 'n': 256, 'alpha': 2.5, 'BLOCK': 128});  y = triton_kernel_wrapper_mutation_proxy = None
    view = torch.ops.aten.view.default(empty_like, [4, 64]);  empty_like = None
    empty_strided_default = torch.ops.aten.empty_strided.default([4, 64], [64, 1], dtype = torch.float32, device = device(type='cpu'))
    triton_kernel_wrapper_mutation = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(4, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'in_ptr0': view, 'in_ptr1': w, 'out_ptr1': empty_strided_default, 'xnumel': 4, 'r0_numel': 64, 'XBLOCK': 1, 'num_warps': 2, 'num_stages': 1});  view = w = triton_kernel_wrapper_mutation = None
    view_1 = torch.ops.aten.view.default(empty_strided_default, [-1]);  empty_strided_default = None
    empty_like_1 = torch.ops.aten.empty_like.default(view_1, pin_memory = False)
    triton_kernel_wrapper_mutation_proxy_1 = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(2, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'x_ptr': view_1, 'y_ptr': x, 'out_ptr': empty_like_1, 'n': 256, 'alpha': 2.5, 'BLOCK': 128});  x = triton_kernel_wrapper_mutation_proxy_1 = None
    return (empty_like_1, view_1)""")


def test_threads_optimizing_at_once_leave_fx_and_inductor_state_intact():
    """Inductor's lowering and make_fx keep process-global state (FX's patcher and tracing flag,
    V.graph): optimizations in several threads at once, with captures in between, each get
    their kernels, and tracing works afterwards (it failed with 'CURRENT_PATCHER is None' and
    'FX ... dynamo-optimized function' when the lowering did not hold Trident's lock)."""
    import threading

    inductor_glue.clear_cache()
    errors, results = [], []

    def work(seed):
        try:
            args = _args(seed=seed)
            for _ in range(2):
                opt = trident.optimize(trident.capture(_rms, *args))
                for got, ref in zip(opt(*args), _rms(*args)):
                    torch.testing.assert_close(got, ref)
                results.append(_launches(opt))
                inductor_glue.clear_cache()  # every optimization lowers again
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    with knobs.scope(fuse_glue="all"):  # one scope around the threads: scopes set the process's environment
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert knobs.fuse_glue() == "cuda"  # the default, back after the scope
    assert not errors, errors
    assert len(results) == 8 and all(len(r) == 3 for r in results), results
    from torch.fx._symbolic_trace import CURRENT_PATCHER, is_fx_symbolic_tracing

    assert CURRENT_PATCHER is None and not is_fx_symbolic_tracing()
    torch.testing.assert_close(torch.compile(lambda x: x * 2, backend="eager")(torch.ones(3)), torch.full((3,), 2.0))


@_CUDA
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_glue_replays_on_cuda(dtype):
    """On the GPU (TRIDENT_FUSE_GLUE=cuda, graph replay on): the RMSNorm and random chains
    between launches run as Inductor's kernels compiled for the device, every call equal to
    eager (bf16: within its rounding), and the region's graph replays them."""
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    args = [a.to("cuda", dtype) for a in _args()]
    with knobs.scope(fuse_glue="cuda", graph_min_saving_us="-inf"):  # a graph however small the saving
        opt = trident.optimize(trident.capture(_rms, *args))
        assert sum(n.startswith("triton_") for n in _launches(opt)) == 1, _launches(opt)
        for seed in range(4):  # recorded after two ordinary calls
            fresh = [a.to("cuda", dtype) for a in _args(seed=seed)]
            for got, ref in zip(opt(*fresh), _rms(*fresh)):
                torch.testing.assert_close(got, ref, **tol)
    info = trident.cache_info(opt)
    assert sum(v.get("graph_replays", 0) for v in info.values()) >= 1, info
    rng = random.Random(1)
    for trial in range(6):
        rows, cols = rng.choice([1, 4]), rng.choice([64, 130, 2048])
        steps = [rng.choice(_STEPS) for _ in range(rng.randint(2, 4))]
        fn = _chain(steps, rows, cols)
        g = torch.Generator().manual_seed(trial)
        n = rows * cols
        call = [torch.randn(n, generator=g), torch.randn(n, generator=g), torch.randn(cols, generator=g)]
        call = [a.to("cuda", dtype) for a in call]
        with knobs.scope(fuse_glue="cuda"):
            opt = trident.optimize(trident.capture(fn, *[a.clone() for a in call]))
        for _ in range(2):
            for got, ref in zip(opt(*call), fn(*call)):
                torch.testing.assert_close(got, ref, **tol, msg=lambda m: f"{[s[0] for s in steps]}: {m}")


def test_lowerings_are_kept_in_the_cache_dir_and_restored_without_inductor(tmp_path, monkeypatch):
    """Note [Lowerings on disk]: with TRIDENT_CACHE_DIR a later process (here: the process's
    memos cleared) restores the group's kernels from the entry without lowering again, and the
    result is the same; an entry that does not read back (its module damaged) is lowered anew."""
    import json
    import pathlib

    args = _args()
    with knobs.scope(cache_dir=str(tmp_path), fuse_glue="all"):
        inductor_glue.clear_cache()
        first = trident.optimize(trident.capture(_rms, *args))
        (entry,) = pathlib.Path(tmp_path, "inductor-glue").rglob("*.json")

        def kernel_modules():  # a kernel's stable key hashes its module (Note [Stable keys])
            return [n.meta["glue_kernel"].fn.__module__ for lowered in inductor_glue._CACHE.values()
                    for n in lowered.graph.nodes if "glue_kernel" in n.meta]

        fresh = kernel_modules()
        inductor_glue.clear_cache()
        inductor_glue._MODULES.clear()
        real = inductor_glue._lower

        def refuse(*a):
            raise AssertionError("lowered again")

        monkeypatch.setattr(inductor_glue, "_lower", refuse)
        again = trident.optimize(trident.capture(_rms, *args))
        assert _launches(again) == _launches(first)
        assert kernel_modules() == fresh  # the plans a cold process wrote are found by the warm one
        for got, ref in zip(again(*args), _rms(*args)):
            torch.testing.assert_close(got, ref)
        data = json.loads(entry.read_text())
        for digest in data["value"]["modules"]:
            data["value"]["modules"][digest] = "raise ImportError('damaged')\n"
        entry.write_text(json.dumps(data))
        inductor_glue.clear_cache()
        inductor_glue._MODULES.clear()
        calls = []
        monkeypatch.setattr(inductor_glue, "_lower", lambda *a: calls.append(1) or real(*a))
        third = trident.optimize(trident.capture(_rms, *args))
        assert calls and _launches(third) == _launches(first)
        for got, ref in zip(third(*args), _rms(*args)):
            torch.testing.assert_close(got, ref)


def _rotary(x, y, inv_freq, pos, batched=True):
    """A launch, a rotary embedding's angles as HF computes them (an outer product of the inverse
    frequencies and the positions, then cat, cos, sin, scaled), a launch."""
    a = K.axpy(x, y)
    if batched:  # [1, D/2, 1] @ [1, 1, L]: aten.bmm
        freqs = (inv_freq[None, :, None].float() @ pos[:, None, :].float()).transpose(1, 2)
    else:  # [L, 1] @ [1, D/2]: aten.mm
        freqs = (pos[0][:, None].float() @ inv_freq[None, :].float())[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * 0.5, emb.sin() * 0.5
    return K.axpy(a, a), emb, cos, sin


@pytest.mark.parametrize("batched", [True, False], ids=["bmm", "mm"])
def test_an_outer_product_is_glue_bit_for_bit(batched):
    """Note [Outer products are glue]: a product with inner size 1 becomes aten.mul and fuses with
    the glue around it: no product is left, the angles are one generated kernel between the two
    launches; the angles are eager's bit for bit (their cos and sin, Triton's, within fp32 rounding),
    with positions the capture never saw."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(256, generator=g), torch.randn(256, generator=g)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32))
    pos = torch.tensor([[7, 8, 9]])
    args = (x, y, inv_freq, pos, batched)
    with knobs.scope(fuse_glue="all"):
        gm = trident.capture(_rotary, *args)
        assert fuse_glue(gm) >= 1
        assert not [n for n in gm.graph.nodes if n.target in (aten.mm.default, aten.bmm.default)]
        opt = trident.optimize(trident.capture(_rotary, *args))
    names = _launches(opt)
    assert names[0] == names[-1] == "axpy_kernel" and len(names) == 3, names
    for p in (pos, torch.tensor([[100, 2000, 30000]])):
        got, want = opt(x, y, inv_freq, p, batched), _rotary(x, y, inv_freq, p, batched)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for g_, w_ in zip(got[2:], want[2:]):
            torch.testing.assert_close(g_, w_, rtol=1e-5, atol=1e-5)


def _products_left(fn, args, **scope) -> list:
    with knobs.scope(**{"fuse_glue": "all", **scope}):
        gm = trident.capture(fn, *args)
        fuse_glue(gm)
    return [n for n in gm.graph.nodes if n.target in (aten.mm.default, aten.bmm.default)]


@pytest.mark.parametrize("setting", ["global", "cpu", "legacy"])
def test_an_fp32_outer_product_with_rounded_inputs_stays_a_product(setting):
    """Where torch rounds fp32 products' inputs (TF32, bf16) the product is no multiply of the values
    and stays: set through torch's per-backend settings or the legacy global one, read without the
    error torch raises on a mix of the two; a setting for CUDA alone leaves the CPU's products alone."""
    g = torch.Generator().manual_seed(0)
    args = (torch.randn(256, generator=g), torch.randn(256, generator=g),
            1.0 / (10000 ** (torch.arange(0, 32, 2).float() / 32)), torch.tensor([[7, 8, 9]]), True)
    names = ("fp32_precision", "cuda.matmul.fp32_precision", "mkldnn.matmul.fp32_precision")

    def backend(name):
        obj = torch.backends
        for part in name.split(".")[:-1]:
            obj = getattr(obj, part)
        return obj

    saved = [getattr(backend(n), n.split(".")[-1]) for n in names]
    legacy, tf32 = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32
    try:
        if setting == "global":
            torch.backends.fp32_precision = "tf32"
        elif setting == "cpu":
            torch.backends.cuda.matmul.fp32_precision = "tf32"  # the CPU's products are unaffected
            assert not _products_left(_rotary, args)
            torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        else:
            torch.set_float32_matmul_precision("high")
        assert _products_left(_rotary, args)
        assert not _products_left(_typed_outer(torch.bfloat16), args[:2])  # no fp32 product: no rounding of it
    finally:  # the legacy setter first: new settings over legacy ones leave a mix torch's getters refuse
        torch.set_float32_matmul_precision(legacy)
        for n, v in zip(names, saved):
            setattr(backend(n), n.split(".")[-1], v)
    assert torch.get_float32_matmul_precision() == legacy and torch.backends.cuda.matmul.allow_tf32 == tf32


def _typed_outer(dtype):
    def outer(a, b):
        return K.axpy(a, a)[:, None].to(dtype) @ b[None, :].to(dtype)

    return outer


def test_outer_products_of_other_kinds_stay():
    """Integer products stay (eager has none on CUDA: a multiply would run what eager refuses), and
    so do products of tensors on a device the mode leaves (TRIDENT_FUSE_GLUE 'cuda': CPU tensors);
    fp16 and bf16 ones become multiplies."""
    a, b = torch.randn(8), torch.randn(5)
    assert _products_left(_typed_outer(torch.float32), (a, b), fuse_glue="cuda")
    assert _products_left(_typed_outer(torch.int64), (a, b))
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert not _products_left(_typed_outer(dtype), (a, b))


def test_an_outer_product_differs_only_in_the_sign_of_a_zero():
    """Note [Outer products are glue]: equal values, including infinities and NaNs; a GEMM adds onto
    +0.0, so where the multiply gives -0.0 the product gives +0.0."""
    def outer(a, b):
        return K.axpy(a, a)[:, None] @ b[None, :]

    a = torch.tensor([0.0, -0.0, 1.5, -2.0, float("inf"), float("nan"), 3e-39])
    b = torch.tensor([0.0, -1.0, 2.0, float("-inf"), 1e-3])
    with knobs.scope(fuse_glue="all"):
        opt = trident.optimize(trident.capture(outer, a, b))
    got, want = opt(a, b), outer(a, b)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    differ = got.view(torch.int32) != want.view(torch.int32)
    assert (got[differ] == 0).all() and (want[differ] == 0).all()


def test_an_outer_product_alone_is_rewritten_and_the_module_runs_it():
    """A product with inner size 1 and no glue to fuse with: the pass alone (outside optimize's one
    recompile) still leaves a module whose code runs the multiply, equal to the product."""
    def outer(a, b):
        return K.axpy(a, a)[:, None] @ b[None, :]

    a, b = torch.randn(8), torch.randn(5)
    with knobs.scope(fuse_glue="all"):
        gm = trident.capture(outer, a, b)
        assert fuse_glue(gm) == 0
    assert "aten.mul.Tensor" in gm.code and "aten.mm" not in gm.code
    assert torch.equal(gm(a, b), outer(a, b))
