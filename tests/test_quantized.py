"""Quantized and offloaded targets on the real SmolLM2-135M: greedy speculative output token-identical to
the same (quantized / offloaded) target's own ``generate``, in float32 compute, for the n-gram and draft
drafters; and clear errors for what cannot work.

- NF4 (bitsandbytes 4-bit, quantized while loading; runs on CPU with bitsandbytes >= 0.45);
- a target offloaded with accelerate (``device_map`` with part of the layers on disk), the draft elsewhere
  (another dtype, not offloaded).

As in the other exactness tests, a verify forward over k+1 positions is not bit-identical to k+1 one-token
forwards; a divergence from plain greedy must be a float near-tie (top-2 logit gap under TIE_BOUND). In
bfloat16 compute (NF4 with bfloat16 matmuls) the rounding is coarser: every divergence must be a near-tie
under BF16_TIE_BOUND, and how many there are is printed (run with -s)."""

import copy
import json

import pytest
import torch

import hf_spec
from hf_spec.quantization import bitsandbytes_bf16_layers, bitsandbytes_config, honor_bitsandbytes_compute_dtype

from .conftest import BF16_TIE_BOUND, TIE_BOUND, check_greedy_identical, encode, tiny_llama, verify_vs_decode

pytestmark = pytest.mark.slow
NEW = 24
KS = [1, 3, 5]


@pytest.fixture(scope="module")
def prompts(specbench_prompts):
    return specbench_prompts[::6]  # 4 prompts of 4 categories (CI time)


@pytest.fixture(scope="module")
def nf4():
    return hf_spec.load("smollm2-135m", dtype=torch.float32, quantization="nf4")


@pytest.fixture(scope="module")
def offloaded(tmp_path_factory):
    """SmolLM2 with its last 10 decoder layers on disk (accelerate hooks load them at each forward)."""
    layers = {f"model.layers.{i}": ("disk" if i >= 20 else "cpu") for i in range(30)}
    device_map = {"model.embed_tokens": "cpu", **layers, "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    model, tok = hf_spec.load("smollm2-135m", dtype=torch.float32, device_map=device_map,
                              offload_folder=str(tmp_path_factory.mktemp("offload")))
    return model, tok


def check_identical(model, tok, prompts, make_drafter, label, bound=TIE_BOUND, max_ties=1):
    return check_greedy_identical(model, tok, prompts, make_drafter, label, NEW, KS, bound, max_ties)


def test_nf4_target_is_quantized(nf4):
    model, _ = nf4
    import bitsandbytes as bnb

    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()) == 30 * 7
    assert model.config.quantization_config.bnb_4bit_quant_type == "nf4"


def test_nf4_verify_forward_matches_one_token_forwards(nf4, smol, prompts):
    """bitsandbytes' 4-bit matmul over 4 positions against 4 one-position forwards, beside float32's."""
    for label, (model, tok) in (("float32", smol), ("nf4", nf4)):
        worst, flips, count = verify_vs_decode(model, tok, prompts)
        print(f"\n{label}: largest |logit difference| {worst:.2e}, greedy choice differs at {flips} of {count} positions")
        assert worst < TIE_BOUND, (label, worst, flips)  # a flip then can only be at a near-tie


def test_nf4_in_float32_computes_in_float32(nf4, prompts):
    """hf_spec.load keeps bitsandbytes' fused bfloat16 CPU kernel (AVX512-BF16 hosts) off a float32-compute
    model, also after forwards: no 4-bit layer is left computing in bfloat16 or repacked for that kernel."""
    model, tok = nf4
    model.generate(**encode(tok, prompts[0].text), max_new_tokens=2, do_sample=False)
    assert bitsandbytes_bf16_layers(model) == []
    packed = [m for m in model.modules() if getattr(getattr(m, "weight", None), "quant_state", None) is not None
              and getattr(m.weight.quant_state, "packing_format_for_cpu", False)]
    assert packed == []


def test_fused_bfloat16_layers_are_reported(prompts, caplog):
    """A 4-bit model loaded without hf_spec.load on an AVX512-BF16 host computes in bfloat16 despite float32:
    hf_spec.generate warns, and switching it after its first forward is a clear error."""
    import bitsandbytes.functional as bnbf
    from transformers import AutoModelForCausalLM

    if not bnbf.has_avx512bf16():
        pytest.skip("bitsandbytes has no fused bfloat16 CPU kernel on this CPU (no AVX512-BF16)")
    path = hf_spec.models.provision("smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 quantization_config=bitsandbytes_config("nf4", torch.float32))
    tok = hf_spec.load("smollm2-135m")[1]
    assert len(bitsandbytes_bf16_layers(model)) == 30 * 7
    with caplog.at_level("WARNING", logger="hf_spec"):
        model.generate(**encode(tok, prompts[0].text), custom_generate=hf_spec.generate, return_dict_in_generate=True,
                       drafter=hf_spec.NgramDrafter(3), max_new_tokens=4, do_sample=False)
    assert "honor_bitsandbytes_compute_dtype" in caplog.text
    with pytest.raises(ValueError, match="right after loading"):
        honor_bitsandbytes_compute_dtype(model)


@pytest.mark.parametrize("drafter", ["ngram", "draft-bf16", "draft-nf4"])
def test_nf4_target_greedy_identical(nf4, smol, prompts, drafter):
    model, tok = nf4
    if drafter == "ngram":
        make = hf_spec.NgramDrafter
    else:
        # the draft in higher precision (the unquantized model in bfloat16), or quantized too (the NF4 model itself)
        draft = copy.deepcopy(smol[0]).to(torch.bfloat16) if drafter == "draft-bf16" else model
        make = lambda k: hf_spec.DraftModelDrafter(draft, k)  # noqa: E731
    check_identical(model, tok, prompts, make, f"nf4/{drafter}")


def test_nf4_target_in_bfloat16_diverges_only_at_near_ties(prompts):
    model, tok = hf_spec.load("smollm2-135m", dtype=torch.bfloat16, quantization="nf4")
    runs, gaps = check_identical(model, tok, prompts, hf_spec.NgramDrafter, "nf4-bf16/ngram", BF16_TIE_BOUND,
                                 max_ties=len(prompts))
    print(f"\nNF4 SmolLM2, bfloat16 compute, n-gram: {len(gaps)} of {runs} outputs diverge from plain greedy, "
          f"all at near-ties (top-2 gaps {[round(g, 3) for g in gaps]})")


@pytest.mark.parametrize("drafter", ["ngram", "draft-bf16"])
def test_offloaded_target_greedy_identical(offloaded, smol, prompts, drafter):
    model, tok = offloaded
    assert any(hasattr(m, "_hf_hook") for m in model.modules())  # accelerate moves the disk layers in
    if drafter == "ngram":
        make = hf_spec.NgramDrafter
    else:
        draft = copy.deepcopy(smol[0]).to(torch.bfloat16)  # another dtype, not offloaded
        make = lambda k: hf_spec.DraftModelDrafter(draft, k)  # noqa: E731
    check_identical(model, tok, prompts, make, f"offloaded/{drafter}")
    # and the offloaded target computes what the in-memory one does
    enc = encode(tok, prompts[0].text)
    assert torch.equal(model.generate(**enc, max_new_tokens=NEW, do_sample=False),
                       smol[0].generate(**enc, max_new_tokens=NEW, do_sample=False))


def test_bad_quantization_requests(tmp_path):
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):
        bitsandbytes_config("int3")
    # a checkpoint that is quantized already (here: a tiny model whose config says AWQ) is not quantized again
    folder = tmp_path / "awq-like"
    tiny_llama().save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 64}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="already quantized \\(awq\\); load it as it is \\(no --quantization / "
                                         "quantization='nf4'"):
        hf_spec.load(str(folder), quantization="nf4")


def test_an_offloaded_draft_is_refused(offloaded, smol):
    target, tok = smol
    enc = encode(tok, "Write a python function that reverses a string.")
    with pytest.raises(ValueError, match="draft model is partly offloaded"):
        target.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=hf_spec.DraftModelDrafter(offloaded[0], 3),
                        max_new_tokens=4, do_sample=False)
