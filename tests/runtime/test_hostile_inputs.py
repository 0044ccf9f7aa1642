"""Bad input never crashes the process and never gives a wrong answer: random inputs (dtypes,
sizes, ranks, layouts, alignments, aliasing, non-tensors) to optimized regions either give
eager's result or raise a TridentError that says what was expected -- nothing else."""

from __future__ import annotations

import random
import warnings

import pytest
import torch
import triton
import triton.language as tl

import trident
from tests import kernels as K
from trident.runtime.cpu_launcher import make_cpu_runner

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool,
          torch.complex64]
N = 1000


def _tensor(rng: random.Random, dtype: torch.dtype, n: int) -> torch.Tensor:
    layout = rng.choice(["contiguous", "strided", "offset", "expanded", "2d", "empty"])
    if layout == "strided":
        base = _values(rng, dtype, 2 * n)
        return base[::2]
    if layout == "offset":  # misaligned by one element
        return _values(rng, dtype, n + 1)[1:]
    if layout == "expanded":
        return _values(rng, dtype, 1).expand(n)
    if layout == "2d":
        return _values(rng, dtype, n).view(n // 10, 10)
    if layout == "empty":
        return _values(rng, dtype, 0)
    return _values(rng, dtype, n)


def _values(rng: random.Random, dtype: torch.dtype, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.randint(-50, 50, (n,), generator=g, dtype=dtype)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def _axpy_expected(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """What Triton computes for axpy_kernel: 2.5 * x + y in fp32 (fp64 for fp64 operands), stored
    in x's dtype (conversion toward zero for integers, nonzero -> True for bool)."""
    wide = torch.float64 if torch.float64 in (x.dtype, y.dtype) else torch.float32
    return (2.5 * x.to(wide) + y.to(wide)).to(x.dtype)


@pytest.mark.parametrize("seed", range(4))
def test_random_inputs_give_eager_results_or_trident_errors(seed):
    rng = random.Random(seed)
    opt = trident.optimize(trident.capture(K.axpy, torch.randn(N), torch.randn(N)))
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(40):
        kind = rng.random()
        dx = rng.choice(DTYPES)
        dy = dx if rng.random() < 0.7 else rng.choice(DTYPES)
        x = _tensor(rng, dx, N)
        y = x if rng.random() < 0.1 else _tensor(rng, dy, N)
        if kind < 0.05:
            x = rng.choice([None, 3, [1.0] * N, "x"])
        try:
            got = opt(x, y)
        except trident.TridentError as e:
            assert str(e), "an error must say what was expected"
            outcomes["refused"] += 1
            continue
        # Accepted: then it must be eager's answer for these inputs.
        assert isinstance(x, torch.Tensor) and x.shape == (N,) and x.stride() == (1,)
        assert got.dtype == x.dtype and got.shape == x.shape
        if x.dtype.is_floating_point and y.dtype.is_floating_point:
            tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(x.dtype, 1e-5)
            torch.testing.assert_close(got, _axpy_expected(x, y), rtol=tol, atol=tol)
        elif not (x.dtype.is_floating_point or y.dtype.is_floating_point) and x.dtype != torch.bool:
            assert torch.equal(got, _axpy_expected(x, y)), (x.dtype, y.dtype)
        # (float -> int/bool stores follow Triton's casts, not torch's: values not compared)
        outcomes["ok"] += 1
    assert outcomes["ok"] > 0 and outcomes["refused"] > 0, outcomes


def test_random_inputs_to_an_inplace_region_leave_refused_inputs_untouched():
    """A refused call must not have written anything: the guards run before any launch."""
    rng = random.Random(7)
    opt = trident.optimize(trident.capture(K.inplace_mul, torch.randn(N)))
    for _ in range(40):
        x = _tensor(rng, rng.choice(DTYPES), N)
        before = x.clone()
        try:
            got = opt(x)
        except trident.TridentError:
            assert torch.equal(x, before), "a refused call changed its input"
            continue
        assert x.shape == (N,) and x.stride() == (1,)
        if x.dtype.is_floating_point:
            want = K.inplace_mul_ref(before.to(torch.float64)).to(x.dtype)
            torch.testing.assert_close(x, want, rtol=1e-2, atol=1e-2)
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dx,dy", [(torch.bfloat16, torch.float64), (torch.bfloat16, torch.int32),
                                   (torch.int32, torch.bfloat16), (torch.float64, torch.bfloat16)])
def test_bfloat16_mixed_with_other_dtypes_on_the_cpu_path(dx, dy):
    """Triton 3.6's interpreter converts bfloat16 only from/to float32 (other casts reinterpret
    the numbers); Trident's CPU launcher routes the others through float32."""
    opt = trident.optimize(trident.capture(K.axpy, torch.randn(N), torch.randn(N)))
    x = (torch.randn(N, dtype=torch.float64) * 8).to(dx)
    y = (torch.randn(N, dtype=torch.float64) * 8).to(dy)
    got = opt(x, y)
    want = _axpy_expected(x, y)
    if dx.is_floating_point:
        torch.testing.assert_close(got.double(), want.double(), rtol=2e-2, atol=5e-2)
    else:  # float -> int stores truncate toward zero; bf16 rounding of y can move a value across an integer
        assert (got.double() - want.double()).abs().max() <= 1


@triton.jit
def _twice_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, v + v, mask=mask)


def _twice(x):
    out = torch.empty_like(x)
    _twice_kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
    return out


def test_bfloat16_kernels_on_the_cpu_path_are_warned_about_once():
    """Triton 3.6's interpreter does bfloat16 arithmetic on the values' bit patterns (a bf16
    axpy gives garbage, as under TRITON_INTERPRET=1): a kernel taking bf16 tensors on the CPU
    is named in one RuntimeWarning; float32 ones are not warned about."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trident.optimize(trident.capture(_twice, torch.randn(N)))(torch.randn(N))
    assert not [w for w in seen if "bfloat16" in str(w.message)]
    x = torch.randn(N, dtype=torch.bfloat16)
    with pytest.warns(RuntimeWarning, match=r"Triton kernel '_twice_kernel' takes bfloat16 tensors .* float32"):
        trident.optimize(trident.capture(_twice, x))(x)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trident.optimize(trident.capture(_twice, x + 1))(x + 1)
    assert not [w for w in seen if "bfloat16" in str(w.message)]


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def test_the_bfloat16_warning_waits_for_a_run_on_the_cpu():
    """Every kernel a region registers gets a CPU runner, on a GPU too, where it is never used: a
    bf16 CUDA model must not be told its kernels run through the interpreter. The warning comes
    with the runner's first run, once."""
    types = ["*bf16", "*bf16", "i32"]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = make_cpu_runner(_copy_kernel, ["x_ptr", "out_ptr", "n"], types, {"BLOCK": 32})
    assert not [w for w in seen if "bfloat16" in str(w.message)]
    x = torch.arange(40, dtype=torch.float32).to(torch.bfloat16)
    out = torch.zeros_like(x)
    with pytest.warns(RuntimeWarning, match=r"Triton kernel '_copy_kernel' takes bfloat16 tensors"):
        run((2, 1, 1), [x.data_ptr(), out.data_ptr(), 40])  # as the SCM passes them
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run((2, 1, 1), [x.data_ptr(), out.data_ptr(), 40])  # as the SCM passes them
    assert not [w for w in seen if "bfloat16" in str(w.message)]
    assert torch.equal(out, x)  # the program ran: a copy moves the bit patterns unchanged


def _perturb(rng: random.Random, t: torch.Tensor) -> torch.Tensor:
    """One hostile change to a decode-step input: its dtype, layout, alignment or shape."""
    change = rng.choice(["dtype", "strided", "offset", "shape", "transposed", "same"])
    if change == "dtype":
        return t.to(rng.choice([torch.float64, torch.float16, torch.int32, torch.int64]))
    if change == "strided":
        return torch.stack([t, t], dim=-1)[..., 0]  # same values, every other element
    if change == "offset":
        flat = torch.empty(t.numel() + 1, dtype=t.dtype)
        view = flat[1:].view(t.shape)
        view.copy_(t)
        return view
    if change == "shape":
        return torch.cat([t.flatten(), t.flatten()[:1]])
    if change == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)  # same values, other strides
    return t.clone()


@pytest.mark.parametrize("seed", range(3))
def test_hostile_inputs_to_a_decode_region_behave_like_eager(seed):
    """One region of launches, matmuls, attention and cache writes. Each call perturbs one input:
    Trident raises whenever eager raises; otherwise it returns eager's result and writes eager's
    caches, or refuses with a TridentError (a guard) -- leaving every cache untouched."""
    from tests.decode_model import Config, decode_step, decode_step_reference, make_caches, make_weights
    import functools

    cfg = Config(layers=1)
    weights, cos, sin = make_weights(cfg, "cpu")
    step = functools.partial(decode_step, cfg)
    args = [torch.randn(1, cfg.hidden), torch.tensor([3]), cos, sin, *make_caches(cfg, "cpu"), *weights]
    opt = trident.optimize(trident.capture(step, *args))
    rng = random.Random(seed)
    seen = set()
    for _ in range(12):
        i = rng.randrange(len(args))
        call = [a.clone() for a in args]
        call[i] = _perturb(rng, args[i])
        ref = [a.clone() for a in call]
        try:
            want = decode_step_reference(cfg, *ref)
            eager_error = None
        except Exception as e:  # noqa: BLE001 - eager's verdict
            eager_error = e
        before = [a.clone() for a in call]
        try:
            got = opt(*call)
        except trident.OperatorError as e:  # an operator failed as eager's does (after earlier steps ran)
            assert eager_error is not None, f"Trident raised {type(e).__name__}: {e} where eager ran"
            seen.add("both raised")
            continue
        except trident.TridentError:
            seen.add("refused")
            for a, b in zip(call, before):
                assert torch.equal(a, b), "a refused call wrote an input"
            continue
        except Exception as e:  # noqa: BLE001
            assert eager_error is not None, f"Trident raised {type(e).__name__}: {e} where eager ran"
            seen.add("both raised")
            continue
        assert eager_error is None, f"eager raised {eager_error!r}, Trident returned a result"
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
        for a, r in zip(call[4:4 + 2 * cfg.layers], ref[4:4 + 2 * cfg.layers]):
            torch.testing.assert_close(a, r, rtol=1e-3, atol=1e-3)
        seen.add("equal")
    assert "refused" in seen, seen
