"""Images in hf-spec's loop: a multimodal target's image goes into the prompt's forward, as ``generate`` feeds its
prefill, and the call decodes as plain ``generate`` does with the image. Three families, each with what its image
changes besides the embeddings: LLaVA (nothing else), Gemma 3 (bidirectional attention among an image's tokens, from
the model's own masks and ``token_type_ids``, and sliding-window layers) and Qwen2-VL (multimodal RoPE: the tokens
after an image sit at positions offset by the image's deltas). Tiny random models; greedy logits compared with plain
``generate``'s, so a mask or a position that is off shows even where the argmax survives it."""
import copy

import pytest
import torch

import hf_spec
from hf_spec.loop import PREFILL_MODEL_INPUTS, unread_model_inputs

IMAGE = 29  # the image placeholder token of every model below


def _llava():
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    text = LlamaConfig(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, bos_token_id=0, eos_token_id=None, pad_token_id=1)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=16, patch_size=4, projection_dim=32)
    model = LlavaForConditionalGeneration(LlavaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE,
                                                      vision_feature_layer=-1,
                                                      vision_feature_select_strategy="default"))
    ids = [[0, 5, 6] + [IMAGE] * 16 + [7, 8, 9, 10, 5, 6, 7], [0, 9] + [IMAGE] * 16 + [8, 8, 11, 5]]
    return model, ids, lambda: torch.randn(2, 3, 16, 16), text


def _gemma3():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    text = Gemma3TextConfig(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=6,
                            layer_types=["sliding_attention", "full_attention"], bos_token_id=2, eos_token_id=None,
                            pad_token_id=0)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=16, patch_size=4)
    model = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                                        image_token_index=IMAGE, boi_token_index=27,
                                                        eoi_token_index=28))
    ids = [[2, 5, 6, 27] + [IMAGE] * 4 + [28, 7, 8, 9, 10, 5, 6, 7], [2, 9, 27] + [IMAGE] * 4 + [28, 8, 11, 5]]
    return model, ids, lambda: torch.randn(2, 3, 16, 16), text


def _qwen2_vl():
    from transformers import Qwen2Config, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=None, pad_token_id=1,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    model = Qwen2VLForConditionalGeneration(Qwen2VLConfig(
        text_config=text, image_token_id=IMAGE, video_token_id=31, vision_start_token_id=32, vision_end_token_id=33,
        vision_config=dict(depth=1, embed_dim=16, hidden_size=64, num_heads=2, patch_size=2, spatial_merge_size=1,
                           temporal_patch_size=1, in_chans=3)))
    # images of 2 x 4, 4 x 4 and 1 x 4 patches: 8, 16 and 4 tokens, whose positions take 4, 4 and 4 (deltas -4, -12
    # and 0: the tokens after the last image need no offset, its own tokens still sit at their grid's positions)
    ids = [[0, 32] + [IMAGE] * 8 + [33, 7, 11, 5, 9, 5, 9, 7], [0, 5, 32] + [IMAGE] * 16 + [33, 8, 8, 11],
           [0, 5, 32] + [IMAGE] * 4 + [33, 7, 11, 5, 9]]
    grids = [[1, 2, 4], [1, 4, 4], [1, 1, 4]]
    return model, ids, grids, Qwen2Config(**{k: v for k, v in text.items() if k != "rope_scaling"})


FAMILIES = {"llava": _llava, "gemma3": _gemma3, "qwen2_vl": _qwen2_vl}


def _build(name, rows):
    """The family's model, a text draft with its vocabulary, and ``rows`` of its prompts as generate's inputs
    (left-padded, with the images of those rows)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model, ids, images, text_config = FAMILIES[name]()
    model.eval()
    draft = AutoModelForCausalLM.from_config(copy.deepcopy(text_config)).eval()
    prompts = [ids[r] for r in rows]
    width = max(map(len, prompts))
    pad = model.config.get_text_config().pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    inputs = dict(input_ids=input_ids, attention_mask=(torch.arange(width)[None] >= torch.tensor(
        [width - len(p) for p in prompts])[:, None]).long())
    if name == "qwen2_vl":
        patches = [images[r][1] * images[r][2] for r in rows]
        inputs.update(pixel_values=torch.randn(sum(patches), 12), image_grid_thw=torch.tensor([images[r] for r in rows]),
                      mm_token_type_ids=(input_ids == IMAGE).long())
    else:
        inputs["pixel_values"] = images()[list(rows)]
        if name == "gemma3":
            inputs["token_type_ids"] = (input_ids == IMAGE).long()
    return model, draft, inputs


KW = dict(max_new_tokens=10, do_sample=False, return_dict_in_generate=True, output_logits=True)


@pytest.fixture(autouse=True)
def _no_window_slack(monkeypatch):
    """Gemma 3's window layers (W = 6) drop the slots past the window inside the image's prompt forward too."""
    monkeypatch.setattr(hf_spec.ragged, "WINDOW_SLACK", 0)


def _check_as_plain(out, plain) -> None:
    assert torch.equal(out.sequences, plain.sequences)
    assert torch.allclose(torch.stack(out.logits), torch.stack(plain.logits), atol=1e-4)


@pytest.mark.parametrize("name", sorted(FAMILIES))
@pytest.mark.parametrize("rows", [(0,), (0, 1)], ids=["one row", "left-padded batch"])
def test_an_image_call_decodes_as_plain_generate_with_the_image(name, rows):
    """Chains from prompt lookup and a draft model, and a suffix tree: the image's call gives plain generate's tokens
    and logits, which differ from the call without the image."""
    model, draft, inputs = _build(name, rows)
    plain = model.generate(**inputs, **KW, pad_token_id=0)
    text_only = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask")}
    assert not torch.allclose(torch.stack(model.generate(**text_only, **KW, pad_token_id=0).logits),
                              torch.stack(plain.logits), atol=1e-4)  # the image matters
    for drafter, tree in ((hf_spec.NgramDrafter(2), None), (hf_spec.DraftModelDrafter(draft), None),
                          (hf_spec.SuffixDrafter(), 5)):
        out = model.generate(**inputs, **KW, pad_token_id=0, custom_generate=hf_spec.generate, drafter=drafter,
                             num_speculative_tokens=3, num_tree_nodes=tree)
        _check_as_plain(out, plain)
        assert out.stats.num_draft_tokens > 0


def test_an_image_whose_tokens_after_it_need_no_position_offset_still_sits_at_its_grid_positions():
    """Qwen2-VL with a 1 x 4 image (delta 0): the prompt's forward takes generate's 3D positions (the loop had
    counted the image's tokens as text, as it does where no delta offsets later tokens)."""
    model, _, inputs = _build("qwen2_vl", (2,))
    plain = model.generate(**inputs, **KW)
    _check_as_plain(model.generate(**inputs, **KW, custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(2),
                                   num_speculative_tokens=3), plain)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_enable_drafters_runs_an_image_call_on_hf_spec_loop(name):
    """After enable_drafters, an image call with transformers' assistant settings runs on hf-spec's loop (it had
    gone to transformers' own assisted generation): its output carries hf-spec's statistics."""
    model, draft, inputs = _build(name, (0,))
    plain = model.generate(**inputs, **KW)
    enabled = hf_spec.enable_drafters(model)
    try:
        for assistant in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=draft)):
            out = enabled.generate(**inputs, **KW, **assistant)
            _check_as_plain(out, plain)
            assert out.stats.num_draft_tokens > 0
    finally:
        hf_spec.disable_drafters(model)


def test_a_conversation_after_an_image_continues_from_its_cache_at_the_image_offset_positions():
    """Qwen2-VL: the second turn continues from the cache the image turn returned; its positions keep the image's
    deltas, as generate's do (the loop had refused such a call)."""
    model, _, inputs = _build("qwen2_vl", (1,))
    kw = dict(max_new_tokens=8, do_sample=False, return_dict_in_generate=True)
    first = model.generate(**inputs, **kw, custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(2),
                           num_speculative_tokens=3)
    plain_first = model.generate(**inputs, **kw)
    assert torch.equal(first.sequences, plain_first.sequences)
    more = torch.cat([first.sequences, torch.tensor([[4, 6, 8, 4, 6]])], 1)
    types = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(more[:, inputs["input_ids"].shape[1]:])], 1)
    plain = model.generate(more, mm_token_type_ids=types, cache=plain_first.cache, output_logits=True, **kw)
    out = model.generate(more, mm_token_type_ids=types, cache=first.cache, output_logits=True, **kw,
                         custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(2), num_speculative_tokens=3)
    _check_as_plain(out, plain)


def test_inputs_read_at_every_step_are_refused_and_media_are_not():
    """Media go into the prompt's forward (transformers' list of prefill-only inputs, and the grids that place
    them); an input a model reads at every step (Mllama's cross_attention_mask) is still refused by name."""
    assert "pixel_values" in PREFILL_MODEL_INPUTS and "mm_encoder_outputs" in PREFILL_MODEL_INPUTS
    media = dict(pixel_values=torch.ones(1), mm_encoder_outputs={"image": torch.ones(1)},
                 image_grid_thw=torch.ones(1, 3), mm_token_type_ids=torch.ones(1, 2, dtype=torch.long))
    assert unread_model_inputs(media) == []
    assert unread_model_inputs({**media, "cross_attention_mask": torch.ones(1, 2)}) == ["cross_attention_mask"]


def test_audio_goes_into_the_prompt_forward_with_its_feature_mask():
    """Qwen2-Audio reads its feature_attention_mask with its input_features only, in the prompt's forward: a left-padded
    batch whose second clip is shorter (masked) decodes as plain generate (the mask had been refused as an input read
    at every step)."""
    from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration, Qwen2Config

    torch.manual_seed(0)
    text = Qwen2Config(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, bos_token_id=0, eos_token_id=None, pad_token_id=1)
    model = Qwen2AudioForConditionalGeneration(Qwen2AudioConfig(
        text_config=text.to_dict(), audio_token_index=IMAGE,
        audio_config=dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                          max_source_positions=16))).eval()
    features, mask = torch.randn(2, 16, 32), torch.ones(2, 32, dtype=torch.long)
    features[1, :, 24:], mask[1, 24:] = 0, 0  # 32 frames pooled to 8 audio tokens, 24 to 6
    prompts = [[0, 5, 31] + [IMAGE] * 8 + [32, 7, 8, 9, 10, 5, 6, 7], [0, 9, 7, 31] + [IMAGE] * 6 + [32, 8, 11, 5]]
    width = max(map(len, prompts))
    ids = torch.tensor([[1] * (width - len(p)) + p for p in prompts])
    inputs = dict(input_ids=ids, attention_mask=(ids != 1).long(), input_features=features,
                  feature_attention_mask=mask)
    plain = model.generate(**inputs, **KW)
    for drafter, tree in ((hf_spec.NgramDrafter(2), None), (hf_spec.SuffixDrafter(), 5)):
        _check_as_plain(model.generate(**inputs, **KW, custom_generate=hf_spec.generate, drafter=drafter,
                                       num_speculative_tokens=3, num_tree_nodes=tree), plain)
