"""Hugging Face transformers through Trident's front doors: 2-layer Llama and Qwen2 built from
configs (random weights, no hub), with Triton kernels patched in -- the user's own (RMSNorm,
SwiGLU, rotary embedding) or Liger-Kernel's (`apply_liger_kernel_to_llama/qwen2`: rope, rms_norm,
swiglu) -- a StaticCache, prefill then greedy decode: the tokens equal eager's (fp32)."""

from __future__ import annotations

import functools

import pytest
import torch
import triton
import triton.language as tl

transformers = pytest.importorskip("transformers")  # pinned in requirements-ci.txt

from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, StaticCache  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2  # noqa: E402

import trident  # noqa: E402,F401  (registers the backend)
from tests.decode_model import rmsnorm_kernel  # noqa: E402  (a user's Triton RMSNorm)
from trident.frontends.dynamo import compiled_graphs  # noqa: E402

MODELING = {"llama": modeling_llama, "qwen2": modeling_qwen2}


class TritonRMSNorm(torch.nn.Module):
    """A user's Triton RMSNorm in place of the model's (the way Liger-Kernel patches models)."""

    def __init__(self, norm):
        super().__init__()
        self.weight = norm.weight
        self.eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(rows)
        n = rows.shape[1]
        rmsnorm_kernel[(rows.shape[0],)](rows, self.weight, out, n, self.eps, BLOCK=triton.next_power_of_2(n))
        return out.view(x.shape)


@triton.jit
def swiglu_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(gate_ptr + offs, mask=mask).to(tl.float32)
    u = tl.load(up_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=mask)


def swiglu_mlp_forward(self, x):
    """LlamaMLP/Qwen2MLP.forward with silu(gate) * up in one Triton kernel."""
    gate = self.gate_proj(x).contiguous()
    up = self.up_proj(x).contiguous()
    act = torch.empty_like(gate)
    n = gate.numel()
    swiglu_kernel[(triton.cdiv(n, 256),)](gate, up, act, n, BLOCK=256)
    return self.down_proj(act)


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, heads, seq, HALF: tl.constexpr):
    # One program per row (batch, head, position) of x [B, H, S, 2*HALF]; cos/sin are [B, S, 2*HALF].
    row = tl.program_id(0)
    pos = (row // heads // seq) * seq + row % seq
    offs = tl.arange(0, HALF)
    x1 = tl.load(x_ptr + row * 2 * HALF + offs).to(tl.float32)
    x2 = tl.load(x_ptr + row * 2 * HALF + HALF + offs).to(tl.float32)
    c1 = tl.load(cos_ptr + pos * 2 * HALF + offs).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * 2 * HALF + HALF + offs).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * 2 * HALF + offs).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * 2 * HALF + HALF + offs).to(tl.float32)
    tl.store(out_ptr + row * 2 * HALF + offs, (x1 * c1 - x2 * s1).to(out_ptr.dtype.element_ty))
    tl.store(out_ptr + row * 2 * HALF + HALF + offs, (x2 * c2 + x1 * s2).to(out_ptr.dtype.element_ty))


def _rope(x, cos, sin):
    x = x.contiguous()
    b, h, s, d = x.shape
    out = torch.empty_like(x)
    rope_kernel[(b * h * s,)](x, cos.contiguous(), sin.contiguous(), out, h, s, HALF=d // 2)
    return out


def triton_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """HF's apply_rotary_pos_emb (q, k [B, H, S, D]; cos, sin [B, S, D]) as a Triton kernel."""
    assert unsqueeze_dim == 1
    return _rope(q, cos, sin), _rope(k, cos, sin)


def _patch_own_kernels(model, modeling, monkeypatch) -> int:
    """The user's own Triton kernels in place of the model's RMSNorms, MLP activations and
    rotary embedding (the rotary function is a module global of the modeling file, as Liger
    patches it). Returns how many modules were replaced."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RMSNorm"):
                setattr(parent, name, TritonRMSNorm(child))
                count += 1
            elif type(child).__name__.endswith("MLP"):
                child.forward = swiglu_mlp_forward.__get__(child)
                count += 1
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", triton_apply_rotary_pos_emb)
    return count


def _patch_liger(kind, model, modeling, monkeypatch) -> None:
    liger = pytest.importorskip("liger_kernel.transformers")  # pinned in requirements-ci.txt
    # Liger assigns module globals of the modeling file (rotary function, RMSNorm and MLP
    # classes): monkeypatch puts them back after the test.
    for name in ("apply_rotary_pos_emb", f"{'Llama' if kind == 'llama' else 'Qwen2'}RMSNorm",
                 f"{'Llama' if kind == 'llama' else 'Qwen2'}MLP"):
        monkeypatch.setattr(modeling, name, getattr(modeling, name))
    apply = liger.apply_liger_kernel_to_llama if kind == "llama" else liger.apply_liger_kernel_to_qwen2
    apply(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False, model=model)


def _model(kind, kernels="own", monkeypatch=None, device="cpu"):
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    if kind == "llama":
        cfg = LlamaConfig(**common)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(**common)
        model = Qwen2ForCausalLM(cfg)
    if kernels == "own":
        assert _patch_own_kernels(model, MODELING[kind], monkeypatch) == 2 * 3 + 1
    elif kernels == "liger":
        _patch_liger(kind, model, MODELING[kind], monkeypatch)
    return cfg, model.to(device).eval()


KERNELS = ["own", "liger"]
# greedy tokens per prompt in the decode tests: positions past 32 with the longer prompt (each
# step runs the Triton kernels through the interpreter on the CPU: 64 took 25-53 s a test)
STEPS = 32


def _prompts(device):
    return [torch.tensor([p], device=device) for p in ([5, 7, 9, 11], [3, 1, 4, 1, 5, 9, 2])]  # two lengths


def _greedy(cfg, forward, prompt, steps):
    cache = StaticCache(config=cfg, max_cache_len=96)
    tokens = []
    with torch.no_grad():
        logits = forward(input_ids=prompt, past_key_values=cache, use_cache=True).logits
        for _ in range(steps):
            tok = logits[:, -1:].argmax(-1)
            tokens.append(tok.item())
            logits = forward(input_ids=tok, past_key_values=cache, use_cache=True).logits
    return tokens


@functools.lru_cache(maxsize=None)
def _eager_tokens(kind, kernels, device, prompt: tuple, steps) -> tuple:
    """`_greedy` of `_model(kind, kernels)` run eagerly (no Trident), once per process: the
    model is built as each test builds its own (seeded, from the config, the same kernels
    patched in, undone on return), so the tests that compare with it share it. A tuple: no
    caller changes what the next one compares with."""
    with pytest.MonkeyPatch.context() as monkeypatch, torch.random.fork_rng():
        cfg, model = _model(kind, kernels, monkeypatch, device)
        return tuple(_greedy(cfg, model.forward, torch.tensor([prompt], device=device), steps))


def _eager_greedy(kind, kernels, device, prompt, steps) -> list:
    """The eager greedy tokens for `prompt` (a [1, n] tensor), as `_greedy` returns them."""
    return list(_eager_tokens(kind, kernels, device, tuple(prompt[0].tolist()), steps))


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_decode_equals_eager(kind, kernels, monkeypatch, device):
    """torch.compile(model.forward, backend="trident"), prefill and decode through it (fp32, on
    the CPU and on CUDA); a new prompt length is served. No graph breaks: Liger's dispatcher is
    torch.compiler.disable()d, and stays in the graph for Trident to trace (Note [Disabled
    functions under backend="trident"])."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg, model = _model(kind, kernels, monkeypatch, device)
    start = len(compiled_graphs())
    compiled = torch.compile(model.forward, backend="trident")
    for prompt in _prompts(device):
        want = _eager_greedy(kind, kernels, device, prompt, STEPS)
        got = _greedy(cfg, compiled, prompt, STEPS)
        assert got == want
    graphs = compiled_graphs()[start:]
    captures = [opt for g in graphs for opt in g.captures.values()]
    assert all(g.eager_calls == 0 for g in graphs)
    # every graph with the Triton RMSNorm in it became SCM regions; the decode steps hit them
    assert sum(sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) for opt in captures) >= 2
    hits = sum(v["hits"] for opt in captures for v in trident.cache_info(opt).values())
    misses = sum(v["misses"] for opt in captures for v in trident.cache_info(opt).values())
    assert misses == 0 and hits >= 2 * STEPS
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_decode_step_captured_without_dynamo(kind, kernels, monkeypatch):
    """The decode step as a closure over the model and its StaticCache, through trident.capture:
    parameters and cache tensors are bound by identity (Note [Closed-over tensors]), the cache is
    written in place each step by the optimized program; STEPS greedy tokens equal eager's."""
    cfg, model = _model(kind, kernels, monkeypatch)
    prompt = torch.tensor([[5, 7, 9, 11]])
    want = _eager_greedy(kind, kernels, "cpu", prompt, STEPS)
    cache = StaticCache(config=cfg, max_cache_len=96)
    with torch.no_grad():
        logits = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits  # eager prefill
        tok = logits[:, -1:].argmax(-1)

        def step(ids):
            return model(input_ids=ids, past_key_values=cache, use_cache=True).logits

        opt = trident.optimize(trident.capture(step, tok))  # captures without running the step
        got = []
        for _ in range(STEPS):
            got.append(tok.item())
            tok = opt(tok)[:, -1:].argmax(-1)
    assert got == want
    (stats,) = trident.cache_info(opt).values()
    assert stats["hits"] == STEPS and stats["misses"] == 0
    assert sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) == 1


@pytest.mark.parametrize("kernels", KERNELS + ["plain"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_trident_compile_of_forward(kind, kernels, monkeypatch, device):
    """`model.forward = trident.compile(model.forward)`, called as HF documents for compiled
    forwards (keyword arguments, the StaticCache passed each call). The first prefill runs
    eagerly (its signature's first call: the StaticCache creates its tensors then) and is
    captured when the first decode step comes (Note [Captured after its first call]), the decode
    step is captured at its second call; STEPS greedy tokens equal eager's, two prompts.
    "plain": the model as HF ships it, no Triton kernel: its ATen ops alone make the region."""
    cfg, model = _model(kind, kernels, monkeypatch, device)
    prompts = _prompts(device)
    want = [_eager_greedy(kind, kernels, device, p, STEPS) for p in prompts]
    model.forward = trident.compile(model.forward)
    got = [_greedy(cfg, model, p, STEPS) for p in prompts]
    assert got == want
    # the first prefill and the first decode step run eagerly; the first prefill is captured
    # (static) when the decode comes, for a prompt of its length; the second prompt's prefill (a
    # new length on a new cache) gets one symbolic capture, its decode steps hit the first
    # cache's decode capture (the cache's state is input, its identity is not: Note [State the
    # function is passed])
    assert len(model.forward.captures) == 3 and model.forward.eager_calls == 2

    def hits(opt):
        return [v["hits"] for v in trident.cache_info(opt).values()]

    static = sorted((o for o in model.forward.captures.values() if not o.meta["trident_symbolic"]),
                    key=lambda o: sum(hits(o)))
    (prefill,) = [o for o in model.forward.captures.values() if o.meta["trident_symbolic"]]
    first_prefill, decode = static
    info = trident.cache_info(decode)
    assert info and all(v["misses"] == 0 and v["hits"] >= 2 * STEPS - 1 for v in info.values())
    assert all(h == 1 for h in hits(prefill)) and not any(hits(first_prefill))


def test_sliding_window_cache_through_trident_compile():
    """Mistral with a sliding window: HF's StaticSlidingWindowLayer counts its length in a Python
    int, read as a constant by a traced call. trident.compile keys on it (Note [What
    trident.compile guards]), so no capture replays a stale position: 40 tokens, past the window
    of 8, equal eager's (each step is a new signature's first call and runs eagerly)."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, sliding_window=8)
    torch.manual_seed(0)
    model = MistralForCausalLM(cfg).eval()
    prompt = torch.tensor([[5, 7, 9, 11]])
    want = _greedy(cfg, model.forward, prompt, 40)
    compiled = trident.compile(model.forward)
    assert _greedy(cfg, compiled, prompt, 40) == want


@pytest.mark.parametrize("door", ["capture", "backend"])
def test_static_cache_update_fused_into_one_launch_per_layer(door, monkeypatch):
    """With Trident's copy kernels on (TRIDENT_TRITON_COPIES=all, the CUDA default), each
    layer's StaticCache.update -- position from the device counter, the counter bump, the K and
    V index_copy_ -- is ONE cache_write_kernel launch (trident/passes/fuse_cache_writes.py), in
    a trident.capture of the decode step and in the backend's graph (where the counters and
    caches are graph inputs); 24 greedy tokens and the counters equal eager's."""
    from trident import knobs
    from trident.runtime import SCMRuntime

    cfg, model = _model("qwen2", "own", monkeypatch)
    prompt = torch.tensor([[5, 7, 9, 11]])
    # greedy decoding's first 24 tokens do not depend on how many follow (the same steps on a
    # StaticCache of the same size): the first 24 of the shared eager STEPS
    want = _eager_greedy("qwen2", "own", "cpu", prompt, STEPS)[:24]
    cache = StaticCache(config=cfg, max_cache_len=96)
    with torch.no_grad(), knobs.scope(triton_copies="all"):
        tok = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)

        def step(ids):
            return model(input_ids=ids, past_key_values=cache, use_cache=True).logits

        if door == "capture":
            run = trident.optimize(trident.capture(step, tok))
            optimized = [run]
        else:
            torch._dynamo.reset()
            start = len(compiled_graphs())
            run = torch.compile(step, backend="trident", fullgraph=True)
        got = []
        for _ in range(24):
            got.append(tok.item())
            tok = run(tok)[:, -1:].argmax(-1)
        if door == "backend":
            optimized = [opt for g in compiled_graphs()[start:] for opt in g.captures.values()]
    assert got == want
    names = [s.kernel_name for opt in optimized for rid in opt.meta["trident_regions"]
             for s in SCMRuntime.get(rid).program.launches]  # fmt: skip
    assert names.count("cache_write_kernel") == cfg.num_hidden_layers, names
    assert "index_copy_kernel" not in names and "index_copy2_kernel" not in names, names
    assert all(int(layer.cumulative_length) == 4 + 24 for layer in cache.layers)
    if door == "backend":
        torch._dynamo.reset()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_prefills_of_several_lengths_through_one_symbolic_capture(kind, monkeypatch, device):
    """trident.compile(model.forward): prefills of lengths 4, 7, 9, 13, 30 on one StaticCache
    (reset between prompts). The first two run eagerly (the first call creates the cache's
    tensors, which changes the cache's Python state, part of the signature, once; the first is
    captured when the second comes), the third
    length makes one capture with symbolic sizes (Note [Symbolic sizes]) and every later length
    is served by it natively: one
    specialization per Triton key of the kernels' integer arguments; logits equal eager's."""
    cfg, model = _model(kind, "own", monkeypatch, device)
    eager = model.forward
    compiled = trident.compile(model.forward)
    cache = StaticCache(config=cfg, max_cache_len=96)
    torch.manual_seed(1)
    lengths = [4, 7, 9, 13, 30]
    with torch.no_grad():
        for length in lengths:
            ids = torch.randint(0, cfg.vocab_size, (1, length), device=device)
            cache.reset()
            got = compiled(input_ids=ids, past_key_values=cache, use_cache=True).logits
            cache.reset()
            want = eager(input_ids=ids, past_key_values=cache, use_cache=True).logits
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert compiled.eager_calls == 2
    # the first call (a cache whose tensors are not made yet: a structure of its own) is
    # captured statically when the second comes (Note [Captured after its first call]): a new
    # cache's first prefill hits it
    (first,) = [o for o in compiled.captures.values() if not o.meta["trident_symbolic"]]
    assert not any(v["hits"] for v in trident.cache_info(first).values())
    (opt,) = [o for o in compiled.captures.values() if o.meta["trident_symbolic"]]
    assert len(compiled.captures) == 2
    # one region, or with graphs on (CUDA) its pieces (Note [Pieces of a symbolic region])
    for stats in trident.cache_info(opt).values():
        assert stats["hits"] + stats["misses"] == len(lengths) - 2
        # rope's `seq` and swiglu's `n = 128 * seq`: these lengths give two keys at most
        assert stats["specializations"] <= 2, stats
    assert "symbolic sizes: s" in trident.explain(compiled)


def test_repeated_prefill_length_gets_a_capture(monkeypatch):
    """A prefill of one length, repeated: its static capture fails on HF's data-dependent mask
    shortcut (the cache's offset tensor compared with 0), so trident.compile captures it with
    symbolic sizes, where HF takes its traceable path (Note [Symbolic sizes]); no eager fallback."""
    cfg, model = _model("llama", "own", monkeypatch)
    eager = model.forward
    compiled = trident.compile(model.forward)
    cache = StaticCache(config=cfg, max_cache_len=96)
    with torch.no_grad():
        for _ in range(4):
            ids = torch.randint(0, cfg.vocab_size, (1, 9))
            cache.reset()
            got = compiled(input_ids=ids, past_key_values=cache, use_cache=True).logits
            cache.reset()
            torch.testing.assert_close(got, eager(input_ids=ids, past_key_values=cache, use_cache=True).logits)
    assert compiled.eager_calls == 2 and compiled.eager_reason is None
    # the first call's own capture (an unmade cache: Note [Captured after its first call]) and
    # the repeated length's, which serves calls 3 and 4
    assert len(compiled.captures) == 2
    (opt,) = [o for o in compiled.captures.values() if sum(v["hits"] for v in trident.cache_info(o).values())]
    assert opt.meta["trident_symbolic"]
