"""Goldens for the captured graph and the optimized graph (one trident.scm call per region)."""

from __future__ import annotations

import expecttest
import torch

import trident
from tests import kernels as K
from tests.conftest import normalize
from tests.goldens import axpy_graph, mixed_graph


class TestOptimizedGraph(expecttest.TestCase):
    def test_axpy_captured(self):
        gm, _ = axpy_graph()
        self.assertExpectedInline(normalize(gm.code.strip()), """\
def forward(self, x, y):
    empty_like = torch.ops.aten.empty_like.default(x, pin_memory = False)
    triton_kernel_wrapper_mutation_proxy = torch.ops.higher_order.triton_kernel_wrapper_mutation(kernel_idx = K, constant_args_idx = C, grid = [(8, 1, 1)], tma_descriptor_metadata = {}, kwargs = {'x_ptr': x, 'y_ptr': y, 'out_ptr': empty_like, 'n': 1000, 'alpha': 2.5, 'BLOCK': 128});  x = y = triton_kernel_wrapper_mutation_proxy = None
    return empty_like""")

    def test_axpy_optimized(self):
        _, opt = axpy_graph()
        self.assertExpectedInline(normalize(opt.code.strip()), """\
def forward(self, x, y):
    scm_default = torch.ops.trident.scm.default(REGION, [], [x, y]);  x = y = None
    getitem = scm_default[0];  scm_default = None
    return getitem""")

    def test_mixed_optimized_two_regions(self):
        _, opt = mixed_graph()
        self.assertExpectedInline(normalize(opt.code.strip()), """\
def forward(self, x, y):
    scm_default = torch.ops.trident.scm.default(REGION, [], [x, y]);  x = y = None
    getitem = scm_default[0];  scm_default = None
    python_scale = tests_goldens_python_scale(getitem);  getitem = None
    scm_default_1 = torch.ops.trident.scm.default(REGION, [python_scale], []);  python_scale = None
    getitem_1 = scm_default_1[0];  scm_default_1 = None
    return getitem_1""")
        scm_calls = [n for n in opt.graph.nodes if n.target is torch.ops.trident.scm.default]
        self.assertEqual(len(scm_calls), 2)


def test_written_params_are_kept_per_constant_arguments():
    """torch's write analysis is reused across launches of one kernel with the same argument
    types and constants, and not across different constants (here one decides what is written)."""
    import triton

    from trident.passes.outline_regions import written_params

    def fn(x, out):
        n = x.numel()
        K.store_where_kernel[(triton.cdiv(n, 64),)](x, out, n, INTO_X=False, BLOCK=64)
        K.store_where_kernel[(triton.cdiv(n, 64),)](out, x, n, INTO_X=False, BLOCK=64)
        K.store_where_kernel[(triton.cdiv(n, 64),)](x, out, n, INTO_X=True, BLOCK=64)
        return x, out

    gm = trident.capture(fn, torch.randn(100), torch.randn(100))
    launches = [n for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert [written_params(n) for n in launches] == [["out_ptr"], ["out_ptr"], ["x_ptr"]]
