"""How the passes that choose an implementation by measurement time a candidate on the GPU.

Note [Timing a candidate in a graph]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A region replays its step as a CUDA graph, so a candidate (a GEMV config, an attention form, the
ATen operator) is timed inside one: `calls` launches of it captured back to back in one graph,
the graph replayed `replays` times, the median replay's time per call. That is what Triton's
`do_bench_cudagraph` measures, except how many calls the graph holds: it sizes the graph to `rep`
milliseconds (20) of the call's time estimated from five launches *from Python*, which for a
kernel of a few microseconds is the host's launch time (~10-50 us), not the kernel's: ~400-2000
calls captured from Python, instantiated and replayed ten times, ~60-150 ms a candidate, ~135
candidates on a Llama-1B decode step's first call. Here the graph holds a fixed number of calls
(64: a 2 us kernel's replay still spans ~130 us against the events' ~0.5 us resolution), one
replay warms up before the timed ones, and a candidate costs ~5-15 ms. The replays are queued back
to back, each between two events, and synchronized once: an event's time is then the device's
alone (a replay enqueued after a synchronization would start its clock before the host had
launched it, and 64 short calls do not hide that as ~1000 did). The graph is captured on the
timing stream itself, of the current device (torch.cuda.graph's default capture stream is one
stream of whichever device first captured in the process). The weight rotation of the callers
(their `fn` picks the next copy at each call, at capture) is unchanged: 64 calls walk the copies
as Triton's ~1000 did.
"""

from __future__ import annotations

import statistics

import torch

CALLS = 64
REPLAYS = 10


def graph_median_us(fn, calls: int = CALLS, replays: int = REPLAYS) -> float:
    """Median microseconds per call of `fn` (launches on the current CUDA device) inside a CUDA
    graph of `calls` calls, over `replays` timed replays after one untimed (Note [Timing a
    candidate in a graph]). `fn` runs once first, outside the graph (compiles, lazy loading), on a
    stream of its own, as every call here does, which the graph is captured on."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(calls):
                fn()
        graph.replay()  # warm: clocks, the instantiated graph's first upload
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
        for start, end in events:  # back to back: each replay's clock starts when the one before ends
            start.record()
            graph.replay()
            end.record()
        stream.synchronize()
        times = [start.elapsed_time(end) * 1e3 / calls for start, end in events]
        del graph
    return statistics.median(times)
