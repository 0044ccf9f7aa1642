"""Per-token decode latency of tools/bench_hf.py results: a PNG bar chart and the README's
markdown table, from one or more result JSONs.

    python tools/plot_hf.py results/bench_hf_llama_X.json results/bench_hf_qwen2_Y.json ... \
        --png results/bench_hf.png --table results/bench_hf_table.md

Files are merged in the order given: per (case, variant), a later file's measurement replaces
an earlier one's (a re-run of some variants); `FILE:v1,v2` takes only those variants of FILE.
Every number keeps the commit of the run it came from, and the table names it (compare ratios
within one run: host-bound paths vary from run to run). Needs matplotlib (not a dependency of
Trident).
"""

from __future__ import annotations

import argparse
import json

ORDER = ("eager", "compile_default", "compile_reduce_overhead", "graph_floor", "trident_backend", "trident_compile")
LABELS = {
    "eager": "eager",
    "compile_default": "torch.compile",
    "compile_reduce_overhead": "torch.compile reduce-overhead",
    "graph_floor": "CUDA-graph floor (eager step)",
    "trident_backend": 'Trident: torch.compile(backend="trident")',
    "trident_compile": "Trident: trident.compile",
}
CASES = ("llama_plain", "llama_liger", "qwen2_plain", "qwen2_liger")
TITLES = {"llama_plain": "Llama-3.2-1B", "llama_liger": "Llama-3.2-1B + Liger", "qwen2_plain": "Qwen2-0.5B",
          "qwen2_liger": "Qwen2-0.5B + Liger"}


def merge(paths: list[str]) -> dict:
    """{case: {variant: (entry, commit)}}; later files win per (case, variant)."""
    merged: dict = {}
    for spec in paths:
        path, _, only = spec.partition(":")
        wanted = set(only.split(",")) if only else set(ORDER)
        with open(path) as f:
            run = json.load(f)
        for case, res in run["cases"].items():
            for key, entry in res.items():
                if key in wanted and key in ORDER and isinstance(entry, dict) and ("ms_per_token" in entry or key not in merged.get(case, {})):
                    merged.setdefault(case, {})[key] = (entry, run.get("commit", "?"))
    return merged


def cell(entry) -> str:
    if "ms_per_token" in entry:
        return f"{entry['ms_per_token']:.2f}"
    if "error" in entry:
        return "fails"
    return "not run"


def table(merged: dict) -> str:
    lines = ["| model | " + " | ".join(LABELS[k] for k in ORDER) + " |", "|---" * (len(ORDER) + 1) + "|"]
    for case in CASES:
        if case not in merged:
            continue
        row = merged[case]
        cells = []
        for k in ORDER:
            if k not in row:
                cells.append("—")
                continue
            entry, commit = row[k]
            text = cell(entry)
            graphs = entry.get("trident", {}).get("dynamo_graphs")
            if graphs and graphs > 1:
                text += f" ({graphs} graphs)"
            cells.append(f"{text} <sub>{commit[:7]}</sub>")
        lines.append(f"| {TITLES[case]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(merged: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in CASES if c in merged]
    width = 0.13
    fig, ax = plt.subplots(figsize=(11, 4.8))
    for i, k in enumerate(ORDER):
        xs, ys = [], []
        for j, case in enumerate(cases):
            entry = merged[case].get(k, ({}, ""))[0]
            if "ms_per_token" in entry:
                xs.append(j + (i - (len(ORDER) - 1) / 2) * width)
                ys.append(entry["ms_per_token"])
        bars = ax.bar(xs, ys, width, label=LABELS[k])
        for x, y in zip(xs, ys):
            ax.text(x, y * 1.04, f"{y:.1f}" if y >= 10 else f"{y:.2f}", ha="center", va="bottom", fontsize=6.5,
                    rotation=90, color=bars.patches[0].get_facecolor() if bars.patches else "k")
    ax.set_yscale("log")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([TITLES[c] for c in cases])
    ax.set_ylabel("ms per token (log scale)")
    ax.set_title("HF decode, batch 1, bf16, StaticCache, H200 (tools/bench_hf.py)")
    ax.legend(fontsize=7.5, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    ax.set_ylim(top=max(e[0].get("ms_per_token", 0) for r in merged.values() for e in r.values()) * 3)
    fig.tight_layout()
    fig.savefig(png, dpi=130)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--png", default="results/bench_hf.png")
    ap.add_argument("--table", default="")
    args = ap.parse_args()
    merged = merge(args.inputs)
    text = table(merged)
    print(text)
    if args.table:
        with open(args.table, "w") as f:
            f.write(text)
    plot(merged, args.png)


if __name__ == "__main__":
    main()
