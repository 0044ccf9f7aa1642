"""flash-linear-attention (fla), a real third-party library of Triton kernels for recurrent
(linear-attention) models, used as its README shows: an HF model built from its config,
`model.generate(input_ids)`. Its layers unpad the tokens by the attention mask (nonzero and
`.item()`: data-dependent sizes feeding its kernels' constexprs), keep their state in a Cache
whose per-layer dicts get new tensors every step, dispatch through `torch.compiler.disable`d
functions returning `(y, None, rstd)`, and memoize in closures. Through trident.compile the
decode step is one capture, the unpadding's count specialized behind a guard. Imported after Trident (conftest),
on the CPU it must keep its CPU path (it asked torch.cuda for the GPU's name and failed to import:
Note [The host target is Triton's and torch's to ask]). Greedy tokens equal eager's through both
doors; from the second generate() on nothing runs eagerly."""

from __future__ import annotations

import pytest
import torch

fla_models = pytest.importorskip("fla.models")  # pinned in requirements-ci.txt
transformers = pytest.importorskip("transformers")

import trident  # noqa: E402
from trident.frontends.dynamo import compiled_graphs  # noqa: E402

PROMPT = [[5, 7, 9, 11]]
NEW = 4


def _model(kind="gla"):
    torch.manual_seed(0)
    if kind == "gla":
        config = fla_models.GLAConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=128,
                                      intermediate_size=128)
    elif kind == "delta_net":
        config = fla_models.DeltaNetConfig(hidden_size=64, num_hidden_layers=2, num_heads=2, vocab_size=128,
                                           intermediate_size=128)
    else:
        config = fla_models.RWKV7Config(hidden_size=64, num_hidden_layers=2, head_dim=32, vocab_size=128)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _generate(model):
    with torch.no_grad():
        return model.generate(torch.tensor(PROMPT), max_new_tokens=NEW, do_sample=False)


@pytest.mark.parametrize("door", ["compile", "backend"])
def test_gla_generate_through_both_doors(door):
    torch._dynamo.reset()
    model = _model()
    want = _generate(model)
    start = len(compiled_graphs())
    if door == "compile":
        model.forward = trident.compile(model.forward)
    else:
        model.forward = torch.compile(model.forward, backend="trident")
    assert torch.equal(_generate(model), want)

    def eager_calls():
        inner = compiled_graphs()[start:]
        own = model.forward.eager_calls if door == "compile" else 0
        return own + sum(g.eager_calls for g in inner)

    warm = eager_calls()
    for _ in range(2):
        assert torch.equal(_generate(model), want)
    # from the second generate() on, every call is served; through trident.compile the prefill,
    # which returns a Cache it makes, runs eagerly (Note [Objects made per call])
    assert eager_calls() == warm + (2 if door == "compile" else 0)
    graphs = compiled_graphs()[start:]
    assert door == "compile" or (graphs and all(g.captures for g in graphs))
    text = trident.explain(model.forward)
    assert "launch fused_recurrent_fwd_kernel" in text, text  # fla's own kernels, captured
    if door == "compile":
        # the decode steps are one capture: the layers' unpadding count (nonzero of the mask) is
        # specialized behind a guard (Note [Values a trace specializes]); the prefill returns a
        # Cache it made from generate()'s DynamicCache: eager (Note [Objects made per call])
        assert len(model.forward.captures) == 1 and "nonzero count at" in text, text
        assert model.forward.dynamo_calls == 0 and "returns a Cache it made during the call" in text, text
        assert "Objects made per call" in text, text
    # fla's norms return (y, None, rstd) from disabled functions: kept in the graph, not broken at
    assert "returns TupleVariable, not tensors" not in text, text
    torch._dynamo.reset()


@pytest.mark.parametrize("kind", ["rwkv7", "delta_net"])
def test_recurrent_models_generate_through_trident_compile(kind):
    """RWKV-7 wraps its activation in torch.compile (traced through: its capture was refused and
    every decode ran eagerly); DeltaNet's short convolution builds its chunk indices with
    `repeat_interleave(arange, counts)` at the prefill (its total specialized: the trace goes on
    to what stops it, the Cache made; before, that family went through Dynamo). Both prefills
    return a Cache the model makes from generate()'s DynamicCache (a capture would return the
    trace's Cache, its tensors fake: that family runs eagerly once the decode steps are
    captured, Note [Objects made per call]). The decode steps are one capture; from the second
    generate() on only the prefill runs eagerly."""
    torch._dynamo.reset()
    model = _model(kind)
    want = _generate(model)
    model.forward = trident.compile(model.forward)
    assert torch.equal(_generate(model), want)
    warm = model.forward.eager_calls
    for _ in range(2):
        assert torch.equal(_generate(model), want)
    assert model.forward.eager_calls == warm + 2
    assert len(model.forward.captures) == 1 and model.forward.dynamo_calls == 0
    assert "returns a Cache it made during the call" in trident.explain(model.forward)
    torch._dynamo.reset()


def test_chunked_kernels_through_trident_compile():
    """fla's chunked form (what its layers run for more than 64 tokens), called as its README
    shows (`chunk_gla(q, k, v, g, initial_state=..., output_final_state=True)`): its kernels call
    methods of their loop variables (Note [Loop variables under the interpreter]); through
    trident.compile, for two lengths, outputs and final states equal fla's naive recurrence."""
    import torch.nn.functional as F
    from fla.ops.gla import chunk_gla
    from fla.ops.gla.naive import naive_recurrent_gla

    def attend(q, k, v, gk, h0):
        return chunk_gla(q, k, v, gk, initial_state=h0, output_final_state=True)

    compiled = trident.compile(attend)
    g = torch.Generator().manual_seed(0)
    for t in (80, 80, 100):
        q, k, v = (torch.randn(1, t, 2, 32, generator=g) for _ in range(3))
        gk = F.logsigmoid(torch.randn(1, t, 2, 32, generator=g)) / 16
        h0 = torch.randn(1, 2, 32, 32, generator=g)
        with torch.no_grad():
            o, ht = compiled(q, k, v, gk, h0)
        want_o, want_ht = naive_recurrent_gla(q, k, v, gk, initial_state=h0, output_final_state=True)
        torch.testing.assert_close(o, want_o, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ht, want_ht, rtol=1e-4, atol=1e-4)
    assert compiled.captures
