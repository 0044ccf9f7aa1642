"""Note [Module attributes a trace rebinds]: a trace that rebinds attributes of the user's modules
leaves them as it found them. A table rebuilt from scratch when a longer sequence comes (the
rotary-embedding cache of flash-attn and flash-linear-attention) keeps its capture; state kept
on a module (`self.h = f(self.h, x)`) sends the family through Dynamo, which replays the
rebinding. Either way every result equals eager's, and no fake tensor or SymInt is left on the
model (before, the next eager call read them and failed in a Triton launch)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import types

import pytest
import torch

import trident
from tests.kernels import axpy
from trident.errors import CaptureError


class Rotary(torch.nn.Module):
    """flash-attn's RotaryEmbedding pattern: tables in plain attributes, rebuilt when longer."""

    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)), persistent=False)
        self._seq_len_cached = 0
        self._cos_cached = None

    def tables(self, seqlen: int):
        if seqlen > self._seq_len_cached or self._cos_cached is None:
            self._seq_len_cached = seqlen
            self._cos_cached = torch.cos(torch.outer(torch.arange(seqlen, dtype=torch.float32), self.inv_freq))
        return self._cos_cached[:seqlen]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = Rotary(8)

    def forward(self, x, offset: int):
        cos = self.rotary.tables(offset + x.shape[0])[-x.shape[0]:]
        return axpy(x, cos.reshape(-1)[: x.numel()].reshape(x.shape).contiguous())


def _no_traced_values(module: torch.nn.Module) -> None:
    for m in module.modules():
        for name, value in m.__dict__.items():
            assert not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)), (name, value)
            assert not isinstance(value, torch._subclasses.fake_tensor.FakeTensor), name


def _served_like_eager(fwd, ref, size: int, calls: int, after=None) -> None:
    """`calls` calls of fwd and of its eager twin `ref` on fresh inputs give equal results (and
    pass `after()`, the state checks), and some went through Dynamo (the door for kept state)."""
    for _ in range(calls):
        x = torch.randn(size)
        torch.testing.assert_close(fwd(x), ref(x))
        if after is not None:
            after()
    assert fwd.dynamo_calls > 0, trident.explain(fwd)


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_rebuilt_table_keeps_its_capture_and_the_model_stays_real(dynamic):
    torch.manual_seed(0)
    model, ref = Model(), Model()
    fwd = trident.compile(model.forward, dynamic=dynamic)
    x = torch.randn(4, 4)
    # a decode-like loop: the table grows every call; then a shorter call (a new generate()'s
    # prefill), which reads the table the model holds
    for offset in (0, 1, 2, 3, 4, 5, 1, 0, 9):
        want = ref(x, offset)
        torch.testing.assert_close(fwd(x, offset), want)
        _no_traced_values(model)
    assert fwd.captures, trident.explain(fwd)
    assert fwd.dynamo_calls == 0


class State(torch.nn.Module):
    """State kept on the module: rebinds a tensor attribute it reads."""

    def __init__(self):
        super().__init__()
        self.h = torch.zeros(16)

    def forward(self, x):
        self.h = axpy(self.h, x)
        return self.h * 1


def test_state_kept_on_a_module_goes_through_dynamo():
    torch.manual_seed(0)
    model, ref = State(), State()
    fwd = trident.compile(model.forward)

    def after():
        torch.testing.assert_close(model.h, ref.h)
        _no_traced_values(model)

    _served_like_eager(fwd, ref, 16, 6, after)
    assert "changes state it keeps outside its arguments" in trident.explain(fwd)
    torch._dynamo.reset()


def test_capture_says_which_attribute():
    model = State()
    with pytest.raises(CaptureError, match=r"rebinds self\.h \(a tensor attribute it reads\)") as info:
        trident.capture(model.forward, torch.randn(16))
    assert info.value.module_state
    assert isinstance(model.h, torch.Tensor) and not isinstance(model.h, torch._subclasses.fake_tensor.FakeTensor)
    torch.testing.assert_close(model.h, torch.zeros(16))  # as the trace found it



class Tables(torch.nn.Module):
    """A length counter beside the table (no `is None` escape): both must come back together."""

    def __init__(self):
        super().__init__()
        self._seq_len_cached = 0
        self._cos_cached = torch.zeros(0, 8)

    def forward(self, x, seqlen: int):
        if seqlen > self._seq_len_cached:
            self._seq_len_cached = seqlen
            self._cos_cached = torch.cos(torch.arange(seqlen, dtype=torch.float32)[:, None] * torch.ones(8))
        return axpy(x, self._cos_cached[:seqlen].sum(0).contiguous())


def test_a_static_trace_puts_back_the_length_with_the_table():
    model, ref = Tables(), Tables()
    x = torch.randn(8)
    torch.testing.assert_close(model(x, 4), ref(x, 4))
    trident.capture(model.forward, x, 8)  # the traced call rebuilds for 8
    assert model._seq_len_cached == 4 and model._cos_cached.shape == (4, 8)
    torch.testing.assert_close(model(x, 6), ref(x, 6))  # eager rebuilds for 6, as ref does


class ListState(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hs = [torch.zeros(16)]

    def forward(self, x):
        self.hs = [axpy(self.hs[0], x)]
        return self.hs[0] * 1


class Engine:
    """A plain object holding the model (the function's `self` is no module)."""

    def __init__(self):
        self.model = Model()

    def step(self, x, offset: int):
        return self.model(x, offset)


def test_state_in_a_list_and_a_model_behind_a_plain_object():
    with pytest.raises(CaptureError, match=r"rebinds self\.hs"):
        trident.capture(ListState().forward, torch.randn(16))
    model, ref = ListState(), ListState()
    fwd = trident.compile(model.forward)
    for _ in range(5):
        x = torch.randn(16)
        torch.testing.assert_close(fwd(x), ref(x))
    engine = Engine()
    trident.capture(engine.step, torch.randn(4, 4), 3, dynamic=True)
    _no_traced_values(engine.model)
    assert engine.model.rotary._seq_len_cached == 0 and engine.model.rotary._cos_cached is None
    torch._dynamo.reset()


class Counting(torch.nn.Module):
    """Python state kept on a module: a counter the result reads, a history list, a dict entry."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.history = []
        self.last = {}

    def forward(self, x):
        self.calls += 1
        y = axpy(x, x)
        self.history.append(y.sum())
        self.last["y"] = y
        return y * self.calls


def test_python_state_kept_on_a_module_goes_through_dynamo():
    """Before, the capture dropped the side effects: `calls` stayed 1 and every result was 2 x
    the traced call's, and the trace's fake tensor stayed in `history`."""
    torch.manual_seed(0)
    model, ref = Counting(), Counting()
    fwd = trident.compile(model.forward)

    def after():
        assert model.calls == ref.calls and len(model.history) == len(ref.history)
        torch.testing.assert_close(torch.stack(model.history), torch.stack(ref.history))
        torch.testing.assert_close(model.last["y"], ref.last["y"])
        assert not any(isinstance(h, torch._subclasses.fake_tensor.FakeTensor) for h in model.history)

    _served_like_eager(fwd, ref, 16, 5, after)
    assert "changes self.calls (1 -> 2)" in trident.explain(fwd)
    torch._dynamo.reset()


class Appending(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.outputs = []

    def forward(self, x):
        y = axpy(x, x)
        self.outputs.append(y)
        return y


class Lazy(torch.nn.Module):
    """A helper object made on the first call: no state a capture must replay."""

    def forward(self, x):
        if not hasattr(self, "helper"):
            self.helper = object()
        return axpy(x, x)


def test_a_trace_leaves_containers_as_found_and_says_what_changed():
    model = Appending()
    with pytest.raises(CaptureError, match=r"changes self\.outputs \(its contents: 0 -> 1 item\(s\)\)") as info:
        trident.capture(model.forward, torch.randn(16))
    assert info.value.module_state and model.outputs == []  # the trace's fake tensor is gone
    lazy = Lazy()
    trident.capture(lazy.forward, torch.randn(16))  # stands: an attribute added, put back
    assert not hasattr(lazy, "helper")


class Stepper:
    """A plain object (no module) whose bound method keeps a step count and a log."""

    def __init__(self):
        self.steps = 0
        self.log = []

    def step(self, x):
        self.steps += 1
        self.log.append(self.steps)
        return axpy(x, x) * self.steps


STEPS = {"n": 0}


def counted(x):
    STEPS["n"] += 1
    return axpy(x, x) * STEPS["n"]


def test_python_state_outside_modules_goes_through_dynamo():
    """A plain object's counter and a global dict's entry: the function's own side effects,
    which a capture dropped (results stayed the traced call's from the third call on)."""
    torch.manual_seed(0)
    stepper, ref = Stepper(), Stepper()
    fwd = trident.compile(stepper.step)

    def after():
        assert (stepper.steps, stepper.log) == (ref.steps, ref.log)

    _served_like_eager(fwd, ref.step, 8, 4, after)
    assert "changes self.steps (1 -> 2)" in trident.explain(fwd)
    STEPS["n"] = 0
    fn = trident.compile(counted)
    for n in range(1, 5):
        x = torch.randn(8)
        torch.testing.assert_close(fn(x), 3.5 * x * n)
        assert STEPS["n"] == n
    assert "changes STEPS['n'] (1 -> 2)" in trident.explain(fn)
    torch._dynamo.reset()


class Cached:
    """A memo dict on a plain object's attribute, filled on a miss: the trace's entry goes."""

    def __init__(self):
        self.memo = {}

    def run(self, x):
        key = x.shape[0]
        if key not in self.memo:
            self.memo[key] = torch.ones(key)
        return axpy(x, self.memo[key])


def test_a_memo_entry_the_trace_made_is_removed_and_the_capture_stands():
    cached = Cached()
    trident.capture(cached.run, torch.randn(8))
    assert cached.memo == {}  # no fake tensor left for an eager call to find
    fwd = trident.compile(cached.run)
    for _ in range(3):
        x = torch.randn(8)
        torch.testing.assert_close(fwd(x), 2.5 * x + 1)
    assert fwd.captures and fwd.dynamo_calls == 0


logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Step:
    n: int


class Mode(enum.Enum):
    A = 1
    B = 2


class Kept(torch.nn.Module):
    """State in values that are not ints: a tuple, a list replaced, a dataclass, an enum."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.pos, self.hist, self.step, self.mode = kind, (0,), [], Step(0), Mode.A

    def forward(self, x):
        if self.kind == "tuple":
            self.pos = (self.pos[0] + 1,)
            n = self.pos[0]
        elif self.kind == "list":
            self.hist = self.hist + [1]
            n = len(self.hist)
        elif self.kind == "object":
            self.step = Step(self.step.n + 1)
            n = self.step.n
        else:
            self.mode = Mode.B if self.mode is Mode.A else Mode.A
            n = self.mode.value
        return axpy(x, x) * n


@pytest.mark.parametrize("kind", ["tuple", "list", "object", "enum"])
def test_state_in_other_values_goes_through_dynamo(kind):
    model, ref = Kept(kind), Kept(kind)
    _served_like_eager(trident.compile(model.forward), ref, 8, 4)
    torch._dynamo.reset()


class Stateless(torch.nn.Module):
    """What is no state: a logger it names (logging's own caches change under a trace), a value
    set again to what it was, a buffer registered lazily, an OrderedDict memo."""

    def __init__(self):
        super().__init__()
        self.scale = 0.0
        self.memo = collections.OrderedDict()

    def forward(self, x):
        logger.debug("step")
        self.scale = 1.0 / x.shape[0]
        if not hasattr(self, "ones"):
            self.register_buffer("ones", torch.ones(8), persistent=False)
        self.memo.setdefault(x.shape[0], "seen")
        return axpy(x, self.ones) * self.scale


def test_what_is_no_state_keeps_its_capture():
    model = Stateless()
    trident.capture(model.forward, torch.randn(8))
    assert not hasattr(model, "ones") and model.memo == {} and model.scale == 0.0  # as found
    fwd = trident.compile(model.forward)
    for _ in range(3):
        x = torch.randn(8)
        torch.testing.assert_close(fwd(x), (2.5 * x + 1) / 8)
    assert fwd.captures and fwd.dynamo_calls == 0, trident.explain(fwd)


def test_a_compiled_function_inside_a_compiled_function():
    """The inner function's capture cache is Trident's own state, not the outer's."""
    inner = trident.compile(lambda x: axpy(x, x))

    def outer(x):
        return inner(x) * 2

    fwd = trident.compile(outer)
    for _ in range(3):
        x = torch.randn(8)
        torch.testing.assert_close(fwd(x), 7 * x)
    assert fwd.captures and fwd.dynamo_calls == 0, trident.explain(fwd)


NS = types.SimpleNamespace(n=0)


@dataclasses.dataclass
class Holder:
    h: torch.Tensor


class Effects(torch.nn.Module):
    """Side effects a capture used to drop, each with results that show it (the second review's)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.seen, self.log = kind, [], collections.deque()
        self._seq_len_cached, self._cos_cached, self.k, self.aux = 0, None, None, None
        self.state = Holder(torch.zeros(()))
        self.h = torch.zeros(8)

    def forward(self, x):
        n = x.shape[0]
        if self.kind == "beside_a_table":  # a list appended to beside a rebuilt table
            if n > self._seq_len_cached:
                self._seq_len_cached, self._cos_cached = n, torch.arange(n, dtype=torch.float32)
            self.seen.append(n)
            return axpy(x, x) * len(self.seen)
        if self.kind == "namespace":  # a standard-library namespace's counter
            NS.n += 1
            return axpy(x, x) * NS.n
        if self.kind == "deque":
            self.log.append(n)
            return axpy(x, x) * len(self.log)
        if self.kind == "filled":  # a cache allocated lazily, then written in place from the input
            if self.k is None or self.k.shape[0] != n:
                self.k = torch.zeros(n)
            self.k.add_(x)
            return axpy(self.k, x)
        if self.kind == "recorded":  # a result recorded on the module (a MoE's auxiliary loss)
            y = axpy(x, x)
            self.aux = y.sum()
            return y
        # an object replaced each call, holding the state the next call reads
        self.state = Holder(self.state.h + axpy(x, x).sum())
        return x * self.state.h


@pytest.mark.parametrize("kind", ["beside_a_table", "namespace", "deque", "filled", "recorded", "object"])
def test_side_effects_the_capture_would_drop_go_through_dynamo(kind):
    NS.n = 0
    model, ref = Effects(kind), Effects(kind)
    fwd = trident.compile(model.forward)
    for n in (4, 8, 8, 4, 8, 8):
        x = torch.ones(n)
        want = ref(x)
        if kind == "namespace":
            NS.n -= 1  # the reference counted too
        torch.testing.assert_close(fwd(x), want)
        if kind == "recorded":
            torch.testing.assert_close(model.aux, ref.aux)  # the capture's result, recorded
    assert fwd.dynamo_calls > 0, trident.explain(fwd)
    torch._dynamo.reset()


class Wrapping(dict):
    def __getitem__(self, key):
        return ("wrapped", dict.__getitem__(self, key))


class Refusing:
    def __getattr__(self, name):
        raise KeyError(name)


class Containers(torch.nn.Module):
    """Containers whose classes override what a snapshot would call; an object that refuses reads."""

    def __init__(self):
        super().__init__()
        self.lru = collections.OrderedDict((i, i) for i in range(3))
        self.wrapping = Wrapping(a=1)
        self.odd = Refusing()

    def forward(self, x):
        self.lru[x.shape[0]] = "new"
        self.lru.popitem(last=False)  # an LRU's eviction: the trace's changes, put back
        return axpy(x, x) * self.wrapping["a"][1]


def test_containers_are_put_back_as_stored():
    model = Containers()
    trident.capture(model.forward, torch.randn(8))
    assert list(model.lru.items()) == [(0, 0), (1, 1), (2, 2)]  # consistent (iterable) and in order
    assert dict.__getitem__(model.wrapping, "a") == 1
