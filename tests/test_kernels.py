"""The verify-friendly linear layer: same product (float32 rounding only), active only where intended."""

import pytest
import torch

from hf_spec import kernels
from hf_spec.kernels import (draft_kind, install_upcast_prefill, install_verify_linear, is_int4_draft, is_int8_draft,
                             measured_attention, measured_forms, one_query_mask_pays, quantize_draft_int4,
                             quantize_draft_int8, upcast_prefill, verify_linear)

from .conftest import tiny_llama


def synthetic_timer(monkeypatch, linear_s: float, mm_s: float) -> list[str]:
    """Replace the clock of the forms' measurement: every run of F.linear takes ``linear_s``, every run of
    (W @ x.T).T ``mm_s`` (nothing is run); measurements start from an empty cache and do not outlive the
    test. Returns the names of the forms timed, in order."""
    timed = []
    monkeypatch.setattr(kernels, "time_form", lambda name, fn: timed.append(name) or {"linear": linear_s,
                                                                                       "mm": mm_s}[name])
    monkeypatch.setattr(kernels, "_MEASURED", {})
    return timed


@pytest.mark.parametrize("linear_s, mm_s, routed", [
    (1.0, 2.0, False),  # F.linear faster: nothing routed
    (2.0, 1.0, True),  # (W @ x.T).T faster: routed
    (1.0, 0.95, False),  # (W @ x.T).T faster, but by less than the margin (10%)
])
def test_the_form_is_chosen_by_measuring_it(monkeypatch, linear_s, mm_s, routed):
    timed = synthetic_timer(monkeypatch, linear_s, mm_s)
    used = []
    real_mm_form = kernels._mm_form
    monkeypatch.setattr(kernels, "_mm_form", lambda w, x: used.append(x.shape[0]) or real_mm_form(w, x))
    lin = torch.nn.Linear(1024, 2048)
    assert install_verify_linear(torch.nn.Sequential(lin)) == 1
    xs = [torch.randn(m, 1024) for m in (3, 4, 5, 1)]
    with torch.no_grad(), verify_linear():
        ys = [lin(x) for x in xs]
        lin(xs[0])  # measured already: not again
    assert used == ([3, 4, 5, 3] if routed else [])  # never for one row
    # 3 and 4 rows share the bucket of 4, 5 rows are in the bucket of 8; one row is never measured
    assert sorted(measured_forms()) == [(2048, 1024, 4, torch.float32), (2048, 1024, 8, torch.float32)]
    assert set(measured_forms().values()) == {(linear_s, mm_s)}
    assert timed.count("linear") == timed.count("mm") == 2 * (kernels.REPEATS + 1)  # a warm-up each
    for x, y in zip(xs, ys):
        torch.testing.assert_close(y, torch.nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


def test_a_measurement_runs_both_forms_on_at_most_2_24_weights(monkeypatch):
    """Both forms run on the weight itself, a vocabulary projection's on its first 2^24 elements only (the
    timer here runs them and reports their output shapes instead of times)."""
    shapes = []
    monkeypatch.setattr(kernels, "time_form", lambda name, fn: shapes.append((name, tuple(fn().shape))) or 1.0)
    weight = torch.randn((1 << 24) // 512 + 64, 512)
    assert kernels.measure_forms(weight, 4, repeats=2) == (1.0, 1.0)
    assert shapes == [("linear", (4, 32768)), ("mm", (4, 32768))] * 3
    shapes.clear()
    kernels.measure_forms(weight[:100], 2, repeats=1)
    assert shapes == [("linear", (2, 100)), ("mm", (2, 100))] * 2


def test_verify_linear_matches_f_linear_and_is_gated(monkeypatch):
    synthetic_timer(monkeypatch, 2.0, 1.0)  # (W @ x.T).T measured faster
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 1024)
    ref = {m: lin(torch.ones(m, 1024)) for m in (1, 3, 16, 200)}
    assert install_verify_linear(torch.nn.Sequential(lin)) == 1
    calls = []
    orig_mm = torch.mm

    def spy(*a):
        calls.append(a[0].shape)
        return orig_mm(*a)

    torch.mm = spy
    try:
        x = torch.randn(3, 1024)
        outside = lin(x)
        assert calls == []  # outside the block: exactly F.linear
        with verify_linear():
            inside = lin(x)
            lin(torch.randn(200, 1024))  # more than 128 rows: F.linear
            lin(torch.randn(1, 1024))   # one row: F.linear
        assert len(calls) == 1
    finally:
        torch.mm = orig_mm
    torch.testing.assert_close(inside, outside, rtol=1e-5, atol=1e-5)
    assert torch.equal(lin(torch.ones(200, 1024)), ref[200])


def test_subclasses_of_linear_are_left_alone():
    class QuantLinear(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), QuantLinear(1024, 1024), torch.nn.Linear(8, 8))
    assert install_verify_linear(model) == 1  # the subclass and the small layer keep their forward
    assert "forward" not in vars(model[1]) and "forward" not in vars(model[2])


def test_model_outputs_agree_inside_and_outside():
    model = tiny_llama(seed=2, hidden=1024)
    ids = torch.tensor([[0, 3, 4, 5, 6]])
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        assert install_verify_linear(model) > 0
        with verify_linear():
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_upcast_prefill_only_for_many_rows_and_only_inside_the_draft_block(monkeypatch):
    """Routed layers compute 48 rows or more in float32 inside upcast_prefill (the draft's catch-up); outside it, in
    this thread or another, they are the model's own bfloat16 F.linear: a model that served as a draft had kept the
    float32 path for good (its plain generate, or its own target role when drafting for itself, rounded otherwise on
    CPUs whose bfloat16 products round differently). Seen by the dtype each product gets (on AMX both round alike)."""
    import threading

    from hf_spec import kernels

    seen = []
    real_linear = kernels.F.linear
    monkeypatch.setattr(kernels.F, "linear", lambda x, w, b=None: seen.append(x.dtype) or real_linear(x, w, b))
    lin = torch.nn.Linear(64, 8).to(torch.bfloat16)
    x_small, x_big = torch.randn(4, 64).to(torch.bfloat16), torch.randn(64, 64).to(torch.bfloat16)
    install_upcast_prefill(torch.nn.Sequential(lin))

    def dtypes(x):
        seen.clear()
        y = lin(x)
        assert y.dtype == torch.bfloat16
        return list(seen)

    with upcast_prefill():
        assert dtypes(x_small) == [torch.bfloat16] and dtypes(x_big) == [torch.float32]
        other = []
        thread = threading.Thread(target=lambda: other.append(dtypes(x_big)))
        thread.start()
        thread.join()
        assert other == [[torch.bfloat16]]  # another thread: the model's own
    assert dtypes(x_big) == [torch.bfloat16] and dtypes(x_small) == [torch.bfloat16]
    exact = real_linear(x_big.float(), lin.weight.float(), lin.bias.float())
    with upcast_prefill():
        torch.testing.assert_close(lin(x_big).float(), exact, rtol=1e-2, atol=1e-2)


def test_routed_models_still_pickle_and_deep_copy():
    """A model that ran hf-spec keeps its routed linear layers; a bound method there broke pickle.loads (it looks
    the function's name up on the module) and copies. The copy must route through its own weights."""
    import copy
    import pickle

    for install, dtype in ((install_verify_linear, torch.float32), (install_upcast_prefill, torch.bfloat16)):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024)).to(dtype)
        assert install(model) == 1
        x = torch.randn(64, 1024, dtype=dtype)
        for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
            with torch.no_grad():
                clone[0].weight.mul_(2)
                with verify_linear(), upcast_prefill():
                    assert torch.allclose(clone(x).float(), torch.nn.functional.linear(
                        x.float(), clone[0].weight.float(), clone[0].bias.float()), rtol=2e-2, atol=2e-2)
                    assert not torch.allclose(clone(x).float(), model(x).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("native_bf16", [True, False])
def test_an_int8_draft_keeps_its_down_projections_and_computes_what_float32_does(monkeypatch, native_bf16):
    """quantize_draft_int8: every linear layer int8 but the MLP down projections (bfloat16 weights where the CPU
    computes bfloat16 natively, else float32), float32 in and out, logits close to the float32 model's; a
    model that is not float32 is refused."""
    from hf_spec import device
    from hf_spec.drafters.base import logit_rows
    from hf_spec.drafters.draft_model import _compute_parameters
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: native_bf16)
    model = tiny_llama(vocab_size=64, hidden=32, layers=2)  # intermediate size 64
    before = _compute_parameters(model)
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        reference = model(ids).logits
    assert not is_int8_draft(model)
    assert quantize_draft_int8(model) == 2 * 6 + 1  # q, k, v, o, gate, up per layer, and the head
    assert is_int8_draft(model) and draft_kind(model) == "int8"
    for layer in model.model.layers:
        assert all(isinstance(getattr(layer.self_attn, n), DynamicLinear) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        assert isinstance(layer.mlp.gate_proj, DynamicLinear) and isinstance(layer.mlp.up_proj, DynamicLinear)
        assert type(layer.mlp.down_proj) is torch.nn.Linear
        assert layer.mlp.down_proj.weight.dtype == (torch.bfloat16 if native_bf16 else torch.float32)
    assert logit_rows(model) == 64 and _compute_parameters(model) == before
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.dtype == torch.float32
    spread = reference.abs().max()
    assert (logits - reference).abs().max() < 0.05 * spread  # int8 rounding, not another function
    assert (logits.argmax(-1) == reference.argmax(-1)).float().mean() > 0.8
    with pytest.raises(ValueError, match="quantized already"):  # on every CPU (the down projections may stay float32)
        quantize_draft_int8(model)
    # the verify-aware forward installed over it (measure_forward_times does, on any float32 CPU model) leaves the
    # bfloat16 down projections theirs: one- and two-row forwards still run and compute the same
    from hf_spec.tuning import measure_forward_times

    monkeypatch.setattr(kernels, "_MIN_WEIGHT", 0)  # tiny weights count as large here
    assert set(measure_forward_times(model, ids[:1], [1, 2], repeats=1)) == {1, 2}
    down = model.model.layers[0].mlp.down_proj
    assert down._hf_spec_forward is (kernels._bfloat16_forward if native_bf16 else kernels._forward)
    with torch.no_grad(), verify_linear():
        assert torch.allclose(model(ids).logits, logits, atol=1e-5)
    with pytest.raises(ValueError, match="float32 model on the CPU"):
        quantize_draft_int8(tiny_llama().to(torch.bfloat16))


@pytest.mark.parametrize("name", ["Gemma 3n (shared keys and values)", "Gemma 4 (shared keys and values)", "OPT",
                                  "GPT-NeoX", "Gemma 3", "Phi-3"])
def test_an_int8_draft_finds_down_projections_of_any_size_and_name(name):
    """The down projections were found by the config's one intermediate_size: Gemma 3n's per-layer list matched none
    and Gemma 4's double-wide MLPs only some, so theirs became int8 (the outliers their inputs carry, lost). Now by
    structure outside attention: every MLP's, whatever it is called (down_proj, fc2, dense_4h_to_h) or however its
    up projection is cut (Phi-3's fused gate_up), and no attention output projection (Gemma 3's heads x head size
    are wider than its hidden size)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from . import conformance as C

    arch = next(a for a in C.ARCHITECTURES if a.name == name)
    model = arch.model(arch.config()).float().eval()
    hidden = model.config.get_text_config().hidden_size
    expected = {id(m) for n, m in model.named_modules()
                if n.rsplit(".", 1)[-1] in ("down_proj", "fc2", "dense_4h_to_h") and type(m) is torch.nn.Linear}
    assert expected
    sizes = {m.in_features for n, m in model.named_modules() if id(m) in expected}
    quantize_draft_int8(model)
    kept = {id(m) for m in model.modules() if type(m) is torch.nn.Linear}
    assert expected <= kept  # every down projection kept its (bfloat16 or float32) weight
    assert not [n for n, m in model.named_modules()
                if type(m) is torch.nn.Linear and id(m) not in expected and m.out_features == hidden
                and "attn" in n]  # attention output projections are int8
    assert any(isinstance(m, DynamicLinear) for m in model.modules())
    if name.startswith("Gemma 4"):
        assert len(sizes) == 2  # the double-wide MLPs too


def test_an_int8_draft_tells_mlps_from_mixers_and_finds_shared_experts():
    """A break-it finding: Mamba's (and Jamba's, Bamba's, a gated delta net's) mixer output projections were taken
    for MLP down projections, and a shared expert narrower than the model was missed."""
    import transformers as tf

    from hf_spec.kernels import _mlp_down_projections

    mamba = tf.MambaForCausalLM(tf.MambaConfig(hidden_size=64, num_hidden_layers=2, vocab_size=128,
                                               intermediate_size=128))
    assert _mlp_down_projections(mamba) == []
    deepseek = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, moe_intermediate_size=32, n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=1,
        first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, n_group=1, topk_group=1))
    found = {n for n, m in deepseek.named_modules() if any(m is d for d in _mlp_down_projections(deepseek))}
    assert found == {"model.layers.0.mlp.down_proj", "model.layers.1.mlp.shared_experts.down_proj"}


def _int4_reference(weight: torch.Tensor, group: int) -> torch.Tensor:
    """What a 4-bit weight should hold, computed here independently of kernels._int4_pack: each group of ``group``
    input channels of a row on 16 levels from its minimum, the step (max - min) / 15 and the offset held in
    bfloat16 as the kernel holds them; a constant group (the embedding row of the padding token, zeros, in a
    tied head) holds its value."""
    rows = weight.float().reshape(weight.shape[0], -1, group)
    low, high = rows.amin(-1, keepdim=True), rows.amax(-1, keepdim=True)
    step = ((high - low) / 15).bfloat16().float().clamp(min=1e-12)
    middle = (low + 8 * step).bfloat16().float()  # the value of level 8
    levels = ((rows - middle) / step + 8).round().clamp(0, 15)
    return ((levels - 8) * step + middle).reshape(weight.shape)


@pytest.mark.parametrize("group, native_bf16", [(32, True), (64, False)])
def test_an_int4_draft_drafts_with_its_rounded_weights_and_prefills_with_bfloat16(monkeypatch, group, native_bf16):
    """quantize_draft_int4: every bfloat16 linear layer whose shape the kernel takes gets 4-bit weights (a tied
    vocabulary projection stays tied; a float32 parameter elsewhere, as models keep some, is left alone); inputs of
    up to INT4_MAX_ROWS rows compute with the rounded weights (not the bfloat16 ones), longer inputs with the
    bfloat16 weights (upcast to float32 on a CPU without native bfloat16); a deep copy drafts the same; refusals."""
    import copy

    from hf_spec import device

    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: native_bf16)
    model = tiny_llama(vocab_size=64, hidden=64, layers=2).to(torch.bfloat16)  # intermediate size 64
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    model.model.norm.float()  # a module kept in float32
    dense = {name: m.weight.detach().clone() for name, m in model.named_modules() if type(m) is torch.nn.Linear}
    assert not is_int4_draft(model) and draft_kind(model) == "bfloat16"
    assert quantize_draft_int4(model, group) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    assert is_int4_draft(model) and draft_kind(model) == "int4"
    assert model.lm_head.weight is model.model.embed_tokens.weight
    twin = copy.deepcopy(model)
    torch.manual_seed(0)
    for name, module in model.named_modules():
        if name not in dense:
            continue
        rounded = _int4_reference(dense[name], group)
        assert not torch.equal(rounded, dense[name].float())
        for rows in (1, kernels.INT4_MAX_ROWS):
            x = torch.randn(rows, module.in_features, dtype=torch.bfloat16)
            y = module(x).float()
            want = x.float() @ rounded.T
            assert (y - want).abs().max() <= 0.02 * want.abs().max() + 1e-3, name  # bfloat16 scales and sums only
            assert (y - x.float() @ dense[name].float().T).abs().max() > 1e-3, name  # not the bfloat16 weights
            assert torch.equal(twin.get_submodule(name)(x), module(x))
        strided = torch.randn(module.in_features, 2, dtype=torch.bfloat16)[:, :1].T  # a batch row's slice
        assert not strided.is_contiguous() and torch.equal(module(strided), module(strided.contiguous()))
        x = torch.randn(kernels.INT4_MAX_ROWS + 1, module.in_features, dtype=torch.bfloat16)
        prefill = (torch.nn.functional.linear(x, dense[name]) if native_bf16 else
                   torch.nn.functional.linear(x.float(), dense[name].float()).to(torch.bfloat16))
        assert torch.equal(module(x), prefill)
    with pytest.raises(ValueError, match="quantized already"):
        quantize_draft_int4(model)
    with pytest.raises(ValueError, match="quantized already"):
        quantize_draft_int8(model)
    with pytest.raises(ValueError, match="no linear layer of this model can take int4 weights.*bfloat16"):
        quantize_draft_int4(tiny_llama())  # float32
    with pytest.raises(ValueError, match="group_size must be one of"):
        quantize_draft_int4(tiny_llama().to(torch.bfloat16), 16)


def test_an_int4_draft_keeps_bfloat16_where_the_kernel_cannot_take_the_shape():
    """Layers whose output features are not a multiple of 16 or whose input features are not a multiple of the
    group size keep their bfloat16 weights (and forward): here the head (vocabulary 40) and, with groups of 64,
    every layer reading the hidden size 32."""
    model = tiny_llama(vocab_size=40, hidden=32, layers=1).to(torch.bfloat16)
    assert quantize_draft_int4(model, 32) == 7  # the head's 40 rows: no
    assert not hasattr(model.lm_head, "_hf_spec_int4")
    model = tiny_llama(vocab_size=64, hidden=32, layers=1).to(torch.bfloat16)
    assert quantize_draft_int4(model, 64) == 1  # only down_proj reads 64 (the intermediate size)
    assert hasattr(model.model.layers[0].mlp.down_proj, "_hf_spec_int4")
    with pytest.raises(ValueError, match="no linear layer of this model can take int4 weights"):
        quantize_draft_int4(tiny_llama(vocab_size=40, hidden=32, layers=1).to(torch.bfloat16), 128)


def test_auto_keeps_a_bfloat16_draft_that_no_int4_layer_fits(monkeypatch, caplog):
    """load_draft_model: where --draft-dtype auto chose int4 and the kernel can take no layer of the draft, the draft
    stays bfloat16 with a warning; asked for int4 explicitly, the error stands."""
    from hf_spec import models
    from hf_spec.drafters import draft_model

    monkeypatch.setattr(models, "load", lambda name, dtype=None: (tiny_llama(vocab_size=40, hidden=40, layers=1).to(dtype), None))
    monkeypatch.setattr(draft_model, "_draft_dtype", lambda target_dtype, name, device: "int4")
    with caplog.at_level("WARNING", logger="hf_spec"):
        model, _ = draft_model.load_draft_model("tiny", None, "auto")
    assert model.dtype == torch.bfloat16 and not is_int4_draft(model) and "stays bfloat16" in caplog.text
    with pytest.raises(ValueError, match="no linear layer"):
        draft_model.load_draft_model("tiny", None, "int4")


@pytest.mark.parametrize("enable_gqa_s, packed_s, mask", [(1.0, 0.2, True), (1.0, 0.6, False), (0.3, 1.0, False)])
def test_one_query_attention_form_is_chosen_by_measuring_it(monkeypatch, enable_gqa_s, packed_s, mask):
    """A one-query forward gets a 4D mask where the packed form measured under half the time; measured once per
    (kv heads, groups, head size, dtype), only for half-precision CPU sdpa models with grouped-query heads."""
    timed = []
    monkeypatch.setattr(kernels, "time_attention", lambda name, fn: timed.append((name, tuple(fn().shape))) or
                        {"transformers": enable_gqa_s, "packed": packed_s}[name])
    monkeypatch.setattr(kernels, "_ATTENTION_MEASURED", {})
    config = tiny_llama().config  # 4 query heads over 2 key/value heads of size 8, sdpa
    assert config._attn_implementation == "sdpa"
    assert one_query_mask_pays(config, torch.bfloat16, "cpu") is mask
    assert one_query_mask_pays(config, torch.bfloat16, "cpu") is mask  # cached: no second measurement
    runs = 1 + 6 * kernels.REPEATS
    assert sorted(set(timed)) == [("packed", (1, 2, 2, 8)), ("transformers", (1, 4, 1, 8))] and len(timed) == 2 * runs
    assert measured_attention() == {(2, 2, 8, torch.bfloat16, torch.get_num_threads(), 1): (enable_gqa_s, packed_s)}
    timed.clear()
    assert one_query_mask_pays(config, torch.float16, "cpu") is mask and len(timed) == 2 * runs  # per dtype
    timed.clear()
    assert not one_query_mask_pays(config, torch.float32, "cpu")  # float32 keeps transformers' path
    assert not one_query_mask_pays(config, torch.bfloat16, "cuda")  # CUDA's fast kernels want no mask
    eager = tiny_llama().config
    eager._attn_implementation = "eager"
    assert not one_query_mask_pays(eager, torch.bfloat16, "cpu")
    mha = tiny_llama().config
    mha.num_key_value_heads = mha.num_attention_heads
    assert not one_query_mask_pays(mha, torch.bfloat16, "cpu")
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1")
    assert not one_query_mask_pays(tiny_llama().config, torch.bfloat16, "cpu")
    assert timed == []


def test_one_query_attention_forms_compute_the_same():
    """The two forms measured are the same attention (what transformers' sdpa runs with and without a mask)."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 6, 1, 16), torch.randn(1, 2, 40, 16)
    v = torch.randn_like(k)
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    packed = torch.nn.functional.scaled_dot_product_attention(q.reshape(1, 2, 3, 16), k, v,
                                                              attn_mask=torch.ones(1, 1, 1, 40, dtype=torch.bool))
    torch.testing.assert_close(packed.reshape(plain.shape), plain)


@pytest.mark.parametrize("transformers_s, packed_s, packed", [(1.0, 0.85, True), (1.0, 0.95, False)])
def test_packed_attention_is_chosen_by_measuring_it(monkeypatch, transformers_s, packed_s, packed):
    """A block of 2..64 queries attends packed where that measured under 1 - MARGIN of transformers' repeat_kv form,
    in float32 as in half precision; measured once per power-of-two bucket of the query count, CPU sdpa models with
    grouped-query heads only."""
    timed = []
    monkeypatch.setattr(kernels, "time_attention", lambda name, fn: timed.append((name, tuple(fn().shape))) or
                        {"transformers": transformers_s, "packed": packed_s}[name])
    monkeypatch.setattr(kernels, "_ATTENTION_MEASURED", {})
    config = tiny_llama().config  # 4 query heads over 2 key/value heads of size 8, sdpa
    runs = 1 + 2 * kernels.REPEATS
    for dtype in (torch.float32, torch.bfloat16):
        timed.clear()
        assert kernels.packed_attention_pays(config, dtype, "cpu", 3) is packed
        assert sorted(set(timed)) == [("packed", (1, 2, 8, 8)), ("transformers", (1, 4, 4, 8))]  # 3 -> bucket 4
        assert len(timed) == 2 * runs
        timed.clear()
        assert kernels.packed_attention_pays(config, dtype, "cpu", 4) is packed and not timed  # same bucket: cached
    assert set(measured_attention()) == {(2, 2, 8, dtype, torch.get_num_threads(), 4)
                                         for dtype in (torch.float32, torch.bfloat16)}
    assert not kernels.packed_attention_pays(config, torch.float32, "cpu", 1)  # one query: one_query_mask_pays
    assert not kernels.packed_attention_pays(config, torch.float32, "cpu", kernels.PACKED_MAX_QUERIES + 1)  # a prompt
    assert not kernels.packed_attention_pays(config, torch.float32, "cuda", 4)
    mha = tiny_llama().config
    mha.num_key_value_heads = mha.num_attention_heads
    assert not kernels.packed_attention_pays(mha, torch.float32, "cpu", 4)
    eager = tiny_llama().config
    eager._attn_implementation = "eager"
    assert not kernels.packed_attention_pays(eager, torch.float32, "cpu", 4)
    assert len(timed) == 0


@pytest.mark.parametrize("groups", [2, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "bool-broadcast", "float", "none", "per-head"])
def test_packed_sdpa_attention_computes_transformers_sdpa_attention(groups, mask_kind):
    """packed_sdpa_attention returns what transformers' sdpa_attention_forward returns, for several queries under a
    4D mask (boolean or additive, broadcast over the batch or per row, holes included), and hands every other case
    (no mask, a mask per head, one query) to transformers' function itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = groups, True
    b, kv, n, t, d = 2, 2, 5, 12, 8
    q, k, v = torch.randn(b, kv * groups, n, d), torch.randn(b, kv, t, d), torch.randn(b, kv, t, d)
    seen = torch.rand(b, 1, n, t) > 0.3
    seen[..., 0] = True
    mask = {"bool": seen, "bool-broadcast": seen[:1],  # one mask for every row
            "float": torch.zeros(b, 1, n, t).masked_fill(~seen, torch.finfo(torch.float32).min),
            "none": None, "per-head": seen.expand(b, kv * groups, n, t)}[mask_kind]
    for queries in (n, 1):
        expected, _ = sdpa_attention_forward(module, q[:, :, :queries], k, v,
                                             None if mask is None else mask[:, :, :queries], scaling=0.3)
        got, _ = kernels.packed_sdpa_attention(module, q[:, :, :queries], k, v,
                                               None if mask is None else mask[:, :, :queries], scaling=0.3)
        assert got.shape == (b, queries, kv * groups, d)
        torch.testing.assert_close(got, expected)


def test_packed_attention_packs_inside_the_block_on_its_thread_only(monkeypatch):
    """Inside packed_attention, a model's sdpa attention over several queries under a 4D mask packs the query heads
    (the same logits as transformers' own path); outside the block, on another thread during it, and after an
    exception in it, transformers' function runs unpacked; the model's config is never touched."""
    import threading

    packed = []
    pack = kernels._pack_queries
    monkeypatch.setattr(kernels, "_pack_queries", lambda q, g: packed.append(threading.get_ident()) or pack(q, g))
    model = tiny_llama()
    ids = torch.tensor([[0, 3, 5, 7, 2, 6]])
    mask = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]  # causal, as a 4D mask [1, 1, 6, 6]
    with torch.no_grad():
        reference = model(input_ids=ids, attention_mask=mask).logits
        assert not packed
        with kernels.packed_attention():
            inside = model(input_ids=ids, attention_mask=mask).logits
            assert packed == [threading.get_ident()] * model.config.num_hidden_layers
            other = threading.Thread(target=lambda: model(input_ids=ids, attention_mask=mask))
            other.start()
            other.join()
            assert len(packed) == model.config.num_hidden_layers  # the other thread did not pack
        assert model.config._attn_implementation == "sdpa"
        torch.testing.assert_close(inside, reference)
        with pytest.raises(RuntimeError, match="inside"):
            with kernels.packed_attention():
                raise RuntimeError("inside")
        model(input_ids=ids, attention_mask=mask)
    assert len(packed) == model.config.num_hidden_layers


def test_measurements_leave_the_global_generator_alone():
    """Both measurements run inside a generate call, where the global generator is the sampler's: a seeded
    call must sample the same whether or not a measurement happened in it."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    kernels.measure_gqa_attention(2, 2, 8, torch.bfloat16, context=16, repeats=1)
    kernels.measure_gqa_attention(2, 2, 8, torch.float32, queries=4, context=16, repeats=1)
    kernels.measure_forms(torch.randn(8, 8, generator=torch.Generator().manual_seed(1)), 2, repeats=1)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("one_s,two_s,joined", [(1.0, 2.0, True), (2.0, 1.0, False)])
def test_extra_rows_join_a_routed_product_only_where_measured_faster(monkeypatch, one_s, two_s, joined):
    """Rows added to a routed layer's product (Medusa heads in the target's lm_head) come back as their own
    projection, and the layer's output is its own input's, where one product measured faster than two; where it
    measured slower nothing is joined and the rows are never made. Other threads and layers are untouched."""
    import threading

    monkeypatch.setattr(kernels, "_EXTRA_MEASURED", {})
    timed = []
    monkeypatch.setattr(kernels, "time_form", lambda name, fn: timed.append(name) or {"one": one_s, "two": two_s}[name])
    torch.manual_seed(0)
    layer, other = torch.nn.Linear(8, 50, bias=False), torch.nn.Linear(8, 50, bias=False)
    assert kernels.route_extra_rows(layer) and kernels.route_extra_rows(layer)  # idempotent
    assert not kernels.route_extra_rows(torch.nn.Embedding(4, 8)) and not kernels.route_extra_rows(None)
    assert not kernels.route_extra_rows(torch.nn.Linear(8, 50))  # a bias, which the drafter's rows go without
    x, rows = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    made, seen = [], {}
    with kernels.extra_rows(layer, lambda h: made.append(h.shape) or rows, 4, 2) as extra:
        y = layer(x)
        z = other(x)  # not the routed layer of this block
        thread = threading.Thread(target=lambda: seen.update(y=layer(x)))
        thread.start()
        thread.join()
    torch.testing.assert_close(y, torch.nn.functional.linear(x, layer.weight))
    torch.testing.assert_close(z, torch.nn.functional.linear(x, other.weight))
    assert torch.equal(seen["y"], torch.nn.functional.linear(x, layer.weight))  # the other thread: F.linear itself
    assert timed.count("one") == timed.count("two") == kernels.REPEATS + 1  # measured once, both forms
    # 6, 8 and 4 rows rounded up; outside verify_linear; this process's threads
    assert list(kernels.measured_extra_rows()) == [(50, 8, torch.float32, "cpu", 8, 8, 4, False, torch.get_num_threads())]
    if joined:
        assert made == [x.shape]
        torch.testing.assert_close(extra.output, torch.nn.functional.linear(rows, layer.weight))
    else:
        assert made == [] and extra.output is None
    timed.clear()
    with kernels.extra_rows(layer, lambda h: rows, 4, 2) as again:
        layer(x)
    assert timed == [] and (again.output is not None) == joined  # the choice is cached for the process
    assert layer(x).shape == (2, 3, 50)  # outside the block: the layer as it was


def test_a_measurement_that_needs_another_runs_it_and_counts_its_time_once(monkeypatch):
    """Inside a float32 verify forward, measuring the joined product asks for the (W @ x.T).T choice of its row
    counts, a measurement inside a measurement: it must run (not wait on the lock its caller holds), and the
    seconds the loop leaves out of step times must count the nested time once (never more than the wall time)."""
    import threading
    import time

    monkeypatch.setattr(kernels, "_EXTRA_MEASURED", {})
    monkeypatch.setattr(kernels, "_MEASURED", {})
    # a lock of this test's own: a regression to a plain Lock hangs this test's thread only, not later measurements
    monkeypatch.setattr(kernels, "_MEASURE_LOCK", type(kernels._MEASURE_LOCK)())
    layer = torch.nn.Linear(1024, 1024, bias=False)  # 2^20 weights: a candidate for (W @ x.T).T
    kernels.route_extra_rows(layer)
    x, rows = torch.randn(1, 3, 1024), torch.randn(1, 4, 1024)
    seen = {}

    def run():
        before, t0 = kernels.measuring_seconds(), time.perf_counter()
        with kernels.verify_linear(True), kernels.extra_rows(layer, lambda h: rows, 4, 4):
            seen["y"] = layer(x)
        seen["measuring"], seen["wall"] = kernels.measuring_seconds() - before, time.perf_counter() - t0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "a nested measurement waited on its caller's lock"
    torch.testing.assert_close(seen["y"], torch.nn.functional.linear(x, layer.weight))
    assert kernels.measured_extra_rows() and kernels.measured_forms()  # both measured, the second inside the first
    assert 0 < seen["measuring"] <= seen["wall"]
