"""The knobs each benchmarked trident.compile variant runs with (issue 25), shared by
tools/bench_hf.py, bench_generate.py, bench_decode.py, bench_batches.py and bench_dynamic.py: `trident_untuned` is
issue 25's passes off (e3252af's defaults, literally), so that a benchmark can show in one run
what those passes change.

Importing it also turns off keeping measured choices across processes (TRIDENT_TUNING_DIR, Note
[Kept measurements]) unless the caller set the variable: a benchmark's first call measures as a
user's first run does, whatever an earlier run left."""

import os

os.environ.setdefault("TRIDENT_TUNING_DIR", "")

TUNED = {"fuse_glue": "cuda", "decode_matmuls": "cuda", "decode_attention": "measured", "pdl": "cuda",
         "prefill_attention": "cuda"}
KNOBS = {"trident_compile": TUNED,
         "trident_untuned": {"fuse_glue": "", "decode_matmuls": "", "decode_attention": "cuda", "pdl": "",
                             "prefill_attention": ""},
         "trident_prefill_cudnn": {**TUNED, "prefill_attention": ""},  # Note [Prefill attention without per-length plans]
         "trident_no_pdl": {**TUNED, "pdl": ""}, "trident_pdl_own": {**TUNED, "pdl_user_kernels": "0"},
         "trident_cache_apart": {**TUNED, "cache_attention": "0"}}
LITERAL = {"trident_untuned"}  # variants whose knobs hold on the CPU as written
PER_DEVICE = set(TUNED)  # knobs whose 'cuda' becomes 'all' on the CPU (bench_hf), so that the passes run there too


def for_device(variant: str, device: str) -> dict:
    """`variant`'s knobs (none for a variant not listed) as run on `device`: on the CPU the tuned
    knobs' 'cuda' and 'measured' become 'all', so that the passes run there as on the GPU, except
    in LITERAL variants."""
    return {k: (v if device == "cuda" or not v or variant in LITERAL or k not in PER_DEVICE else "all")
            for k, v in KNOBS.get(variant, {}).items()}
