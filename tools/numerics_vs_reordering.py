"""How far Trident's logits drift from eager's over a greedy generate(), against how far eager's
own drift when only the summation order of its matrix products changes: the yardstick for a
token parting (issue 22: is it Trident, or the model's sensitivity to any reordering?).

    python tools/numerics_vs_reordering.py [--model gla] [--dtype fp16] [--layers 8] [--new 24]

Runs on the CPU (Triton kernels through the interpreter, which has no bf16 arithmetic: fp16 or
fp32) with Trident's device passes forced on ('all': fused glue, decode attention, and every
one-split GEMV preferred by a stand-in timer), or on CUDA with its defaults. Prints, per decode
step, max |variant - eager| / max |eager| of the logits for

  reordered   eager with every nn.Linear accumulated in fp32 and rounded once (a legitimate order)
  trident     trident.compile(model.forward), its second generate()

and, against the same model in fp32 (the yardstick of both), eager's and Trident's drift
(`eager_vs_fp32`, `trident_vs_fp32`): Trident no farther from it than eager is no less accurate.

and the first step where each one's tokens part from eager's. Random weights (seed 0)."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import trident  # noqa: E402
from trident import knobs  # noqa: E402
from trident.passes import choose_matmuls as CM  # noqa: E402

PROMPT = 8


def build(kind: str, layers: int, dtype, dev: str, hidden: int = 128):
    import transformers

    torch.manual_seed(0)
    if kind == "gla":
        import fla.models as M

        cfg = M.GLAConfig(hidden_size=hidden, num_hidden_layers=layers, num_heads=max(2, hidden // 256),
                          vocab_size=512, intermediate_size=2 * hidden)
    else:
        cfg = transformers.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(4, hidden // 64),
                                       num_key_value_heads=2, intermediate_size=2 * hidden, vocab_size=512)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval().to(dev, dtype)


def generate(model, ids, new: int):
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)


def drift(want, got) -> dict:
    w, g = want.sequences[0, PROMPT:].tolist(), got.sequences[0, PROMPT:].tolist()
    first = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), None)
    upto = len(w) if first is None else first + 1
    rel = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
           for a, b in zip(got.logits[:upto], want.logits[:upto])]
    return {"first_differing_step": first, "rel_logit_diff_per_step": [float(f"{r:.2e}") for r in rel]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gla", choices=("gla", "llama"))
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "fp32", "bf16"))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dtype = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = build(args.model, args.layers, dtype, args.device, args.hidden)
    model.generation_config.pad_token_id = 0
    ids = torch.randint(0, 512, (1, PROMPT), generator=torch.Generator().manual_seed(0)).to(args.device)
    want = generate(model, ids, args.new)
    out = {"model": args.model, "dtype": args.dtype, "layers": args.layers, "hidden": args.hidden,
           "device": args.device, "commit": os.environ.get("TRIDENT_COMMIT", "unknown")}
    exact = build(args.model, args.layers, torch.float32, args.device, args.hidden)  # the yardstick of both
    exact.generation_config.pad_token_id = 0
    reference = generate(exact, ids, args.new)
    del exact
    out["eager_vs_fp32"] = drift(reference, want)

    linear = F.linear  # reordered: eager with fp32 accumulation, one rounding, in every nn.Linear
    F.linear = lambda x, w, b=None: linear(x.float(), w.float(), None if b is None else b.float()).to(x.dtype)
    try:
        out["reordered"] = drift(want, generate(model, ids, args.new))
    finally:
        F.linear = linear

    scope = {}
    if args.device == "cpu":  # the device passes, forced on; every one-split GEMV measured "faster"
        CM.set_timer(lambda name, shape, cfg: 0.5 if name == "gemv" and cfg[2] == 1 else 1.0)
        scope = dict(fuse_glue="all", decode_matmuls="all", decode_attention="all")
    forward = model.forward
    with knobs.scope(**scope):
        model.forward = trident.compile(forward)
        generate(model, ids, args.new)
        got = generate(model, ids, args.new)
        out["trident"] = drift(want, got)
        out["trident_vs_fp32"] = drift(reference, got)
    model.forward = forward
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
