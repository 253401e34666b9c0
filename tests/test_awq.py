"""An AWQ-INT4 target (SmolLM2-135M quantized by ``hf-spec quantize`` on the CPU, cached under
``$HF_SPEC_CACHE/awq/``) with the n-gram drafter, a bfloat16 draft and the AWQ model drafting for itself.

On the CPU, gptqmodel runs AWQ layers with ``TorchAtenAwqLinear``: PyTorch's int4-packed matmul, which is
row-consistent itself, between a cast of the input to bfloat16 and of the output back, whatever the model's
dtype. A float32 rounding difference elsewhere in a verify forward that crosses a bfloat16 rounding boundary
becomes a bfloat16 step: the largest logit difference between one 4-position forward and four 1-position
forwards was 0.33 in "float32" compute (0.69 in bfloat16) on SmolLM2, against 5e-5 for float32 and 6e-5 for
NF4 (``test_quantized.py``). So a verify forward can round a near-tie the other way than plain decoding does. The tests check what holds: every
output that differs from the AWQ model's own greedy ``generate`` differs first at a near-tie, with a top-2
logit gap under AWQ_TIE_BOUND, and they print how many differ (run with -s)."""

import copy
import json

import pytest
import torch
from transformers import GenerationConfig

import hf_spec
from hf_spec.kernels import NEAR_TIE_BOUNDS
from hf_spec.models import cache_dir, provision

from .conftest import check_greedy_identical, verify_vs_decode

pytestmark = pytest.mark.slow
#: gptqmodel's CPU AWQ layers (bfloat16 inside): verify-vs-decode differences measured 0.33 ("float32") / 0.69
#: (bfloat16) logits
AWQ_TIE_BOUND = NEAR_TIE_BOUNDS["awq"]
NEW = 24
KS = [1, 3, 5]


@pytest.fixture(scope="module")
def awq_path():
    """The AWQ-INT4 SmolLM2 (group size 64, 16 short calibration texts), made once per cache."""
    from hf_spec.quantize import quantize_awq  # without gptqmodel: ImportError naming the extra to install

    path = cache_dir() / "awq" / "smollm2-135m-g64"
    if not (path / "hf_spec_quantize.json").is_file():
        quantize_awq("smollm2-135m", path, group_size=64, num_texts=16, max_chars=600)
    return path


@pytest.fixture(scope="module")
def prompts(specbench_prompts):
    return specbench_prompts[::6]  # 4 prompts of 4 categories (CI time)


def test_awq_checkpoint(awq_path):
    config = json.loads((awq_path / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "awq"
    assert config["quantization_config"]["bits"] == 4 and config["quantization_config"]["group_size"] == 64
    report = json.loads((awq_path / "hf_spec_quantize.json").read_text())
    assert report["method"] == "awq" and report["num_texts"] == 16
    # generate() on the checkpoint decodes as on its source: greedy (gptqmodel's own generation config said
    # do_sample=True, and plain generate sampled; an AWQ cache made before the fix fails here: delete it)
    source = GenerationConfig.from_pretrained(provision("smollm2-135m"))
    made = GenerationConfig.from_pretrained(awq_path)
    assert not made.do_sample, f"{awq_path} samples by default"
    assert all(getattr(made, key) == getattr(source, key) for key in ("do_sample", "temperature", "top_p", "top_k"))


def test_awq_verify_forward_stays_near_one_token_forwards(awq_path, prompts):
    """The AWQ int4 kernel over 4 positions against 4 one-position forwards (float32 compute): not the same
    rounding, but within AWQ_TIE_BOUND (a wrong row or a wrong position would be off by far more)."""
    model, tok = hf_spec.load(str(awq_path), dtype=torch.float32)
    worst, flips, count = verify_vs_decode(model, tok, prompts)
    print(f"\nawq: largest |logit difference| {worst:.2e}, greedy choice differs at {flips} of {count} positions")
    assert worst < AWQ_TIE_BOUND, (worst, flips)


@pytest.mark.parametrize("drafter", ["ngram", "draft-bf16", "draft-awq"])
def test_awq_target_in_float32_diverges_only_at_near_ties(awq_path, smol, prompts, drafter):
    model, tok = hf_spec.load(str(awq_path), dtype=torch.float32)
    if drafter == "ngram":
        make = hf_spec.NgramDrafter
    else:
        draft = copy.deepcopy(smol[0]).to(torch.bfloat16) if drafter == "draft-bf16" else model
        make = lambda k: hf_spec.DraftModelDrafter(draft, k)  # noqa: E731
    runs, gaps = check_greedy_identical(model, tok, prompts, make, f"awq/{drafter}", NEW, KS, AWQ_TIE_BOUND,
                                        max_ties=len(prompts))
    print(f"\nAWQ SmolLM2, float32 compute, {drafter}: {len(gaps)} of {runs} outputs differ from plain greedy, "
          f"all first at near-ties (top-2 gaps {[round(g, 3) for g in gaps]})")


def test_awq_target_in_bfloat16_diverges_only_at_near_ties(awq_path, prompts):
    model, tok = hf_spec.load(str(awq_path), dtype=torch.bfloat16)
    runs, gaps = check_greedy_identical(model, tok, prompts, hf_spec.NgramDrafter, "awq-bf16/ngram", NEW, KS,
                                        AWQ_TIE_BOUND, max_ties=len(prompts))
    print(f"\nAWQ SmolLM2, bfloat16 compute, n-gram: {len(gaps)} of {runs} outputs diverge from plain greedy, "
          f"all at near-ties (top-2 gaps {[round(g, 3) for g in gaps]})")
