"""README's `generate()` block as a user runs it, and what the user is told while it runs.

Each door of README.md's "Hugging Face `generate()`" section, each on a fresh Llama-3.2-1B-shaped
model in a process of its own (random weights, bf16, Liger-Kernel applied with its defaults,
`apply_liger_kernel_to_llama(model=model)`):

  door1_dynamic   model.forward = trident.compile(model.forward); model.generate(ids, max_new_tokens=N)
  door1_static    door1 with model.generate(ids, ..., cache_implementation="static")
  door2           model.generation_config.compile_config = CompileConfig(backend="trident"), static cache
  door3           model.forward = torch.compile(model.forward, backend="trident"), dynamic cache

then `trident.explain(model.forward)`. Recorded per door: every Python warning and every log
record at WARNING or above (the root logger's, and torch's, which does not propagate), the most
repeated lines of its stderr, the wall time of the first and second generate(), and
whether the tokens equal eager's (bf16: where they part, the step). A door that warns a CUDA user
about something that is not so (a bf16 kernel "runs on the CPU through Triton's interpreter":
e515c59) shows here. Exit status 1 when a door raised, or when a warning or log line names
Trident's own module and `--strict` is given.

    python tools/readme_generate.py --out results/readme_generate.json [--layers 16] [--new 32]
    python tools/readme_generate.py --device cpu --tiny   # smoke test
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import trident  # noqa: E402
from tools.bench_hf import configs  # noqa: E402

DOORS = ("door1_dynamic", "door1_static", "door2", "door3")
PROMPT = 16


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append({"logger": record.name, "level": record.levelname, "message": record.getMessage()[:400]})


def _model(dev, tiny, layers):
    from liger_kernel.transformers import apply_liger_kernel_to_llama
    from transformers import LlamaForCausalLM

    cfg = configs(tiny)["llama"]
    if layers:
        cfg.num_hidden_layers = layers
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16 if dev == "cuda" else torch.float32).eval()
    apply_liger_kernel_to_llama(model=model)  # README: the library's defaults
    return cfg, model


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def _eager_margin(logits, want, got, at: int) -> dict:
    """Where the door's tokens part from eager's (position `at`): eager's margin between its own
    token and the door's in the logits its generate() chose by (`logits`: generate()'s
    output_logits, one per new token), and its largest logit (a near-tie at bf16 when the margin is
    a few of the logits' rounding steps, 2**-7 of the largest) -- as bench_generate's field."""
    step = logits[at - PROMPT][0].float()
    return {"eager_margin_there": round((step[want[0, at]] - step[got[0, at]]).item(), 5),
            "eager_logit_max_there": round(step.abs().max().item(), 4)}


def run_door(door: str, dev: str, tiny: bool, layers: int, new: int) -> dict:
    from transformers import CompileConfig

    cfg, model = _model(dev, tiny, layers)
    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1)).to(dev)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    if door in ("door1_static", "door2"):
        kw["cache_implementation"] = "static"
    model.generation_config.disable_compile = True
    eager = model.generate(ids, **kw, return_dict_in_generate=True, output_logits=True)  # eager's tokens and logits
    want = eager.sequences
    model.generation_config.disable_compile = False
    seen, handler = [], _Records()
    loggers = [logging.getLogger(), logging.getLogger("torch")]  # torch's loggers do not propagate to the root
    for logger in loggers:
        logger.addHandler(handler)
    out = {"door": door}
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if door.startswith("door1"):
                model.forward = trident.compile(model.forward)
            elif door == "door2":
                model.generation_config.compile_config = CompileConfig(backend="trident")
            else:
                model.forward = torch.compile(model.forward, backend="trident")
            walls, got = [], None
            for _ in range(2):
                _sync(dev)
                t0 = time.perf_counter()
                got = model.generate(ids, **kw)
                _sync(dev)
                walls.append(round(time.perf_counter() - t0, 3))
            text = trident.explain(model.forward) if door != "door2" else ""
        differ = (got[0] != want[0]).nonzero()
        out.update(first_s=walls[0], second_s=walls[1], tokens_equal=bool(torch.equal(got, want)),
                   first_differing_step=int(differ[0, 0]) - PROMPT if len(differ) else None,
                   explain_lines=len(text.splitlines()), explain_head=text.splitlines()[:6])
    except Exception as e:  # noqa: BLE001 - a door that raises is the finding
        out["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    if "error" not in out and len(differ):
        out.update(_eager_margin(eager.logits, want, got, int(differ[0, 0])))
    out["warnings"] = [{"category": w.category.__name__, "message": str(w.message)[:400],
                        "where": f"{os.path.relpath(w.filename)}:{w.lineno}"} for w in seen]
    out["log_lines"] = handler.lines
    return out


def _common(text: str, top: int = 25) -> list:
    """The most repeated lines of a door's stderr (glog's "W1206 10:33:12.123000 1234 " prefix
    dropped), with counts, and its first lines: what the user scrolls through."""
    counts: dict = {}
    for line in text.splitlines():
        line = re.sub(r"^[IWEF]\d{4} [\d:.]+ \d+ ", "", line)[:160]
        counts[line] = counts.get(line, 0) + 1
    return sorted(([n, line] for line, n in counts.items()), reverse=True)[:top] + [[0, ln[:160]] for ln in
                                                                                  text.splitlines()[:15]]


def _ours(entry: dict) -> list:
    return [w for w in entry.get("warnings", []) if "trident" in w["where"].split(os.sep)] + \
        [r for r in entry.get("log_lines", []) if r["logger"].startswith("trident")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/readme_generate.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the model's (0: all)")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--doors", default=",".join(DOORS))
    ap.add_argument("--strict", action="store_true", help="exit 1 when Trident itself warns or logs")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a door in this process, JSON on stdout
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_door(args.one, args.device, args.tiny, args.layers, args.new)))
        return
    doors = [d for d in args.doors.split(",") if d]
    unknown = sorted(set(doors) - set(DOORS))
    if unknown:
        sys.exit(f"--doors: expected names from {', '.join(DOORS)}; got {', '.join(unknown)}")
    report = {"commit": os.environ.get("TRIDENT_COMMIT") or subprocess.run(
                  ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
              "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "method": " ".join(["python", *sys.argv]), "doors": {}}
    failed = False
    for door in doors:  # each door in a process of its own: no capture, cache or warning filter shared
        cmd = [sys.executable, __file__, "--one", door, "--device", args.device, "--layers", str(args.layers),
               "--new", str(args.new), *(["--tiny"] if args.tiny else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        entry = json.loads(line[7:]) if line else {"door": door, "error": f"exit {proc.returncode}",
                                                   "stderr_tail": proc.stderr[-3000:]}
        entry["stderr_lines"] = len(proc.stderr.splitlines())
        entry["stderr_common"] = _common(proc.stderr)
        report["doors"][door] = entry
        failed |= "error" in entry or (args.strict and bool(_ours(entry)))
        shown = ("first_s", "second_s", "tokens_equal", "first_differing_step", "eager_margin_there", "error")
        print(door, {k: entry.get(k) for k in shown}, f"{len(entry.get('warnings', []))} warnings,",
              f"{len(entry.get('log_lines', []))} log lines, {len(_ours(entry))} of them Trident's", flush=True)
        for w in _ours(entry):
            print("   ", w, flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
