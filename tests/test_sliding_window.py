"""Targets (and drafts) with sliding-window attention (Mistral here; Gemma 2/3, Phi-3 and Qwen2 with
``use_sliding_window`` use the same cache layer): exact while the cache stays within the window, refused
clearly before any work past it (before, the first rollback past the window crashed inside transformers:
"crop was called, but the current layer does not track past states")."""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

import hf_spec

from .test_medusa import random_heads

PROMPT = torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]])


def tiny_mistral(window: int, seed: int = 0, noise: float = 0.0):
    torch.manual_seed(seed)
    model = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
                                             bos_token_id=0, eos_token_id=None, pad_token_id=1)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * torch.randn_like(p))
    return model


def drafters(draft, target, k):
    return [hf_spec.NgramDrafter(k), hf_spec.DraftModelDrafter(draft, k),
            hf_spec.MedusaDrafter(random_heads(n=3, seed=1).bind(target), min(k, 3))]


def test_exact_within_the_window_single_and_batched():
    target = tiny_mistral(64)
    draft = tiny_mistral(64, noise=0.02)
    ids = torch.tensor([[1, 1, 1, 1, 0, 5, 9, 5, 9, 5, 3], [0, 7, 3, 7, 3, 7, 3, 7, 3, 7, 3], [1, 1, 1, 1, 1, 1, 1, 1, 0, 4, 4]])
    mask = (torch.arange(ids.shape[1])[None] >= (ids == 1).sum(1, keepdim=True)).long()
    for inputs in (dict(input_ids=PROMPT), dict(input_ids=ids, attention_mask=mask)):
        ref = target.generate(**inputs, max_new_tokens=30, do_sample=False)
        for k in (1, 3):
            for drafter in drafters(draft, target, k):
                out = target.generate(**inputs, max_new_tokens=30, do_sample=False, custom_generate=hf_spec.generate,
                                      drafter=drafter)
                assert out.sequences.tolist() == ref.tolist(), (drafter.method, k)


def test_past_the_window_is_refused_before_any_work_and_plain_decoding_still_runs():
    target = tiny_mistral(16)
    for drafter in drafters(tiny_mistral(64, noise=0.02), target, 3):
        seen = []
        with pytest.raises(ValueError, match="sliding window of 16 tokens and this call needs 41"):
            target.generate(PROMPT, max_new_tokens=30, do_sample=False, custom_generate=hf_spec.generate,
                            drafter=drafter, event_listeners=[seen.append])
        assert seen == []  # nothing ran
    # a draft with a sliding window is checked the same way
    with pytest.raises(ValueError, match="draft model attends within a sliding window of 16"):
        tiny_mistral(64).generate(PROMPT, max_new_tokens=30, do_sample=False, custom_generate=hf_spec.generate,
                                  drafter=hf_spec.DraftModelDrafter(tiny_mistral(16), 3))
    ref = target.generate(PROMPT, max_new_tokens=30, do_sample=False)
    out = target.generate(PROMPT, max_new_tokens=30, do_sample=False, custom_generate=hf_spec.generate, drafter=None)
    assert out.sequences.tolist() == ref.tolist()
