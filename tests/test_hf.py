"""Hugging Face transformers through torch.compile(backend="trident"): 2-layer Llama and Qwen2
built from configs (random weights, no hub), their RMSNorms replaced by a Triton kernel, a
StaticCache, prefill then greedy decode: the tokens equal eager's (fp32)."""

from __future__ import annotations

import pytest
import torch
import triton

transformers = pytest.importorskip("transformers")  # pinned in requirements-ci.txt

from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, StaticCache  # noqa: E402

import trident  # noqa: E402,F401  (registers the backend)
from tests.decode_model import rmsnorm_kernel  # noqa: E402  (a user's Triton RMSNorm)
from trident.capture.dynamo import compiled_graphs  # noqa: E402


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


def _patch_rmsnorms(model) -> int:
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RMSNorm"):
                setattr(parent, name, TritonRMSNorm(child))
                count += 1
    return count


def _model(kind):
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    if kind == "llama":
        cfg = LlamaConfig(**common)
        model = LlamaForCausalLM(cfg)
    else:
        cfg = Qwen2Config(**common)
        model = Qwen2ForCausalLM(cfg)
    assert _patch_rmsnorms(model) == 2 * 2 + 1
    return cfg, model.eval()


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


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_decode_equals_eager(kind):
    torch._dynamo.reset()
    cfg, model = _model(kind)
    start = len(compiled_graphs())
    compiled = torch.compile(model.forward, backend="trident")
    for prompt in (torch.tensor([[5, 7, 9, 11]]), torch.tensor([[3, 1, 4, 1, 5, 9, 2]])):  # a new prompt length
        want = _greedy(cfg, model.forward, prompt, 64)
        got = _greedy(cfg, compiled, prompt, 64)
        assert got == want
    graphs = compiled_graphs()[start:]
    captures = [opt for g in graphs for opt in g.captures.values()]
    assert all(g.eager_calls == 0 for g in graphs)
    # every graph with the Triton RMSNorm in it became SCM regions; the decode steps hit them
    assert sum(sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) for opt in captures) >= 2
    hits = sum(v["hits"] for opt in captures for v in trident.cache_info(opt).values())
    misses = sum(v["misses"] for opt in captures for v in trident.cache_info(opt).values())
    assert misses == 0 and hits >= 2 * 64
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_decode_step_captured_without_dynamo(kind):
    """The decode step as a closure over the model and its StaticCache, through trident.capture:
    parameters and cache tensors are bound by identity (Note [Closed-over tensors]), the cache is
    written in place each step by the optimized program; 64 greedy tokens equal eager's."""
    cfg, model = _model(kind)
    prompt = torch.tensor([[5, 7, 9, 11]])
    want = _greedy(cfg, model.forward, prompt, 64)
    cache = StaticCache(config=cfg, max_cache_len=96)
    with torch.no_grad():
        logits = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits  # eager prefill
        tok = logits[:, -1:].argmax(-1)

        def step(ids):
            return model(input_ids=ids, past_key_values=cache, use_cache=True).logits

        opt = trident.optimize(trident.capture(step, tok))  # captures without running the step
        got = []
        for _ in range(64):
            got.append(tok.item())
            tok = opt(tok)[:, -1:].argmax(-1)
    assert got == want
    (stats,) = trident.cache_info(opt).values()
    assert stats["hits"] == 64 and stats["misses"] == 0
    assert sum(n.target is torch.ops.trident.scm.default for n in opt.graph.nodes) == 1


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_trident_compile_of_forward(kind):
    """`model.forward = trident.compile(model.forward)`, called as HF documents for compiled
    forwards (keyword arguments, the StaticCache passed each call). Each prefill runs eagerly
    (its signature's first call: the StaticCache creates its tensors then), the decode step of
    each cache is captured at its second call; 64 greedy tokens equal eager's, two prompts."""
    cfg, model = _model(kind)
    eager = model.forward
    prompts = (torch.tensor([[5, 7, 9, 11]]), torch.tensor([[3, 1, 4, 1, 5, 9, 2]]))
    want = [_greedy(cfg, eager, p, 64) for p in prompts]
    model.forward = trident.compile(model.forward)
    got = [_greedy(cfg, model, p, 64) for p in prompts]
    assert got == want
    # one decode capture per cache object (passed by identity); prefills ran eagerly
    assert len(model.forward.captures) == 2 and model.forward.eager_calls == 4
    for opt in model.forward.captures.values():
        assert all(v["misses"] == 0 for v in trident.cache_info(opt).values())
