"""Hugging Face `generate()` as users call it, through every front door, with the default
DynamicCache and with a StaticCache: tiny Llama and Qwen2 (random weights, no hub) with the
user's Triton RMSNorm, SwiGLU and rotary kernels patched in (tests/test_hf.py). Greedy tokens
equal eager's; from the second `generate()` on, no call runs eagerly."""

from __future__ import annotations

import functools

import pytest
import torch

transformers = pytest.importorskip("transformers")  # pinned in requirements-ci.txt

from transformers import CompileConfig  # noqa: E402

import trident  # noqa: E402
from tests.test_hf import _model  # noqa: E402
from trident.frontends.dynamo import compiled_graphs  # noqa: E402

PROMPT = [[5, 7, 9, 11]]
NEW = 12


def _generate(model, cache: str, new: int = NEW, **kw):
    kw.update(max_new_tokens=new, do_sample=False)
    if cache == "static":
        kw["cache_implementation"] = "static"
    return model.generate(torch.tensor(PROMPT), **kw)


@functools.lru_cache(maxsize=None)
def _eager_output(kind, kernels, cache: str, new: int) -> tuple:
    """`_generate` of `_model(kind, kernels)` run eagerly (no Trident), once per process: the
    model is built as each test builds its own (seeded, from the config, the same kernels
    patched in, undone on return), so the tests that compare with it share it. (sequences,
    the logits of each new token); `_eager` hands out copies."""
    with pytest.MonkeyPatch.context() as monkeypatch, torch.random.fork_rng():
        _, model = _model(kind, kernels, monkeypatch)
        out = _generate(model, cache, new, return_dict_in_generate=True, output_logits=True)
    return out.sequences, tuple(out.logits)


def _eager(kind, kernels, cache: str, new: int = NEW) -> tuple:
    """Copies of the eager (sequences, logits): no test changes what the next one compares with."""
    sequences, logits = _eager_output(kind, kernels, cache, new)
    return sequences.clone(), [t.clone() for t in logits]


def _captures(door, model, start):
    if door == "compile":
        return len(model.forward.captures)
    return sum(len(g.captures) for g in compiled_graphs()[start:])


def _eager_calls(door, model, start):
    if door == "compile":
        return model.forward.eager_calls
    return sum(g.eager_calls for g in compiled_graphs()[start:])


@pytest.mark.parametrize(
    "door,cache",
    [("compile", "dynamic"), ("compile", "static"), ("backend", "dynamic"), ("backend", "static"), ("config", "static")],
)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_generate_through_every_door(kind, door, cache, monkeypatch):
    """compile: `model.forward = trident.compile(model.forward)`; backend: `model.forward =
    torch.compile(model.forward, backend="trident")`; config: HF's own knob,
    `generation_config.compile_config = CompileConfig(backend="trident")`, with which
    generate() compiles the model's __call__ itself for static caches (passing mode=
    "reduce-overhead": Note [Backend arguments]; HF does so on accelerators only, so the test
    sets CompileConfig's switch for every device)."""
    torch._dynamo.reset()
    _, model = _model(kind, "own", monkeypatch)
    want, _ = _eager(kind, "own", cache)
    start = len(compiled_graphs())
    if door == "compile":
        model.forward = trident.compile(model.forward)
    elif door == "backend":
        model.forward = torch.compile(model.forward, backend="trident")
    else:
        config = CompileConfig(backend="trident")
        config._compile_all_devices = True
        model.generation_config.compile_config = config
    with torch.no_grad():
        assert torch.equal(_generate(model, cache), want)
        warm, made = _eager_calls(door, model, start), _captures(door, model, start)
        for _ in range(2):
            assert torch.equal(_generate(model, cache), want)
    # from the second generate() on every call is served: nothing runs eagerly and nothing is
    # captured (the prefill, made once per generate(), was captured during the first: Note
    # [Captured after its first call])
    assert (_eager_calls(door, model, start), _captures(door, model, start)) == (warm, made)
    if door == "compile":
        # a new cache object per generate() reuses the captures (identity is no part of the signature)
        assert 1 <= len(model.forward.captures) <= 4
        hits = sum(v["hits"] for opt in model.forward.captures.values() for v in trident.cache_info(opt).values())
    else:
        graphs = compiled_graphs()[start:]
        assert graphs and all(g.captures for g in graphs)
        hits = sum(v["hits"] for g in graphs for opt in g.captures.values() for v in trident.cache_info(opt).values())
    assert hits >= 2 * (NEW - 2)
    torch._dynamo.reset()


def test_hf_auto_compile_around_a_trident_compiled_forward(monkeypatch):
    """generate() with a StaticCache compiles the model's __call__ with torch.compile (Inductor,
    reduce-overhead) by itself. A trident.compile'd forward inside it is called, never traced
    (Dynamo would trace Trident's capture machinery and hand Inductor fake tensors: it crashed
    in Inductor's copy_misaligned_inputs): tokens equal eager's and Trident's captures serve the
    decode steps."""
    torch._dynamo.reset()
    _, model = _model("llama", "own", monkeypatch)
    want, _ = _eager("llama", "own", "static")
    config = CompileConfig()  # HF's default: Inductor, mode="reduce-overhead"
    config._compile_all_devices = True
    model.generation_config.compile_config = config
    model.forward = trident.compile(model.forward)
    with torch.no_grad():
        for _ in range(2):
            assert torch.equal(_generate(model, "static"), want)
    assert hasattr(model, "_compiled_call")  # HF did compile around it
    hits = sum(v["hits"] for opt in model.forward.captures.values() for v in trident.cache_info(opt).values())
    assert hits >= NEW - 2
    torch._dynamo.reset()


def test_backend_arguments():
    """Note [Backend arguments]: mode and options are taken, a wrong mode or argument is an error
    naming what is accepted."""
    from trident.frontends.dynamo import trident_backend

    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    for mode in ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", None):
        assert callable(trident_backend(gm, [torch.ones(2)], mode=mode, options={"triton.cudagraphs": True}))
    with pytest.raises(trident.TridentError, match="expected one of 'default', 'reduce-overhead'"):
        trident_backend(gm, [torch.ones(2)], mode="fast")
    with pytest.raises(TypeError, match="takes mode= and options="):
        trident_backend(gm, [torch.ones(2)], fullgraph=True)
    for how in ({"mode": "reduce-overhead"}, {"options": {"triton.cudagraphs": True}}):
        f = torch.compile(lambda x: x * 2, backend="trident", dynamic=False, fullgraph=True, **how)
        torch.testing.assert_close(f(torch.ones(3)), torch.full((3,), 2.0))
    torch._dynamo.reset()


@pytest.mark.parametrize("door", ["compile", "backend"])
def test_dynamic_cache_decode_replays_graphs_around_the_attention(door, monkeypatch):
    """Note [Pieces of a symbolic region]: with a DynamicCache the key/value length grows every
    step, so the decode capture is symbolic; its regions are cut into static pieces (embedding,
    norms, projections, rotary, MLP: one graph each, replayed every step) and symbolic pieces
    (the cache's concatenation and the attention), which run natively. Graphs are emulated on the
    CPU (TRIDENT_GRAPHS=all); tokens equal eager's."""
    from trident import knobs
    from trident.runtime import SCMRuntime
    from trident.runtime.native import C

    torch._dynamo.reset()
    _, model = _model("llama", "own", monkeypatch)
    want, _ = _eager("llama", "own", "dynamic")
    start = len(compiled_graphs())
    with knobs.scope(graphs="all"):
        if door == "compile":
            model.forward = trident.compile(model.forward)
        else:
            model.forward = torch.compile(model.forward, backend="trident")
        with torch.no_grad():
            for _ in range(3):
                assert torch.equal(_generate(model, "dynamic"), want)
    if door == "compile":
        captures = list(model.forward.captures.values())
    else:
        captures = [opt for g in compiled_graphs()[start:] for opt in g.captures.values()]
    symbolic = [opt for opt in captures if opt.meta["trident_symbolic"]]
    assert symbolic
    replays = {True: 0, False: 0}
    lent = 0
    for opt in symbolic:
        for rid in opt.meta["trident_regions"]:
            program = SCMRuntime.get(rid).program
            replays[bool(program.symbols)] += sum(g["replays"] for g in C.graph_stats(rid)["graphs"])
            lent += sum(g["lent"] for g in C.graph_stats(rid)["graphs"] if not g["retired"])
    # the decode steps of the 2nd and 3rd generate() replay the static pieces' graphs
    assert replays[False] >= 2 * (NEW - 4), replays
    assert replays[True] == 0, replays
    # Note [Lent outputs]: the pieces hand each other their outputs without copies
    assert lent > 0
    torch._dynamo.reset()


@pytest.mark.parametrize("kernels", ["plain", "own"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_generate_with_fused_glue(kind, kernels, monkeypatch):
    """issue 25 item 2 (Note [Fused glue]): with TRIDENT_FUSE_GLUE the ATen glue of the decode
    step (norms, rotary embedding, residual adds, SwiGLU) runs as Inductor-generated Triton
    kernels inside Trident's region; generate()'s tokens equal eager's, the logits within fp32
    rounding, and the step runs fewer operator calls than unfused."""
    torch._dynamo.reset()
    _, model = _model(kind, kernels, monkeypatch)
    want_sequences, want_logits = _eager(kind, kernels, "static")
    forward = model.forward
    counts = {}
    for mode in ("", "all"):
        with trident.knobs.scope(fuse_glue=mode):
            model.forward = trident.compile(forward)
            with torch.no_grad():
                for _ in range(2):
                    got = model.generate(torch.tensor(PROMPT), max_new_tokens=NEW, do_sample=False,
                                         cache_implementation="static", return_dict_in_generate=True,
                                         output_logits=True)
                    assert torch.equal(got.sequences, want_sequences)
                    for a, b in zip(got.logits, want_logits):
                        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        decode = max((opt for opt in model.forward.captures.values()),
                     key=lambda opt: sum(v["hits"] for v in trident.cache_info(opt).values()))
        from trident.runtime import SCMRuntime

        programs = [SCMRuntime.get(r).program for r in decode.meta["trident_regions"]]
        counts[mode] = (sum(len(p.steps) for p in programs),
                        sum(s.kernel_name.startswith("triton_") for p in programs for s in p.launches))
    # plain: per layer at least the two norms, the rotary embedding and the SwiGLU; with the user's
    # own RMSNorm, SwiGLU and rotary kernels less glue is left (residual adds, casts)
    assert counts[""][1] == 0 and counts["all"][1] >= (2 * 4 if kernels == "plain" else 1), counts
    assert counts["all"][0] < counts[""][0], counts
    torch._dynamo.reset()


@pytest.mark.parametrize("graphs", ["", "all"])
def test_dynamic_cache_generate_with_fused_glue(graphs, monkeypatch):
    """A DynamicCache decode step is a symbolic capture: the glue whose sizes are all static
    (norms, rotary, SwiGLU of the one new token) is fused, the attention over the growing cache
    is not; tokens equal eager's. With graphs (the symbolic region cut into pieces: what CUDA
    runs by default) too: the views sunk into the pieces once put a transpose after one of its
    slices, the symbolic capture failed, and every step past 8 captures ran eagerly."""
    torch._dynamo.reset()
    _, model = _model("llama", "plain", monkeypatch)
    # 6 new tokens: 5 decode lengths, so a failed symbolic capture shows as well as with 12 (no
    # symbolic capture, a static one per length: more than 3)
    want, _ = _eager("llama", "plain", "dynamic", new=6)
    with torch.no_grad():
        with trident.knobs.scope(fuse_glue="all", graphs=graphs, triton_copies="all", decode_attention="all"):
            model.forward = trident.compile(model.forward)
            for _ in range(2):
                assert torch.equal(_generate(model, "dynamic", new=6), want)
    from trident.runtime import SCMRuntime

    symbolic = [opt for opt in model.forward.captures.values() if opt.meta.get("trident_symbolic")]
    assert symbolic and len(model.forward.captures) <= 3 and model.forward.eager_calls <= 3, trident.explain(model.forward)
    fused = [s.kernel_name for opt in symbolic for r in opt.meta["trident_regions"]
             for s in SCMRuntime.get(r).program.launches if s.kernel_name.startswith("triton_")]
    assert len(fused) >= 2 * 4, fused
    torch._dynamo.reset()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the device machine)")
@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_generate_with_fused_glue_and_decode_matmuls_cuda(cache, monkeypatch):
    """issue 25 on the GPU: TRIDENT_FUSE_GLUE, TRIDENT_DECODE_MATMULS and measured decode
    attention together (Trident's defaults on CUDA, named here so that the test keeps its
    meaning), fp32 so that greedy tokens are comparable exactly: generate() equals eager's tokens
    through graph replays. The reference is eager (disable_compile): HF's own automatic compile of
    static-cache generation is not what is compared (under compute-sanitizer its CUDA-graph trees
    refused their own memory pool)."""
    torch._dynamo.reset()
    _, model = _model("llama", "plain", monkeypatch, device="cuda")
    prompt = torch.tensor(PROMPT, device="cuda")
    kw = dict(max_new_tokens=NEW, do_sample=False, **({"cache_implementation": "static"} if cache == "static" else {}))
    with torch.no_grad():
        want = model.generate(prompt, **kw, disable_compile=True)
        with trident.knobs.scope(fuse_glue="cuda", decode_matmuls="cuda", decode_attention="measured"):
            model.forward = trident.compile(model.forward)
            for _ in range(3):
                assert torch.equal(model.generate(prompt, **kw), want)
    torch._dynamo.reset()


def test_generate_with_sliding_and_full_layers_through_trident_compile():
    """Gemma 2 (every other layer a sliding window of 8, the others full; soft-capped logits),
    `generate()` with its default DynamicCache: the sliding layers' Python token count is written
    back from a symbolic capture as `keys.shape[2] + 1` while the window fills (Note [State the
    function is passed]), and when it has filled one more symbolic capture serves every step
    (Note [Symbolic regimes]). Before: a static capture per step, then past TRIDENT_CAPTURES
    every step eager (8 captures, then 6 more eager calls each generate()). Tokens equal eager's
    over 14 new tokens after a 4-token prompt (the window fills on the way); the second
    generate() captures and runs nothing eagerly."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                       sliding_window=8)
    torch.manual_seed(0)
    model = Gemma2ForCausalLM(cfg).eval()

    def generate():
        return model.generate(torch.tensor(PROMPT), max_new_tokens=14, do_sample=False)

    want = generate()
    model.forward = trident.compile(model.forward)
    assert torch.equal(generate(), want)
    captures, eager = len(model.forward.captures), model.forward.eager_calls
    assert captures <= 6 and eager <= 3, model.forward.eager_log
    assert torch.equal(generate(), want)
    assert (len(model.forward.captures), model.forward.eager_calls) == (captures, eager), model.forward.eager_log
