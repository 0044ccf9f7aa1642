"""The README's headline plot: ms/token of HF generate() (tools/bench_generate.py results), per
cache, every door and baseline, from one or more result JSONs.

    python tools/plot_generate.py results/bench_generate_X.json [FILE:v1,v2 ...] --png results/bench_generate.png

Files are merged in the order given: per (cache, variant) a later file's measurement replaces an
earlier one's; `FILE:v1,v2` takes only those variants of FILE. Each bar is labelled with its value
and the commit of the run it came from. Needs matplotlib (not a dependency of Trident).
"""

from __future__ import annotations

import argparse
import json

LABELS = {
    "eager": "eager",
    "hf_compile": "HF's automatic torch.compile",
    "inductor_forward": "torch.compile(model.forward)",
    "trident_compile": "trident.compile",
    "trident_config": 'CompileConfig(backend="trident")',
    "trident_backend": 'torch.compile(backend="trident")',
}


def merge(specs: list[str], case: str) -> dict:
    """{cache: {variant: (ms_per_token, commit)}}, plus the static floor when measured."""
    merged: dict = {"static": {}, "dynamic": {}}
    for spec in specs:
        path, _, only = spec.partition(":")
        wanted = set(only.split(",")) if only else None
        with open(path) as f:
            run = json.load(f)
        results = run["cases"].get(case, {})
        for cache in ("static", "dynamic"):
            for name, r in results.get(cache, {}).items():
                if "ms_per_token" in r and (wanted is None or name in wanted):
                    merged[cache][name] = (r["ms_per_token"], run["commit"])
        if "static_floor_ms_per_token" in results and (wanted is None or "graph_floor" in wanted):
            merged["floor"] = (results["static_floor_ms_per_token"], run["commit"])
    return merged


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+")
    p.add_argument("--case", default="llama+liger")
    p.add_argument("--png", default="results/bench_generate.png")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    merged = merge(args.files, args.case)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for ax, cache in zip(axes, ("static", "dynamic")):
        rows = [(LABELS[n], ms, commit) for n, (ms, commit) in merged[cache].items() if n in LABELS]
        rows.sort(key=lambda r: -r[1])
        names = [r[0] for r in rows]
        values = [r[1] for r in rows]
        colors = ["#d62728" if "trident" in n.lower() or "Trident" in n else "#7f7f7f" for n in names]
        ax.barh(names, values, color=colors)
        for y, (_, ms, commit) in enumerate(rows):
            ax.text(ms, y, f" {ms:.2f} ({commit})", va="center", fontsize=8)
        if cache == "static" and "floor" in merged:
            ax.axvline(merged["floor"][0], color="black", linestyle="--", linewidth=1)
            ax.text(merged["floor"][0], len(rows) - 0.5, " CUDA-graph step + generate()'s own", fontsize=7)
        ax.set_title(f"{args.case}, {cache} cache")
        ax.set_xlabel("ms per generated token (lower is better)")
        ax.set_xlim(0, max(values) * 1.45)
    fig.suptitle("HF generate() of 64 tokens, Llama-3.2-1B shapes, bf16, batch 1, H200")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(args.png)


if __name__ == "__main__":
    main()
