"""Graph replay (Note [Graph replay]): the policy, staging, pinning and copy-out, on the CPU
through the emulated mode (TRIDENT_GRAPHS=all: a "graph" reruns the host program on the
static inputs), and on CUDA with real graphs (marked cuda)."""

from __future__ import annotations

import functools

import expecttest
import pytest
import torch
import triton

import trident
from tests.decode_model import (
    Config,
    check_steps_against_reference,
    decode_step,
    decode_step_reference,
    make_caches,
    make_weights,
)
from tests.kernels import axpy, axpy_kernel, inplace_mul_kernel
from trident import knobs
from trident.runtime import SCMRuntime, graphs
from trident.runtime.native import C


def _region(opt):
    (rid,) = opt.meta["trident_regions"]
    return rid


def _optimized_decode(device, cfg, batch=1, **knob_values):
    weights, cos, sin = make_weights(cfg, device)
    step = functools.partial(decode_step, cfg)
    x0 = torch.randn(batch, cfg.hidden, device=device)
    with knobs.scope(**knob_values):
        opt = trident.optimize(
            trident.capture(step, x0, torch.tensor([0], device=device), cos, sin, *make_caches(cfg, device, batch=batch), *weights)
        )
    return opt, weights, cos, sin


def _graph_device(device, always=True):
    """Graphs on for `device`; `always`: also for regions too small for a replay to pay off
    (Note [When a graph pays off]), so the mechanism is tested on one- and two-kernel regions."""
    mode = {"graphs": "all"} if device == "cpu" else {"graphs": "cuda"}
    return mode | ({"graph_min_saving_us": "-inf"} if always else {})


def test_decode_loop_feeding_each_output_back_replays(device):
    """x = opt(x, pos, ...): the hidden state is the previous step's output (a fresh tensor per
    replay), the position a new tensor: one graph, staged x and pos, results exact."""
    cfg = Config()
    opt, weights, cos, sin = _optimized_decode(device, cfg, **_graph_device(device, always=False))
    caches, ref_caches = make_caches(cfg, device), make_caches(cfg, device)
    x = torch.randn(1, cfg.hidden, device=device)
    x_ref = x.clone()
    for p in range(10):
        x = opt(x, torch.tensor([p], device=device), cos, sin, *caches, *weights)
        x_ref = decode_step_reference(cfg, x_ref, torch.tensor([p], device=device), cos, sin, *ref_caches, *weights)
        torch.testing.assert_close(x, x_ref, rtol=1e-4, atol=1e-4)
    (g,) = C.graph_stats(_region(opt))["graphs"]
    names = [i.name for i in SCMRuntime.get(_region(opt)).program.inputs]
    assert sorted(names[i] for i in g["staged"]) == ["pos", "x"] and g["replays"] == 8


def test_decode_steps_replay_one_graph_with_moving_token_and_position(device):
    """Fresh x and pos tensors every step (their addresses move): they are staged, everything
    else (weights, caches) pinned; outputs and caches equal the reference at every step."""
    cfg = Config()
    opt, weights, cos, sin = _optimized_decode(device, cfg, **_graph_device(device, always=False))
    check_steps_against_reference(cfg, opt, weights, cos, sin, range(8), device)
    st = C.graph_stats(_region(opt))
    assert st["off_reason"] is None
    (g,) = st["graphs"]
    names = [i.name for i in SCMRuntime.get(_region(opt)).program.inputs]
    assert sorted(names[i] for i in g["staged"]) == ["pos", "x"]  # x, pos
    assert g["replays"] == 6  # recorded after 2 ordinary calls
    (stats,) = trident.cache_info(opt).values()
    assert stats["hits"] == 8 and stats["misses"] == 0 and stats["graph_replays"] == 6


def test_moved_written_input_takes_the_ordinary_path_then_is_staged(device):
    """Caches that never moved are pinned: at new addresses they match no graph (ordinary path,
    still exact); two such calls later a graph staging them both ways replaces the first one
    (Note [Graph lifetimes])."""
    cfg = Config(layers=1)
    opt, weights, cos, sin = _optimized_decode(device, cfg, **_graph_device(device))
    caches = make_caches(cfg, device)
    ref = make_caches(cfg, device)
    xs = [torch.randn(1, cfg.hidden, device=device) for _ in range(7)]  # held: addresses differ
    ps = [torch.tensor([p], device=device) for p in range(7)]
    outs, want = [], []
    for p in range(7):
        if p == 3:
            caches = [c.clone() for c in caches]  # same contents, new addresses
        outs.append(opt(xs[p], ps[p], cos, sin, *caches, *weights))
        want.append(decode_step_reference(cfg, xs[p].clone(), ps[p], cos, sin, *ref, *weights))
    for o, w in zip(outs, want):
        torch.testing.assert_close(o, w, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref):
        torch.testing.assert_close(c, r, rtol=1e-4, atol=1e-4)
    st = C.graph_stats(_region(opt))
    assert [g["replays"] for g in st["graphs"]] == [1, 2]
    assert [g["retired"] for g in st["graphs"]] == [True, False]
    written = [i for i, inp in enumerate(SCMRuntime.get(_region(opt)).program.inputs) if inp.mutated]
    assert len(written) == 2 and st["graphs"][1]["written_back"] == written  # the two caches
    assert st["declined"] == 2


def _inplace_scaled_add(x, a):
    # x (written, pinned) += 2 * a (read: staged when it moves)
    n = x.numel()
    axpy_kernel[(triton.cdiv(n, 64),)](a, x, x, n, 2.0, BLOCK=64)
    inplace_mul_kernel[(triton.cdiv(n, 64),)](x, n, 0.5, BLOCK=64)
    return x


def _inplace_reference(x, a):
    x.copy_((x + 2.0 * a) * 0.5)
    return x


def _optimized_inplace(device):
    x, a = torch.zeros(256, device=device), torch.zeros(256, device=device)
    with knobs.scope(**_graph_device(device)):
        return trident.optimize(trident.capture(_inplace_scaled_add, x, a))


def test_staged_input_aliasing_a_written_input_is_not_replayed(device):
    opt = _optimized_inplace(device)
    x = torch.randn(256, device=device)
    x_ref = x.clone()
    fresh = [torch.randn(256, device=device) for _ in range(4)]  # held: their addresses differ
    for a in fresh:  # a fresh `a` each call: staged
        opt(x, a)
        _inplace_reference(x_ref, a)
    torch.testing.assert_close(x, x_ref)
    (g,) = C.graph_stats(_region(opt))["graphs"]
    assert g["staged"] == [1] and g["replays"] == 2
    # Now `a` is x itself: staging would snapshot x before the kernels write it.
    for _ in range(2):
        opt(x, x)
        _inplace_reference(x_ref, x_ref)
    torch.testing.assert_close(x, x_ref)
    st = C.graph_stats(_region(opt))
    assert st["graphs"][0]["replays"] == 2 and st["declined"] == 2


def test_graph_limit_and_off_switch(device):
    with knobs.scope(graph_limit="1"):
        opt = _optimized_inplace(device)
    x = torch.zeros(256, device=device)
    fresh = [torch.randn(256, device=device) for _ in range(8)]
    moved = [x.clone() for _ in range(4)]
    for i in range(8):
        opt(x if i < 4 else moved[i - 4], fresh[i])  # x (written, pinned) moves after 4 calls
    st = C.graph_stats(_region(opt))
    # at the limit, a graph staging x may still replace the one that pinned it (Note [Graph lifetimes])
    assert [(g["staged"], g["retired"]) for g in st["graphs"]] == [([1], True), ([0, 1], False)]
    assert st["declined"] == 2 and st["graphs"][1]["replays"] == 2
    # a graph for other calls (float64) is recorded too, and at the limit the least recently
    # used live graph goes (Note [Graph bound]); explain says so
    x64 = torch.zeros(256, device=device, dtype=torch.float64)
    for _ in range(4):
        opt(x64, torch.randn(256, device=device, dtype=torch.float64))
    st = C.graph_stats(_region(opt))
    assert [(g["retired"], g["evicted"]) for g in st["graphs"]] == [(True, False), (True, True), (False, False)]
    assert st["evicted"] == 1 and st["graphs"][2]["replays"] == 2
    assert "bound reached (TRIDENT_GRAPH_LIMIT=1 live graphs" in trident.explain(opt)
    x2 = torch.zeros(256, device=device)
    for _ in range(2):  # float32 again: the next graph after two calls, float64's evicted
        opt(x2, torch.randn(256, device=device))
    assert C.graph_stats(_region(opt))["evicted"] == 2
    with knobs.scope(graphs=""):
        x, a = torch.zeros(256, device=device), torch.zeros(256, device=device)
        off = trident.optimize(trident.capture(_inplace_scaled_add, x, a))
    for _ in range(4):
        off(x, torch.randn(256, device=device))
    assert C.graph_stats(_region(off))["graphs"] == []
    assert "graphs: off (TRIDENT_GRAPHS='')" in trident.explain(off)


def test_explain_lists_graphs(device):
    opt = _optimized_inplace(device)
    x = torch.zeros(256, device=device)
    assert "graphs: none recorded yet" in trident.explain(opt)
    for a in [torch.randn(256, device=device) for _ in range(5)]:
        opt(x, a)
    mode = "emulated" if device == "cpu" else "CUDA"
    assert f"graph 0 ({mode}): 3 replay(s), 1.0 KiB held; staged: a; pinned: the other 1 input(s)" in trident.explain(opt)


def test_random_operators_never_use_graphs():
    def noisy(x):
        out = torch.empty_like(x)
        n = x.numel()
        axpy_kernel[(triton.cdiv(n, 64),)](x, torch.rand_like(x), out, n, 1.0, BLOCK=64)
        return out

    x = torch.zeros(64)
    with knobs.scope(graphs="all"):
        opt = trident.optimize(trident.capture(noisy, x))
    outs = [opt(x) for _ in range(4)]
    assert not torch.equal(outs[2], outs[3])  # new random numbers every call
    assert C.graph_stats(_region(opt))["graphs"] == []
    assert "draws random numbers" in trident.explain(opt)


def test_knob_values_are_checked():
    with knobs.scope(graphs="sometimes"), pytest.raises(ValueError, match="TRIDENT_GRAPHS"):
        knobs.graphs()
    with knobs.scope(graph_limit="99"), pytest.raises(ValueError, match="0..16"):
        knobs.graph_limit()
    with knobs.scope(graph_min_saving_us="soon"), pytest.raises(ValueError, match="TRIDENT_GRAPH_MIN_SAVING_US"):
        knobs.graph_min_saving_us()


def test_a_region_too_small_to_pay_off_keeps_the_ordinary_path(device):
    """One kernel writing a fresh tensor: a replay (graph launch, staging copy, output copy) would
    cost more host time than the launch it replaces, so none is recorded (Note [When a graph pays
    off]); results stay right and explain() says why with both estimates."""
    x = torch.randn(256, device=device)
    with knobs.scope(**_graph_device(device, always=False)):
        opt = trident.optimize(trident.capture(_axpy, x, torch.zeros(256, device=device)))
    fresh = [torch.randn(256, device=device) for _ in range(5)]
    for a in fresh:
        torch.testing.assert_close(opt(x, a), 2.0 * a + x)
    st = C.graph_stats(_region(opt))
    assert st["graphs"] == [] and "would not pay off" in st["off_reason"]
    program = SCMRuntime.get(_region(opt)).program
    assert graphs.ordinary_cost_us(program) < graphs.replay_cost_us(program, staged=1)
    assert "estimated host cost 7.7 µs per replay vs 3.3 µs per ordinary call" in trident.explain(opt)
    # A caller who wants every region replayed (a benchmark of the mechanism) can say so.
    with knobs.scope(**_graph_device(device, always=True)):
        opt = trident.optimize(trident.capture(_axpy, x, torch.zeros(256, device=device)))
    for a in fresh:
        torch.testing.assert_close(opt(x, a), 2.0 * a + x)
    assert C.graph_stats(_region(opt))["graphs"][0]["replays"] == 3


def test_cost_estimates_rank_a_decode_step_for_graphs():
    cfg = Config()
    opt, *_ = _optimized_decode("cpu", cfg)
    program = SCMRuntime.get(_region(opt)).program
    ordinary, replay = graphs.ordinary_cost_us(program), graphs.replay_cost_us(program, staged=2)
    assert ordinary > 10 * replay, (ordinary, replay)


@pytest.mark.cuda
def test_user_capture_sees_ordinary_launches():
    """Inside a caller's own torch.cuda.graph capture the region launches normally (no replay,
    no recording), so the caller's graph contains the work and replays it correctly."""
    opt = _optimized_inplace("cuda")
    x = torch.zeros(256, device="cuda")
    a = torch.ones(256, device="cuda")
    for a_i in [torch.randn(256, device="cuda") for _ in range(4)]:
        opt(x, a_i)
    replays = C.graph_stats(_region(opt))["graphs"][0]["replays"]
    x.zero_()
    _replay_in_a_user_capture(opt, x, a)
    assert C.graph_stats(_region(opt))["graphs"][0]["replays"] == replays


def _replay_in_a_user_capture(opt, x, a):
    """The caller captures one call of `opt` into its own CUDA graph and replays it 3 times."""
    graph, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=s):
        opt(x, a)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(x, torch.full_like(x, 1.75))  # x = (x + 2a) / 2 three times from 0, a = 1


@pytest.mark.cuda
def test_user_capture_of_a_region_with_a_written_staged_input():
    """The region's graph stages x both ways (x moved); inside the caller's own capture the
    region still launches ordinarily on the caller's x, and the caller's graph replays right."""
    opt = _optimized_inplace("cuda")
    held = [(torch.randn(256, device="cuda"), torch.randn(256, device="cuda")) for _ in range(4)]
    for x, a in held:  # held: distinct addresses, so x moves (staged, written back)
        opt(x, a)
    (g,) = C.graph_stats(_region(opt))["graphs"]
    assert g["written_back"] == [0] and g["replays"] == 2
    _replay_in_a_user_capture(opt, torch.zeros(256, device="cuda"), torch.ones(256, device="cuda"))
    st = C.graph_stats(_region(opt))
    assert st["graphs"][0]["replays"] == 2 and st["last_ordinary"][0] == "capturing"


@pytest.mark.cuda
def test_replay_on_another_stream_uses_the_ordinary_path_or_its_own_graph():
    opt = _optimized_inplace("cuda")
    x = torch.zeros(256, device="cuda")
    x_ref = x.clone()
    s = torch.cuda.Stream()
    fresh = [torch.randn(256, device="cuda") for _ in range(8)]
    for i, a in enumerate(fresh):
        stream = s if i >= 4 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            opt(x, a)
        torch.cuda.current_stream().wait_stream(stream)
        _inplace_reference(x_ref, a)
    torch.testing.assert_close(x, x_ref)
    st = C.graph_stats(_region(opt))
    assert len(st["graphs"]) == 2 and {g["stream"] for g in st["graphs"]} == {
        torch.cuda.current_stream().cuda_stream, s.cuda_stream}


def _axpy(x, a):
    out = torch.empty_like(x)
    n = x.numel()
    axpy_kernel[(triton.cdiv(n, 64),)](a, x, out, n, 2.0, BLOCK=64)
    return out


def test_replayed_outputs_are_fresh_and_keep_their_values(device):
    """Each replay returns new tensors: a result kept from an earlier call is not overwritten
    by the next replay (the graph's own output buffer is)."""
    x = torch.randn(256, device=device)
    with knobs.scope(**_graph_device(device)):
        opt = trident.optimize(trident.capture(_axpy, x, torch.zeros(256, device=device)))
    fresh = [torch.randn(256, device=device) for _ in range(6)]
    outs = [opt(x, a) for a in fresh]
    for a, o in zip(fresh, outs):
        torch.testing.assert_close(o, 2.0 * a + x)
    assert len({o.data_ptr() for o in outs}) == len(outs)
    (g,) = C.graph_stats(_region(opt))["graphs"]
    assert g["replays"] == 4


def test_new_dtype_gets_its_own_specialization_and_graph(device):
    """Facts include the dtype: a float64 call matches no float32 graph (ordinary path, a new
    specialization), and two such calls later it has a graph of its own."""
    opt = _optimized_inplace(device)
    xs = {dt: torch.randn(256, device=device, dtype=dt) for dt in (torch.float32, torch.float64)}
    refs = {dt: x.clone() for dt, x in xs.items()}
    for dtype in (torch.float32, torch.float64, torch.float32, torch.float64):
        for a in [torch.randn(256, device=device, dtype=dtype) for _ in range(3)]:
            opt(xs[dtype], a)
            _inplace_reference(refs[dtype], a)
        torch.testing.assert_close(xs[dtype], refs[dtype])
    st = C.graph_stats(_region(opt))
    assert [g["replays"] for g in st["graphs"]] == [4, 4]
    (stats,) = trident.cache_info(opt).values()
    assert stats["specializations"] == 2 and stats["hits"] + stats["misses"] == 12


def _scale_rows(x, out):
    # x read through its strides by ATen (any layout), then a kernel: out = 2 * (3 x) + out
    y = torch.mul(x, 3.0).contiguous()
    n = out.numel()
    axpy_kernel[(triton.cdiv(n, 64),)](y, out, out, n, 2.0, BLOCK=64)
    return out


@pytest.mark.parametrize(
    "make",
    [
        lambda dev: torch.randn(4, 16, device=dev)[:, ::2],  # strided (gaps between elements)
        lambda dev: torch.randn(1, 8, device=dev).expand(4, 8),  # stride 0: rows overlap
        lambda dev: torch.randn(8, 4, device=dev).t(),  # transposed
        lambda dev: torch.randn(40, device=dev)[3:35].view(4, 8),  # storage offset
    ],
    ids=["strided", "expanded", "transposed", "offset"],
)
def test_staged_inputs_of_any_layout(device, make):
    """A staged input is copied as the bytes its elements span, into a buffer with its strides
    and address residue: any layout gives eager's result."""
    example = make(device)
    out = torch.zeros(4, 8, device=device)
    with knobs.scope(**_graph_device(device)):
        opt = trident.optimize(trident.capture(_scale_rows, example, out))
    xs = [make(device) for _ in range(5)]  # held: addresses differ
    for x in xs:
        out.zero_()  # written: pinned at its address
        opt(x, out)
        torch.testing.assert_close(out, 6.0 * x)
    (g,) = C.graph_stats(_region(opt))["graphs"]
    names = [i.name for i in SCMRuntime.get(_region(opt)).program.inputs]
    assert [names[i] for i in g["staged"]] == ["x"] and g["replays"] == 3


@pytest.mark.parametrize("seed", range(3))
def test_random_call_sequences_equal_the_reference(device, seed):
    """Differential test of the replay policy: 40 calls choosing at random among written tensors
    (pinned), read tensors (staged or pinned), the read tensor being the written one, and two
    dtypes; after every call the written tensor equals the reference computed in PyTorch."""
    g = torch.Generator().manual_seed(seed)
    opt = _optimized_inplace(device)

    def rand(dtype):
        return torch.randn(256, generator=g, dtype=dtype).to(device)

    dtypes = (torch.float32, torch.float64)
    written = {dt: [rand(dt) for _ in range(2)] for dt in dtypes}
    reads = {dt: [rand(dt) for _ in range(3)] for dt in dtypes}
    refs = {dt: [w.clone() for w in ws] for dt, ws in written.items()}
    for _ in range(40):
        dt = dtypes[int(torch.randint(0, 2, (1,), generator=g))]
        wi = int(torch.randint(0, 2, (1,), generator=g))
        choice = int(torch.randint(0, 5, (1,), generator=g))
        if choice == 4:  # the read tensor is the written one
            opt(written[dt][wi], written[dt][wi])
            _inplace_reference(refs[dt][wi], refs[dt][wi])
        else:
            a = reads[dt][choice % 3] if choice < 3 else rand(dt)
            opt(written[dt][wi], a)
            _inplace_reference(refs[dt][wi], a)
        for w, r in zip(written[dt], refs[dt]):
            torch.testing.assert_close(w, r)
    st = C.graph_stats(_region(opt))
    assert st["graphs"] and sum(x["replays"] for x in st["graphs"]) > 0


def test_explain_says_cpu_regions_get_no_graphs_by_default():
    x, a = torch.zeros(256), torch.zeros(256)
    opt = trident.optimize(trident.capture(_inplace_scaled_add, x, a))  # TRIDENT_GRAPHS=cuda
    for a in [torch.randn(256) for _ in range(3)]:
        opt(x, a)
    assert "graphs: none on the CPU (TRIDENT_GRAPHS=cuda" in trident.explain(opt)
    assert C.graph_stats(_region(opt))["graphs"] == []


def test_staging_buffers_keep_layout_and_residue():
    from trident.runtime import graphs

    base = torch.randn(100)
    for t in (base[3:35].view(4, 8), base[1:].view(9, 11)[:, ::2], base[:8].expand(3, 8)):
        buf = graphs.staging_buffer(t)
        assert buf.shape == t.shape and buf.stride() == t.stride() and buf.data_ptr() % 16 == t.data_ptr() % 16
    odd = torch.empty(9, dtype=torch.uint8)[1:].view(torch.uint8)  # residue 1 of a 1-byte type: fine
    assert graphs.staging_buffer(odd) is not None


def test_a_moving_read_input_spanning_more_than_the_limit_stays_pinned(monkeypatch):
    """A read-only input whose elements span more than STAGING_LIMIT is pinned; while it keeps
    moving no graph is recorded (none could replay), and explain() names it and says why."""
    from trident.runtime import graphs

    monkeypatch.setattr(graphs, "STAGING_LIMIT", 512)  # bytes; `a` spans 1 KiB
    opt = _optimized_inplace("cpu")
    x, x_ref = torch.zeros(256), torch.zeros(256)
    for a in [torch.randn(256) for _ in range(5)]:
        opt(x, a)
        _inplace_reference(x_ref, a)
    torch.testing.assert_close(x, x_ref)
    st = C.graph_stats(_region(opt))
    assert st["graphs"] == [] and st["last_ordinary"] == ("unstageable", 1)
    text = trident.explain(opt)
    assert "input 'a' moves between calls but is pinned: it spans 1024 bytes > 512" in text
    assert "the last ordinary call replayed no graph: input 'a' moves between calls and cannot be staged" in text


class TestGraphExplainGolden(expecttest.TestCase):
    def test_explain_graph_lines(self):
        opt = _optimized_inplace("cpu")
        x = torch.zeros(256)
        fresh = [torch.randn(256) for _ in range(5)]
        for a in fresh:
            opt(x, a)
        opt(x.clone(), fresh[0])  # x never moved while observed, so pinned: at a new address, no graph matches
        lines = [line.strip() for line in trident.explain(opt).splitlines() if "graph" in line]
        self.assertExpectedInline("\n".join(lines), """\
graph 0 (emulated): 3 replay(s), 1.0 KiB held; staged: a; pinned: the other 1 input(s)
graphs: inputs seen moving between calls: x, a
graphs: 1 call(s) matched no recorded graph (ordinary path)
graphs: the last ordinary call replayed no graph: input 'x' is pinned in the graphs and came at another address""")


# -- written inputs that move (Note [Staging written inputs]) --------------------------------


def _decode_inplace(cfg, x, *rest):
    """A decode step that updates the hidden state in place (a residual stream written with
    copy_), the way a caller's loop may hand the same buffer role a fresh tensor every step."""
    x.copy_(decode_step(cfg, x, *rest))
    return x


def _optimized_decode_inplace(device, cfg, **knob_values):
    weights, cos, sin = make_weights(cfg, device)
    with knobs.scope(**knob_values):
        opt = trident.optimize(
            trident.capture(
                functools.partial(_decode_inplace, cfg), torch.randn(1, cfg.hidden, device=device),
                torch.tensor([0], device=device), cos, sin, *make_caches(cfg, device), *weights,
            )
        )
    return opt, weights, cos, sin


def _run_decode_loop(cfg, opt, weights, cos, sin, device, steps, fresh):
    """`steps` decode steps the way a caller writes the loop: the hidden state is a new tensor
    each step (`fresh(prev)`: the previous step's output or a new one), the position a new
    tensor; outputs, hidden states and caches equal the PyTorch reference at every step."""
    caches, ref_caches = make_caches(cfg, device), make_caches(cfg, device)
    prev = torch.randn(1, cfg.hidden, device=device)
    # Every step's hidden state and position at a new address, as the tests' counts assume: held,
    # since the allocator may hand a freed address back and a moving input would look pinned for
    # a call (Trident then supersedes the graph: correct, but a replay fewer).
    held = []
    for p in range(steps):
        x = fresh(prev)
        pos = torch.tensor([p], device=device)
        held += [x, pos]
        x_ref = x.clone()
        want = decode_step_reference(cfg, x_ref, pos.clone(), cos, sin, *ref_caches, *weights)
        got = opt(x, pos, cos, sin, *caches, *weights)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(x, want, rtol=1e-4, atol=1e-4)  # written in place, as eager does
        for c, r in zip(caches, ref_caches):
            torch.testing.assert_close(c, r, rtol=1e-4, atol=1e-4)
        prev = got


@pytest.mark.parametrize(
    "fresh",
    [lambda prev: torch.randn_like(prev) * 0.5, lambda prev: prev.clone()],
    ids=["new_tensor", "copy_of_previous"],
)
def test_written_hidden_state_fresh_every_step_is_staged_both_ways(device, fresh):
    cfg = Config()
    opt, weights, cos, sin = _optimized_decode_inplace(device, cfg, **_graph_device(device, always=False))
    _run_decode_loop(cfg, opt, weights, cos, sin, device, 10, fresh)
    st = C.graph_stats(_region(opt))
    live = [g for g in st["graphs"] if not g["retired"]]
    assert len(live) == 1, st
    names = [i.name for i in SCMRuntime.get(_region(opt)).program.inputs]
    assert [names[i] for i in live[0]["written_back"]] == ["x"]  # staged both ways
    assert {names[i] for i in live[0]["staged"]} == {"x", "rest_0"}  # the position is rest[0]
    (stats,) = trident.cache_info(opt).values()
    assert stats["graph_replays"] >= 7 and stats["ordinary_calls"] == 10 - stats["graph_replays"]
    assert st["graphs"][-1]["replays"] >= 7
    assert "staged: x (written back), rest_0" in trident.explain(opt)


def test_written_inputs_above_the_threshold_stay_pinned(device):
    """TRIDENT_GRAPH_STAGE_WRITTEN_BYTES below the hidden state's 256 bytes: it is pinned, and
    since it moves every call no graph is recorded at all (none could replay); results exact."""
    cfg = Config()
    opt, weights, cos, sin = _optimized_decode_inplace(
        device, cfg, graph_stage_written_bytes="255", **_graph_device(device, always=False)
    )
    _run_decode_loop(cfg, opt, weights, cos, sin, device, 6, lambda prev: prev.clone())
    st = C.graph_stats(_region(opt))
    assert st["graphs"] == [] and st["last_ordinary"] == ("unstageable", 0)
    assert "TRIDENT_GRAPH_STAGE_WRITTEN_BYTES=255" in trident.explain(opt)
    (stats,) = trident.cache_info(opt).values()
    assert stats["graph_replays"] == 0 and stats["ordinary_calls"] == 6
    # at exactly its size it is staged
    opt, weights, cos, sin = _optimized_decode_inplace(
        device, cfg, graph_stage_written_bytes="256", **_graph_device(device, always=False)
    )
    _run_decode_loop(cfg, opt, weights, cos, sin, device, 6, lambda prev: prev.clone())
    assert trident.cache_info(opt)["region0"]["graph_replays"] == 4


def test_stage_written_knob_is_checked():
    with knobs.scope(graph_stage_written_bytes="lots"), pytest.raises(ValueError, match="STAGE_WRITTEN_BYTES"):
        knobs.graph_stage_written_bytes()
    with knobs.scope(graph_stage_written_bytes="-1"), pytest.raises(ValueError, match=">= 0"):
        knobs.graph_stage_written_bytes()
    assert knobs.graph_stage_written_bytes() == 16 << 20


def test_written_input_sharing_storage_with_another_input_is_not_staged(device):
    """x (written) and a (read) as two views of one storage: staging x would copy back bytes
    the graph read from a's old address. Such calls take the ordinary path; results exact."""
    opt = _optimized_inplace(device)
    fresh = [torch.randn(512, device=device) for _ in range(6)]
    # a moves every call too; held, so that no read input can come at a freed one's address
    # (the allocator may hand it back, and `a` would then look pinned: a race on allocation)
    reads = [buf[256:].clone() for buf in fresh]
    for buf, a in zip(fresh, reads):  # x moves every call: staged both ways
        x, x_ref = buf[:256], buf[:256].clone()
        opt(x, a)
        _inplace_reference(x_ref, buf[256:])
        torch.testing.assert_close(x, x_ref)
    (g,) = C.graph_stats(_region(opt))["graphs"]
    assert g["written_back"] == [0] and g["replays"] == 4
    for buf in [torch.randn(512, device=device) for _ in range(3)]:
        x, a = buf[:256], buf[256:]  # disjoint halves of one storage
        want = (x + 2.0 * a) * 0.5
        opt(x, a)
        torch.testing.assert_close(x, want)
    st = C.graph_stats(_region(opt))
    assert st["graphs"][0]["replays"] == 4 and st["last_ordinary"] == ("aliased", 0)


def test_pinned_inputs_are_not_held_by_a_graph(device):
    """Note [Pinned inputs are not held]: once the caller drops a pinned input, the graph does
    not keep it alive (it would block its address for every later tensor)."""
    import gc
    import weakref

    opt = _optimized_inplace(device)
    x = torch.zeros(256, device=device)
    for a in [torch.randn(256, device=device) for _ in range(3)]:
        opt(x, a)
    (g,) = C.graph_stats(_region(opt))["graphs"]
    assert g["staged"] == [1]  # x pinned
    alive = weakref.ref(x)
    del x
    gc.collect()
    assert alive() is None


def test_an_input_pinned_by_chance_is_staged_by_the_next_graph(device):
    """The observed calls brought `a` at one address (the caller reused one tensor), then it
    moves every call: the first graph declines, a second graph staging `a` is recorded and the
    first retired, releasing its memory (Note [Graph lifetimes])."""
    opt = _optimized_inplace(device)
    x, x_ref = torch.zeros(256, device=device), torch.zeros(256, device=device)
    same = torch.randn(256, device=device)
    calls = [same, same] + [torch.randn(256, device=device) for _ in range(8)]
    for a in calls:
        opt(x, a)
        _inplace_reference(x_ref, a)
    torch.testing.assert_close(x, x_ref)
    st = C.graph_stats(_region(opt))
    assert [(g["staged"], g["retired"]) for g in st["graphs"]] == [([], True), ([1], False)]
    assert st["graphs"][0]["bytes"] == 0 and st["graphs"][1]["replays"] == 6
    mode = "emulated" if device == "cpu" else "CUDA"
    assert f"graph 0 ({mode}): retired after 0 replay(s)" in trident.explain(opt)
    (stats,) = trident.cache_info(opt).values()
    assert stats["graph_replays"] == 6 and stats["ordinary_calls"] == 4


def test_a_graph_serving_aliased_calls_is_not_retired_by_one_that_stages(device):
    """Graph 0 serves opt(x, x) (a pinned, sharing x's storage); then `a` moves and graph 1
    stages it. Graph 1 cannot serve opt(x, x) (a staged copy would hide the write to x), so
    graph 0 stays live and keeps serving those calls (Note [Graph lifetimes])."""
    opt = _optimized_inplace(device)
    x = torch.randn(256, device=device)
    x_ref = x.clone()
    for _ in range(3):
        opt(x, x)
        _inplace_reference(x_ref, x_ref)
    for a in [torch.randn(256, device=device) for _ in range(4)]:
        opt(x, a)
        _inplace_reference(x_ref, a)
    for _ in range(2):
        opt(x, x)
        _inplace_reference(x_ref, x_ref)
    torch.testing.assert_close(x, x_ref)
    st = C.graph_stats(_region(opt))
    assert [(g["staged"], g["retired"]) for g in st["graphs"]] == [([], False), ([1], False)]
    assert [g["replays"] for g in st["graphs"]] == [1 + 2, 2]


@pytest.mark.parametrize("seed", range(2))
def test_graph_facts_guard_is_the_twin_of_the_native_replay_match(device, seed):
    """Note [One guard table]: GraphFacts.check (Python) predicts, before every call, whether the
    native runtime replays a recorded graph -- over random calls mixing pinned and staged, moved,
    aliased and other-dtype inputs -- and when no graph holds, its failure names the first fact
    that stood in the way, in the caller's names."""
    g = torch.Generator().manual_seed(seed)
    opt = _optimized_inplace(device)
    rid = _region(opt)
    names = [i.name for i in SCMRuntime.get(rid).program.inputs]

    def rand(dtype=torch.float32):
        return torch.randn(256, generator=g, dtype=dtype).to(device)

    written = [rand(), rand()]
    reads = [rand(), rand()]
    outcomes = set()
    for _ in range(60):
        choice = int(torch.randint(0, 6, (1,), generator=g))
        w = written[int(torch.randint(0, 2, (1,), generator=g))]
        args = {0: (w, reads[0]), 1: (w, reads[1]), 2: (w, rand()), 3: (w, w),
                4: (rand(torch.float64), rand(torch.float64)), 5: (written[0], reads[0])}[choice]
        st = C.graph_stats(rid)
        live = [guard for guard, info in zip(graphs.graph_guards(rid), st["graphs"]) if not info["retired"]]
        predicted = any(guard.check(args) for guard in live)
        before = sum(x["replays"] for x in st["graphs"])
        opt(*args)
        replayed = sum(x["replays"] for x in C.graph_stats(rid)["graphs"][: len(st["graphs"])]) > before
        assert replayed == predicted, (choice, [guard.failure(args, names) for guard in live])
        outcomes.add(replayed)
        for guard in live:
            why = guard.reason(args)
            assert (why is None) == guard.check(args)
            if why is not None:
                outcomes.add(why[0])
                assert guard.failure(args, names).startswith(f"graph {guard.graph}: ")
    assert {True, False, "facts"} <= outcomes and ({"pinned_moved", "aliased"} & outcomes), outcomes


def test_graph_facts_reasons(device):
    opt = _optimized_inplace(device)
    rid = _region(opt)
    x = torch.randn(256, device=device)
    fresh = [torch.randn(256, device=device) for _ in range(4)]  # held: a freed one's address could come back
    for a in fresh:
        opt(x, a)  # `a` fresh each call: staged; x pinned
    (guard,) = graphs.graph_guards(rid)
    names = ["x", "a"]
    assert guard.staged == (False, True) and guard.written == (True, False)
    assert guard.check((x, torch.randn(256, device=device)))
    assert guard.failure((x.clone(), torch.randn(256, device=device)), names) == (
        "graph 0: input 'x' is pinned in the graphs and came at another address")
    assert guard.reason((x, torch.randn(256, device=device, dtype=torch.float64))) == ("facts", 1)
    assert guard.failure((x, x), names) == ("graph 0: staged input 'a' shares memory with an input the region "
                                             "writes (or is written and shares memory with another input)")
    assert "pinned at their recorded addresses: x" in guard.describe(names)


def _handoff(x, y):
    """Two regions (a data-dependent nonzero cuts between them): the first one's output `a` is
    read only by the second, so its graph lends it (Note [Lent outputs]); `b` is returned."""
    a = axpy(x, y)
    n = torch.nonzero(y > 0)
    return axpy(a, y), n


def test_a_lent_output_still_held_is_never_overwritten(device):
    """Note [Lent outputs]: an output only a later region reads is lent, not copied; a replay
    would overwrite it, so while anything holds it the region takes the ordinary path (fresh
    outputs) and the held tensor keeps its values; returned values are never lent."""
    x, y = torch.randn(100, device=device), torch.randn(100, device=device)
    with knobs.scope(**_graph_device(device)):
        opt = trident.optimize(trident.capture(_handoff, x, y))
    first, second = opt.meta["trident_regions"]
    kept = []  # every x stays alive, so that none comes at an address a graph could pin

    def check(x):
        kept.append(x)
        b, n = opt(x, y)
        torch.testing.assert_close(b, 2.5 * (2.5 * x + y) + y)
        torch.testing.assert_close(n, torch.nonzero(y > 0))

    for _ in range(5):
        check(torch.randn(100, device=device))
    live = [g for g in C.graph_stats(first)["graphs"] if not g["retired"]]
    assert live and live[-1]["lent"] == 1 and live[-1]["replays"] > 0
    assert all(g["lent"] == 0 for g in C.graph_stats(second)["graphs"])  # its output is returned
    x1 = torch.randn(100, device=device)
    kept.append(x1)
    held = torch.ops.trident.scm.default(first, [], [x1, y])[0]  # what the graph lends to region 1
    want = (2.5 * x1 + y).clone()
    for _ in range(4):
        check(torch.randn(100, device=device))
    torch.testing.assert_close(held, want)
    st = C.graph_stats(first)
    assert st["lent_held"] >= 1
    assert "lent output still referenced" in "\n".join(graphs.describe(first, ["x", "y"], None))
    del held
    replays = sum(g["replays"] for g in C.graph_stats(first)["graphs"])
    for _ in range(3):
        check(torch.randn(100, device=device))
    assert sum(g["replays"] for g in C.graph_stats(first)["graphs"]) > replays


def test_lending_knob_off_copies_every_output(device):
    """TRIDENT_GRAPH_LEND=0: replays copy every output out, as before Note [Lent outputs]."""
    x, y = torch.randn(100, device=device), torch.randn(100, device=device)
    with knobs.scope(graph_lend="0", **_graph_device(device)):
        opt = trident.optimize(trident.capture(_handoff, x, y))
    for _ in range(5):
        x = torch.randn(100, device=device)
        torch.testing.assert_close(opt(x, y)[0], 2.5 * (2.5 * x + y) + y)
    first = opt.meta["trident_regions"][0]
    assert all(g["lent"] == 0 for g in C.graph_stats(first)["graphs"])
    assert sum(g["replays"] for g in C.graph_stats(first)["graphs"]) > 0


def test_a_staged_input_that_stopped_moving_gets_a_graph_that_pins_it(device):
    """Note [Pinning what stopped moving]: the second region's input moves until the first
    region's graph lends it from one address; then a graph pinning it is recorded and replays,
    the staging graph kept for calls where it moves again (here: while a lent value is held, the
    first region's outputs are fresh). Results are exact throughout."""
    x, y = torch.randn(100, device=device), torch.randn(100, device=device)
    with knobs.scope(**_graph_device(device)):
        opt = trident.optimize(trident.capture(_handoff, x, y))
    first, second = opt.meta["trident_regions"]
    kept = []  # every x stays alive: the first region's input keeps moving, its graph's output does not

    def check():
        x = torch.randn(100, device=device)
        kept.append(x)
        torch.testing.assert_close(opt(x, y)[0], 2.5 * (2.5 * x + y) + y)

    def replays(staged):
        return sum(g["replays"] for g in C.graph_stats(second)["graphs"] if g["staged"] == staged)

    for _ in range(16):
        check()
    pinned = replays([])
    assert replays([0]) > 0 and pinned > 0
    held = torch.ops.trident.scm.default(first, [], [x, y])[0]  # the first region now returns fresh outputs
    for _ in range(6):
        check()
    del held
    for _ in range(8):
        check()
    assert replays([]) > pinned
