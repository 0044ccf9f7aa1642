"""The GPU timer of the passes that choose by measurement (Note [Timing a candidate in a graph])."""

import pytest
import torch

from trident.passes import timing

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device machine)")


@cuda
def test_cuda_the_graph_holds_the_calls_asked_for_and_fn_runs_once_before():
    """fn runs once outside the graph, then `calls` times while captured; replays run no Python."""
    x = torch.zeros(1024, device="cuda")
    seen = []

    def fn():
        seen.append(torch.cuda.is_current_stream_capturing())
        x.add_(1)

    us = timing.graph_median_us(fn, calls=16, replays=3)
    assert seen == [False] + [True] * 16
    assert us > 0
    torch.cuda.synchronize()
    assert x[0].item() == 1 + 16 * (1 + 3)  # the warm replay and the 3 timed ones ran the 16 adds


@cuda
def test_cuda_agrees_with_tritons_graph_timer_on_a_memory_bound_copy():
    """A copy of 64 MiB (~25-40 us on an H100/H200): the per-call median of 64 calls is within 25 %
    of do_bench_cudagraph's (~20 ms of calls); twice the bytes take longer."""
    from triton.testing import do_bench_cudagraph

    src = torch.randn(16 << 20, device="cuda")
    dst = torch.empty_like(src)
    ours = timing.graph_median_us(lambda: dst.copy_(src))
    theirs = do_bench_cudagraph(lambda: dst.copy_(src), rep=20, return_mode="median") * 1e3
    assert 0.75 < ours / theirs < 1.25, (ours, theirs)
    big, big_dst = torch.randn(32 << 20, device="cuda"), torch.empty(32 << 20, device="cuda")
    assert timing.graph_median_us(lambda: big_dst.copy_(big)) > 1.5 * ours
