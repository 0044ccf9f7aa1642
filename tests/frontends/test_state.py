"""The state of objects a function is passed (Note [State the function is passed]): a recurrent
model whose cache replaces its per-layer state tensors every step and counts tokens in a Python
int, through both front doors; the pieces of trident/frontends/state.py alone."""

from __future__ import annotations

import gc

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

import trident
from tests.recurrent_model import RecurrentModel, decode
from trident import knobs
from trident.frontends import state
from trident.frontends.dynamo import compiled_graphs

STEPS = 64


def _model(device="cpu"):
    torch.manual_seed(0)
    return RecurrentModel(dim=16, layers=3).to(device).eval()


def _assert_same(want, got):
    (want_out, want_cache), (got_out, got_cache) = want, got
    assert len(want_out) == len(got_out)
    for a, b in zip(want_out, got_out):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert got_cache.seen == want_cache.seen == STEPS
    for a, b in zip(want_cache.states, got_cache.states):
        assert type(b["recurrent_state"]) is torch.Tensor  # the caller's, real, never a fake
        torch.testing.assert_close(b["recurrent_state"], a["recurrent_state"], rtol=1e-5, atol=1e-5)


def test_replaced_state_and_counter_through_trident_compile(device):
    """64 steps: counts 0, 1 and the first count >= 2 run eagerly (each a new structure's first
    call), then ONE capture (the count symbolic) serves every step; its writes give the caller's
    cache the new state tensors and the advanced count. The steps of counts 0 and 1 are
    captured when the next step comes, from their state as it was before they ran (Note
    [Captured after its first call]); count 2's is not (the symbolic capture made at count 3
    serves it). A second decode on a new cache object is served whole: identity is not part of
    the signature, and nothing is captured or run eagerly again."""
    model = _model(device)
    want = decode(model, 16, STEPS, device=device)
    compiled = trident.compile(model)
    _assert_same(want, decode(compiled, 16, STEPS, device=device))
    assert len(compiled.captures) == 3 and compiled.eager_calls == 3, compiled.eager_log
    assert sum(opt.meta["trident_symbolic"] for opt in compiled.captures.values()) == 1
    log = "\n".join(compiled.eager_log)
    assert "cache.seen: 1 -> 2" in log and "cache.states[0]['recurrent_state']: absent -> float32[1, 16, 16]" in log
    for _ in range(2):
        _assert_same(want, decode(compiled, 16, STEPS, device=device))
        assert len(compiled.captures) == 3 and compiled.eager_calls == 3, compiled.eager_log


def test_a_counter_read_as_a_position_keeps_one_region_and_one_graph(device):
    """`positions[cache.seen]` reads a Python counter no tensor input carries (Note [Ints no input
    carries]): the host takes the row before the region's call, so the whole step is ONE region
    with nothing symbolic, and one graph (emulated on the CPU) replays every step with the row
    staged; no cut, results equal eager's."""
    from trident import knobs
    from trident.runtime import SCMRuntime
    from trident.runtime.native import C

    model = _model(device)
    want = decode(model, 16, STEPS, device=device)
    compiled = trident.compile(model)
    gc.disable()  # Note [No cycles on the call path]: nothing may wait for the cyclic collector
    try:
        with knobs.scope(graphs="all" if device == "cpu" else "cuda"):
            _assert_same(want, decode(compiled, 16, STEPS, device=device))
    finally:
        gc.enable()
    (opt,) = [opt for opt in compiled.captures.values() if opt.meta["trident_symbolic"]]
    (rid,) = opt.meta["trident_regions"]
    assert not opt.meta.get("trident_cuts"), opt.meta.get("trident_cuts")
    assert not SCMRuntime.get(rid).program.symbols
    # Note [Carried state in rotation]: the new states are lent to the cache; the graph that lent
    # them cannot replay while the next step brings them back, so two graphs alternate
    graphs = C.graph_stats(rid)["graphs"]
    assert len(graphs) == 2 and not any(g["retired"] for g in graphs), graphs
    assert sum(g["replays"] for g in graphs) >= STEPS - 8 and min(g["replays"] for g in graphs) >= STEPS // 2 - 6
    assert all(g["rotating"] and g["carried"] == 3 and g["lent"] == 3 for g in graphs), graphs
    names = [i.name for i in SCMRuntime.get(rid).program.inputs]
    assert {"x", "cache_states_0_recurrent_state"} <= {names[i] for i in graphs[0]["staged"]}
    assert "rotates with another graph" in trident.explain(compiled)


def test_carried_state_the_caller_keeps_is_never_overwritten(device):
    """Note [Carried state in rotation]: a caller that keeps every step's state (a list of the
    cache's tensors) holds storages the graphs lent; no replay overwrites one (each kept state
    equals eager's at the end), and the decode still equals eager's."""
    from trident import knobs

    def run(step):
        kept = []

        def keep(x, cache):
            out = step(x, cache)
            kept.append(cache.states[1]["recurrent_state"])
            return out

        return decode(keep, 16, 24, device=device), kept

    model = _model(device)
    (want_out, _), want_kept = run(model)
    compiled = trident.compile(model)
    with knobs.scope(graphs="all" if device == "cpu" else "cuda"):
        (got_out, _), got_kept = run(compiled)
    for a, b in zip(want_out + want_kept, got_out + got_kept):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # two graphs found a state they lent kept; the region's next graph copies its outputs out
    from trident.runtime.native import C

    (opt,) = [opt for opt in compiled.captures.values() if opt.meta["trident_symbolic"]]
    stats = C.graph_stats(opt.meta["trident_regions"][0])
    assert stats["lent_held"] == 2 and stats["graphs"][-1]["lent"] == 0, stats
    assert stats["graphs"][-1]["replays"] >= 8, stats


def test_replaced_state_and_counter_through_the_backend(device):
    """torch.compile(model, backend="trident"): Dynamo keeps the side effects itself; the count it
    makes dynamic after it changed is a free int of the graph, passed as a carrier (Note [Dynamic
    Dynamo graphs]): no eager call, a few captures, no graph break."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _model(device)
    want = decode(model, 16, STEPS, device=device)
    start = len(compiled_graphs())
    _assert_same(want, decode(torch.compile(model, backend="trident"), 16, STEPS, device=device))
    graphs = compiled_graphs()[start:]
    assert sum(g.eager_calls for g in graphs) == 0
    assert sum(len(g.captures) for g in graphs) <= 3
    assert not counters["graph_break"]
    torch._dynamo.reset()


def test_no_traced_value_stays_in_the_callers_objects():
    """A capture runs the function on traced tensors inside the caller's objects; afterwards the
    objects hold exactly what they held (Snapshot.restore), then what the optimized program
    wrote. Before, a symbolic capture left fake tensors there, and the caller's own tensor code
    (HF's stopping check, `bool(t.max() == 0)`) failed outside the captured call."""

    class Box:
        def __init__(self):
            self.t = torch.zeros(5)
            self.n = 3
            self.memo = {}

    def f(x, box):
        box.t = box.t + x
        box.n += 1
        box.memo["last"] = box.t * 2
        return box.t.sum(0, keepdim=True)

    compiled = trident.compile(f, dynamic=True)
    box, eager = Box(), Box()
    for i in range(6):
        x = torch.full((5,), float(i))
        torch.testing.assert_close(compiled(x, box), f(x, eager))
        assert type(box.t) is torch.Tensor and type(box.memo["last"]) is torch.Tensor
        assert not isinstance(box.t, FakeTensor)
        assert bool(box.t.max() == 0) == bool(eager.t.max() == 0)  # the caller's own code
        torch.testing.assert_close(box.memo["last"], eager.memo["last"])
        assert box.n == eager.n
    # the first call (an empty memo: a structure of its own) is captured when the second comes
    # (Note [Captured after its first call]); one symbolic capture serves every later call
    assert len(compiled.captures) == 2


def test_walk_paths_and_structure():
    class Layer:
        def __init__(self, k):
            self.keys = k
            self.count = 2

    class Cache:
        def __init__(self):
            self.layers = [Layer(torch.ones(2)), Layer(torch.zeros(3))]
            self.opts = {"window": 4, "dtype": torch.float16}
            self.fn = len  # opaque: by identity

    c = Cache()
    w = state.walk([c])
    texts = [state.path_text("cache", steps) for _, steps, _ in w.leaves]
    assert texts == ["cache.layers[0].keys", "cache.layers[0].count", "cache.layers[1].keys", "cache.layers[1].count",
                     "cache.opts['window']", "cache.opts['dtype']", "cache.fn"]
    assert [kind for _, _, _, kind, _ in w.nodes] == [Cache, list, Layer, Layer, dict]
    shared = Layer(torch.ones(1))
    c.layers = [shared, shared]  # one object in two places: walked once
    assert len(state.walk([c]).nodes) == 4
    assert not state.walkable(torch.nn.Linear(2, 2)) and not state.walkable(3) and state.walkable(c)


def _record(obj, fn):
    """Run fn on obj with nothing traced; the writes that replay what fn did."""
    w = state.walk([obj])
    snap = state.Snapshot(w)
    installed = [v for _, _, v in w.leaves]
    fn(obj)
    try:
        return state.record_writes(w, snap, installed, 0, {}, [obj], ["obj"], {})
    finally:
        snap.restore()


def test_record_and_apply_writes():
    class Obj:
        def __init__(self):
            self.a = torch.ones(2)
            self.n = 1
            self.d = {"x": 1, "gone": 2}
            self.sub = type("S", (), {})()
            self.sub.v = 5

    def fn(o):
        o.n = 7
        o.d["y"] = (3, "s")
        del o.d["gone"]
        o.moved = o.sub  # an object moved to a second place
        o.sub = None
        o.a = torch.zeros(2)  # a tensor not made by a trace: bound by identity

    o = Obj()
    before_sub = o.sub
    writes, extra = _record(o, fn)
    assert extra == [] and o.n == 1 and "gone" in o.d and o.sub is before_sub  # restored
    assert sorted(w.text for w in writes) == ["obj.a", "obj.d['gone']", "obj.d['y']", "obj.moved", "obj.n", "obj.sub"]
    state.apply_writes(writes, [o], [], [], [])
    assert o.n == 7 and o.d == {"x": 1, "y": (3, "s")} and o.moved is before_sub and o.sub is None
    assert torch.equal(o.a, torch.zeros(2))


def test_lists_appended_to_and_truncated_are_replayed():
    """A list the function appends to (a cache's per-layer list filled on the first step) or
    truncates: a resize write; the kept items keep their identity, a kept dict's own change is
    a write of its own, the new items are built per call."""
    keep = {"s": 1}

    class Obj:
        def __init__(self):
            self.items = [keep, 5]
            self.short = [1, 2, 3]

    def fn(o):
        o.items[0]["s"] = 2
        o.items.append({"new": 3})
        o.items.append(4)
        del o.short[1:]

    o = Obj()
    writes, extra = _record(o, fn)
    assert o.items == [keep, 5] and keep == {"s": 1} and o.short == [1, 2, 3]  # restored
    state.apply_writes(writes, [o], [], [], [])
    assert o.items[0] is keep and o.items == [{"s": 2}, 5, {"new": 3}, 4] and o.short == [1]


@pytest.mark.parametrize("change", ["new object", "list rebuilt"])
def test_unreplayable_changes_are_named(change):
    class Obj:
        def __init__(self):
            self.items = [{"a": 1}, {"b": 2}]
            self.child = None

    def fn(o):
        if change == "new object":
            o.child = Obj()
        else:
            o.items[:] = [o.items[1], o.items[0], {}]

    with pytest.raises(state.Unreplayable, match=r"obj\.child becomes a new Obj|obj\.items changes length"):
        _record(Obj(), fn)


def test_carrier_is_a_size():
    c = state.carrier(37)
    assert c.shape == (37,) and c.stride() == (0,) and c.untyped_storage().nbytes() == 1


def test_a_replaced_state_is_freed_when_the_cache_drops_it(device):
    """Note [No cycles on the call path]: with Python's cyclic collector off, a state the cache
    replaced is freed at once (nothing of the call -- its walk of the arguments, its writes --
    keeps it), and no cyclic garbage the calls leave holds a tensor (torch's own pytree
    flattening leaves a function cycle, without tensors)."""
    import weakref

    model = _model(device)
    compiled = trident.compile(model)
    x = torch.randn(1, 16, device=device)
    cache = __import__("tests.recurrent_model", fromlist=["RecurrentCache"]).RecurrentCache()
    with torch.no_grad():
        for _ in range(6):  # past the eager calls and the capture
            x = compiled(x, cache)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(8):
                old = weakref.ref(cache.states[1]["recurrent_state"])
                x = compiled(x, cache)
                assert old() is None, "the replaced state is still referenced after the call"
            gc.collect()
            def real(v):
                return isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor) and v.device.type != "meta"

            holding = [o for o in gc.garbage if real(o) or isinstance(o, (list, tuple)) and any(map(real, o))]
            assert not holding, holding
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert compiled.eager_calls == 3, compiled.eager_log


def test_a_pending_first_call_leaves_every_object_as_eager_does(monkeypatch):
    """Note [Captured after its first call]: settling the first call puts its objects back as
    they were before it ran for the trace, then as they are now -- objects it detached included
    (the caller's own update of one survives) -- and a capture that fails there (an error in
    compiling) never fails the call settling it."""
    from trident.frontends import compile as C

    class S:
        def __init__(self):
            self.n = 0

    class Holder:
        def __init__(self):
            self.cur = S()

    def f(x, obj):
        if isinstance(obj, Holder):
            obj.cur.n += 1
            obj.cur = S()  # a fresh state; the old one is the caller's
            return x + 1
        return x * obj.n

    compiled = trident.compile(f)
    h = Holder()
    old = h.cur
    compiled(torch.ones(2), h)  # pending
    old.n = 5  # the caller's own update of the detached state
    torch.testing.assert_close(compiled(torch.ones(3), old), torch.full((3,), 5.0))
    assert old.n == 5 and h.cur.n == 0 and h.cur is not old

    calls = [0]
    real = C.optimize

    def failing_once(gm, *a, **k):
        calls[0] += 1
        if calls[0] == 1:
            raise ValueError("a compile failure")
        return real(gm, *a, **k)

    monkeypatch.setattr(C, "optimize", failing_once)
    g = trident.compile(lambda x: x * 2 + 1)
    g(torch.ones(3))  # pending
    torch.testing.assert_close(g(torch.ones(2, 2)), torch.full((2, 2), 3.0))  # settles: the capture fails
    torch.testing.assert_close(g(torch.ones(3)), torch.full((3,), 3.0))  # its second sighting captures
    assert calls[0] >= 2


def test_a_pending_first_call_is_not_captured_under_another_autocast():
    """A first call is captured from the next call only under the same grad, autocast and
    default-dtype context (not part of the key): a plain call after it stays float32."""
    w = torch.randn(8, 8)

    def f(x):
        return x @ w

    compiled = trident.compile(f)
    x = torch.randn(4, 8)
    compiled(x)  # pending, plain
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled(torch.randn(3, 5, 8))  # another family, under autocast: the pending call is dropped
    for _ in range(2):
        got = compiled(x)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, f(x))


class _WindowCache:
    """A sliding-window cache layer as HF's DynamicSlidingWindowLayer keeps one: key tensors
    replaced every step (the last `window - 1` kept), a Python token count, and mask sizes that
    branch on whether the window has filled."""

    def __init__(self, window: int):
        self.window = window
        self.keys = None
        self.count = 0


def _window_step(x, cache: _WindowCache):
    """x: [1, 1, d], one new token. The keys the step attends over are the window's and the new
    one; the mask covers `kv_length` of them, computed from the Python count as HF's
    get_mask_sizes does (so until the window fills the trace finds the count equal to the
    keys' length, and torch's shape environment puts one for the other)."""
    cache.count += x.shape[-2]
    full = x if cache.keys is None else torch.cat([cache.keys, x], dim=-2)
    cache.keys = full[:, -cache.window + 1:, :]
    kv_length = cache.window - 1 + x.shape[-2] if cache.count >= cache.window else cache.count
    weights = torch.arange(kv_length, dtype=x.dtype, device=x.device).view(1, -1, 1) + 1.0
    return (full * weights).sum(dim=-2, keepdim=True) / cache.count


def test_a_sliding_window_is_served_by_one_symbolic_capture_per_regime():
    """Note [Symbolic regimes]: before the window fills, the symbolic capture's trace finds the
    count equal to the keys' length (the written count comes out as `keys.shape[1] + 1`: read
    from the call's tensor, Note [State the function is passed]); after it fills, that capture's
    guards refuse every step, and one more symbolic capture serves them all. Before, the count
    could not be written back from a symbolic capture (a static capture per step until
    TRIDENT_CAPTURES, then every step eager), and a symbolic capture's refused step got a static
    capture, every step after the window filled."""
    def decode(fn, steps=24):
        torch.manual_seed(0)
        cache, outs = _WindowCache(window=6), []
        for _ in range(steps):
            outs.append(fn(torch.randn(1, 1, 8), cache))
        return outs, cache

    want, want_cache = decode(_window_step)
    compiled = trident.compile(_window_step)
    for _ in range(3):
        got, got_cache = decode(compiled)
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a)
        assert got_cache.count == want_cache.count == 24 and type(got_cache.count) is int
        torch.testing.assert_close(got_cache.keys, want_cache.keys)
        # count 0 (no keys yet) and 1 static; symbolic ones for the growing window (torch's
        # slicing specializes the step where the window just fills) and one for the full window
        symbolic = [opt for opt in compiled.captures.values() if opt.meta["trident_symbolic"]]
        assert 2 <= len(symbolic) <= 4 and len(compiled.captures) <= 6, list(compiled.captures.values())
        # each structure's first call (Note [Captured after its first call]): no keys yet, count
        # and keys of size 1, the first of sizes >= 2 (0, 1 and "2 or more" are structure)
        assert compiled.eager_calls == 3, compiled.eager_log
        captures = dict(compiled.captures)
        full = decode(compiled, 40)[1]  # 16 steps more, past the window: the last regime serves them all
        assert full.count == 40 and compiled.captures == captures and compiled.eager_calls == 3


def test_a_written_int_computed_from_a_tensor_size_reads_the_call():
    """state.symbolic_int over an int symbol and a tensor's size symbol: evaluated from the call's
    ints and the sizes of the call's tensor leaves."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    n = env.create_unbacked_symint()
    m = env.create_unbacked_symint()
    s = state.symbolic_int(n + 2 * m + 1, {n.node.expr: 0}, {m.node.expr: (3, 1)})
    leaves = [None, None, None, torch.empty(2, 5)]
    assert s.fn([10], leaves) == 10 + 2 * 5 + 1
    assert state.symbolic_int(n + m, {n.node.expr: 0}) is None  # a size no call leaf has


def test_a_refused_regime_past_the_capture_bound_runs_eagerly():
    """Note [Symbolic regimes] under TRIDENT_CAPTURES=3: a call no symbolic capture serves, with
    the cache full, runs eagerly with the bound as its reason (before, it got a static capture
    past the bound, one per size); every output and the cache's state stay eager's."""
    torch.manual_seed(0)
    xs = [torch.randn(1, 1, 8) for _ in range(20)]
    want_cache = _WindowCache(window=6)
    want = [_window_step(x, want_cache) for x in xs]
    with knobs.scope(captures=3):
        compiled = trident.compile(_window_step)
        cache = _WindowCache(window=6)
        got = [compiled(x, cache) for x in xs]
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a)
    assert cache.count == want_cache.count and torch.equal(cache.keys, want_cache.keys)
    assert len(compiled.captures) == 3, list(compiled.captures)
    assert "past TRIDENT_CAPTURES=3" in compiled.eager_log[-1], compiled.eager_log


def _returns_its_state(x, state):
    """A recurrent layer's step: replaces its state entry and returns the state with the output."""
    state["h"] = state["h"] * 0.5 + x
    return x * 2, state


def test_a_state_container_returned_is_the_callers_with_the_writes():
    """A dict argument the function writes and returns comes back as the caller's own dict, holding
    what the call wrote, as eagerly. Flattened like any result, it was rebuilt from what it held
    once the trace's snapshot was restored: every captured call returned the old entry (the
    caller's dict itself got the writes, so a loop feeding the returned dict back kept its input
    state from the first capture on)."""
    compiled = trident.compile(_returns_its_state)
    got, want = {"h": torch.zeros(4)}, {"h": torch.zeros(4)}
    for step in range(6):
        x = torch.randn(4, generator=torch.Generator().manual_seed(step))
        out, got2 = compiled(x, got)
        wout, want = _returns_its_state(x, want)
        assert got2 is got
        torch.testing.assert_close(out, wout)
        torch.testing.assert_close(got2["h"], want["h"])
        got = got2
    assert compiled.captures and compiled.eager_calls <= 2, trident.explain(compiled)


def _swap_and_return(state, x):
    a, b = state["a"], state["b"]
    state["a"], state["b"] = b, a  # the state's objects move
    return a, x * 2  # the one that was at "a"


def test_a_state_object_returned_after_it_moved_is_the_one_eager_returns():
    """The returned object is found where the call left it, not where it was before the call:
    after the swap is replayed, the old place holds the other object."""
    compiled = trident.compile(_swap_and_return)
    x = torch.randn(4)
    for _ in range(4):
        got_state = {"a": [torch.zeros(2)], "b": [torch.ones(2)]}
        got, _ = compiled(got_state, x)
        assert got is got_state["b"] and torch.equal(got[0], torch.zeros(2))
    assert compiled.captures, trident.explain(compiled)


class _Box:
    def __init__(self, t):
        self.t = t


def _pop_and_return(state, x):
    taken = state.pop("a")  # out of the state: no place to read it from after the call
    state["b"] = [x * 2]
    return taken


def test_a_state_object_taken_out_and_returned_is_eagers():
    """An object taken out of the state and returned: a capture would return its own trace's
    object every call (the state no longer holds the caller's), so such a call is refused and
    runs eagerly, returning the caller's object. (A list taken out comes back rebuilt around
    the same tensors, as pytree rebuilds any returned list.)"""
    compiled = trident.compile(_pop_and_return)
    x = torch.randn(3)
    for step in range(3):
        mine = _Box(torch.full((2,), float(step)))
        got_state = {"a": mine}
        assert compiled(got_state, x) is mine and torch.equal(got_state["b"][0], x * 2)
    assert "took out of the state" in trident.explain(compiled), trident.explain(compiled)


def _replace_entries(x, state, pair):
    for i, k in enumerate(list(state) if isinstance(state, dict) else range(len(state))):
        state[k] = state[k] + x.sum() * (i + 1)
    counts, scale = pair
    counts[0] = torch.cat([counts[0], x[:1]])  # a list inside a tuple, its entry growing
    counts.append(x[-1:] * scale)
    return x * 2


@pytest.mark.parametrize("kind", ["dict", "list"])
def test_entries_replaced_in_a_dict_or_list_argument_reach_the_caller(kind):
    """A dict or list passed as an argument (not held by an object) is the caller's: entries the
    function replaces and items it appends reach it after every captured call, as eagerly --
    flattened into its tensors, the capture's writes had no place to go and the caller kept the
    old entries. The same container across calls and a new one per call."""
    compiled = trident.compile(_replace_entries)

    def make(step):
        values = [torch.full((), float(step)) for _ in range(3)]
        state = dict(zip("abc", values)) if kind == "dict" else values
        return state, ([torch.zeros(1)], 2.0)

    def entries(state):
        return list(state.values()) if kind == "dict" else list(state)

    for fresh in (True, False):
        want_state, want_pair = make(0)
        got_state, got_pair = make(0)
        for step in range(5):
            if fresh:
                (want_state, want_pair), (got_state, got_pair) = make(step), make(step)
            x = torch.randn(4)
            torch.testing.assert_close(compiled(x, got_state, got_pair), _replace_entries(x, want_state, want_pair))
            for a, b in zip(entries(want_state), entries(got_state)):
                assert type(b) is torch.Tensor
                torch.testing.assert_close(b, a)
            assert len(got_pair[0]) == len(want_pair[0])
            for a, b in zip(want_pair[0], got_pair[0]):
                torch.testing.assert_close(b, a)
    assert compiled.captures, trident.explain(compiled)


class _Holder:
    pass


def test_argument_containers_the_walk_must_not_take_whole():
    """What stays as before flatten_arguments (review of 3a547ed): a registered pytree dict
    subclass (an HF ModelOutput, as generate() passes `encoder_outputs`) stays a pytree node; a
    dict with a key the walk cannot follow and a list too long to walk stay pytree nodes (their
    tensors inputs, never constants); a list argument costs no level of the walk's depth; a call
    whose objects hold more than MAX_LEAVES leaves runs eagerly. Each against eager, with new
    tensors every call."""
    from transformers.modeling_outputs import BaseModelOutput

    def from_output(x, eo):
        return x + eo.last_hidden_state

    def from_tuple_keys(x, table):
        return x + table[("a", 1)]

    def from_long_list_and_cache(x, ids, cache):
        return x * len(ids) + cache.t

    def from_deep_state(x, boxes):
        return x + boxes[0].layers[0].state["s"]["t"]

    def deep(t):
        cache, layer = _Holder(), _Holder()
        layer.state = {"s": {"t": t}}
        cache.layers = [layer]
        return [cache]

    def long_cache(t):
        cache = _Holder()
        cache.t = t
        return cache

    cases = [
        (from_output, lambda t: (BaseModelOutput(last_hidden_state=t),)),
        (from_tuple_keys, lambda t: ({("a", 1): t},)),
        (from_long_list_and_cache, lambda t: (list(range(5000)), long_cache(t))),
        (from_deep_state, lambda t: (deep(t),)),
    ]
    for fn, make in cases:
        compiled = trident.compile(fn)
        for step in range(4):
            x, t = torch.randn(4), torch.full((4,), float(step))
            torch.testing.assert_close(compiled(x, *make(t)), fn(x, *make(t)), msg=fn.__name__)
        assert compiled.captures, (fn.__name__, trident.explain(compiled))

    def from_huge_state(x, holder):
        return x + holder.items[-1]

    huge = _Holder()
    compiled = trident.compile(from_huge_state)
    for step in range(3):
        huge.items = [torch.full((4,), float(i + step)) for i in range(state.MAX_LEAVES + 8)]
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x, huge), from_huge_state(x, huge))
    assert not compiled.captures and "more than 4096 leaves" in trident.explain(compiled)
