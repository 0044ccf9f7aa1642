"""@triton.autotune and @triton.heuristics launches inside regions (Note [Autotuned launches]):
the config is chosen once per specialization, by Triton's own key, cache, pruning and (on CUDA)
benchmarker; heuristics are computed at capture and re-checked per specialization."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.autotuner import Autotuner

import trident
from tests import kernels as K
from trident.errors import UnsupportedError
from trident.runtime import SCMRuntime
from trident.scm import tuning


def _launch_plans(opt):
    (rid,) = opt.meta["trident_regions"]
    return [launch for spec in SCMRuntime.get(rid).scm.specializations for launch in spec.launches]


@pytest.fixture(autouse=True)
def _fresh_tuning_state():
    """Autotuner caches are process-wide (as in Triton): each test starts from empty ones."""
    for kernel in (K.tuned_scale_kernel, K.pruned_scale_kernel, K.tuned_sum_kernel, K.heuristic_tuned_kernel.fn,
                   K.tuned_heuristic_kernel):
        kernel.cache.clear()
    yield
    tuning.set_cpu_timer(None)


def test_autotuned_launch_joins_the_region_and_matches_eager(device):
    x = torch.randn(1000, device=device)
    opt = trident.optimize(trident.capture(lambda t: K.tuned_scale(t).sin(), x))
    assert len(opt.meta["trident_regions"]) == 1
    torch.testing.assert_close(opt(x), (3.0 * x).sin())
    (plan,) = _launch_plans(opt)
    assert plan.step.tuned.startswith("config ")
    assert "autotuned: config" in trident.explain(opt)


@pytest.mark.parametrize("winner", [0, 1, 2])
def test_the_timed_winner_sets_grid_and_meta_parameters(winner):
    """Each config has its own BLOCK and grid: results are right only if both come from the
    same config (n = 1000 is no multiple of 256, so a wrong grid leaves elements unwritten)."""
    configs = K.tuned_scale_kernel.configs
    timed = []

    def timer(tuner, config, args):
        timed.append(tuning._config_index(tuner, config))
        return 0.0 if config is configs[winner] else 1.0

    tuning.set_cpu_timer(timer)
    x = torch.randn(1000)
    opt = trident.optimize(trident.capture(K.tuned_scale, x))
    torch.testing.assert_close(opt(x), 3.0 * x)
    (plan,) = _launch_plans(opt)
    assert sorted(timed) == [0, 1, 2]
    block = configs[winner].kwargs["BLOCK"]
    assert plan.constexprs["BLOCK"] == block and plan.step.grid == (-(-1000 // block), 1, 1)
    assert plan.num_warps == configs[winner].num_warps
    assert plan.step.tuned == f"{tuning.describe(K.tuned_scale_kernel, winner)}; timed by the CPU timer, key (1000, 'torch.float32', 'torch.float32')"
    # The winner is in the autotuner's own cache: eager launches of the kernel would take it too.
    assert K.tuned_scale_kernel.cache[(1000, "torch.float32", "torch.float32")] is configs[winner]


def test_a_config_in_the_autotuners_cache_is_taken_without_timing():
    x = torch.randn(1000)
    K.tuned_scale_kernel.cache[(1000, "torch.float32", "torch.float32")] = K.tuned_scale_kernel.configs[2]
    tuning.set_cpu_timer(lambda *a: pytest.fail("a cached key must not be timed"))
    opt = trident.optimize(trident.capture(K.tuned_scale, x))
    torch.testing.assert_close(opt(x), 3.0 * x)
    (plan,) = _launch_plans(opt)
    assert plan.constexprs["BLOCK"] == 256 and "autotuner cache" in plan.step.tuned


def test_each_dtype_specialization_is_tuned_under_its_own_key():
    picks = {torch.float32: 1, torch.float64: 2}
    configs = K.tuned_scale_kernel.configs
    tuning.set_cpu_timer(lambda tuner, c, args: 0.0 if c is configs[picks[args["x_ptr"].dtype]] else 1.0)
    opt = trident.optimize(trident.capture(K.tuned_scale, torch.randn(1000)))
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(1000, dtype=dtype)
        torch.testing.assert_close(opt(x), 3.0 * x)
    blocks = [p.constexprs["BLOCK"] for p in _launch_plans(opt)]
    assert blocks == [64, 256]


def test_pruning_is_tritons():
    """early_config_prune drops config 1; without a timer the first config left is taken."""
    x = torch.randn(1000)
    opt = trident.optimize(trident.capture(K.pruned_scale, x))
    torch.testing.assert_close(opt(x), 2.0 * x)
    (plan,) = _launch_plans(opt)
    assert plan.constexprs["BLOCK"] == 64 and "first config after pruning" in plan.step.tuned


def test_tuning_key_is_the_one_autotuner_run_caches_under():
    class Stub:  # a kernel that only records: Autotuner.run's bookkeeping without a launch
        def __init__(self):
            self.fn = lambda: None

        def run(self, *args, **kwargs):
            return None

    x, y = torch.randn(8), torch.randn(8, dtype=torch.float64)
    for keys, args in [
        (["n"], {"x_ptr": x, "out_ptr": y, "n": 8, "factor": 2.0}),
        (["n", "factor"], {"x_ptr": x, "out_ptr": y, "n": 8, "factor": 2.0}),
        ([], {"x_ptr": y, "out_ptr": x, "n": 3, "factor": 1.0}),
        (["factor"], {"x_ptr": x, "out_ptr": y, "n": 8}),  # a missing key argument is skipped
    ]:
        tuner = Autotuner(Stub(), ["x_ptr", "out_ptr", "n", "factor"], K.tuning_configs(), keys, None, None,
                          do_bench=lambda call, quantiles: [1.0, 1.0, 1.0])
        positional, kwargs = tuning.call_order(tuner, args)
        tuner.run(*positional, **kwargs)
        assert list(tuner.cache) == [tuning.tuning_key(tuner, args)]


def test_config_pre_hook_is_refused_at_capture():
    """torch's tracer refuses configs with hooks (Python before every launch); the error says so."""
    with pytest.raises(trident.errors.CaptureError, match="pre_hook and post_hook are not supported"):
        trident.capture(K.hooked_scale, torch.randn(100))


def test_heuristics_are_computed_at_capture():
    x = torch.randn(1000)
    gm = trident.capture(K.heuristic_double, x)
    (launch,) = [n for n in gm.graph.nodes if "kernel_idx" in n.kwargs]
    h, values = launch.meta["trident_heuristics"]
    assert values == {"EVEN": False, "WIDE": False}
    opt = trident.optimize(gm)
    torch.testing.assert_close(opt(x), 2.0 * x)
    x = torch.randn(1024)
    opt = trident.optimize(trident.capture(K.heuristic_double, x))
    (plan,) = _launch_plans(opt)
    assert plan.constexprs["EVEN"] is True
    torch.testing.assert_close(opt(x), 2.0 * x)


def test_a_heuristic_that_changes_with_a_new_specialization_raises():
    """WIDE depends on the dtype: a float64 call would need another kernel than the one
    captured for float32, so Trident refuses instead of running it."""
    opt = trident.optimize(trident.capture(K.heuristic_double, torch.randn(1000)))
    with pytest.raises(UnsupportedError, match=r"value 'WIDE' of heuristic_double_kernel is True for these inputs, but False"):
        opt(torch.randn(1000, dtype=torch.float64))
    x = torch.randn(1000)
    torch.testing.assert_close(opt(x), 2.0 * x)  # the region still serves what it was captured for


def test_heuristics_over_and_under_autotune():
    x = torch.randn(1000)
    tuning.set_cpu_timer(lambda tuner, c, args: -c.kwargs["BLOCK"])  # the largest block wins
    opt = trident.optimize(trident.capture(K.heuristic_tuned, x))
    torch.testing.assert_close(opt(x), 0.5 * x)
    (plan,) = _launch_plans(opt)
    assert plan.constexprs["BLOCK"] == 256 and plan.constexprs["EVEN"] is False
    assert plan.step.heuristics is not None and plan.step.autotuner is K.heuristic_tuned_kernel.fn
    opt = trident.optimize(trident.capture(K.tuned_heuristic, x))
    torch.testing.assert_close(opt(x), 4.0 * x)
    (plan,) = _launch_plans(opt)
    # torch's tracer folded the heuristic into a copy of every config: EVEN per config's BLOCK
    assert plan.constexprs["BLOCK"] == 256 and plan.constexprs["EVEN"] is False


def test_heuristic_that_reads_data_fails_capture_clearly():
    import triton
    import triton.language as tl

    assert isinstance(K.heuristic_double_kernel.fn, triton.runtime.jit.JITFunction)
    h = triton.runtime.autotuner.Heuristics(K.heuristic_double_kernel.fn, K.heuristic_double_kernel.arg_names, {
        "EVEN": lambda args: bool(args["x_ptr"].sum() > 0),  # reads data: not available while tracing
        "WIDE": lambda args: False,
    })
    del tl

    def fn(x):
        out = torch.empty_like(x)
        h[(16,)](x, out, x.numel(), BLOCK=64)
        return out

    with pytest.raises(trident.errors.CaptureError, match="value 'EVEN' of heuristic_double_kernel could not be computed at capture"):
        trident.capture(fn, torch.randn(1000))


@pytest.mark.cuda
def test_cuda_config_is_timed_by_the_autotuner_with_its_hooks():
    """On the GPU the autotuner itself times the configs (on stand-ins); reset_to_zero zeroes
    the stand-in between timings, and the real output sees exactly one launch."""
    x = torch.randn(5000, device="cuda")
    opt = trident.optimize(trident.capture(K.tuned_sum, x))
    for _ in range(3):
        torch.testing.assert_close(opt(x), x.sum().reshape(1), rtol=1e-4, atol=1e-3)
    (plan,) = _launch_plans(opt)
    assert "timed by the autotuner on stand-ins" in plan.step.tuned
    assert len(K.tuned_sum_kernel.cache) == 1
