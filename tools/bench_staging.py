"""What staging a written input costs (Note [Staging written inputs]): one device-to-device copy
into the graph's buffer before a replay and one back after it, per size, on the caller's stream.
The measured both-ways device time is what TRIDENT_GRAPH_STAGE_WRITTEN_BYTES's default is
chosen from; the host time of enqueueing both copies is the same few µs at every size.

    python tools/bench_staging.py --out results/bench_staging.json

Device µs: CUDA events around 50 back-to-back pairs of copies, / 50, median of 7. Host µs: wall
time of enqueueing 50 pairs (no synchronization inside), / 50, median of 7. The same copies
Trident makes (cuMemcpyDtoDAsync through torch's copy_ of byte tensors).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
PAIRS = 50


def measure(nbytes: int) -> dict:
    caller = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    buffer = torch.empty_like(caller)

    def pairs():
        for _ in range(PAIRS):
            buffer.copy_(caller)  # staging in
            caller.copy_(buffer)  # writing back

    pairs()
    torch.cuda.synchronize()
    device, host = [], []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter_ns()
        pairs()
        host.append((time.perf_counter_ns() - t0) / PAIRS / 1e3)
        end.record()
        end.synchronize()
        device.append(start.elapsed_time(end) * 1e3 / PAIRS)
    d = statistics.median(device)
    return {
        "bytes": nbytes,
        "device_us_both_ways": d,
        "host_us_both_ways": statistics.median(host),
        "gb_per_s_each_way": 2 * nbytes / (d / 2 * 1e-6) / 1e9,  # a copy reads and writes its bytes
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/bench_staging.json")
    args = ap.parse_args()
    rows = [measure(n) for n in SIZES]
    for r in rows:
        print(
            f"{r['bytes'] >> 10:>8} KiB: device {r['device_us_both_ways']:9.2f} µs, host {r['host_us_both_ways']:6.2f} µs "
            f"both ways ({r['gb_per_s_each_way']:.0f} GB/s)",
            flush=True,
        )
    result = {
        "commit": os.environ.get("TRIDENT_COMMIT", "unknown"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "method": "copy_ of byte tensors into a buffer and back; device: CUDA events over 50 pairs; host: enqueue "
        "time of 50 pairs; medians of 7",
        "rows": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
