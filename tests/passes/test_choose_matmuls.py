"""trident/passes/choose_matmuls.py (Note [Decode matmuls by measurement]): products of at most
16 rows run as Trident's Triton GEMV where it is measured faster than the operator. Without a
GPU nothing is timed, so these tests install a timer (set_timer) to decide, and check the GEMV
kernels (split-K or not, with an addend or not) against torch through Triton's interpreter over
random shapes, dtypes and layouts, the choice's cache, and what explain() prints."""

from __future__ import annotations

import ast
import gc
import math
import random
import threading
import time

import pytest
import torch

import trident
from tests import kernels as K
from trident import knobs, pdl
from trident.kernels import gemv as G
from trident.passes import choose_matmuls as CM

_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device machine)")


@pytest.fixture(autouse=True)
def _no_timer():
    CM.set_timer(None)
    yield
    CM.set_timer(None)


def _tile(cfg):
    """The config with the K loop as compiled by default (first round of the measurement)."""
    return G.Config(*cfg)._replace(stages=0, unroll=1)


def _favor(config):
    """A timer under which `config` is fastest ('aten' for the operator); its tile with the
    default loop second, so that a pipelined or unrolled config gets to the second round."""

    def timer(name, shape, cfg):
        if config == "aten":
            return 1.0 if name == "aten" else 2.0
        if cfg is not None and G.Config(*cfg) == G.Config(*config):
            return 0.5
        if cfg is not None and G.Config(*cfg) == _tile(config):
            return 0.7
        return 1.0 if name == "aten" else 0.9

    return timer


def _launches(gm):
    from trident.runtime import SCMRuntime

    return [s.kernel_name for rid in gm.meta["trident_regions"] for s in SCMRuntime.get(rid).program.launches]


def _linear(x, w):
    return K.axpy(x, x) @ w.t()  # a launch, then x @ w.T: aten.mm(a, aten.t(w))


def _linear_bias(x, w, bias):
    return torch.nn.functional.linear(K.axpy(x, x), w, bias)  # aten.addmm(bias, a, aten.t(w))


FP32 = dict(rtol=1e-4, atol=1e-4)  # another summation order than the operator's
_DEFAULT_LOOPS = [c for c in G.CONFIGS if not c.stages and c.unroll == 1]  # the interpreter runs the others alike


def _run(fn, args, config, **scope):
    CM.set_timer(_favor(config))
    with knobs.scope(decode_matmuls="all", **scope):
        opt = trident.optimize(trident.capture(fn, *[a.clone() for a in args]))
    return opt


def test_a_measured_faster_gemv_replaces_the_product_and_equals_it():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 300, generator=g), torch.randn(100, 300, generator=g)
    config = (32, 256, 1, 4, 0)
    opt = _run(_linear, [x, w], config)
    assert _launches(opt) == ["axpy_kernel", "gemv_kernel"]
    torch.testing.assert_close(opt(x, w), _linear(x, w), **FP32)
    text = trident.explain(opt)
    assert "decode matmuls:" in text and "mm 1x300 @ 300x100 torch.float32: gemv(BLOCK_N=32, BLOCK_K=256, " \
        "SPLIT_K=1, num_warps=4) [measured: " in text, text


def _with_two_launch_form(monkeypatch, config):
    """The two-launch split-K form is no longer measured (gemv.CONFIGS), only kept as the reference
    the one-launch form equals bit for bit: offered here so that the pass can choose it."""
    assert config[2] > 1 and not config[4] and config not in G.CONFIGS
    monkeypatch.setattr(G, "CONFIGS", (*G.CONFIGS, config))


def test_split_k_with_a_bias_is_two_launches_equal_to_addmm(monkeypatch):
    g = torch.Generator().manual_seed(1)
    x, w, bias = torch.randn(3, 1024, generator=g), torch.randn(64, 1024, generator=g), torch.randn(64, generator=g)
    config = (64, 128, 4, 4, 0)
    _with_two_launch_form(monkeypatch, config)
    assert G.useful(64, 1024, config)
    opt = _run(_linear_bias, [x, w, bias], config)
    assert _launches(opt) == ["axpy_kernel", "gemv_kernel", "gemv_reduce_kernel"]
    torch.testing.assert_close(opt(x, w, bias), _linear_bias(x, w, bias), **FP32)


def test_the_last_program_reduces_in_one_launch_bit_for_bit(monkeypatch):
    """Note [The last program reduces]: a split-K product whose last program sums the pieces is
    one launch, equal bit for bit to the two-launch form (the same sum in split order), with or
    without an addend, one row or three, call after call (the counters are per call)."""
    g = torch.Generator().manual_seed(5)
    _with_two_launch_form(monkeypatch, (64, 128, 4, 4, 0))
    for m in (1, 3):
        x, w, bias = torch.randn(m, 1024, generator=g), torch.randn(80, 1024, generator=g), torch.randn(80, generator=g)
        for fn, args in ((_linear, [x, w]), (_linear_bias, [x, w, bias])):
            one = _run(fn, args, (64, 128, 4, 4, 1))
            two = _run(fn, args, (64, 128, 4, 4, 0))
            assert _launches(one) == ["axpy_kernel", "gemv_kernel"]
            assert _launches(two) == ["axpy_kernel", "gemv_kernel", "gemv_reduce_kernel"]
            want = two(*args)
            for _ in range(3):
                assert torch.equal(one(*args), want)
            torch.testing.assert_close(want, fn(*args), **FP32)
            assert "SPLIT_K=4, LAST_REDUCES, num_warps=4) [measured: " in trident.explain(one)


def test_products_of_a_graph_share_one_counter_allocation():
    """The counters of every last-program-reduces product come from one zeros allocation per
    call (made at the graph's start, then sunk to its first reader), each product at its own
    offset."""

    def two_products(x, w1, w2):
        a = K.axpy(x, x)
        return a @ w1.t(), (a + 1) @ w2.t()

    g = torch.Generator().manual_seed(6)
    x, w1, w2 = torch.randn(1, 1024, generator=g), torch.randn(96, 1024, generator=g), torch.randn(40, 1024, generator=g)
    CM.set_timer(_favor((32, 256, 4, 4, 1)))
    gm = trident.capture(two_products, x, w1, w2)
    with knobs.scope(decode_matmuls="all"):
        assert CM.choose_matmuls(gm) == 2
    zeros = [n for n in gm.graph.nodes if n.target is torch.ops.aten.zeros.default]
    assert len(zeros) == 1 and zeros[0].args[0] == [3 + 2]  # cdiv(96, 32) + cdiv(40, 32) counters
    launches = [n for n in gm.graph.nodes if "gemv" in str(n.kwargs.get("kernel_idx", "")) or n.op == "call_function"
                and "triton_kernel_wrapper" in str(n.target)]
    offsets = [n.kwargs["kwargs"].get("count_offset") for n in launches if "count_offset" in n.kwargs.get("kwargs", {})]
    assert offsets == [0, 3], offsets
    with knobs.scope(graphs="all"):  # ordinary calls, then graph replays (emulated on the CPU)
        opt = _run(two_products, [x, w1, w2], (32, 256, 4, 4, 1))
        for _ in range(5):
            x = torch.randn(1, 1024, generator=g)
            for got, want in zip(opt(x, w1, w2), two_products(x, w1, w2)):
                torch.testing.assert_close(got, want, **FP32)
    assert sum(v["graph_replays"] for v in trident.cache_info(opt).values()) == 3


def test_counters_are_allocated_per_device():
    """Products on two devices get one counter allocation each, on their own device (review of
    the pass, 2026-12-03: one allocation on the first product's device was handed to all); the
    decode attention's counters come from the same allocation (`call_counters`: one fill kernel
    a call)."""
    from trident.passes.common import call_counters
    from torch._subclasses.fake_tensor import FakeTensorMode

    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    config = (32, 256, 4, 4, 1)
    chosen = []
    with FakeTensorMode():
        for device in ("cpu", "cuda", "cpu"):
            b = gm.graph.placeholder(f"b{len(chosen)}")
            b.meta["val"] = torch.empty(1024, 64, device=device)
            node = gm.graph.call_function(torch.ops.aten.mm.default, (b, b))
            node.meta["val"] = torch.empty(1, 64, device=device)
            chosen.append(([(node, b, b, None)], config))
        where = CM._counters(gm, chosen)
        attention, off3 = call_counters(gm, torch.empty(1, device="cpu"), 3)
    (cpu0, off0), (cuda, off1), (cpu1, off2) = (where[members[0][0]] for members, _ in chosen)
    assert cpu0 is cpu1 is attention and cpu0 is not cuda and (off0, off1, off2, off3) == (0, 0, 2, 4)
    assert cpu0.kwargs["device"].type == "cpu" and cuda.kwargs["device"].type == "cuda"
    assert cpu0.args[0] == [7] and cuda.args[0] == [2]


def _qkv(x, wq, wk, wv, *biases):
    """Three products of one row block, written as HF writes q/k/v projections (each weight's
    transpose read just before its product, views of each result between them; a 3-D input is
    viewed as rows anew by each F.linear)."""
    h = K.axpy(x, x)
    if biases:
        q, k, v = (torch.nn.functional.linear(h, w, b) for w, b in zip((wq, wk, wv), biases))
    else:
        q, k, v = (torch.nn.functional.linear(h, w) for w in (wq, wk, wv))
    return q.view(*h.shape[:-1], 4, -1), k * 2, v


def _group_timer(config, group_us=0.5):
    """Alone each product's GEMV `config` takes 1.0 and the operator 2.0; the group takes `group_us`
    with `config`, 5.0 with others."""

    def timer(name, shape, cfg):
        chosen = cfg is not None and G.Config(*cfg) == G.Config(*config)
        if name == "group":
            return group_us if chosen else 5.0
        return 2.0 if name == "aten" else (1.0 if chosen else 3.0)

    return timer


@pytest.mark.parametrize("config", [(32, 256, 1, 4, 0), (32, 256, 2, 4, 1)], ids=["one_split", "last_reduces"])
@pytest.mark.parametrize("rows", [(1,), (3,), (1, 1, 1)], ids=["1", "3", "3d"])
@pytest.mark.parametrize("bias", [False, True])
def test_products_of_one_row_block_become_one_launch(config, rows, bias):
    """Note [Products sharing a row block]: q, k and v of one row block (with a bias row each, or
    not; a [B, T, H] activation viewed anew by each product, as in HF) are one launch of
    gemv_group_kernel where it is measured faster than the three alone; the results equal the
    operator's; explain() lists the group and its times."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(*rows, 512, generator=g)
    ws = [torch.randn(n, 512, generator=g) for n in (64, 32, 48)]
    args = [x, *ws] + ([torch.randn(n, generator=g) for n in (64, 32, 48)] if bias else [])
    CM.set_timer(_group_timer(config))
    with knobs.scope(decode_matmuls="all"):
        opt = trident.optimize(trident.capture(_qkv, *[t.clone() for t in args]))
    assert _launches(opt) == ["axpy_kernel", "gemv_group_kernel"], _launches(opt)
    text = trident.explain(opt)
    assert "group of mm" in text or "group of addmm" in text, text
    assert "members 3.00 us" in text, text
    for _ in range(3):
        x = torch.randn(*rows, 512, generator=g)
        for got, want in zip(opt(x, *args[1:]), _qkv(x, *args[1:])):
            torch.testing.assert_close(got, want, **FP32)


@pytest.mark.parametrize("config", [c for c in _DEFAULT_LOOPS if c[2] == 1 or c[4]],
                         ids=lambda c: "x".join(map(str, c)))
def test_every_group_config_through_the_interpreter(config):
    """Each config a group may take, 2 and 3 members, 1 and 3 rows, with bias rows: the one
    launch equals the operator's products."""
    g = torch.Generator().manual_seed(14)
    k = 2048
    for m, ns in ((1, (96, 40, 40)), (3, (64, 96))):
        a = torch.randn(m, k, generator=g)
        ws = [torch.randn(n, k, generator=g) for n in ns]
        cs = [torch.randn(n, generator=g) for n in ns]
        outs = [torch.full((m, n), float("nan")) for n in ns]
        CM._run_group(a, [w.t() for w in ws], cs, outs, config)
        for out, w, c in zip(outs, ws, cs):
            torch.testing.assert_close(out, torch.addmm(c, a, w.t()), **FP32)


def test_a_group_slower_than_its_members_alone_is_not_made():
    g = torch.Generator().manual_seed(12)
    args = [torch.randn(1, 512, generator=g)] + [torch.randn(n, 512, generator=g) for n in (64, 32, 48)]
    CM.set_timer(_group_timer((32, 256, 1, 4, 0), group_us=2.9))  # 3 x 1.0 alone: 2.9 > 0.95 x 3
    with knobs.scope(decode_matmuls="all"):
        opt = trident.optimize(trident.capture(_qkv, *args))
    assert _launches(opt) == ["axpy_kernel"] + ["gemv_kernel"] * 3, _launches(opt)
    assert ": the members as listed alone [measured: " in trident.explain(opt)


def test_a_write_between_products_keeps_them_apart():
    """A launch between two products of one `a` (here it writes `a`'s storage) keeps them as they
    are: the second must read what the launch wrote."""

    def fn(x, w1, w2):
        h = K.axpy(x, x)
        y1 = h @ w1.t()
        K.inplace_mul(h)  # h *= factor, in place by a Triton launch, between the products
        return y1, h @ w2.t()

    g = torch.Generator().manual_seed(13)
    args = [torch.randn(1, 512, generator=g), torch.randn(64, 512, generator=g), torch.randn(32, 512, generator=g)]
    CM.set_timer(_group_timer((32, 256, 1, 4, 0)))
    with knobs.scope(decode_matmuls="all"):
        opt = trident.optimize(trident.capture(fn, *[t.clone() for t in args]))
    assert "gemv_group_kernel" not in _launches(opt)
    for got, want in zip(opt(*[t.clone() for t in args]), fn(*[t.clone() for t in args])):
        torch.testing.assert_close(got, want, **FP32)


def test_a_python_call_between_products_keeps_them_apart():
    """A node without a schema between two products (a Python callable in the graph) may write
    anything: no group across it (review of the pass, 2026-12-03: it mutated `a` unseen)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def double_(t):
        return t.mul_(2)

    x, w1, w2 = torch.randn(1, 512), torch.randn(64, 512), torch.randn(32, 512)
    gm = make_fx(lambda x, w1, w2: (torch.mm(x, w1.t()), torch.mm(x, w2.t())))(x, w1, w2)
    mm1, mm2 = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default]
    assert CM._quiet_between(mm1, mm2)
    with gm.graph.inserting_after(mm1):
        gm.graph.call_function(double_, (mm1.args[0],))
    assert not CM._quiet_between(mm1, mm2)


def test_last_program_reduces_orders_its_pieces_before_its_count_on_sm90():
    """The sm_90 PTX of the one-launch split-K: every thread's piece is stored, then the CTA
    synchronizes, then one acquire-release atomic at GPU scope counts the arrival; the last
    program reads the pieces through L2 (ld.global.cg), not L1."""
    f = torch.zeros(4096)
    compiled = G.gemv_kernel.warmup(
        f, f, f, f, f, torch.zeros(64, dtype=torch.int32), 4, 64, 1024, 1, 1, 1, 1024, 0, 1, 64, 1, 0,
        HAS_C=True, SPLIT_K=4, PRECISION="ieee", BLOCK_M=1, BLOCK_N=32, BLOCK_K=64, LAST_REDUCES=True,
        grid=(1, 1, 1))
    ptx = compiled.asm["ptx"]
    atom = ptx.find("atom.global.gpu.acq_rel.add")
    assert atom >= 0 and ptx.count("atom.") == 1, ptx
    store, barrier = ptx.rfind("st.global", 0, atom), ptx.rfind("bar.sync", 0, atom)
    assert 0 <= store < barrier < atom, (store, barrier, atom)  # the piece, the barrier, the count
    assert ptx[atom:].count("ld.global.cg") == 4  # the 4 pieces, through L2
    # the count is shared from the one thread that made it through a barrier before any reads
    assert 0 <= ptx.find("bar.sync", atom) < ptx.find("ld.global.cg", atom)


class _RecordingLock:
    """precompile's parse lock, noting the threads that take it."""

    def __init__(self):
        self.lock, self.threads = threading.RLock(), []

    def __enter__(self):
        self.threads.append(threading.current_thread().name)
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


def test_candidates_compile_ahead_in_threads(monkeypatch, caplog, tmp_path):
    """precompile: every candidate's Triton compile runs in a worker thread (Triton's
    AsyncCompileMode) and is done when it returns: the measurement's launches then compile
    nothing (here sm_90 cubins through the host-only driver). Each compile (an empty Triton
    cache: all of them parse) parses the kernel's source through the one lock (Note [One AST
    conversion at a time]), while collections inside the conversions pass the GIL."""
    from triton.runtime import driver

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # (setting Triton's knob would pin it for the process)
    parses = _RecordingLock()
    monkeypatch.setattr(CM, "_parse_lock", parses)

    G.gemv_kernel.device_caches[driver.active.get_current_device()]  # binds `compile` (Triton does on first use)
    seen = []
    real = G.gemv_kernel.compile

    def recording(*args, **kwargs):
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(G.gemv_kernel, "compile", recording)
    k, n = 1088, 96  # an inner size no other test compiles (K is a constexpr)
    a, w, out = torch.randn(1, k), torch.randn(n, k), torch.empty(1, n)
    configs = [c for c in G.CONFIGS if G.useful(n, k, c)][:3]
    switches = lambda phase, info: time.sleep(0)  # noqa: E731 - the GIL passes at every collection
    gc.callbacks.append(switches)
    try:
        with caplog.at_level("DEBUG", logger="trident.lowering"):  # a compile failed in its thread: why
            CM.precompile([lambda c=c: CM._run_gemv(a, w.t(), None, out, c, compile_only=True) for c in configs])
    finally:
        gc.callbacks.remove(switches)
    assert len(seen) == len(configs) and all(name.startswith("trident-compile") for name in seen), seen
    for c in configs:  # compiled: Triton's cache of the function has them
        CM._run_gemv(a, w.t(), None, out, c, compile_only=True)
    # (failed in CI runs of 2026-12-04/05 before Note [One AST conversion at a time])
    assert len(seen) == len(configs), (seen, [r.getMessage() for r in caplog.records if "compiled ahead" in r.getMessage()])
    in_threads = [t for t in parses.threads if t.startswith("trident-compile")]  # (the main thread's: cache keys)
    assert len(in_threads) >= len(configs), parses.threads


def test_precompile_converts_one_ast_at_a_time():
    """Note [One AST conversion at a time]: while a precompile runs, threads parsing at once (the
    GIL passing inside their conversions) all succeed -- CPython 3.11 fails one of four such
    threads in nearly every run without the lock -- and `ast.parse` is the caller's again after."""
    source = "\n".join(f"def f{i}(a, b):\n    return [a + b * {i} for _ in a] if a else (b, {{1: {i}}})"
                        for i in range(300))
    errors, found = [], ast.parse

    def parse():
        for _ in range(30):
            try:
                ast.parse(source)
            except SystemError as e:
                errors.append(e)

    switches = lambda phase, info: time.sleep(0)  # noqa: E731 - the GIL passes at every collection
    gc.callbacks.append(switches)
    try:
        with CM._SERIAL_PARSE.held():
            threads = [threading.Thread(target=parse) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        gc.callbacks.remove(switches)
    assert errors == [] and ast.parse is found, (errors, ast.parse)


def test_an_interrupted_precompile_leaves_no_compile_mode_behind():
    """An interrupt while candidates compile ahead reaches the caller, and Triton's compile mode
    is unset (Triton's own exit does not unset it when interrupted: every later compile of the
    thread would go to a pool that is gone)."""
    from triton.runtime import _async_compile

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        CM.precompile([lambda: None, interrupted])
    assert _async_compile.active_mode.get() is None
    CM.precompile([lambda: None, lambda: None])  # and it works again
    assert _async_compile.active_mode.get() is None


def test_residual_mm_keeps_its_addend():
    def block(x, w, res):
        return res + K.axpy(x, x) @ w.t()

    g = torch.Generator().manual_seed(2)
    x, w, res = torch.randn(2, 1024, generator=g), torch.randn(128, 1024, generator=g), torch.randn(2, 128, generator=g)
    for config in [(64, 128, 1, 4, 0), (64, 128, 4, 4, 0)]:
        opt = _run(block, [x, w, res], config, gemm_epilogues="all")
        assert "gemv_kernel" in _launches(opt)
        torch.testing.assert_close(opt(x, w, res), block(x, w, res), **FP32)


def test_the_operator_stays_where_it_is_measured_faster_or_nothing_is_measured():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(1, 256, generator=g), torch.randn(64, 256, generator=g)
    opt = _run(_linear, [x, w], "aten")
    assert _launches(opt) == ["axpy_kernel"]
    assert "the operator (cuBLAS on CUDA) [measured: aten 1.00 us" in trident.explain(opt)
    CM.set_timer(None)
    with knobs.scope(decode_matmuls="all"):
        opt = trident.optimize(trident.capture(_linear, x, w))
    assert _launches(opt) == ["axpy_kernel"]
    assert "[not measured: no GPU and no timer]" in trident.explain(opt)
    with knobs.scope(decode_matmuls=""):  # off: the pass does not run
        opt = trident.optimize(trident.capture(_linear, x, w))
    assert "decode matmuls" not in trident.explain(opt)


def test_more_than_16_rows_is_not_a_decode_product():
    x, w = torch.randn(17, 64), torch.randn(32, 64)
    opt = _run(_linear, [x, w], (32, 256, 1, 4, 0))
    assert _launches(opt) == ["axpy_kernel"]
    assert "decode matmuls" not in trident.explain(opt)


def test_a_shape_is_measured_once():
    calls = []
    favor = _favor((32, 256, 1, 4, 0))
    CM.set_timer(lambda name, shape, cfg: calls.append((name, cfg)) or favor(name, shape, cfg))
    x, w = torch.randn(1, 64), torch.randn(32, 64)
    with knobs.scope(decode_matmuls="all"):
        for _ in range(2):
            trident.optimize(trident.capture(_linear, x, w))
    assert len(calls) == len(set(calls)) and ("aten", None) in calls


def test_random_products_equal_torch():
    """Random rows (1-16), sizes, dtypes, addends and transposed operands, each with a random
    config of those measured for its shape: the GEMV's result is the operator's within the dtype's rounding."""
    rng = random.Random(0)
    for trial in range(10):
        m = rng.choice([1, 1, 2, 5, 16])
        n, k = rng.choice([40, 96, 200, 512]), rng.choice([48, 128, 520, 1024])
        dtype = torch.float16 if trial % 4 == 3 else torch.float32
        config = rng.choice([c for c in G.CONFIGS if G.useful(n, k, c)])
        g = torch.Generator().manual_seed(trial)
        transposed = trial % 3 == 1  # w stored [in, out]: the product's b is contiguous along n
        w = torch.randn((k, n) if transposed else (n, k), generator=g).to(dtype)
        x = torch.randn(m, k, generator=g).to(dtype)
        bias = torch.randn(n, generator=g).to(dtype) if trial % 2 else None

        def fn(x, w, *rest):
            a = K.axpy(x, x)
            b = w if transposed else w.t()
            return torch.addmm(rest[0], a, b) if rest else a @ b

        args = [x, w] + ([bias] if bias is not None else [])
        opt = _run(fn, args, config)
        assert "gemv_kernel" in _launches(opt), (m, n, k, config)
        # fp32: the split sums round in another order than the operator's, an error that grows
        # with the inner size (k = 1024 with 4 splits: 1.5e-4 in the CI of 2026-12-04, within 1e-4
        # in earlier runs); a wrong piece of the product is off by O(1)
        tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=1e-4, atol=1e-4 * max(1, k / 256))
        torch.testing.assert_close(opt(*args), fn(*args), **tol, msg=lambda s: f"{m}x{k}x{n} {dtype} {config}: {s}")


@_CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_gemv_config_equals_torch_cuda(dtype):
    """Each configuration the pass measures compiles for the GPU and computes the product
    (decode shapes of Llama-3.2-1B and Qwen2-0.5B, 1 and 4 rows, with and without an addend)."""
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else FP32
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in [(1, 2048, 2048), (1, 512, 2048), (4, 8192, 2048), (1, 2048, 8192), (1, 128, 896), (2, 4864, 896)]:
        a = torch.randn(m, k, device="cuda", generator=g).to(dtype)
        w = torch.randn(n, k, device="cuda", generator=g).to(dtype) / k ** 0.5
        c = torch.randn(n, device="cuda", generator=g).to(dtype)
        for config in [cfg for cfg in G.CONFIGS if G.useful(n, k, cfg, m, dtype.itemsize)]:
            for addend in (None, c):
                out = torch.empty(m, n, device="cuda", dtype=dtype)
                CM._run_gemv(a, w.t(), addend, out, config)
                want = a.float() @ w.t().float() + (0 if addend is None else addend.float())
                torch.testing.assert_close(out.float(), want, **tol, msg=lambda s: f"{m}x{k}x{n} {config}: {s}")


@_CUDA
def test_last_program_reduces_equals_two_launches_call_after_call_cuda():
    """Note [The last program reduces] on the GPU: 300 calls reusing one counter buffer (the
    kernel puts the counters back), each bit for bit the two-launch result (a piece read before it
    was written, or a lost count, would differ or leave out unwritten)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for m, n, k in [(1, 512, 2048), (1, 2048, 8192), (4, 896, 896)]:
        a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
        c = torch.randn(n, device="cuda", generator=g).bfloat16()
        for config in [cfg for cfg in G.CONFIGS if cfg[4] and G.useful(n, k, cfg)]:
            want = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            CM._run_gemv(a, w.t(), c, want, (*config[:4], 0))
            counts = torch.zeros(G.counters(n, config), dtype=torch.int32, device="cuda")
            outs = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(300)]
            for out in outs:
                CM._run_gemv(a, w.t(), c, out, config, counts)
            assert all(torch.equal(out, want) for out in outs), (m, n, k, config)
            assert not counts.any()


@_CUDA
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_group_config_equals_torch_cuda(dtype):
    """Note [Products sharing a row block] on the GPU: each config a group may take (one split, or
    split-K with the last program reducing) for Llama-1B's q/k/v and gate/up and Qwen2-0.5B's q/k/v
    (biases), 1 and 4 rows, 50 calls reusing the counters, equals torch."""
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else FP32
    g = torch.Generator(device="cuda").manual_seed(2)
    for m, ns, k, bias in [(1, (2048, 512, 512), 2048, False), (4, (8192, 8192), 2048, False),
                           (1, (896, 128, 128), 896, True)]:
        a = torch.randn(m, k, device="cuda", generator=g).to(dtype)
        ws = [(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(dtype) for n in ns]
        cs = [torch.randn(n, device="cuda", generator=g).to(dtype) if bias else None for n in ns]
        wants = [a.float() @ w.t().float() + (0 if c is None else c.float()) for w, c in zip(ws, cs)]
        for config in [cfg for cfg in G.CONFIGS
                       if (cfg[2] == 1 or cfg[4]) and all(G.useful(n, k, cfg, m, dtype.itemsize) for n in ns)]:
            counts = torch.zeros(max(1, sum(G.counters(n, config) for n in ns)), dtype=torch.int32, device="cuda")
            for _ in range(50):
                outs = [torch.full((m, n), float("nan"), device="cuda", dtype=dtype) for n in ns]
                CM._run_group(a, [w.t() for w in ws], cs, outs, config, counts)
            for out, want in zip(outs, wants):
                torch.testing.assert_close(out.float(), want, **tol, msg=lambda s: f"{m} {ns} {k} {config}: {s}")
            assert not counts.any()


@_CUDA
def test_measured_choice_on_cuda():
    """On the GPU the pass times the operator and every useful config inside CUDA graphs; the
    result is the operator's (within rounding) whichever wins, and explain() lists the times."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(1, 2048, generator=g).cuda().bfloat16(), torch.randn(512, 2048, generator=g).cuda().bfloat16()
    with knobs.scope(decode_matmuls="cuda"):
        opt = trident.optimize(trident.capture(_linear, x, w))
    text = trident.explain(opt)
    assert "decode matmuls:" in text and "[measured: " in text and "aten " in text, text
    assert ("; each as added after a kernel, under programmatic dependent launch]" in text) == CM._chained(x.device)
    for _ in range(3):
        torch.testing.assert_close(opt(x, w), _linear(x, w), rtol=2e-2, atol=2e-2)


def test_explain_says_when_times_are_as_added_after_a_kernel():
    choice = {"config": [32, 256, 1, 4, 0], "us": {"aten": 6.2, CM._name((32, 256, 1, 4, 0)): 5.5}}
    plain, chained = CM.describe(choice, "mm 1x2048"), CM.describe(choice, "mm 1x2048", chained=True)
    assert plain.endswith("[measured: gemv(BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, num_warps=4) 5.50 us, aten 6.20 us]")
    assert chained == plain[:-1] + "; each as added after a kernel, under programmatic dependent launch]"


def test_candidates_are_timed_as_launched_under_pdl():
    """Note [Measured after a kernel]: under PDL a candidate is timed with the region's own launch
    arguments (PDL, the PREFETCH emit_launch gives the launch: gemv.prefetch_for) and programmatic
    serialization, a single product and a group alike; timed after a kernel only on a CUDA device that
    wants PDL for user kernels too."""
    a, b = torch.randn(1, 2048), torch.randn(512, 2048).t()
    configs = [c for c in G.CONFIGS if G.useful(512, 2048, c)]
    assert configs
    prefetches = set()
    for config in configs:
        single = [CM._launch_args(a, b, None, config, 1, 512, 2048, programmatic=p) for p in (False, True)]
        group = [CM._group_args(a, b, [512, 512], False, config, programmatic=p) for p in (False, True)]
        for (plain, made), grid, weight in ((single, G.grid(512, 2048, config), "b_ptr"),
                                            (group, G.group_grid([512, 512], config), "b0_ptr")):
            assert "PDL" not in plain and "PREFETCH" not in plain and "launch_pdl" not in plain
            assert made == {**plain, "PDL": True, "PREFETCH": made["PREFETCH"], "launch_pdl": True}
            assert made["PREFETCH"] == G.prefetch_for(grid, {**plain, weight: b})  # what emit_launch sets
            prefetches.add(made["PREFETCH"])
    assert len(prefetches) > 1  # the configs' K loops differ: not one constant
    for setting in ("", "cuda", "all"):
        with knobs.scope(pdl=setting):
            assert not CM._chained(torch.device("cpu"))


@_CUDA
def test_timed_after_a_kernel_on_cuda(monkeypatch):
    """On a GPU that wants PDL the measurement launches every candidate programmatically after
    `after_kernel`, and a time is what the candidate adds after it (that kernel's own time, chained,
    subtracted): below the two together; without PDL, or with user kernels in order, the product
    alone."""
    if not pdl.wanted(torch.device("cuda")):
        pytest.skip("PDL is not wanted on this GPU (compute capability < 9.0 or CUDA < 12.3)")
    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16).t()
    out = torch.empty(1, 2048, device="cuda", dtype=torch.bfloat16)
    config = (64, 128, 4, 4, 1)
    counts = torch.zeros(G.counters(2048, config), dtype=torch.int32, device="cuda")
    timer = CM._Timer(x, chained=True)
    assert timer.after is not None and 0 < timer.base < 100

    def gemv():
        CM._run_gemv(x, w, None, out, config, counts, programmatic=True)

    gemv()
    torch.testing.assert_close(out, x @ w, rtol=2e-2, atol=2e-2)
    added = timer(gemv)
    alone = CM._Timer(x, chained=False)(gemv)
    assert 0.001 < added < alone + timer.base, (added, alone, timer.base)
    seen = []
    run_gemv = CM._run_gemv
    monkeypatch.setattr(CM, "_run_gemv", lambda *a, **k: (seen.append(k.get("programmatic")), run_gemv(*a, **k))[1])
    times = CM._measure_cuda(torch.ops.aten.mm.default, x, w, None, [config, (32, 256, 1, 4, 0)], rounds=False)
    assert set(times) == {"aten", CM._name(config), CM._name((32, 256, 1, 4, 0))} and set(seen) == {True}
    assert CM._chained(x.device)
    for scope in ({"pdl": ""}, {"pdl_user_kernels": "0"}):
        with knobs.scope(**scope):
            assert not CM._chained(x.device)


def _stand_in_cases(device):
    base = torch.empty(64, 48, dtype=torch.bfloat16, device=device)
    return [base.t(), base[3:, 5:40], torch.empty(2, 3, 5, device=device).transpose(0, 2),
            torch.empty(7, dtype=torch.float16, device=device), torch.empty(2, 9, dtype=torch.int64, device=device),
            torch.empty(1, 1, 4, 16, dtype=torch.bool, device=device)[..., ::2]]


def _check_stand_in(v, s):
    assert (s.shape, s.stride(), s.storage_offset(), s.dtype, s.device) == \
        (v.shape, v.stride(), v.storage_offset(), v.dtype, v.device)
    if v.dtype == torch.bool:
        assert bool(s.all())
    elif v.is_floating_point():
        assert bool(((s >= -1) & (s <= 1)).all()) and s.float().std() > 0.3  # spread over [-1, 1)
    else:
        assert not bool(s.any())


def test_stand_ins_keep_the_layout_and_draw_from_the_callers_generator():
    """A measurement's stand-in has its value's sizes, strides, offset, dtype and device; floating
    values spread over [-1, 1) from the caller's generator (the same seed, the same values; the
    program's random stream untouched), integers 0, a mask all true."""
    from trident.passes.common import stand_in

    state = torch.get_rng_state()
    for v in _stand_in_cases("cpu"):
        s = stand_in(v, torch.Generator().manual_seed(0))
        _check_stand_in(v, s)
        assert torch.equal(s, stand_in(v, torch.Generator().manual_seed(0)))
        if v.is_floating_point():
            assert not torch.equal(s, stand_in(v, torch.Generator().manual_seed(1)))
    assert torch.equal(torch.get_rng_state(), state)
    if torch.cuda.is_available():  # a generator of another device type: drawn on the host from its seed
        v = _stand_in_cases("cpu")[0]
        _check_stand_in(v, stand_in(v, torch.Generator(device="cuda").manual_seed(0)))


@_CUDA
def test_stand_ins_are_drawn_on_the_device_cuda():
    """With a generator of the device the stand-ins are drawn there (no host copy of a weight):
    same layout, spread and determinism; the program's CUDA random stream is left alone."""
    from trident.passes.common import stand_in

    state = torch.cuda.get_rng_state()
    for v in _stand_in_cases("cuda"):
        s = stand_in(v, torch.Generator(device="cuda").manual_seed(0))
        _check_stand_in(v, s)
        assert torch.equal(s, stand_in(v, torch.Generator(device="cuda").manual_seed(0)))
    assert torch.equal(torch.cuda.get_rng_state(), state)


@pytest.mark.parametrize("setting", ["cache_dir", "tuning_dir"])
def test_the_choice_is_kept_in_the_cache_dir_and_restored(tmp_path, setting):
    """With TRIDENT_CACHE_DIR a measured choice is written beside the plans, without it in
    TRIDENT_TUNING_DIR (Note [Kept measurements]), and a later process (here: the process's memo
    cleared) takes it from there without measuring again; an entry naming a config the pass does
    not measure is ignored."""
    x, w = torch.randn(1, 1024), torch.randn(64, 1024)
    config = (64, 128, 4, 4, 1)
    label = "TRIDENT_" + setting.upper()
    with knobs.scope(**{setting: str(tmp_path)}, **{"cache_dir": None} if setting == "tuning_dir" else {}):
        opt = _run(_linear, [x, w], config)
        assert "gemv_kernel" in _launches(opt)

        def no_timer(*_):
            raise AssertionError("measured again")

        CM.set_timer(no_timer)  # also clears the process's memo
        with knobs.scope(decode_matmuls="all"):
            opt = trident.optimize(trident.capture(_linear, x, w))
        assert _launches(opt) == ["axpy_kernel", "gemv_kernel"]
        assert f"gemv(BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, LAST_REDUCES, num_warps=4) [measured, from {label}: " \
            in trident.explain(opt)
        torch.testing.assert_close(opt(x, w), _linear(x, w), **FP32)
        import json
        import pathlib

        (entry,) = pathlib.Path(tmp_path, "decode-matmul").rglob("*.json")
        data = json.loads(entry.read_text())
        data["value"]["config"] = [48, 128, 1, 4, 0]  # not a config of gemv.CONFIGS
        entry.write_text(json.dumps(data))
        CM.set_timer(_favor("aten"))
        with knobs.scope(decode_matmuls="all"):
            opt = trident.optimize(trident.capture(_linear, x, w))
        assert _launches(opt) == ["axpy_kernel"]  # measured again: the operator wins


def test_bf16_on_the_cpu_keeps_the_operator_where_the_interpreter_cannot_multiply_it():
    """Triton's interpreter multiplies bf16 tl.dot tiles as their integer bit patterns: on the
    CPU a bf16 product of 2-16 rows (the tl.dot path) keeps the operator; one row (fp32 multiply
    and sum) runs the GEMV (review of the pass, 2026-12-03)."""
    g = torch.Generator().manual_seed(0)
    for m, rewritten in ((1, True), (4, False)):
        x, w = torch.randn(m, 256, generator=g).bfloat16(), torch.randn(64, 256, generator=g).bfloat16()
        opt = _run(_linear, [x, w], (32, 256, 1, 4, 0))
        assert ("gemv_kernel" in _launches(opt)) == rewritten
        torch.testing.assert_close(opt(x, w).float(), _linear(x, w).float(), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("config", _DEFAULT_LOOPS, ids=lambda c: "x".join(map(str, c)))
def test_every_config_through_the_interpreter(config):
    """Each configuration the pass may choose, for one row (the multiply-and-sum path) and for
    three (the tl.dot path), with an addend, equals the operator."""
    g = torch.Generator().manual_seed(7)
    n, k = 96, 2048
    assert G.useful(n, k, config)
    for m in (1, 3):
        x, w, bias = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
        opt = _run(_linear_bias, [x, w, bias], config)
        assert "gemv_kernel" in _launches(opt)
        torch.testing.assert_close(opt(x, w, bias), _linear_bias(x, w, bias), **FP32)


def _sm90(config, m=1, n=2048, k=2048, dtype=torch.bfloat16):
    """gemv_kernel compiled for sm_90 with `config` (bf16, an nn.Linear weight seen through .t()),
    nothing launched: on the CPU through the host-only driver."""
    a, w = torch.empty(m, k, dtype=dtype), torch.empty(n, k, dtype=dtype)
    out, ws = torch.empty(m, n, dtype=dtype), torch.empty(config[2], m, n)
    counts = torch.zeros(max(1, G.counters(n, config)), dtype=torch.int32)
    return G.gemv_kernel.warmup(a, w.t(), a, out, ws, counts, grid=G.grid(n, k, config),
                                **CM._launch_args(a, w.t(), None, config, m, n, k))


def test_pipelined_and_unrolled_loops_put_more_tiles_in_flight():
    """Note [Bytes in flight], checked in the sm_90 code Triton emits: STAGES=3 loads the weight's
    tiles through shared memory with cp.async, 2 tiles ahead (two buffers of a 64 x 128 bf16 tile);
    UNROLL=2 issues twice the 128-bit global loads per loop iteration; the default loop neither."""
    import re

    base = G.Config(64, 128, 1, 4, 0)
    plain, staged, unrolled = (_sm90(c) for c in (base, base._replace(stages=3), base._replace(unroll=2)))
    vector_loads = [len(re.findall(r"ld\.global(?:\.\w+)*\.v4", k.asm["ptx"])) for k in (plain, staged, unrolled)]
    assert "cp.async" not in plain.asm["ptx"] and "cp.async" in staged.asm["ptx"], vector_loads
    assert staged.metadata.shared >= 2 * 64 * 128 * 2 > plain.metadata.shared
    assert vector_loads[0] >= 8 and vector_loads[2] >= 2 * vector_loads[0], vector_loads
    assert vector_loads[1] < vector_loads[0], vector_loads  # pipelined: cp.async instead


def test_pipelined_configs_only_where_their_tiles_fit_in_shared_memory():
    """A pipelined K loop keeps its weight tiles in shared memory: fp32's 64 x 256 tiles at 3
    stages asked the H200 for 327,680 bytes and could not launch. `useful` keeps a pipelined config
    only where G.pipelined_bytes, an upper bound of what Triton's sm_90 code asks for (checked
    here for every pipelined config, bf16 and fp32), fits in SHARED_BYTES."""
    for dtype in (torch.bfloat16, torch.float32):
        for config in {c for c in G.CONFIGS if c.stages}:
            asked = _sm90(config, k=8192, dtype=dtype).metadata.shared
            assert asked <= G.pipelined_bytes(config, dtype.itemsize), (config, dtype, asked)
            fits = G.pipelined_bytes(config, dtype.itemsize) <= G.SHARED_BYTES
            assert G.useful(2048, 8192, config, 1, dtype.itemsize) == fits, (config, dtype)
            if dtype == torch.bfloat16:
                assert fits, config  # every bf16 tile: the decode products' dtype
    assert not G.useful(2048, 8192, G.Config(64, 256, 1, 4, 0, stages=3), 1, 4)
    # the tl.dot loop of more rows (Triton pipelines it by default): fp32 64x256 unrolled twice asked an
    # H100 for 327,680 bytes and could not launch
    for dtype in (torch.bfloat16, torch.float32):
        for config in {c for c in G.CONFIGS if not c.stages}:
            asked = _sm90(config, m=4, n=8192, k=8192, dtype=dtype).metadata.shared
            assert asked <= G.pipelined_bytes(config, dtype.itemsize, 4), (config, dtype, asked)
            fits = G.pipelined_bytes(config, dtype.itemsize, 4) <= G.SHARED_BYTES
            assert G.useful(8192, 8192, config, 4, dtype.itemsize) == (fits and G.useful(8192, 8192, config, 4, 2)), \
                (config, dtype)
    assert not G.useful(8192, 8192, G.Config(64, 256, 1, 8, 0, unroll=2), 4, 4)
    assert G.useful(8192, 8192, G.Config(64, 256, 1, 8, 0, unroll=2), 4, 2)
    # a GPU with less (an RTX 4090's opt-in block: 101,376 bytes): the device's own limit decides
    small = 101376
    assert G.useful(2048, 8192, G.Config(64, 256, 1, 4, 0, stages=3), 1, 2)
    assert not G.useful(2048, 8192, G.Config(64, 256, 1, 4, 0, stages=3), 1, 2, small)
    assert all(G.pipelined_bytes(c, 2) <= small for c in G.CONFIGS if G.useful(2048, 8192, c, 1, 2, small))
    assert CM._shared_bytes(torch.device("cpu")) == G.SHARED_BYTES  # no device to ask: H100/H200's


def test_pipelined_and_unrolled_configs_only_where_they_change_the_kernel():
    """A pipelined config is measured for one row only (Triton pipelines the tl.dot loop of more
    rows by default) and only where the loop runs at least STAGES tiles; an unrolled one where it
    runs at least UNROLL."""
    staged, unrolled = G.Config(64, 128, 4, 4, 1, stages=3), G.Config(64, 128, 4, 4, 1, unroll=2)
    assert G.useful(2048, 2048, staged, m=1) and not G.useful(2048, 2048, staged, m=4)  # 4 tiles a split
    assert not G.useful(2048, 1024, staged) and G.useful(2048, 1024, unrolled)  # 2 tiles a split
    assert not G.useful(2048, 512, unrolled) and G.useful(2048, 512, G.Config(64, 128, 4, 4, 1))
    assert {c for c in G.CONFIGS if G.useful(2048, 2048, c, m=4)} >= {c._replace(unroll=2) for c in _DEFAULT_LOOPS
                                                                   if G.useful(2048, 1024, c, m=4)}


def test_a_pipelined_config_is_chosen_named_and_restored(tmp_path):
    """A config with its loads pipelined runs through the pass like any (the interpreter ignores
    the stages), explain() names it, and the choice comes back from TRIDENT_CACHE_DIR with them."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(1, 1024, generator=g), torch.randn(64, 1024, generator=g)
    config = G.Config(64, 128, 1, 4, 0, stages=3)
    assert config in G.CONFIGS
    name = "gemv(BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, STAGES=3, num_warps=4)"
    with knobs.scope(cache_dir=str(tmp_path)):
        opt = _run(_linear, [x, w], config)
        assert _launches(opt) == ["axpy_kernel", "gemv_kernel"] and f"{name} [measured: " in trident.explain(opt)
        torch.testing.assert_close(opt(x, w), _linear(x, w), **FP32)

        def no_timer(*_):
            raise AssertionError("measured again")

        CM.set_timer(no_timer)  # also clears the process's memo
        with knobs.scope(decode_matmuls="all"):
            opt = trident.optimize(trident.capture(_linear, x, w))
        assert f"{name} [measured, from TRIDENT_CACHE_DIR: " in trident.explain(opt)
        torch.testing.assert_close(opt(x, w), _linear(x, w), **FP32)


@_CUDA
def test_pipelined_and_unrolled_loops_give_the_same_bits_cuda():
    """Note [Bytes in flight]: the stages and the unrolling change when tiles are loaded, not the
    order they are summed in: each such config's result is bit for bit its default loop's."""
    g = torch.Generator(device="cuda").manual_seed(3)
    for m, n, k in [(1, 2048, 2048), (1, 512, 2048), (1, 2048, 8192), (1, 4864, 896), (4, 8192, 2048)]:
        a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
        c = torch.randn(n, device="cuda", generator=g).bfloat16()
        for config in [cfg for cfg in G.CONFIGS if (cfg.stages or cfg.unroll > 1) and G.useful(n, k, cfg, m)]:
            want = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            CM._run_gemv(a, w.t(), c, want, config._replace(stages=0, unroll=1))
            got = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            CM._run_gemv(a, w.t(), c, got, config)
            assert torch.equal(got, want), (m, n, k, config)


def test_other_k_loops_are_measured_for_the_two_fastest_tiles_only():
    """Note [Bytes in flight]: the first round times every tile with the default loop, the second
    the pipelined and unrolled loops of the two fastest; the choice is the fastest of both."""
    x, w = torch.randn(1, 2048), torch.randn(96, 2048)
    useful = [c for c in G.CONFIGS if G.useful(96, 2048, c, 1, x.dtype.itemsize)]
    tiles = [c for c in useful if c == _tile(c)]
    fast = [tiles[3], tiles[1]]  # the two fastest tiles with the default loop
    timed = []

    def timer(name, shape, cfg):
        timed.append(cfg)
        if name == "aten":
            return 10.0
        speed = {fast[0]: 2.0, fast[1]: 3.0}.get(_tile(cfg), 5.0)
        return speed - (1.5 if cfg.unroll > 1 and _tile(cfg) == fast[1] else 0.0)  # fast[1] unrolled: 1.5

    CM.set_timer(timer)
    with knobs.scope(decode_matmuls="all"):
        opt = trident.optimize(trident.capture(_linear, x, w))
    others = [c for c in timed[1:] if c != _tile(c)]
    assert timed[1:len(tiles) + 1] == tiles and set(others) == {c for c in useful if c != c._replace(
        stages=0, unroll=1) and _tile(c) in fast}, (timed, fast)
    assert len(timed) == 1 + len(tiles) + len(others)
    assert f"{CM._name(fast[1]._replace(unroll=2))} [measured: " in trident.explain(opt)


def test_weights_are_prefetched_before_the_wait():
    """Note [Weights ahead of the wait], in the sm_90 code: with PDL and PREFETCH a GEMV program
    asks the L2 for its weight lines (one prefetch per 128-byte line of each tile it streams)
    before griddepcontrol.wait, and its loop is the same; emit_launch sets PREFETCH with PDL for
    CUDA tensors only (the interpreter runs no inline PTX)."""
    import re

    config = G.Config(32, 256, 1, 4, 0)
    m, n, k = 1, 2048, 2048
    a, w = torch.empty(m, k, dtype=torch.bfloat16), torch.empty(n, k, dtype=torch.bfloat16)
    out, ws = torch.empty(m, n, dtype=torch.bfloat16), torch.empty(1, m, n)
    counts = torch.zeros(1, dtype=torch.int32)
    args = CM._launch_args(a, w.t(), None, config, m, n, k)
    plain = G.gemv_kernel.warmup(a, w.t(), a, out, ws, counts, grid=G.grid(n, k, config), **args, PDL=True)
    tiles = G.prefetch_tiles(math.prod(G.grid(n, k, config)), k, 32, 256, 1, 2)
    assert tiles == 8  # 64 programs x 8 tiles of 16 KB: 8 MB, within PREFETCH_BYTES
    assert G.prefetch_for(G.grid(n, k, config), {**args, "b_ptr": w.t()}) == tiles  # what emit_launch sets
    # larger than the budget (Llama's gate/up: 67 MB; an lm_head): as many tiles as fit, at least one
    assert G.prefetch_tiles(2 * 8192 // 32, 2048, 32, 256, 1, 2) == 2
    assert G.prefetch_tiles(128256 // 32, 2048, 32, 256, 1, 2) == 1
    ahead = G.gemv_kernel.warmup(a, w.t(), a, out, ws, counts, grid=G.grid(n, k, config), **args, PDL=True,
                                 PREFETCH=tiles)
    ptx = ahead.asm["ptx"]
    assert "prefetch.global.L2" not in plain.asm["ptx"]
    assert ptx.index("prefetch.global.L2") < ptx.index("griddepcontrol.wait")
    # 32 rows x 4 lines a tile, 8 tiles: 1024 lines over 128 threads, 8 prefetch instructions each
    assert len(re.findall(r"prefetch\.global\.L2", ptx)) == 1024 // 128
    first = G.gemv_kernel.warmup(a, w.t(), a, out, ws, counts, grid=G.grid(n, k, config), **args, PDL=True,
                                 PREFETCH=1)
    assert len(re.findall(r"prefetch\.global\.L2", first.asm["ptx"])) == 1  # the first tile's 128 lines
    # and the launch stays programmatic: nothing before the wait reads a value or branches
    assert pdl.waits_before_memory(plain.asm["ptx"]) and pdl.waits_before_memory(ptx)
    group = G.gemv_group_kernel.warmup(
        a, w.t(), w.t(), w.t(), a, a, a, out, out, out, ws, counts, m, k, n, n, n, k, 1, 1, k, 1, 0,
        MEMBERS=3, HAS_C=False, SPLIT_K=1, PRECISION="tf32", BLOCK_M=1, BLOCK_N=32, BLOCK_K=256, PDL=True,
        PREFETCH=2, grid=(3 * n // 32, 1, 1))
    gptx = group.asm["ptx"]
    assert "prefetch.global.L2" in gptx and gptx.index("prefetch.global.L2") < gptx.index("griddepcontrol.wait")
    assert pdl.waits_before_memory(gptx)
    assert not pdl.waits_before_memory(gptx.replace("prefetch.global.L2", "prefetch.global.L1"))  # L1: not coherent


def test_narrow_tiles_only_for_one_row():
    """The 8-column tile (one-row products' narrow tiles, no split) is measured for one row only:
    tl.dot, which products of more rows use, takes tiles of at least 16 columns."""
    narrow = G.Config(8, 1024, 1, 4, 0)
    assert narrow in G.CONFIGS and G.useful(896, 896, narrow)
    assert not G.useful(896, 896, narrow, m=4)
    assert G.useful(896, 896, G.Config(16, 512, 1, 4, 0), m=4)
