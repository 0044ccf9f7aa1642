"""Which SDPA backend torch picks for a decode step's attention (one query token, GQA, a float
mask as HF's tracing path builds it), with the keys/values repeated as HF's repeat_kv does or
with enable_gqa, and the host and device time of each (H200 question for issue 22: can the
repeat_kv clones go). Prints one JSON line."""

from __future__ import annotations

import json
import time

import torch
import torch.nn.functional as F


def host_us(fn, n=200):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return round(host, 2)


def main():
    dev, dt = "cuda", torch.bfloat16
    out = {}
    for L in (17, 80):
        q = torch.randn(1, 32, 1, 64, device=dev, dtype=dt)
        k = torch.randn(1, 8, L, 64, device=dev, dtype=dt)
        v = torch.randn(1, 8, L, 64, device=dev, dtype=dt)
        bias = torch.zeros(1, 1, 1, L, device=dev, dtype=dt)
        kr = k[:, :, None].expand(1, 8, 4, L, 64).reshape(1, 32, L, 64)
        vr = v[:, :, None].expand(1, 8, 4, L, 64).reshape(1, 32, L, 64)
        row = {}
        for name, args, kw in (("repeated+mask", (q, kr, vr), dict(attn_mask=bias)),
                               ("gqa+mask", (q, k, v), dict(attn_mask=bias, enable_gqa=True)),
                               ("gqa", (q, k, v), dict(enable_gqa=True)),
                               ("repeated", (q, kr, vr), {})):
            try:
                choice = torch._fused_sdp_choice(*args, **kw)
                ref = F.scaled_dot_product_attention(q.float(), kr.float(), vr.float(),
                                                     attn_mask=bias.float() if "mask" in name else None)
                got = F.scaled_dot_product_attention(*args, **kw)
                row[name] = {"backend": int(choice), "host_us": host_us(lambda: F.scaled_dot_product_attention(*args, **kw)),
                             "max_abs_err": float((got.float() - ref).abs().max())}
            except Exception as e:  # noqa: BLE001
                row[name] = {"error": str(e)[:200]}
        row["clone_host_us"] = host_us(lambda: k[:, :, None].expand(1, 8, 4, L, 64).clone())
        row["cudnn_op_host_us"] = host_us(lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, kr, vr, bias, False, 0.0, False, False, scale=0.125))
        out[L] = row
    print(json.dumps({"torch": torch.__version__, "backends": "0 math, 1 flash, 2 efficient, 3 cudnn (torch SDPBackend)",
                      "sdpa": out}))


if __name__ == "__main__":
    main()
