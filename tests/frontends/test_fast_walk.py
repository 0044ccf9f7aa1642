"""Generated structure checks (Note [Generated structure checks]): the golden of one, its verdicts
against the generic walk's over many changed calls, and the hit path of trident.compile through it."""

from __future__ import annotations

import copy
import random

import expecttest
import pytest
import torch

import trident
from tests.recurrent_model import RecurrentModel, decode
from trident.frontends import compile as fc
from trident.frontends import fast_walk, state


class Layer:
    def __init__(self, n):
        self.state = {"h": torch.zeros(2, n), "steps": 0}
        self.window = [torch.ones(n), None]


class Cache:
    def __init__(self, layers=2, n=3):
        self.layers = [Layer(n) for _ in range(layers)]
        self.seen = 5
        self.dtype = torch.float32


def _call(*args, dynamic=None, **kwargs):
    return fc._Call(args, kwargs, dynamic)


class TestGolden(expecttest.TestCase):
    def test_source(self):
        call = _call(torch.ones(4), Cache(), 3, scale=0.5)
        fn, src = fast_walk.make_checker(call, None, ["x", "cache", "n", "scale"])
        assert fn is not None, src
        self.assertExpectedInline(src, """\
# c1 = the class builtins.tuple
# c2 = ('scale',)
# c3 = the class builtins.float
# c4 = 0.5
# c5 = the class tests.frontends.test_fast_walk.Cache
# c6 = ('layers', 'seen', 'dtype')
# c7 = the class builtins.list
# c8 = the class tests.frontends.test_fast_walk.Layer
# c9 = ('state', 'window')
# c10 = ('h', 'steps')
# c11 = the class torch.dtype
# c12 = torch.float32
def check(args, kwargs):
    try:
        if type(args) is not c1 or len(args) != 3: return None
        if type(kwargs) is not dict or tuple(kwargs) != c2: return None
        v0 = args[0]  # x
        v1 = args[1]  # cache
        v2 = args[2]  # n
        v3 = kwargs['scale']  # scale
        if not isinstance(v0, Tensor): return None
        if type(v2) is not int: return None
        if type(v3) is not c3 or v3 != c4: return None
        if type(v1) is not c5: return None
        v4 = v1.__dict__  # cache.__dict__
        if type(v4) is not dict or tuple(v4) != c6: return None
        v5 = v4['layers']  # cache.layers
        if type(v5) is not c7 or len(v5) != 2: return None
        v6 = v5[0]  # cache.layers[0]
        if type(v6) is not c8: return None
        v7 = v6.__dict__  # cache.layers[0].__dict__
        if type(v7) is not dict or tuple(v7) != c9: return None
        v8 = v7['state']  # cache.layers[0].state
        if type(v8) is not dict or tuple(v8) != c10: return None
        v9 = v8['h']  # cache.layers[0].state['h']
        if not isinstance(v9, Tensor): return None
        v10 = v8['steps']  # cache.layers[0].state['steps']
        if type(v10) is not int: return None
        v11 = v7['window']  # cache.layers[0].window
        if type(v11) is not c7 or len(v11) != 2: return None
        v12 = v11[0]  # cache.layers[0].window[0]
        if not isinstance(v12, Tensor): return None
        v13 = v11[1]  # cache.layers[0].window[1]
        if v13 is not None: return None
        v14 = v5[1]  # cache.layers[1]
        if type(v14) is not c8: return None
        v15 = v14.__dict__  # cache.layers[1].__dict__
        if type(v15) is not dict or tuple(v15) != c9: return None
        v16 = v15['state']  # cache.layers[1].state
        if type(v16) is not dict or tuple(v16) != c10: return None
        v17 = v16['h']  # cache.layers[1].state['h']
        if not isinstance(v17, Tensor): return None
        v18 = v16['steps']  # cache.layers[1].state['steps']
        if type(v18) is not int: return None
        v19 = v15['window']  # cache.layers[1].window
        if type(v19) is not c7 or len(v19) != 2: return None
        v20 = v19[0]  # cache.layers[1].window[0]
        if not isinstance(v20, Tensor): return None
        v21 = v19[1]  # cache.layers[1].window[1]
        if v21 is not None: return None
        v22 = v4['seen']  # cache.seen
        if type(v22) is not int: return None
        v23 = v4['dtype']  # cache.dtype
        if type(v23) is not c11 or v23 != c12: return None
        if len({id(v1), id(v5), id(v6), id(v8), id(v11), id(v14), id(v16), id(v19)}) != 8: return None
        v24 = v0.shape  # its sizes: 0, 1 or 2 and more, as the symbolic trace specialized them
        if len(v24) != 1 or v24[0] < 2: return None
        v25 = v9.shape  # its sizes: 0, 1 or 2 and more, as the symbolic trace specialized them
        if len(v25) != 2 or v25[0] < 2 or v25[1] < 2: return None
        v26 = v12.shape  # its sizes: 0, 1 or 2 and more, as the symbolic trace specialized them
        if len(v26) != 1 or v26[0] < 2: return None
        v27 = v17.shape  # its sizes: 0, 1 or 2 and more, as the symbolic trace specialized them
        if len(v27) != 2 or v27[0] < 2 or v27[1] < 2: return None
        v28 = v20.shape  # its sizes: 0, 1 or 2 and more, as the symbolic trace specialized them
        if len(v28) != 1 or v28[0] < 2: return None
        if v2 < 2: return None
        if v10 != 0: return None
        if v18 != 0: return None
        if v22 < 2: return None
        return [v0, v1, v2, v3, v9, v10, v12, v13, v17, v18, v20, v21, v22, v23], [v0, v9, v12, v17, v20], (v2, v10, v18, v22, )
    except (KeyError, IndexError, AttributeError, TypeError):
        return None
""")


# Changes to a call, each a function of (args, kwargs) -> (args, kwargs) on a deep copy.
def _change(rng, args, kwargs):
    x, cache, n = args
    layer = rng.choice(cache.layers)
    what = rng.randrange(16)
    if what == 0:
        layer.state["h"] = torch.zeros(2, rng.choice([1, 3, 5]))  # a new tensor, maybe a new size class
    elif what == 1:
        layer.state["steps"] = rng.choice([0, 1, 2, 7])  # an int: its size class
    elif what == 2:
        layer.state["extra"] = 1  # a new key
    elif what == 3:
        del layer.state["steps"]
    elif what == 4:
        layer.window.append(None)
    elif what == 5:
        layer.window[1] = torch.ones(1)  # None -> a tensor
    elif what == 6:
        layer.state["h"] = [torch.zeros(2, 3)]  # a tensor -> a list
    elif what == 7:
        cache.layers[1] = cache.layers[0]  # one object met twice
    elif what == 8:
        cache.seen = True  # an int -> a bool
    elif what == 9:
        cache.dtype = torch.float16
    elif what == 10:
        kwargs = {**kwargs, "scale": 0.25}
    elif what == 11:
        args = (x, cache, rng.choice([0, 1, 2, 9]))
    elif what == 12:
        cache.layers = tuple(cache.layers)  # a list -> a tuple
    elif what == 13:
        layer.window = list(layer.window)  # an equal list, a new object: same structure
    elif what == 14:
        cache.__dict__["note"] = "x"  # a new attribute
    else:
        args = (torch.ones(rng.choice([1, 4]), 2), cache, n)  # a rank or size class
    return args, kwargs


@pytest.mark.parametrize("dynamic", [None, False])
def test_verdicts_equal_the_generic_walks(dynamic):
    """Over 400 calls changed at random from a recorded one: the check accepts exactly the calls
    whose generic structure equals the recorded one (an object met twice excepted: it may
    refuse those), and then returns the generic walk's leaves, tensors and ints."""
    rng = random.Random(0)
    base = ((torch.ones(4), Cache(), 3), {"scale": 0.5})
    like = fc._Call(*base, dynamic)
    fn, src = fast_walk.make_checker(like, dynamic)
    assert fn is not None, src
    accepted = refused = 0
    for _ in range(400):
        args, kwargs = copy.deepcopy(base)
        for _ in range(rng.randrange(1, 3)):
            args, kwargs = _change(rng, args, kwargs)
        generic = fc._Call(args, kwargs, dynamic)
        got = fn(args, kwargs)
        if got is None:
            refused += 1
            aliased = len({id(o) for _, _, o, _, _ in generic.walk.nodes}) < len(generic.walk.nodes) or any(
                state.walkable(v) for _, _, v in generic.walk.leaves)
            assert generic.structure != like.structure or aliased
            continue
        accepted += 1
        assert generic.structure == like.structure
        leaves, tensors, ints = got
        assert all(a is b for a, b in zip(leaves, generic.leaves)) and len(leaves) == len(generic.leaves)
        assert all(a is b for a, b in zip(tensors, generic.tensors)) and ints == generic.ints
    assert accepted > 40 and refused > 100, (accepted, refused)


def test_keys_in_another_order_are_another_structure():
    """A dict (or kwargs, or attributes) whose keys come in another order is another structure
    for the generic walk (its leaves come in that order): the check refuses it too; a function
    that reads the first value must not be served the capture of the other order."""
    like = _call(Cache(), dynamic=None)
    fn, _ = fast_walk.make_checker(like, None)
    cache = Cache()
    cache.layers[0].state = {"steps": 0, "h": torch.zeros(2, 3)}
    assert fn((cache,), {}) is None and fc._Call((cache,), {}, None).structure != like.structure
    cache = Cache()
    cache.__dict__ = {"seen": 5, "layers": cache.layers, "dtype": torch.float32}
    assert fn((cache,), {}) is None
    kw = _call(torch.ones(2), a=1, b=2.0)
    kfn, _ = fast_walk.make_checker(kw, None)
    assert kfn((torch.ones(2),), {"a": 1, "b": 2.0}) is not None and kfn((torch.ones(2),), {"b": 2.0, "a": 1}) is None

    from tests import kernels as K

    def first(x, d):
        return K.axpy(x, next(iter(d.values())))

    compiled = trident.compile(first)
    x, a, b = torch.randn(64), torch.randn(64), torch.randn(64)
    for _ in range(4):
        compiled(x, {"a": a, "b": b})
    torch.testing.assert_close(compiled(x, {"b": b, "a": a}), K.axpy_ref(x, b))


def test_keys_that_are_not_literals_and_dicts_that_insert():
    """Keys of other types than plain str/int (an IntEnum) are named constants of the check, never
    source text; a defaultdict in the state is left to the generic walk (reading a key it lacks
    would insert it)."""
    import collections
    import enum

    class Kind(enum.IntEnum):
        H = 0

    holder = Cache()
    holder.by_kind = {Kind.H: torch.ones(2)}
    fn, src = fast_walk.make_checker(_call(holder), None)
    code = [line.split("#")[0] for line in src.split("def check")[1].splitlines()]
    assert fn is not None and not any("Kind" in line for line in code), src
    other = Cache()
    other.by_kind = {Kind.H: torch.ones(3)}
    assert fn((other,), {}) is not None
    other.by_kind = {0: torch.ones(3)}  # an int key equal to the enum: another structure for the walk?
    assert (fn((other,), {}) is not None) == (fc._Call((other,), {}, None).structure == fc._Call((holder,), {}, None).structure)
    dd = Cache()
    dd.counts = collections.defaultdict(int, a=0)
    assert fast_walk.make_checker(_call(dd), None)[0] is None


def test_what_it_does_not_express():
    big = Cache()
    big.many = [torch.ones(1)] * (state.MAX_LEAVES + 1)  # walked: the walk stops at MAX_LEAVES
    cut = _call(big)
    assert fast_walk.make_checker(cut, None)[0] is None
    import collections

    Pair = collections.namedtuple("Pair", "a b")
    pair = _call(Pair(torch.ones(1), torch.ones(2)))  # a pytree node other than tuple/list/dict
    assert fast_walk.make_checker(pair, None) == (
        None, "an argument pytree flattens as a namedtuple (only tuples, lists and dicts are checked)")
    ordered = _call(collections.OrderedDict(h=torch.ones(1)))  # a dict argument is state, walked
    assert fast_walk.make_checker(ordered, None) == (None, "a OrderedDict (a dict subclass) in the state")
    nan = Cache()
    nan.scale = float("nan")
    assert fast_walk.make_checker(_call(nan), None)[0] is None


def test_steady_calls_do_not_walk(monkeypatch):
    """trident.compile of a recurrent model whose cache replaces its state every step: after the
    structure served a call, steady calls go through its generated check, walking nothing, and
    the decode equals eager's."""
    torch.manual_seed(0)
    model = RecurrentModel(dim=16, layers=3).eval()
    want, _ = decode(model, 16, 24)
    compiled = trident.compile(model)
    walks = []
    real = state.walk
    monkeypatch.setattr(state, "walk", lambda roots: walks.append(1) or real(roots))
    got, _ = decode(compiled, 16, 24)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert len(compiled._compiled._checks) >= 1
    assert f"structure checks: {len(compiled._compiled._checks)} generated" in trident.explain(compiled)
    # the eager calls, the captures, the first hit of each structure walk; the rest do not
    assert len(walks) <= 8, len(walks)


def test_the_structure_that_served_last_is_tried_first():
    """Two structures in turn (a state dict with one key, then two): each gets its check, and
    the one that served the latest call is tried first (a failing check costs a walk's time)."""
    from tests import kernels as K

    def f(x, state):
        return K.axpy(x, state["h"])

    compiled = trident.compile(f)
    x = torch.randn(64)
    one, two = {"h": torch.randn(64)}, {"h": torch.randn(64), "note": 1}
    for _ in range(4):
        for s in (one, two):
            torch.testing.assert_close(compiled(x, s), K.axpy_ref(x, s["h"]))
    assert len(compiled._checks) == 2  # dict arguments: pytree's containers are checked too
    assert compiled._checks[0].fn((x, two), {}) is not None
    compiled(x, one)
    assert compiled._checks[0].fn((x, one), {}) is not None and compiled._checks[0].fn((x, two), {}) is None


def test_containers_among_the_arguments():
    """Lists, tuples and dicts pytree flattens among the arguments are checked by type, length
    and keys, and their leaves fetched by index and key."""
    like = _call([torch.ones(2), (3, Cache())], {"k": torch.zeros(2)}, flag=True)
    fn, src = fast_walk.make_checker(like, None)
    assert fn is not None, src
    args = ([torch.ones(5), (4, Cache())], {"k": torch.zeros(3)})
    leaves, tensors, ints = fn(args, {"flag": True})
    generic = fc._Call(args, {"flag": True}, None)
    assert generic.structure == like.structure and all(a is b for a, b in zip(leaves, generic.leaves))
    assert ints == generic.ints and len(tensors) == len(generic.tensors)
    for changed in [([torch.ones(5)], {"k": torch.zeros(3)}), ([torch.ones(5), [4, Cache()]], {"k": torch.zeros(3)}),
                    ([torch.ones(5), (4, Cache())], {"j": torch.zeros(3)})]:
        assert fn(changed, {"flag": True}) is None
        assert fc._Call(changed, {"flag": True}, None).structure != like.structure


def test_at_most_checks_structures():
    """Five structures in turn: CHECKS (4) checks are kept, the oldest dropped; a dropped
    structure keeps the generic walk (a check remade on every call would cost more)."""
    from tests import kernels as K

    def f(x, state):
        return K.axpy(x, state["h"])

    compiled = trident.compile(f)
    x = torch.randn(64)
    states = [{"h": torch.randn(64), **{f"k{j}": j for j in range(i)}} for i in range(5)]
    for s in states:
        for _ in range(3):
            torch.testing.assert_close(compiled(x, s), K.axpy_ref(x, s["h"]))
    assert len(compiled._checks) == fc.CHECKS == 4
    assert all(c.fn((x, states[0]), {}) is None for c in compiled._checks)  # the first one was dropped
    for _ in range(3):  # it keeps the generic walk: no check made (and dropped) on every call
        torch.testing.assert_close(compiled(x, states[0]), K.axpy_ref(x, states[0]["h"]))
    assert all(c.fn((x, states[0]), {}) is None for c in compiled._checks) and len(compiled._checks) == 4
