"""Hit/miss accounting, miss reasons, and bad input: a miss plus a correct result when the
kernel can serve it, otherwise a TridentError naming what was expected. Never a crash."""

from __future__ import annotations

import random

import pytest
import torch

import trident
from tests import kernels as K
from tests.decode_model import misaligned
from trident.runtime import SCMRuntime, check_verbose


def _opt(fn, *example):
    return trident.optimize(trident.capture(fn, *example))


def _stats(opt):
    (s,) = trident.cache_info(opt).values()
    return s


def test_hits_and_misses_are_counted(device):
    opt = _opt(K.axpy, torch.randn(1000, device=device), torch.randn(1000, device=device))
    assert _stats(opt) | {} == _stats(opt)
    s = _stats(opt)
    assert (s["hits"], s["misses"], s["specializations"]) == (0, 0, 1)
    x, y = torch.randn(1000, device=device), torch.randn(1000, device=device)
    for _ in range(4):
        torch.testing.assert_close(opt(x, y), K.axpy_ref(x, y))
    s = _stats(opt)
    assert (s["hits"], s["misses"], s["specializations"]) == (4, 0, 1)

    # Misaligned first input: Triton keys it '*fp32' (no 'D'), so a new specialization.
    xs = torch.randn(1001, device=device)[1:]
    torch.testing.assert_close(opt(xs, y), K.axpy_ref(xs, y))
    s = _stats(opt)
    assert (s["hits"], s["misses"], s["specializations"]) == (4, 1, 2)
    assert s["last_miss_reason"] == (
        "specialization 0: tensor 'x' alignment mismatch: expected 16-byte aligned, got offset 4"
    )
    # Same signature again: a hit on the new specialization.
    torch.testing.assert_close(opt(xs, y), K.axpy_ref(xs, y))
    s = _stats(opt)
    assert (s["hits"], s["misses"], s["specializations"], s["last_specialization"]) == (5, 1, 2, 1)
    assert "last miss: specialization 0: tensor 'x' alignment mismatch" in trident.explain(opt)


def test_new_dtype_is_a_miss_with_a_correct_result(device):
    opt = _opt(K.axpy, torch.randn(1000, device=device), torch.randn(1000, device=device))
    x, y = torch.randn(1000, device=device, dtype=torch.float64), torch.randn(1000, device=device, dtype=torch.float64)
    out = opt(x, y)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, K.axpy_ref(x, y))
    s = _stats(opt)
    assert (s["misses"], s["specializations"]) == (1, 2)
    assert "dtype mismatch: expected f32, got f64" in s["last_miss_reason"]


def test_wrong_arity_and_non_tensor():
    opt = _opt(K.axpy, torch.randn(1000), torch.randn(1000))
    with pytest.raises(trident.TridentError, match=r"expected 2 positional inputs \(x, y\), got 1"):
        opt(torch.randn(1000))
    with pytest.raises(trident.TridentError, match=r"input 'y' \(position 1\) expected a Tensor, got int"):
        opt(torch.randn(1000), 3)
    with pytest.raises(trident.TridentError, match=r"input 'x' \(position 0\) expected a strided \(dense\) tensor"):
        opt(torch.randn(1000).to_sparse(), torch.randn(1000))


def test_other_shape_or_rank_raises_guard_error():
    opt = _opt(K.axpy, torch.randn(1000), torch.randn(1000))
    with pytest.raises(trident.GuardError, match=r"expected sizes \[1000\] and strides \[1\] as captured, got sizes \[10, 100\]"):
        opt(torch.randn(10, 100), torch.randn(1000))
    with pytest.raises(trident.GuardError, match=r"got sizes \[999\]"):
        opt(torch.randn(999), torch.randn(1000))
    # The failed miss left the SCM usable.
    x, y = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(opt(x, y), K.axpy_ref(x, y))


def test_dtype_triton_cannot_take_raises_trident_error():
    opt = _opt(K.axpy, torch.randn(1000), torch.randn(1000))
    z = torch.randn(1000, dtype=torch.complex64)
    with pytest.raises(trident.TridentError, match="Triton has no pointer type for dtype 'complex64'"):
        opt(z, z)
    x = torch.randn(1000)
    torch.testing.assert_close(opt(x, x), K.axpy_ref(x, x))  # the region still serves others


def test_captured_scalar_inputs_are_guarded():
    def fn(x, k):
        return K.axpy(x, x) + k

    opt = _opt(fn, torch.randn(1000), 3)
    x = torch.randn(1000)
    torch.testing.assert_close(opt(x, 3), K.axpy_ref(x, x) + 3)
    with pytest.raises(trident.GuardError, match="captured as the constant 3, got 4"):
        opt(x, 4)


@pytest.mark.cuda
def test_mixed_devices_raise():
    opt = _opt(K.axpy, torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda"))
    with pytest.raises(trident.TridentError, match="mixes devices"):
        opt(torch.randn(1000, device="cuda"), torch.randn(1000))


def test_native_guards_agree_with_python_twin():
    """The generated guard code (probe) and check_verbose agree on many generated inputs."""
    opt = _opt(K.axpy, torch.randn(64), torch.randn(64))
    (rid,) = opt.meta["trident_regions"]
    rt = SCMRuntime.get(rid)
    # Grow a few specializations: misaligned x, misaligned y, float64.
    opt(torch.randn(65)[1:], torch.randn(64))
    opt(torch.randn(64), torch.randn(66)[2:])
    opt(torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64))
    rng = random.Random(0)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.int32]
    checked = 0
    for _ in range(400):
        def make():
            dt = rng.choice(dtypes)
            shape = rng.choice([(64,), (63,), (8, 8), (65,)])
            n = 1
            for s in shape:
                n *= s
            off = rng.randrange(0, 4)
            base = torch.zeros(n + off, dtype=dt)
            t = base[off:off + n].view(shape)
            if rng.random() < 0.2 and len(shape) == 2:
                t = t.t()
            return t

        inputs = [make(), make()]
        expected = next(
            (s.index for s in rt.scm.specializations if all(check_verbose(g, inputs[g.input]) is None for g in s.guards)),
            -1,
        )
        assert rt.probe(inputs) == expected, [(t.dtype, t.shape, t.stride(), t.data_ptr() % 16) for t in inputs]
        checked += 1
    assert checked == 400


def test_one_tensor_in_two_positions_at_capture_is_guarded(device):
    """make_fx traces one tensor passed twice as one value, so the graph reads it for both
    positions: distinct tensors there later would silently get the wrong answer. They raise."""
    x0 = torch.randn(1000, device=device)
    opt = _opt(K.axpy, x0, x0)
    x, y = torch.randn(1000, device=device), torch.randn(1000, device=device)
    with pytest.raises(trident.GuardError, match=r"inputs 'x' \(position 0\) and 'y' \(position 1\) were one tensor at capture"):
        opt(x, y)
    torch.testing.assert_close(opt(x, x), K.axpy_ref(x, x))
    # Captured with distinct tensors, the same tensor twice is an ordinary call.
    opt = _opt(K.axpy, x0, torch.randn(1000, device=device))
    torch.testing.assert_close(opt(x, x), K.axpy_ref(x, x))
    torch.testing.assert_close(opt(x, y), K.axpy_ref(x, y))


def _axpy_rounded_once(a, b):
    return K.axpy_ref(a.double(), b.double()).to(a.dtype)  # the kernel rounds once, in fp32


def test_a_miss_builds_only_the_new_specialization(device):
    """Note [One host program per specialization]: each miss compiles one host program, the
    earlier ones stay as they were and keep serving their inputs; calls interleaved over five
    specializations each take the first whose guards hold, with correct results."""
    from trident.optimize import _regions

    x, y = torch.randn(1000, device=device), torch.randn(1000, device=device)
    opt = _opt(K.axpy, x, y)
    (rt,) = _regions(opt)
    kinds = [
        lambda: (torch.randn(1000, device=device), torch.randn(1000, device=device)),
        lambda: (torch.randn(1000, device=device, dtype=torch.float64), torch.randn(1000, device=device, dtype=torch.float64)),
        lambda: (misaligned(torch.randn(1000, device=device)), torch.randn(1000, device=device)),
        lambda: (torch.randn(1000, device=device), misaligned(torch.randn(1000, device=device), 2)),
        lambda: (torch.randn(1000, device=device, dtype=torch.float16), torch.randn(1000, device=device, dtype=torch.float16)),
    ]
    texts = []
    for i, make in enumerate(kinds):  # one miss each after the first
        a, b = make()
        torch.testing.assert_close(opt(a, b), _axpy_rounded_once(a, b))
        assert len(rt.host_mlirs) == len(rt.build_costs) == i + 1
        assert rt.host_mlirs[:i] == texts  # the earlier programs were not rebuilt
        texts = list(rt.host_mlirs)
        assert rt.build_costs[-1]["specialization"] == i
    random.seed(0)
    for _ in range(40):
        k = random.randrange(len(kinds))
        a, b = kinds[k]()
        torch.testing.assert_close(opt(a, b), _axpy_rounded_once(a, b))
        assert rt.probe([a, b]) == k  # axpy's region reads its two inputs in this order
    s = _stats(opt)
    assert s["specializations"] == 5 and s["misses"] == 4


def test_host_program_code_does_not_grow_with_the_region():
    """Note [Host plans]: a region's steps are a table the runtime walks, so the code compiled per
    specialization (guards loop, size program, the run_plan call) is the same for a 1- and a
    3-layer decode step; only the step table and the guard table's data grow. The alignment miss
    reuses the first specialization's layouts (Note [Layouts per input facts])."""
    import functools
    import re

    from tests.decode_model import Config, decode_step, make_caches, make_weights
    from trident.optimize import _regions

    code, ops = [], []
    for layers in (1, 3):
        cfg = Config(layers=layers)
        weights, cos, sin = make_weights(cfg, "cpu")
        caches = make_caches(cfg, "cpu")
        x, pos = torch.randn(1, cfg.hidden), torch.tensor([0])
        opt = trident.optimize(trident.capture(functools.partial(decode_step, cfg), x, pos, cos, sin, *caches, *weights))
        (rt,) = _regions(opt)
        (layouts,) = rt.program.layouts.values()
        opt(misaligned(x), pos, cos, sin, *caches, *weights)  # a miss: specialization 1
        assert len(rt.scm.specializations) == 2
        assert list(rt.program.layouts.values()) == [layouts]  # propagated once for both
        text = re.sub(r"dense<[^>]*>", "dense<...>", rt.host_mlirs[1])  # the guard table's data
        text = re.sub(r"\d+", "N", text)  # its length and the specialization's constants
        code.append(text)
        ops.append(len(rt.host_plans[1].ops))
    assert code[0] == code[1]
    assert ops[1] > 2.5 * ops[0]
    assert f"host plan: {ops[1]} op(s), 0 computed size(s); built in plan" in trident.explain(opt)


def test_an_alignment_miss_replans_only_the_launches_that_read_the_input():
    """_memo_launch_plan: launches whose arguments have the facts of an earlier specialization's
    reuse its plan (Triton's binder not called again); the others are planned anew, with the new
    key, and every result stays right."""
    import functools

    from tests.decode_model import Config, decode_step, make_caches, make_weights
    from trident.optimize import _regions

    cfg = Config(layers=2)
    weights, cos, sin = make_weights(cfg, "cpu")
    caches = make_caches(cfg, "cpu")
    x, pos = torch.randn(1, cfg.hidden), torch.tensor([0])
    step = functools.partial(decode_step, cfg)
    opt = trident.optimize(trident.capture(step, x, pos, cos, sin, *caches, *weights))
    (rt,) = _regions(opt)
    planned = len(rt.program.launch_plans)
    assert planned == len(rt.program.launches)
    xm = misaligned(torch.randn(1, cfg.hidden))
    ref_caches = [c.clone() for c in caches]
    want = step(xm.clone(), pos, cos, sin, *ref_caches, *weights)
    torch.testing.assert_close(opt(xm, pos, cos, sin, *caches, *weights), want)
    assert len(rt.scm.specializations) == 2
    new = len(rt.program.launch_plans) - planned
    assert 0 < new < len(rt.program.launches)  # only launches reading the misaligned state
    first, second = rt.scm.specializations
    changed = [a.key != b.key for a, b in zip(first.launches, second.launches)]
    assert sum(changed) == new and any(changed)
