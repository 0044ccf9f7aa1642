"""Note [Prefill attention without per-length plans]: in a capture of a symbolic query length,
cuDNN's attention becomes the memory-efficient op, with the bias expanded as torch's SDPA gives it
to that backend; everything the note lists as a condition keeps cuDNN's, and explain() says why.
On the CPU the graph is checked (neither op runs there: the check is a stand-in); on the GPU the
results equal eager's for lengths the capture never saw."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import trident
from trident import knobs
from trident.passes import prefill_attention as PA
from trident.passes.common import stand_in

aten = torch.ops.aten
H, D = 4, 64


def _attention(x, k, v, causal=False, lse=False, bias_dtype=None, row_bias=False, key_bias=False, q_strided=False):
    """A prefill's attention as torch's SDPA gives it to cuDNN: q a view of the projections, a
    float bias of the query's dtype [1, 1, L, S] ([1, 1, 1, S] with `row_bias`, [1, 1, L, 1] with
    `key_bias`; none, causal)."""
    length = x.shape[1]
    q = x.view(1, length, D, H).permute(0, 3, 1, 2) if q_strided else x.view(1, length, H, D).transpose(1, 2)
    if k.dim() == 3:  # keys and values as a DynamicCache's projections give them: a symbolic length
        k, v = (t.view(1, t.shape[1], H, D).transpose(1, 2) for t in (k, v))
    rows = 1 if row_bias else length
    columns = 1 if key_bias else k.shape[2]
    bias = None if causal else torch.zeros(1, 1, rows, columns, dtype=bias_dtype or x.dtype)
    r = aten._scaled_dot_product_cudnn_attention(q, k, v, bias, False, 0.0, causal, False, scale=0.125)
    out = r[0].transpose(1, 2).reshape(1, length, H * D)
    return out + r[1].sum() if lse else out


def _self_attention(x):
    length = x.shape[1]
    q = x.view(1, length, H, D).transpose(1, 2)
    return aten._scaled_dot_product_cudnn_attention(q, q, q, None, False, 0.0, True, False)[0]


def _captured(fn, length=7, cache=16, static=True, kv_heads=H, kv_rows=False, **kw):
    x = torch.randn(1, length, H * D)
    k, v = torch.randn(1, kv_heads, cache, D), torch.randn(1, kv_heads, cache, D)
    if kv_rows:
        k, v = torch.randn(1, cache + 3, H * D), torch.randn(1, cache + 3, H * D)
        static = False
    return trident.capture(lambda x, k, v: fn(x, k, v, **kw), x, k, v, dynamic=static is not None,
                           static_inputs=(1, 2) if static else ())


def _run(gm, mode="all", check=None):
    PA.set_check(check or (lambda *a: None))
    try:
        with knobs.scope(prefill_attention=mode):
            return PA.prefill_attention(gm)
    finally:
        PA.set_check(None)


def _optimized(gm):
    """trident.optimize with the pass on for the CPU, its GPU check agreeing."""
    PA.set_check(lambda *a: None)
    try:
        with knobs.scope(prefill_attention="all"):
            return trident.optimize(gm)
    finally:
        PA.set_check(None)


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _guards(gm) -> list:
    x = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"]
    return [str(g.expr) for g in next(s for s in x.shape if isinstance(s, torch.SymInt)).node.shape_env.guards]


def test_symbolic_length_becomes_the_memory_efficient_op():
    gm = _captured(_attention)
    guards = _guards(gm)
    assert _run(gm) == 1
    assert _guards(gm) == guards  # the prompt length stays a symbol
    targets = _targets(gm)
    assert PA.CUDNN not in targets and targets.count(PA.EFFICIENT) == 1
    eff = next(n for n in gm.graph.nodes if n.target is PA.EFFICIENT)
    bias = eff.args[3]
    assert bias.target is aten.expand.default and bias.args[1] == [-1, H, -1, -1], bias.args
    assert eff.kwargs == {"dropout_p": 0.0, "is_causal": False, "scale": 0.125}
    (item,) = eff.users
    assert item.args == (eff, 0) and isinstance(item.meta["val"].shape[2], torch.SymInt)
    (line,) = gm.meta["trident_prefill_attention"]
    assert "memory-efficient SDPA in place of cuDNN's" in line and f"H={H}" in line, line


def test_causal_attention_without_a_bias():
    x = torch.randn(1, 9, H * D)
    gm = trident.capture(_self_attention, x, dynamic=True)
    assert _run(gm) == 1
    eff = next(n for n in gm.graph.nodes if n.target is PA.EFFICIENT)
    assert eff.args[3] is None and eff.kwargs["is_causal"] is True
    assert aten.expand.default not in _targets(gm)


def test_an_unaligned_bias_of_a_static_key_length_is_padded_as_torch_pads_it():
    """A StaticCache of 13 positions: the bias's rows do not start at multiples of 8 elements, so
    it is padded by 3 keys and sliced back to 13 (torch's pad_bias) through ops that keep the
    prompt length a symbol (constant_pad_nd's fake propagation fixed it), then expanded; the check
    is asked about the same padding."""
    gm = _captured(_attention, cache=13)
    guards = _guards(gm)
    seen = []
    assert _run(gm, check=lambda *a: seen.append(a[-2:])) == 1
    assert seen == [(3, [-1, H, -1, -1])] and _guards(gm) == guards
    eff = next(n for n in gm.graph.nodes if n.target is PA.EFFICIENT)
    sliced = eff.args[3].args[0]
    scattered = sliced.args[0]
    zeros = scattered.args[0]
    assert eff.args[3].target is aten.expand.default and sliced.target is aten.slice.Tensor
    assert sliced.args[1:] == (-1, 0, 13) and scattered.target is aten.slice_scatter.default
    assert zeros.target is aten.new_zeros.default and zeros.args[1][-1] == 16
    val = sliced.meta["val"]
    assert isinstance(val.shape[2], torch.SymInt) and val.shape[-1] == 13 and val.stride()[-2] == 16
    bias = torch.randn(1, 1, 5, 13)
    want = F.pad(bias, (0, 3))[..., :13].expand(1, H, 5, 13)
    got = PA._efficient_bias(bias, 3, [-1, H, -1, -1])
    assert torch.equal(got, want) and got.stride() == want.stride() and got.stride()[2] == 16


def test_every_reader_of_the_output_is_served():
    """Two getitem(0) nodes of one call (the pass runs before CSE merges them)."""
    gm = _captured(_attention)
    node = next(n for n in gm.graph.nodes if n.target is PA.CUDNN)
    first = next(u for u in node.users if u.args[1] == 0)
    with gm.graph.inserting_after(first):
        second = gm.graph.call_function(operator.getitem, (node, 0))
        second.meta["val"] = first.meta["val"]
        double = gm.graph.call_function(aten.add.Tensor, (second, second))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    output.args = ((output.args[0], double),)
    assert _run(gm) == 1
    eff = next(n for n in gm.graph.nodes if n.target is PA.EFFICIENT)
    (item,) = eff.users
    assert double.args == (item, item) and PA.CUDNN not in _targets(gm)


def test_a_node_without_a_traced_value_is_left_silently():
    gm = _captured(_attention)
    node = next(n for n in gm.graph.nodes if n.target is PA.CUDNN)
    del node.args[0].meta["val"]
    assert _run(gm) == 0 and PA.CUDNN in _targets(gm) and "trident_prefill_attention" not in gm.meta


@pytest.mark.parametrize("case,reason", [
    (dict(lse=True), "more than its output is read"),
    (dict(bias_dtype=torch.float64), "not four-dimensional in the query's dtype"),
    (dict(kv_rows=True), "a bias of a symbolic key length whose rows are not at multiples of 8 elements"),
    (dict(static=False), "key/value heads not known to equal the query's"),
    (dict(row_bias=True), "a bias broadcast over a symbolic size"),
    (dict(kv_heads=2), "key/value heads not known to equal the query's"),
    (dict(key_bias=True), "a bias broadcast over the keys"),
    (dict(q_strided=True), "not contiguous over its head size"),
])
def test_what_keeps_cudnn_is_said(case, reason):
    """The log-sum-exp read, a bias of another dtype, an unaligned bias of a symbolic key length
    (torch pads it by a symbolic amount), key/value heads symbolic or grouped, one bias row for
    every query row of a symbolic length, one bias column for every key: cuDNN's op stays, and
    the line says why."""
    gm = _captured(_attention, **case)
    assert _run(gm) == 0
    assert PA.CUDNN in _targets(gm) and PA.EFFICIENT not in _targets(gm)
    (line,) = gm.meta["trident_prefill_attention"]
    assert "cuDNN's as traced" in line and reason in line, line


def test_a_failed_check_keeps_cudnn():
    gm = _captured(_attention)
    assert _run(gm, check=lambda *a: "AssertionError: differs") == 0
    assert PA.CUDNN in _targets(gm)
    assert "differs" in gm.meta["trident_prefill_attention"][0]


def test_static_length_off_and_other_devices_are_left_silently():
    for gm, mode in [(_captured(_attention, static=None), "all"), (_captured(_attention), ""),
                     (_captured(_attention), "cuda")]:  # CPU values under the default
        before = [str(n) for n in gm.graph.nodes]
        assert _run(gm, mode=mode) == 0
        assert [str(n) for n in gm.graph.nodes] == before and "trident_prefill_attention" not in gm.meta


def test_stand_ins_take_the_examples_sizes_of_a_symbolic_value():
    """What the GPU check runs on: each traced value at the example's sizes and layout (hints, never
    a guard), and the check's answer without a GPU names the device."""
    gm = _captured(_attention)
    guards = _guards(gm)
    node = next(n for n in gm.graph.nodes if n.target is PA.CUDNN)
    q = node.args[0].meta["val"]
    example = PA._Example(q, torch.device("cpu"))
    assert example.shape == (1, H, 7, D) and example.stride() == (7 * H * D, D, H * D, 1)
    real = stand_in(example, torch.Generator().manual_seed(0))
    assert real.shape == (1, H, 7, D) and real.stride() == (7 * H * D, D, H * D, 1) and real.abs().max() <= 1
    assert _guards(gm) == guards
    assert PA._gpu_check(q, q, q, None, True, None) == "not checked on cpu"


def test_explain_lists_the_choice():
    gm = _captured(_attention)
    opt = _optimized(gm)
    text = trident.explain(opt)
    assert "prefill attention (symbolic lengths):" in text and "memory-efficient SDPA" in text, text


@pytest.fixture
def efficient_on_the_cpu():
    """The memory-efficient op with a CPU kernel for this test only (torch has none): the math
    backend's result in the layout the op's meta function gives; the biases it was called with."""
    calls = []

    def efficient(q, k, v, bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
        calls.append(None if bias is None else (tuple(bias.shape), bias.stride()))
        out = aten._scaled_dot_product_attention_math(q, k, v, bias, dropout_p, is_causal, None, scale=scale)[0]
        b, h, length, d = out.shape
        laid = torch.empty(b, length, h, d, dtype=out.dtype).transpose(1, 2)
        laid.copy_(out)
        seed = torch.empty((), dtype=torch.int64)
        return laid, torch.empty(b, h, 0), seed, seed.clone()

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_scaled_dot_product_efficient_attention", efficient, "CPU")
    try:
        yield calls
    finally:
        lib._destroy()


@pytest.mark.parametrize("cache", [16, 13])
def test_lengths_never_seen_equal_sdpa_through_the_runtime(efficient_on_the_cpu, cache):
    """End to end on the CPU, the native runtime running the rewritten region: HF's boolean mask
    made cuDNN's bias (0 / -65504) as torch's SDPA makes it, a StaticCache of 16 positions (aligned)
    or 13 (the bias padded to rows of 16 elements); prompt lengths the capture never saw equal SDPA's."""
    k, v = torch.randn(1, H, cache, D), torch.randn(1, H, cache, D)

    def mask(x, k):
        return torch.ones(x.shape[1], k.shape[2], dtype=torch.bool).tril()[None, None]

    def traced(x, k, v):
        q = x.view(1, x.shape[1], H, D).transpose(1, 2)
        bias = torch.where(mask(x, k).logical_not(), -65504.0, 0.0).to(x.dtype)
        out = aten._scaled_dot_product_cudnn_attention(q, k, v, bias, False, 0.0, False, False, scale=0.125)[0]
        return out.transpose(1, 2).reshape(1, x.shape[1], H * D)

    def sdpa(x, k, v):
        q = x.view(1, x.shape[1], H, D).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask(x, k), scale=0.125)
        return out.transpose(1, 2).reshape(1, x.shape[1], H * D)

    gm = trident.capture(traced, torch.randn(1, 7, H * D), k, v, dynamic=True, static_inputs=(1, 2))
    opt = _optimized(gm)
    assert "memory-efficient SDPA in place of cuDNN's" in trident.explain(opt)
    for length in (7, 3, 11, cache):
        x = torch.randn(1, length, H * D)
        torch.testing.assert_close(opt(x, k, v), sdpa(x, k, v))
    assert [shape for shape, _ in efficient_on_the_cpu] == [(1, H, n, cache) for n in (7, 3, 11, cache)]
    assert all(stride[2] == 16 for _, stride in efficient_on_the_cpu)  # rows at multiples of 8 elements


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device machine)")
@pytest.mark.parametrize("dtype,cache", [(torch.bfloat16, 128), (torch.float16, 128), (torch.bfloat16, 100)])
def test_prefill_lengths_never_seen_equal_eager_cuda(dtype, cache):
    """HF's prefill over a StaticCache: a boolean mask [1, 1, L, S], torch's SDPA (cuDNN on
    sm_90); the symbolic capture serves lengths it never saw, each equal to eager's (a cache of
    100 positions: the bias padded to rows of 104 elements)."""
    k = torch.randn(1, H, cache, D, device="cuda", dtype=dtype)
    v = torch.randn(1, H, cache, D, device="cuda", dtype=dtype)

    def prefill(x, k, v):
        length = x.shape[1]
        q = x.view(1, length, H, D).transpose(1, 2)
        mask = torch.ones(length, cache, dtype=torch.bool, device=x.device).tril()[None, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(1, length, H * D)

    x = torch.randn(1, 17, H * D, device="cuda", dtype=dtype)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # as torch picks it on sm_90 with a mask
        gm = trident.capture(prefill, x, k, v, dynamic=True, static_inputs=(1, 2))
    assert PA.CUDNN in _targets(gm)
    opt = trident.optimize(gm)
    assert "memory-efficient SDPA in place of cuDNN's" in trident.explain(opt), trident.explain(opt)
    for length in (17, 33, 50, 97):
        x = torch.randn(1, length, H * D, device="cuda", dtype=dtype)
        torch.testing.assert_close(opt(x, k, v), prefill(x, k, v), rtol=2e-2, atol=2e-2)
