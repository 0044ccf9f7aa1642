"""The benchmark tools' own logic that runs without a GPU: how tools/bench_hf.py and
tools/bench_generate.py split a step's device time by part and bound it by the HBM floor (issue 25
item 4), from kernel names as torch.profiler gives them, and bench_generate's floors of
generate() (`GraphStep`, `_Inside`) on the CPU."""

from __future__ import annotations

import pytest
import torch

from tests.decode_model import Config
from tools.bench_batches import kv_bytes, schedule, step_bytes
from tools.bench_generate import CALLS, NEW, PROMPT, _build, _Inside, _timed, use_graph_step
from tools.bench_hf import hbm_floor_ms
from tools.device_time import critical_path, device_category, device_split, trident_kernel_names


@pytest.mark.parametrize("name,part", [
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "matmul"),
    ("void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false>(...)", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(...)", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_kernel0_0", "attention"),
    ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<64, 64, 256, 4>>(...)", "attention"),
    ("decode_attention_split_kernel", "attention"),
    ("cache_write_kernel", "trident"),
    ("gemv_kernel", "matmul"),
    ("gemv_group_kernel", "matmul"),
    ("strided_copy_kernel", "trident"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "fused_glue"),
    ("triton_poi_fused_0", "fused_glue"),
    ("_rms_norm_forward_kernel", "user"),
    ("_swiglu_forward_kernel", "user"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)", "glue"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>(...)",
     "glue"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("Memset (Device)", "copy"),
])
def test_device_time_parts(name, part):
    assert device_category(name, trident_kernel_names()) == part


def test_device_split_sums_per_part():
    rows = [(10.0, 1.0, "gemv_kernel"), (5.0, 2.0, "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"), (1.5, 3.0, "triton_poi_fused_0"),
            (2.0, 1.0, "_rms_norm_forward_kernel")]
    assert device_split(rows) == {"matmul": {"us": 15.0, "kernels": 3.0}, "user": {"us": 2.0, "kernels": 1.0},
                                  "fused_glue": {"us": 1.5, "kernels": 3.0}}


def test_critical_path_counts_overlap_once():
    """Under PDL a kernel starts inside the one before it: it adds only its end past the latest end
    before it; a kernel starting after every earlier one ended leaves a gap; exposed times and gaps
    sum to the span, in any order of the input."""
    kernels = [(0.0, 10.0, "gemv_kernel"), (8.0, 13.0, "_rms_norm_forward_kernel"),  # 2 us overlap: adds 3
               (9.0, 12.0, "_triton_rope"),  # ends inside the norm: adds nothing
               (15.0, 20.0, "gemv_kernel"), (20.0, 21.0, "_rms_norm_forward_kernel")]  # 2 us gap first
    exposed, gaps, span = critical_path(list(reversed(kernels)))
    assert exposed == {"gemv_kernel": 15.0, "_rms_norm_forward_kernel": 4.0, "_triton_rope": 0.0}
    assert gaps == 2.0 and span == 21.0 and sum(exposed.values()) + gaps == span
    assert critical_path([]) == ({}, 0.0, 0.0)


@pytest.mark.parametrize("tied", [False, True])
def test_hbm_floor_counts_each_weight_once_and_the_kv_read(tied):
    """Every weight a step multiplies, read once: an untied embedding only by its looked-up row, a
    tied one in full (it is the lm_head's weight); the KV cache at the given context."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())  # a tied weight once
    embed = 256 * 64
    want_weights = 2 * (params - (0 if tied else embed) + 64)
    floor = hbm_floor_ms(model, cfg, context=100)
    assert floor["weight_bytes"] == want_weights
    assert floor["kv_bytes_mean"] == 2 * 2 * 2 * 16 * 100 * 2  # K and V, layers, kv heads, head dim, tokens, bf16
    assert floor["hbm_floor_ms_per_token"] == pytest.approx((want_weights + floor["kv_bytes_mean"]) / 4.8e12 * 1e3)


def test_hbm_floor_is_the_cards_own():
    """An H100's floor is read at its own peak (3.35 TB/s), not the H200's; an unlisted device and
    the CPU get the H200's, where issue 25's targets are set."""
    from tools.device_time import hbm_bytes_per_s

    assert hbm_bytes_per_s("NVIDIA H200") == 4.8e12
    assert hbm_bytes_per_s("NVIDIA H100 80GB HBM3") == 3.35e12
    assert hbm_bytes_per_s("NVIDIA H100 PCIe") == 2.0e12 and hbm_bytes_per_s("NVIDIA H100 NVL") == 3.9e12
    assert hbm_bytes_per_s("NVIDIA A100-SXM4-80GB") == 2.039e12 and hbm_bytes_per_s("NVIDIA A100-SXM4-40GB") == 1.555e12
    assert hbm_bytes_per_s("a GPU of tomorrow") == 4.8e12
    if not torch.cuda.is_available():
        assert hbm_bytes_per_s() == 4.8e12


def test_trident_kernel_names_are_its_jit_functions():
    names = trident_kernel_names()
    assert {"strided_copy_kernel", "index_copy_kernel", "cache_write_kernel", "decode_attention_split_kernel",
            "decode_attention_combine_kernel"} <= names
    assert "decode_attention" not in names  # a Python wrapper, not a kernel


def _tiny(kind):
    from transformers import GenerationConfig

    cfg, model = _build(kind, "plain", "cpu", torch.float32, True)
    model.generation_config = GenerationConfig.from_model_config(cfg)
    model.generation_config.pad_token_id = 0
    model.generation_config.disable_compile = True
    ids = torch.randint(0, cfg.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    return cfg, model, ids


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_graph_step_serves_generate_from_static_copies(kind):
    """graph_generate (on the CPU the "replay" runs the eager forward on the static copies, the
    recording its warm-up and the cache's restore, the output the GPU's rebuild): tokens equal
    eager's over generate() calls and a shorter prompt, all from ONE recording (the variant's own
    StaticCache keeps its addresses; a value of the first prompt baked into it would show)."""
    cfg, model, ids = _tiny(kind)
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        want = model.generate(ids, **kw)
        want_short = model.generate(ids[:, :5], **kw)
        step = use_graph_step(model, cfg, "cpu")
        for call in range(2):
            assert torch.equal(model.generate(ids, **kw), want)
            # NEW - 1 one-token steps a call; the first call's first one ran eagerly
            assert step.replays == (call + 1) * (NEW - 1) - 1
        assert torch.equal(model.generate(ids[:, :5], **kw), want_short)
    assert step.recorded == 1 and step.replays == 3 * (NEW - 1) - 1


def test_generate_own_is_generates_time_outside_the_forward():
    cfg, model, ids = _tiny("llama")
    with torch.no_grad():
        inside = _Inside(model.forward, "cpu")
        model.forward = inside
        _, secs = _timed(model, ids, "static", "cpu")
    assert len(inside.per_call) == CALLS + 1 and inside.per_call[0] == 0.0  # one slot per timed call
    assert all(0 < spent < wall for spent, wall in zip(inside.per_call[1:], secs))


def test_batches_floor_reads_the_live_sequences_filled_positions():
    """bench_batches' HBM floor (issue 25 item 4): each step reads every weight and K and V of
    positions 0..t (mod the cache length) of each live sequence, every layer."""
    cfg = Config(layers=3, hidden=64, heads=4, kv_heads=2, max_seq=4)
    assert kv_bytes(cfg, 5, 9, 2) == 2 * 3 * 5 * 2 * 10 * 16 * 2
    per_position = 2 * 3 * 2 * 16 * 4  # K and V, 3 layers, 2 kv heads, head_dim 16, fp32
    got = step_bytes(cfg, 1000, [1, 1, 3, 3, 2, 2], 4)
    assert got == [1000 + per_position * b * (t % 4 + 1) for t, b in enumerate([1, 1, 3, 3, 2, 2])]
    assert got[4] == 1000 + per_position * 2 * 1  # step 4 wrote position 0 again: one position read
    batches = schedule(12)
    assert len(batches) == 12 and all(1 <= b <= 8 for b in batches)
    assert all(batches[i] == batches[i - i % 4] for i in range(12))  # a batch size holds for 4 steps


def test_profiled_call_reports_host_functions_events_and_its_result():
    """bench_dynamic --profile-call: the profiled call's result comes back with where its host time
    went (cProfile's functions, the profiler's host events); on the CPU no kernels."""
    from tools.bench_dynamic import profiled

    x = torch.randn(64, 64)
    out, report = profiled(lambda: torch.mm(x, x).relu(), "cpu")
    assert torch.equal(out, torch.mm(x, x).relu())
    assert any("cumulative" in row for row in report["host_cumulative"])
    assert any("internal time" in row for row in report["host_self"])
    assert any(e["name"] == "aten::mm" and e["n"] == 1 for e in report["host_events"]), report["host_events"]
    assert report["kernels"] == [] and report["device_us"] == 0


def test_dynamic_variants_cover_every_knob_set():
    """bench_dynamic runs trident.compile under each knob set of tools/knob_sets.py."""
    import trident
    from tools.bench_dynamic import make_forward
    from tools.knob_sets import KNOBS, for_device

    model = torch.nn.Linear(4, 4)
    for variant in KNOBS:
        assert callable(make_forward(variant, model))
        with trident.knobs.scope(**for_device(variant, "cuda")):  # every knob name and value is one
            pass
    with pytest.raises(ValueError):
        make_forward("trident_nonesuch", model)
