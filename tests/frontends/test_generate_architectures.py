"""`generate()` of more Hugging Face architectures through `trident.compile`, as the README shows
it: tiny configs (random weights, no hub, fp32 on the CPU), plain and with Liger-Kernel's Triton
kernels applied as its README applies them (`apply_liger_kernel_to_<arch>(model=model)`). Each
architecture brings something Llama and Qwen2 do not: sliding-window and global layers with
logit soft-capping (Gemma2), fused q/k/v and gate/up projections (Phi-3), q/k norms (Qwen3),
norms after attention and MLP (OLMo2), residual, embedding and logit multipliers (Granite).
Greedy tokens equal eager's, and the second `generate()` runs no call eagerly."""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")  # pinned in requirements-ci.txt

import trident  # noqa: E402

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0)
ARCHS = {
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "gemma2", dict(head_dim=16, sliding_window=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", "phi3", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "qwen3", dict(head_dim=16)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", "olmo2", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", "granite", {}),
}


def _model(arch: str, kernels: str, monkeypatch):
    config_name, model_name, module, extra = ARCHS[arch]
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**COMMON, **extra)).eval()
    if kernels == "liger":
        monkey_patch = pytest.importorskip("liger_kernel.transformers.monkey_patch")  # pinned in requirements-ci.txt
        # Liger assigns the modeling file's globals (norm, MLP classes, the rotary function) and,
        # for Granite by default, torch.nn.functional.cross_entropy: all put back after the test
        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        for name, value in list(vars(modeling).items()):
            monkeypatch.setattr(modeling, name, value)
        monkeypatch.setattr(torch.nn.functional, "cross_entropy", torch.nn.functional.cross_entropy)
        getattr(monkey_patch, f"apply_liger_kernel_to_{arch}")(model=model)
    return model


def _generate(model):
    prompt = torch.tensor([[5, 7, 9, 11, 13, 2, 4]])
    return model.generate(prompt, max_new_tokens=8, do_sample=False, cache_implementation="static")


@pytest.mark.parametrize("kernels", ["plain", "liger"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_generate_equals_eager(arch, kernels, monkeypatch):
    model = _model(arch, kernels, monkeypatch)
    with torch.no_grad():
        want = _generate(model)
        model.forward = trident.compile(model.forward)
        first = _generate(model)
        eager_calls = model.forward.eager_calls
        second = _generate(model)
    assert torch.equal(first, want) and torch.equal(second, want), (want.tolist(), first.tolist(), second.tolist())
    assert model.forward.captures
    assert model.forward.eager_calls == eager_calls, trident.explain(model.forward)


def test_serving_shapes_stay_captured_under_the_default_bound(monkeypatch, caplog):
    """One Gemma2 + Liger model served as a program serves it: both cache kinds, two prompt
    lengths and a left-padded batch of 2, each generate() twice. generate() multiplies the
    forward's families (prefill and decode, each cache kind, batch 1 and n, the sliding window
    before and after it fills: 18 captures here); under the default TRIDENT_CAPTURES every second
    call runs nothing eagerly and the bound is never reported (at 8 the static cache's calls ran
    eagerly: Note [One capture cache]). Tokens equal eager's throughout."""
    monkeypatch.setattr(logging.getLogger("trident.misses"), "propagate", True)  # to caplog, under TRIDENT_LOG too
    model = _model("gemma2", "liger", monkeypatch)
    inputs = {
        "p5": dict(input_ids=torch.tensor([[5, 7, 9, 11, 13]])),
        "p7": dict(input_ids=torch.tensor([[3, 1, 4, 1, 5, 9, 6]])),
        "b2pad": dict(input_ids=torch.tensor([[0, 0, 5, 7, 9], [3, 1, 4, 1, 5]]),
                      attention_mask=torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])),
    }
    calls = [(cache, name) for cache in ("dynamic", "static") for name in inputs]

    def generate(cache, name):
        kw = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
        if cache == "static":
            kw["cache_implementation"] = "static"
        return model.generate(**inputs[name], **kw)

    with torch.no_grad(), caplog.at_level("WARNING", logger="trident.misses"):
        want = {c: generate(*c) for c in calls}
        model.forward = trident.compile(model.forward)
        for c in calls:
            for _ in range(2):
                eager_calls = model.forward.eager_calls
                assert torch.equal(generate(*c), want[c]), c
            assert model.forward.eager_calls == eager_calls, (c, trident.explain(model.forward))
    assert len(model.forward.captures) > 8  # more than the old bound: what this test guards
    assert not [r for r in caplog.records if "TRIDENT_CAPTURES" in r.getMessage()]
