"""Note [CSE under mutation]: repeated pure operator calls are computed once, never across a
write to what they read, never when their result is written, never for allocations or random
ops; optimized results stay eager's."""

from __future__ import annotations

import functools
import operator

import expecttest
import torch
import triton

import trident
from tests import kernels as K
from tests.conftest import normalize
from tests.decode_model import Config, check_steps_against_reference, decode_step, make_caches, make_weights
from trident.optimize import _regions
from trident.passes import eliminate_common_subexpressions

aten = torch.ops.aten


class _Triton:
    """The kernels a test function launches; _Eager is the same math in plain PyTorch."""

    axpy = staticmethod(K.axpy)

    @staticmethod
    def mul3_(t):
        K.inplace_mul_kernel[(triton.cdiv(t.numel(), 128),)](t, t.numel(), 3.0, BLOCK=128)


class _Eager:
    axpy = staticmethod(K.axpy_ref)

    @staticmethod
    def mul3_(t):
        t.mul_(3.0)


def _capture(fn, *example):
    """Capture fn(*example, k=_Triton)."""
    return trident.capture(lambda *args: fn(*args, k=_Triton), *[e.clone() for e in example])


def _cse(fn, *example):
    """(captured graph after the pass, nodes removed)."""
    gm = _capture(fn, *example)
    removed = eliminate_common_subexpressions(gm)
    gm.recompile()
    return gm, removed


def _count(gm, target) -> int:
    return sum(n.target is target for n in gm.graph.nodes)


def _check_against_eager(fn, *example, runs=2):
    """The optimized graph gives eager's results and leaves the inputs as eager leaves them."""
    opt = trident.optimize(_capture(fn, *example))
    for _ in range(runs):
        inputs = [torch.randn_like(e) for e in example]
        ref_inputs = [i.clone() for i in inputs]
        got, want = opt(*inputs), fn(*ref_inputs, k=_Eager)
        torch.testing.assert_close(got, want)
        for a, b in zip(inputs, ref_inputs):
            torch.testing.assert_close(a, b)
    return opt


def _xy():
    return torch.randn(1000), torch.randn(1000)


class TestCSEGoldens(expecttest.TestCase):
    def test_pure_duplicates_are_merged(self):
        def fn(x, y, k=_Triton):
            a = x.sin() * 2
            b = x.sin() * 2
            return k.axpy(a, b)

        gm, removed = _cse(fn, *_xy())
        self.assertEqual(removed, 2)
        self.assertExpectedInline(normalize(gm.code.strip()), """\
def forward(self, args_0, args_1):
    sin = torch.ops.aten.sin.default(args_0);  args_0 = None
    mul = torch.ops.aten.mul.Tensor(sin, 2);  sin = None
    empty_like = torch.ops.aten.empty_like.default(mul, pin_memory = False)
    triton_kernel_wrapper_mutation_proxy = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(8, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'x_ptr': mul, 'y_ptr': mul, 'out_ptr': empty_like, 'n': 1000, 'alpha': 2.5, 'BLOCK': 128});  mul = triton_kernel_wrapper_mutation_proxy = None
    return empty_like""")
        opt = _check_against_eager(fn, *_xy())
        assert "common subexpressions removed: 2 node(s)" in trident.explain(opt)

    def test_not_merged_across_an_inplace_write_to_the_input(self):
        def fn(x, y, k=_Triton):
            a = x.sin()
            x.add_(1)
            b = x.sin()
            return k.axpy(a, b)

        gm, removed = _cse(fn, *_xy())
        self.assertEqual(removed, 0)
        self.assertExpectedInline(normalize(gm.code.strip()), """\
def forward(self, args_0, args_1):
    sin = torch.ops.aten.sin.default(args_0)
    add_ = torch.ops.aten.add_.Tensor(args_0, 1);  args_0 = None
    sin_1 = torch.ops.aten.sin.default(add_);  add_ = None
    empty_like = torch.ops.aten.empty_like.default(sin, pin_memory = False)
    triton_kernel_wrapper_mutation_proxy = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(8, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'x_ptr': sin, 'y_ptr': sin_1, 'out_ptr': empty_like, 'n': 1000, 'alpha': 2.5, 'BLOCK': 128});  sin = sin_1 = triton_kernel_wrapper_mutation_proxy = None
    return empty_like""")


def test_not_merged_across_an_inplace_write_end_to_end():
    # x.add_(y), not x.add_(1): an in-place op with a Scalar argument does not lower in a
    # region yet (torch-mlir adds a NumToTensor step), with or without this pass. The write
    # through a view leaves later reads of x reading the placeholder itself.
    def fn(x, y, k=_Triton):
        a = x.sin()
        x.add_(y)
        b = x.sin()
        c = x.sin()
        x[:500].add_(y[:500])
        d = x.sin()
        return k.axpy(a, b) + k.axpy(c, d)

    gm, removed = _cse(fn, *_xy())
    assert removed == 1 and _count(gm, aten.sin.default) == 3  # c is b
    _check_against_eager(fn, *_xy())


def test_not_merged_across_a_kernel_writing_a_view_of_the_input():
    def fn(x, y, k=_Triton):
        a = x.cos()
        k.mul3_(x[100:612])
        b = x.cos()
        return k.axpy(a, b)

    gm, removed = _cse(fn, *_xy())
    assert removed == 0 and _count(gm, aten.cos.default) == 2
    _check_against_eager(fn, *_xy())


def test_graph_inputs_may_alias_each_other():
    """A write to y may be a write to x: the caller can pass one tensor twice."""

    def fn(x, y, k=_Triton):
        a = x.exp()
        k.mul3_(y)
        b = x.exp()
        return k.axpy(a, b)

    gm, removed = _cse(fn, *_xy())
    assert removed == 0 and _count(gm, aten.exp.default) == 2
    opt = trident.optimize(_capture(fn, *_xy()))
    x = torch.randn(1000)
    ref = x.clone()
    got = opt(x, x)
    torch.testing.assert_close(got, fn(ref, ref, k=_Eager))
    torch.testing.assert_close(x, ref)


def test_writes_to_unrelated_tensors_do_not_block_merging():
    def fn(x, y, k=_Triton):
        a = x.exp()
        out = k.axpy(y, y)  # the launch writes only its fresh output
        out.index_copy_(0, torch.tensor([0]), y[:1])
        b = x.exp()
        return k.axpy(a, b) + out

    gm, removed = _cse(fn, *_xy())
    assert removed == 1 and _count(gm, aten.exp.default) == 1
    _check_against_eager(fn, *_xy())


def test_results_written_later_are_not_merged():
    def fn(x, y, k=_Triton):
        a = x.cos()
        b = x.cos()
        k.mul3_(a)
        c = y.sin()
        d = y.sin()
        d.copy_(x)
        return k.axpy(a, b) + c + d

    gm, removed = _cse(fn, *_xy())
    assert removed == 0
    assert _count(gm, aten.cos.default) == 2 and _count(gm, aten.sin.default) == 2
    _check_against_eager(fn, *_xy())


def test_results_that_both_leave_the_graph_are_not_merged():
    """Eager returns two tensors; one tensor returned twice would alias them."""

    def fn(x, y, k=_Triton):
        return k.axpy(x, y), x.sin(), x.sin()

    gm, removed = _cse(fn, *_xy())
    assert removed == 0
    opt = _check_against_eager(fn, *_xy())
    _, a, b = opt(*_xy())
    assert a.data_ptr() != b.data_ptr()


def test_allocations_are_never_merged():
    def fn(x, y, k=_Triton):
        z1 = torch.zeros(1000)
        z2 = torch.zeros(1000)
        e1 = torch.empty_like(x)
        e2 = torch.empty_like(x)
        e1.copy_(x)
        e2.copy_(y)
        k.mul3_(e1)
        return k.axpy(z1 + e1, z2 + e2)

    gm, removed = _cse(fn, *_xy())
    assert removed == 0
    assert _count(gm, aten.zeros.default) == 2 and _count(gm, aten.empty_like.default) == 3
    _check_against_eager(fn, *_xy())


def test_unwritten_allocations_are_not_merged_either():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    allocs = [graph.call_function(op, args) for op, args in [
        (aten.empty_like.default, (x,)), (aten.empty_like.default, (x,)),
        (aten.zeros.default, ([4],)), (aten.zeros.default, ([4],)),
        (aten.empty_permuted.default, ([4], [0])), (aten.empty_permuted.default, ([4], [0])),
    ]]
    graph.output(tuple(graph.call_function(aten.add.Tensor, (a, x)) for a in allocs))
    assert eliminate_common_subexpressions(torch.fx.GraphModule(torch.nn.Module(), graph)) == 0


def test_random_ops_are_not_merged():
    def fn(x, y, k=_Triton):
        return k.axpy(torch.rand_like(x) + torch.rand_like(x), torch.bernoulli(y, 0.5) + torch.bernoulli(y, 0.5))

    gm, removed = _cse(fn, *_xy())
    assert removed == 0
    assert _count(gm, aten.rand_like.default) == 2 and _count(gm, aten.bernoulli.p) == 2


def test_constants_compare_with_their_type():
    """1 == 1.0 == True and 0.0 == -0.0 in Python; as operator arguments they differ."""

    def fn(x, y, k=_Triton):
        ints = torch.full((1000,), 3)
        floats = torch.full((1000,), 3.0)
        bools = torch.full((1000,), True)
        again = torch.full((1000,), 3.0)  # the only duplicate
        zero = torch.scalar_tensor(0.0)
        neg_zero = torch.scalar_tensor(-0.0)
        return k.axpy((x + ints) / 2, y + floats + bools + again) + 1.0 / zero + 1.0 / neg_zero

    gm, removed = _cse(fn, *_xy())
    assert removed == 1
    fills = [n.args[1] for n in gm.graph.nodes if n.target is aten.full.default]
    assert [(type(v), v) for v in fills] == [(int, 3), (float, 3.0), (bool, True)]
    assert [str(n.args[0]) for n in gm.graph.nodes if n.target is aten.scalar_tensor.default] == ["0.0", "-0.0"]


def test_constants_compare_with_their_type_end_to_end():
    # No bool fill here: full(True) does not lower in a region yet (torch-mlir adds an
    # aten.Int.bool step), with or without this pass.
    def fn(x, y, k=_Triton):
        ints = torch.full((1000,), 7) // torch.full((1000,), 2)  # 3, an int tensor
        floats = torch.full((1000,), 7.0) // torch.full((1000,), 2.0)  # 3.0
        zero, neg_zero = torch.scalar_tensor(0.0), torch.scalar_tensor(-0.0)
        # exp(-1/0) + exp(1/-0) = 0 + 0; inf if the two zeros were one.
        return k.axpy(x + ints, y * floats) + (-1.0 / zero).exp() + (1.0 / neg_zero).exp()

    gm, removed = _cse(fn, *_xy())
    assert removed == 0
    assert _count(gm, aten.full.default) == 4 and _count(gm, aten.scalar_tensor.default) == 2
    _check_against_eager(fn, *_xy())


def test_a_python_callable_is_a_barrier():
    """A callable without a schema may write anything it is given."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(aten.cos.default, (x,))
    b = graph.call_function(torch.Tensor.mul_, (x, 2))
    c = graph.call_function(aten.cos.default, (x,))
    d = graph.call_function(aten.cos.default, (x,))
    graph.output((graph.call_function(aten.add.Tensor, (a, c)), d, b))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert eliminate_common_subexpressions(gm) == 1  # d merged into c, c not into a
    assert [n for n in gm.graph.nodes if n.target is aten.cos.default] == [a, c]
    gm.recompile()
    x = torch.randn(8)
    want = x.cos() + (x * 2).cos()
    got, d_out, _ = gm(x.clone())
    torch.testing.assert_close(got, want)


def test_duplicate_projections_are_merged():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    vm = graph.call_function(aten.var_mean.correction, (x,), {"dim": [0]})
    p0 = graph.call_function(operator.getitem, (vm, 0))
    p1 = graph.call_function(operator.getitem, (vm, 0))
    graph.output((graph.call_function(aten.add.Tensor, (p0, p1)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert eliminate_common_subexpressions(gm) == 1
    x = torch.randn(4, 3)
    torch.testing.assert_close(gm(x)[0], 2 * x.var(0))


def _decode(cfg):
    weights, cos, sin = make_weights(cfg, "cpu")
    gm = trident.capture(
        functools.partial(decode_step, cfg),
        torch.randn(1, cfg.hidden), torch.tensor([0]), cos, sin, *make_caches(cfg, "cpu"), *weights,
    )
    return gm, weights, cos, sin


def test_decode_step_computes_the_attention_mask_once():
    """Every layer's attention turns the same boolean mask into the same additive mask
    (where(mask, 0, -inf)): one where and its two scalar tensors are left for all layers."""
    cfg = Config(layers=2)
    gm, weights, cos, sin = _decode(cfg)
    assert _count(gm, aten.where.self) == 2
    opt = trident.optimize(gm)
    assert opt.meta["trident_cse_removed"] == 3  # where, and both scalar_tensor
    (rt,) = _regions(opt)
    assert [s.op for s in rt.program.atens].count(aten.where.self) == 1
    assert [s.op for s in rt.program.atens].count(aten.scalar_tensor.default) == 2
    assert "common subexpressions removed: 3 node(s)" in trident.explain(opt)

    check_steps_against_reference(cfg, opt, weights, cos, sin, range(3))


def test_reads_of_one_closed_over_tensor_are_one_region_input():
    """make_fx emits a get_attr per read of a closed-over tensor; merged, the region has the
    tensor as ONE input (one guard), the duplicate pure reads of it merge, and the in-place write
    between two reads is still seen by the second."""
    cache = torch.zeros(16)
    y = torch.randn(16)

    def fn(x):
        a = K.axpy(cache, x)  # reads cache
        b = cache * 2.0
        c = cache * 2.0  # the same pure read: merged
        _Triton.mul3_(cache)  # writes cache
        return K.axpy(cache, a) + b + c  # reads the written cache

    gm = trident.capture(fn, y.clone())
    assert sum(n.op == "get_attr" for n in gm.graph.nodes) >= 3, gm.code
    opt = trident.optimize(gm)
    assert sum(n.op == "get_attr" for n in opt.graph.nodes) == 1, opt.code
    (rt,) = _regions(opt)
    names = [i.name for i in rt.program.inputs]
    assert len(names) == len(set(names)) and sum("cache" in n or "tensor_constant" in n for n in names) == 1, names
    want_cache = cache.clone()
    got = opt(y)
    ref_cache = want_cache
    a = K.axpy_ref(ref_cache, y)
    b = ref_cache * 2.0
    ref_cache.mul_(3.0)
    want = K.axpy_ref(ref_cache, a) + b + b
    assert torch.allclose(got, want) and torch.equal(cache, ref_cache)
