"""hf-spec behaves like ``generate`` for code written around it: return types, ``scores`` / ``logits``, streamers,
transformers' own assisted-generation settings after ``enable_drafters``, the Hub ``custom_generate`` folder and
``pipeline("text-generation")``. Tiny random models; a tokenizer only where text is needed."""

from __future__ import annotations

import copy
import io
import pickle
import queue
import threading
from pathlib import Path

import pytest
import torch
from transformers import (GenerationConfig, LlamaConfig, LlamaForCausalLM, LogitsProcessorList, StoppingCriteria,
                          StoppingCriteriaList, TemperatureLogitsWarper, TextIteratorStreamer, TopKLogitsWarper,
                          TopPLogitsWarper)
from transformers.generation.utils import GenerateDecoderOnlyOutput

import hf_spec

from .conftest import tiny_llama, tiny_pair

PROMPT = torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]])
BATCH = torch.tensor([[1, 1, 1, 0, 5, 9, 5, 9], [0, 4, 8, 12, 4, 8, 12, 4], [1, 1, 0, 7, 7, 3, 7, 7]])
BATCH_MASK = (torch.arange(8)[None, :] >= torch.tensor([[3], [0], [2]])).long()
HUB = Path(__file__).resolve().parents[1] / "hub"


@pytest.fixture(scope="module")
def tiny():
    return tiny_pair()


@pytest.fixture(scope="module")
def text_pair(tokenizer):
    """A tiny target and a perturbed copy as draft, with SmolLM2's vocabulary (for text in, text out)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    target = LlamaForCausalLM(cfg).eval()
    draft = LlamaForCausalLM(cfg).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.01 * torch.randn_like(p))
    for m in (target, draft):
        m.generation_config.pad_token_id = tokenizer.pad_token_id
        m.generation_config.eos_token_id = tokenizer.eos_token_id
    return target, draft


def _entry_points(target, drafter):
    """The two ways in: ``custom_generate=hf_spec.generate`` and ``assistant_model=`` after ``enable_drafters``."""
    enabled = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))  # a copy: the fixture stays plain
    return {
        "custom_generate": lambda ids, **kw: target.generate(ids, custom_generate=hf_spec.generate, drafter=drafter, **kw),
        "assistant_model": lambda ids, **kw: enabled.generate(ids, assistant_model=drafter, **kw),
    }


# ---- return types and scores -----------------------------------------------------------------------

@pytest.mark.parametrize("entry", ["custom_generate", "assistant_model"])
def test_return_types_are_generate_s(tiny, entry):
    target, draft = tiny
    run = _entry_points(target, hf_spec.DraftModelDrafter(draft, 3))[entry]
    plain = target.generate(PROMPT, max_new_tokens=10, do_sample=False)
    out = run(PROMPT, max_new_tokens=10, do_sample=False)
    assert type(out) is torch.Tensor and torch.equal(out, plain)
    out = run(PROMPT, max_new_tokens=10, do_sample=False, return_dict_in_generate=True)
    assert isinstance(out, GenerateDecoderOnlyOutput) and torch.equal(out.sequences, plain)
    assert out.scores is None and out.logits is None  # not asked for
    assert out.stats.num_emitted_tokens == 10 and out.stats.num_draft_tokens > 0
    # a model whose generation config asks for the dict gets it without the argument, as generate does
    config = GenerationConfig.from_dict({**target.generation_config.to_dict(), "return_dict_in_generate": True})
    assert isinstance(run(PROMPT, max_new_tokens=4, generation_config=config), GenerateDecoderOnlyOutput)


@pytest.mark.parametrize("entry", ["custom_generate", "assistant_model"])
@pytest.mark.parametrize("kind", ["draft", "ngram"])
def test_greedy_scores_and_logits_equal_plain_generate(tiny, entry, kind):
    """One [B, V] entry per generated position, equal (float rounding) to plain decoding's, in a left-padded
    batch whose rows end at different steps; past a row's end, the pad token's one-hot log-probabilities."""
    target, draft = tiny
    drafter = hf_spec.DraftModelDrafter(draft, 3) if kind == "draft" else hf_spec.NgramDrafter(3)
    run = _entry_points(target, drafter)[entry]
    kw = dict(max_new_tokens=14, do_sample=False, return_dict_in_generate=True, output_scores=True, output_logits=True,
              repetition_penalty=1.3)
    for ids, mask in ((PROMPT, None), (BATCH, BATCH_MASK)):
        extra = {} if mask is None else {"attention_mask": mask}
        plain = target.generate(ids, **kw, **extra)
        out = run(ids, **kw, **extra)
        assert torch.equal(out.sequences, plain.sequences)
        assert len(out.scores) == len(out.logits) == out.sequences.shape[1] - ids.shape[1]
        eos = target.generation_config.eos_token_id
        for b in range(ids.shape[0]):
            new = out.sequences[b, ids.shape[1]:].tolist()
            n = hf_spec.loop.generated_length(new, eos)
            for t in range(n):
                torch.testing.assert_close(out.scores[t][b], plain.scores[t][b], rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(out.logits[t][b], plain.logits[t][b], rtol=1e-4, atol=1e-4)
                assert int(out.scores[t][b].argmax()) == new[t]
            for t in range(n, len(out.scores)):
                assert int(out.scores[t][b].argmax()) == new[t] and float(out.scores[t][b].exp().sum()) == 1.0
        if mask is not None:  # the batch must exercise rows that ended early
            assert any(hf_spec.loop.generated_length(out.sequences[b, ids.shape[1]:].tolist(), eos)
                       < len(out.scores) for b in range(ids.shape[0]))


@pytest.mark.parametrize("entry", ["custom_generate", "assistant_model"])
def test_sampled_scores_are_what_plain_decoding_reports_for_the_sampled_sequence(tiny, entry):
    """Under sampling the tokens differ from plain generate's (another random stream), so the reference is plain
    decoding's definition: the target's logits after each prefix, processed by the same warpers."""
    target, draft = tiny
    run = _entry_points(target, hf_spec.DraftModelDrafter(draft, 3))[entry]
    torch.manual_seed(3)
    out = run(PROMPT, max_new_tokens=12, do_sample=True, temperature=0.7, top_k=20, top_p=0.8,
              return_dict_in_generate=True, output_scores=True, output_logits=True)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8)])
    seq = out.sequences
    with torch.no_grad():
        logits = target(seq).logits[0].float()
    start = PROMPT.shape[1]
    for t in range(seq.shape[1] - start):
        raw = logits[start + t - 1]
        torch.testing.assert_close(out.logits[t][0], raw, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.scores[t][0], warpers(seq[:, : start + t], raw[None].clone())[0],
                                   rtol=1e-4, atol=1e-4)
        assert torch.isfinite(out.scores[t][0][seq[0, start + t]])  # the sampled token was allowed


def test_attentions_and_hidden_states_are_refused_clearly(tiny):
    target, _ = tiny
    for flag in ("output_attentions", "output_hidden_states"):
        with pytest.raises(ValueError, match="output_scores"):
            target.generate(PROMPT, max_new_tokens=3, custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(2),
                            return_dict_in_generate=True, **{flag: True})


# ---- streamers ---------------------------------------------------------------------------------------

def _streamed(tokenizer, call, error=None):
    """Run ``call(streamer)`` while another thread reads a ``TextIteratorStreamer`` as a consumer would; with
    ``error``, the call must raise it. Asserts the consumer finished (the streamer was ended, never a timeout).
    Returns ``(what call returned, the text the consumer got)``."""
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=60)
    chunks: list = []

    def consume():
        try:
            chunks.extend(streamer)
        except queue.Empty:  # the streamer's timeout: generation never ended it
            chunks.append(None)

    consumer = threading.Thread(target=consume)
    consumer.start()
    if error is None:
        result = call(streamer)
    else:
        with pytest.raises(error):
            call(streamer)
        result = None
    consumer.join(timeout=120)
    assert not consumer.is_alive() and None not in chunks, "the streamer was never ended"
    return result, "".join(chunks)


@pytest.mark.parametrize("entry", ["custom_generate", "assistant_model"])
def test_text_iterator_streamer_consumer_finishes(text_pair, tokenizer, entry):
    """``streamer=`` on both entry points: the consumer gets exactly the new text and then the end (before, with
    custom_generate it got the prompt and waited forever)."""
    target, draft = text_pair
    run = _entry_points(target, hf_spec.DraftModelDrafter(draft, 3))[entry]
    ids = tokenizer("The quick brown fox", return_tensors="pt").input_ids
    out, text = _streamed(tokenizer, lambda s: run(ids, max_new_tokens=12, do_sample=False, streamer=s))
    assert text == tokenizer.decode(out[0, ids.shape[1]:])


# ---- transformers' own assisted-generation calls, after enable_drafters ---------------------------------

def test_transformers_assisted_calls_run_on_hf_spec_after_enable(tiny, monkeypatch):
    """Existing ``assistant_model=`` / ``prompt_lookup_num_tokens=`` code runs hf-spec's loop with the matching
    drafter and k (seen in which drafter drafted, and in the stats transformers' loop does not return), with
    identical greedy output; ``disable_drafters`` gives transformers' loop back."""
    target, draft = tiny
    drafted = []
    for cls in (hf_spec.DraftModelDrafter, hf_spec.NgramDrafter):
        monkeypatch.setattr(cls, "draft", lambda self, rows, k, _f=cls.draft: drafted.append(type(self)) or _f(self, rows, k))
    model = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    kw = dict(max_new_tokens=16, do_sample=False, return_dict_in_generate=True)

    def check(out, cls, k):
        assert torch.equal(out.sequences, plain) and set(drafted) == {cls} and max(out.stats.k_per_step) == k
        drafted.clear()

    check(model.generate(PROMPT, assistant_model=draft, num_assistant_tokens=4, **kw), hf_spec.DraftModelDrafter, 4)
    # settings transformers reads only for a draft with another tokenizer: dropped as it drops them (the loop's
    # refusal of assisted-generation settings in a custom_generate call raised here)
    check(model.generate(PROMPT, assistant_model=draft, num_assistant_tokens=4, assistant_lookbehind=5,
                         target_lookbehind=5, **kw), hf_spec.DraftModelDrafter, 4)
    check(model.generate(PROMPT, prompt_lookup_num_tokens=5, max_matching_ngram_size=1, **kw), hf_spec.NgramDrafter, 5)
    # from the generation config, as transformers reads them
    config = GenerationConfig.from_dict({**target.generation_config.to_dict(), "prompt_lookup_num_tokens": 2})
    check(model.generate(PROMPT, generation_config=config, **kw), hf_spec.NgramDrafter, 2)
    out = model.generate(PROMPT, assistant_model=draft, num_assistant_tokens_schedule="heuristic", **kw)
    assert out.stats.policy_events  # hf-spec's adaptive k ran; whether it drafted depends on this machine's timings
    assert torch.equal(out.sequences, plain) and set(drafted) <= {hf_spec.DraftModelDrafter}
    drafted.clear()
    # both: prompt lookup, as transformers' generate does (it never uses the assistant then)
    check(model.generate(PROMPT, assistant_model=draft, prompt_lookup_num_tokens=3, **kw), hf_spec.NgramDrafter, 3)
    # a generation config passed positionally is read too; an hf-spec drafter takes num_assistant_tokens as k
    check(model.generate(PROMPT, config, **kw), hf_spec.NgramDrafter, 2)
    check(model.generate(PROMPT, assistant_model=hf_spec.DraftModelDrafter(draft), num_assistant_tokens=5, **kw),
          hf_spec.DraftModelDrafter, 5)

    # transformers' confidence stop: the draft model drafter's confidence_threshold, from the call or the config
    thresholds = []
    wrapped = hf_spec.DraftModelDrafter.draft
    monkeypatch.setattr(hf_spec.DraftModelDrafter, "draft",
                        lambda self, rows, k: thresholds.append(self.confidence_threshold) or wrapped(self, rows, k))
    check(model.generate(PROMPT, assistant_model=draft, num_assistant_tokens=4, assistant_confidence_threshold=0.7,
                         **kw), hf_spec.DraftModelDrafter, 4)
    assert set(thresholds) == {0.7}
    thresholds.clear()
    config = GenerationConfig.from_dict({**target.generation_config.to_dict(), "assistant_confidence_threshold": 0.2})
    # no num_assistant_tokens: the draft model's own k, 6 with a stop (3 without, as in this module's other calls)
    check(model.generate(PROMPT, assistant_model=draft, generation_config=config, **kw), hf_spec.DraftModelDrafter, 6)
    assert set(thresholds) == {0.2}

    # a bad setting is named as the call gave it (it was blamed on num_speculative_tokens, which it never passed)
    # (for an assistant, unset is its default k: no speculation is no assistant)
    for bad, advice in (({"prompt_lookup_num_tokens": 0}, "leave it unset"),
                        ({"assistant_model": draft, "num_assistant_tokens": 0}, "drop assistant_model=")):
        with pytest.raises(ValueError, match=f"{[key for key in bad if key != 'assistant_model'][0]} must be an "
                                             f"integer >= 1, got 0.*{advice}"):
            model.generate(PROMPT, **bad, **kw)

    # set permanently on the model, as transformers reads it too
    model.generation_config.prompt_lookup_num_tokens = 4
    check(model.generate(PROMPT, **kw), hf_spec.NgramDrafter, 4)
    model.generation_config.prompt_lookup_num_tokens = None

    hf_spec.disable_drafters(model)
    back = model.generate(PROMPT, prompt_lookup_num_tokens=5, **kw)
    assert torch.equal(back.sequences, plain) and not hasattr(back, "stats") and not drafted  # transformers' own
    assert hf_spec.disable_drafters(model) is model  # a second call changes nothing


def test_enable_drafters_on_a_torch_compiled_model(tiny):
    """A torch.compile'd model (an OptimizedModule, whose class has no generate) had failed every call after
    enable_drafters with an AttributeError; now its assisted calls run hf-spec's loop and the rest transformers'."""
    target, draft = tiny
    compiled = hf_spec.enable_drafters(torch.compile(pickle.loads(pickle.dumps(target))))
    kw = dict(max_new_tokens=12, do_sample=False)
    plain = target.generate(PROMPT, **kw)
    out = compiled.generate(PROMPT, assistant_model=draft, return_dict_in_generate=True, **kw)
    assert torch.equal(out.sequences, plain) and out.stats is not None  # hf-spec's loop: its statistics
    assert torch.equal(compiled.generate(PROMPT, **kw), plain)
    shallow = hf_spec.enable_drafters(copy.copy(compiled._orig_mod))  # it shared the original's bound generate
    shallow.generation_config = GenerationConfig(max_new_tokens=3, do_sample=False)
    assert shallow.generate(PROMPT, prompt_lookup_num_tokens=2).shape[1] == PROMPT.shape[1] + 3  # the copy's config
    for copied in (copy.deepcopy(compiled), pickle.loads(pickle.dumps(compiled))):  # both had failed ('training')
        assert torch.equal(copied.generate(PROMPT, **kw), plain)
    out = hf_spec.disable_drafters(compiled).generate(PROMPT, assistant_model=draft, return_dict_in_generate=True, **kw)
    assert not hasattr(out, "stats")  # undone: transformers' own assisted generation ran (it had stayed hf-spec's)


def test_the_assistants_own_generation_config_sets_k_and_the_confidence_stop(tiny, monkeypatch):
    """transformers 5 reads num_assistant_tokens and assistant_confidence_threshold from the assistant model's own
    generation config; enable_drafters ignored it there (a break-it tester's calls drafted 6 where the draft's config
    said 2). The draft's config now counts, below the call's own settings."""
    target, draft = tiny
    draft = pickle.loads(pickle.dumps(draft))
    model = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))
    thresholds = []
    wrapped = hf_spec.DraftModelDrafter.draft
    monkeypatch.setattr(hf_spec.DraftModelDrafter, "draft",
                        lambda self, rows, k: thresholds.append(self.confidence_threshold) or wrapped(self, rows, k))
    draft.generation_config.num_assistant_tokens = 2
    draft.generation_config.assistant_confidence_threshold = 0.0
    kw = dict(max_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    out = model.generate(PROMPT, assistant_model=draft, **kw)
    assert max(out.stats.k_per_step) == 2 and set(thresholds) == {0.0}
    assert torch.equal(out.sequences, target.generate(PROMPT, max_new_tokens=16, do_sample=False))
    thresholds.clear()
    out = model.generate(PROMPT, assistant_model=draft, num_assistant_tokens=4, assistant_confidence_threshold=0.5, **kw)
    assert max(out.stats.k_per_step) == 4 and set(thresholds) == {0.5}  # the call's own win


def test_what_generate_would_not_hand_to_the_loop_is_refused_or_kept(tiny):
    """Found by a break-it tester, each silent before: assisted settings inside a generation_config= passed to
    custom_generate=hf_spec.generate (the keyword was refused, the config's ran without drafting); an offloaded cache
    with a batch (decoded in hf-spec's own cache, which does not offload); after enable_drafters, continuous batching
    (cache_implementation="paged" ran plain, dropping the assistant) and token healing (transformers' misleading
    error about a tokenizer the call passed); an int32 prompt (returned int32, where generate returns int64)."""
    target, draft = tiny
    with pytest.raises(ValueError, match=r"does not read transformers' own assisted-generation settings "
                                         r"\(prompt_lookup_num_tokens\)"):
        target.generate(PROMPT, GenerationConfig(prompt_lookup_num_tokens=3, max_new_tokens=8),
                        custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(3))
    mask = BATCH_MASK
    with pytest.raises(ValueError, match="offloaded.*a batch in a per-row cache"):
        target.generate(BATCH, attention_mask=mask, max_new_tokens=8, do_sample=False, cache_implementation="offloaded",
                        custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(3))
    model = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))
    with pytest.raises(ValueError, match="continuous batching, which runs no assistant"):
        model.generate(PROMPT, assistant_model=draft, max_new_tokens=8, cache_implementation="paged")
    with pytest.raises(ValueError, match=r"heal the prompt first, input_ids = model.heal_tokens"):
        model.generate(PROMPT, assistant_model=draft, max_new_tokens=8, token_healing=True)
    plain = target.generate(PROMPT.int(), max_new_tokens=8, do_sample=False)
    for out in (target.generate(PROMPT.int(), max_new_tokens=8, do_sample=False, custom_generate=hf_spec.generate,
                                drafter=hf_spec.NgramDrafter(3)),
                model.generate(PROMPT.int(), assistant_model=draft, max_new_tokens=8, do_sample=False)):
        assert out.dtype == plain.dtype == torch.long and torch.equal(out, plain)


def test_enable_drafters_reads_settings_as_generate_merges_them(tiny):
    """Found by a second break-it pass: a call's generation_config= hid the model's own generation config from
    enable_drafters (transformers merges the model's values into every unset one), so the model's prompt lookup ran
    transformers' loop instead of hf-spec's, and the model's token_healing got transformers' misleading tokenizer
    error; transformers' lossy assistant_ensemble_weight was dropped without a word on both entry points (a
    lossless output where the caller asked for the ensemble); a draft's own num_assistant_tokens=0 was reported as
    if the call had set it."""
    target, draft = tiny
    kw = dict(max_new_tokens=8, do_sample=False, return_dict_in_generate=True)
    model = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))
    model.generation_config.prompt_lookup_num_tokens = 3
    for config in (None, GenerationConfig(max_new_tokens=8)):  # the model's setting, with and without a call config
        out = model.generate(PROMPT, generation_config=config, **kw)
        assert isinstance(out, hf_spec.SpeculativeOutput) and out.stats.method == "ngram", config  # hf-spec's loop
    model.generation_config.prompt_lookup_num_tokens = None
    model.generation_config.token_healing = True
    with pytest.raises(ValueError, match="heal the prompt first"):
        model.generate(PROMPT, generation_config=GenerationConfig(max_new_tokens=8), assistant_model=draft)
    model.generation_config.token_healing = False
    # the ensemble: transformers' own assisted generation runs it (what the caller asked by name, lossy) ...
    ensemble = dict(assistant_model=draft, assistant_ensemble_weight=0.5, **kw)
    theirs = target.generate(PROMPT, **ensemble)
    out = model.generate(PROMPT, **ensemble)
    assert not isinstance(out, hf_spec.SpeculativeOutput) and torch.equal(out.sequences, theirs.sequences)
    with pytest.raises(ValueError, match="lossy ensemble verification"):  # ... which hf-spec's drafters cannot
        model.generate(PROMPT, **dict(ensemble, assistant_model=hf_spec.NgramDrafter(3)))
    for settings in ({"assistant_ensemble_weight": 0.5},  # refused by custom_generate, keyword or in a config
                     {"generation_config": GenerationConfig(assistant_ensemble_weight=0.5, max_new_tokens=8)}):
        with pytest.raises(ValueError, match=r"settings \(assistant_ensemble_weight\).*lossy ensemble"):
            target.generate(PROMPT, custom_generate=hf_spec.generate, drafter=hf_spec.DraftModelDrafter(draft, 2),
                            **dict(dict(max_new_tokens=8), **settings))
    shy = pickle.loads(pickle.dumps(draft))
    shy.generation_config.num_assistant_tokens = 0
    with pytest.raises(ValueError, match=r"num_assistant_tokens \(in the draft's generation_config\) must be"):
        model.generate(PROMPT, assistant_model=shy, max_new_tokens=8)


def test_the_cache_decoded_in_is_the_callers_or_refused_when_offloaded():
    """An offloaded cache where hf-spec decodes in a cache of its own is refused, for every such case: a batch, and
    (found by a break-it pass) one sequence on a sliding-window model, whose rolled-back cache keeps every slot; a
    draft whose layers hf-spec cannot roll back is named as the draft, with a drafter's advice."""
    from transformers import MistralConfig, MistralForCausalLM

    from .conformance import ARCHITECTURES

    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, sliding_window=4)).eval()
    with pytest.raises(ValueError, match="offloaded.*a sliding-window model in a cache of its own"):
        mistral.generate(PROMPT[:, :6], max_new_tokens=4, do_sample=False, cache_implementation="offloaded",
                         custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(3))
    arch = {a.name: a for a in ARCHITECTURES}
    models = [a.model(a.config()).eval() for a in (arch["Llama"], arch["Llama 4 text (chunked attention)"])]
    with pytest.raises(ValueError, match=r"the draft model has layers of kind chunked_attention.*model-free drafter"):
        models[0].generate(PROMPT, max_new_tokens=4, do_sample=False, custom_generate=hf_spec.generate,
                           drafter=hf_spec.DraftModelDrafter(models[1], 2))


# ---- the Hub custom_generate folder and pipelines ------------------------------------------------------

def test_hub_custom_generate_folder_loads_from_a_path(tiny, text_pair, tokenizer):
    assert "custom_generate" in (HUB / "README.md").read_text().split("---")[1]  # the Hub tag in the card
    target, draft = tiny
    plain = target.generate(PROMPT, max_new_tokens=12, do_sample=False)
    for kw in ({"drafter": hf_spec.DraftModelDrafter(draft, 3)}, {"drafter": "ngram", "num_speculative_tokens": 2},
               {"assistant_model": draft}, {}):
        out = target.generate(PROMPT, custom_generate=str(HUB), trust_remote_code=True, max_new_tokens=12,
                              do_sample=False, return_dict_in_generate=True, **kw)
        assert torch.equal(out.sequences, plain) and isinstance(out, hf_spec.SpeculativeOutput), kw
        if "assistant_model" in kw or isinstance(kw.get("drafter"), hf_spec.DraftModelDrafter):
            assert out.stats.num_draft_tokens > 0, kw
    # "none" is plain decoding, as everywhere else (it was n-gram lookup here), and refuses speculative settings
    out = target.generate(PROMPT, custom_generate=str(HUB), trust_remote_code=True, max_new_tokens=12, do_sample=False,
                          return_dict_in_generate=True, drafter="none")
    assert torch.equal(out.sequences, plain) and not hasattr(out, "stats")  # transformers' own decoding
    with pytest.raises(ValueError, match="drafter='none' decodes without speculation; drop num_speculative_tokens"):
        target.generate(PROMPT, custom_generate=str(HUB), trust_remote_code=True, max_new_tokens=2, drafter="none",
                        num_speculative_tokens=2)
    # streamer= reaches the loop through this path too (transformers passes every argument on)
    target, draft = text_pair
    ids = tokenizer("Once upon a time", return_tensors="pt").input_ids
    seq, text = _streamed(tokenizer, lambda s: target.generate(
        ids, custom_generate=str(HUB), trust_remote_code=True, drafter="ngram", max_new_tokens=8, do_sample=False,
        streamer=s))
    assert text == tokenizer.decode(seq[0, ids.shape[1]:])
    with pytest.raises(ValueError, match="trust_remote_code"):
        target.generate(ids, custom_generate=str(HUB), max_new_tokens=2)


def test_text_generation_pipeline_runs_hf_spec_drafters(text_pair, tokenizer):
    from transformers import pipeline

    target, draft = text_pair
    text = "Speculative decoding verifies drafted tokens"
    kw = dict(max_new_tokens=12, do_sample=False, return_full_text=False)
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)(text, **kw)[0]["generated_text"]
    # 1. custom_generate through the pipeline's generate kwargs
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer)
    stats = hf_spec.SpecStats()
    got = pipe(text, custom_generate=hf_spec.generate, drafter=hf_spec.DraftModelDrafter(draft, 3),
               event_listeners=[stats], **kw)
    assert got[0]["generated_text"] == plain and stats.num_draft_tokens > 0
    # 2. the pipeline's own assistant_model= (a transformers draft model), after enable_drafters
    enabled = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))
    pipe = pipeline("text-generation", model=enabled, tokenizer=tokenizer, assistant_model=draft)
    stats = hf_spec.SpecStats()
    assert pipe(text, event_listeners=[stats], **kw)[0]["generated_text"] == plain and stats.num_draft_tokens > 0


# ---- found by trying to break it: stop strings from the config, early failures, mixed entry points ----------

def test_stop_strings_from_the_generation_config_work_on_every_entry_point(text_pair, tokenizer):
    """transformers drops tokenizer= before a custom loop's stop strings are built; stop strings set in the
    generation config (a model's shipped config, or generation_config=) crashed the second entry point and the Hub
    folder. All forms must stop where plain generate stops."""
    target, draft = text_pair
    ids = tokenizer("The quick brown fox", return_tensors="pt").input_ids
    new = target.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:]
    stop = tokenizer.decode(new[5:7])  # text the greedy continuation reaches after a few tokens
    plain = target.generate(ids, max_new_tokens=24, do_sample=False, stop_strings=[stop], tokenizer=tokenizer)
    assert plain.shape[1] < ids.shape[1] + 24  # the stop string ended it early
    model = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))
    config = GenerationConfig.from_dict({**target.generation_config.to_dict(), "stop_strings": [stop]})
    runs = {
        "call": lambda: model.generate(ids, assistant_model=draft, max_new_tokens=24, do_sample=False,
                                       stop_strings=[stop], tokenizer=tokenizer),
        "generation_config=": lambda: model.generate(ids, generation_config=config, assistant_model=draft,
                                                     max_new_tokens=24, do_sample=False, tokenizer=tokenizer),
        "hub": lambda: target.generate(ids, custom_generate=str(HUB), trust_remote_code=True, drafter="ngram",
                                       generation_config=config, max_new_tokens=24, do_sample=False,
                                       tokenizer=tokenizer),
    }
    for name, run in runs.items():
        assert torch.equal(run(), plain), name
    # set on the model itself (as a shipped generation_config.json would), generate merges them into every call's
    # config and transformers refuses them for any custom loop: a clear error that says how to move them
    model.generation_config.stop_strings = [stop]
    with pytest.raises(ValueError, match="move them to the call"):
        model.generate(ids, prompt_lookup_num_tokens=3, max_new_tokens=24, do_sample=False, tokenizer=tokenizer)


def test_a_streamer_ends_whenever_the_call_fails_before_its_loop(text_pair, tokenizer):
    target, draft = text_pair
    ids = tokenizer("The quick brown fox", return_tensors="pt").input_ids
    model = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))
    failing = [
        (ValueError, lambda s: model.generate(ids, assistant_model=draft, num_assistant_tokens=0, streamer=s)),
        (ValueError, lambda s: model.generate(ids, prompt_lookup_num_tokens=3, stop_strings=["x"], streamer=s)),
        (ValueError, lambda s: target.generate(ids, custom_generate=str(HUB), trust_remote_code=True,
                                               drafter="bogus", streamer=s)),
        (ValueError, lambda s: target.generate(ids, custom_generate=str(HUB), trust_remote_code=True, drafter="ngram",
                                               assistant_model=draft, streamer=s)),
        (TypeError, lambda s: target.generate(ids, custom_generate=str(HUB), trust_remote_code=True, drafter=42,
                                              streamer=s)),
        (ValueError, lambda s: target.generate(ids, custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(),
                                               num_speculative_tokens=0, streamer=s)),
    ]
    for error, call in failing:
        _streamed(tokenizer, call, error)


def test_a_wrapper_around_hf_spec_generate_still_streams(text_pair, tokenizer):
    """A user's own custom_generate function that calls hf_spec.generate: the streamer transformers filled with
    the prompt still gets the tokens and its end."""
    target, _ = text_pair
    ids = tokenizer("Once upon a time", return_tensors="pt").input_ids

    def my_generate(model, input_ids, logits_processor, stopping_criteria, generation_config, **kw):
        return hf_spec.generate(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                drafter=hf_spec.NgramDrafter(2), **kw)

    seq, text = _streamed(tokenizer, lambda s: target.generate(ids, custom_generate=my_generate, max_new_tokens=8,
                                                               do_sample=False, streamer=s))
    assert text == tokenizer.decode(seq[0, ids.shape[1]:])


def test_assistant_model_with_custom_generate_is_a_clear_error(tiny):
    """transformers drops assistant_model= before a custom loop sees it: the call ran without speculation."""
    target, draft = tiny
    enabled = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))
    for model in (target, enabled):
        with pytest.raises(ValueError, match="drafter=hf_spec.DraftModelDrafter"):
            model.generate(PROMPT, custom_generate=hf_spec.generate, assistant_model=draft, max_new_tokens=4)


# ---- what generate hands streamers and stopping criteria, and what it refuses ----------------------------

class _RecordingStreamer:
    """Keeps every ``put`` value as ``generate`` passes it."""

    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ended = True


class _ScoresCriterion(StoppingCriteria):
    """Stops a row once it has ``n`` scores (only where ``generate`` passes them), and records what it got."""

    def __init__(self, n: int):
        self.n, self.seen = n, []

    def __call__(self, input_ids, scores, **kwargs):
        self.seen.append((input_ids.shape[1], None if scores is None else [s.clone() for s in scores]))
        stop = scores is not None and len(scores) >= self.n
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool)


@pytest.mark.parametrize("entry", ["custom_generate", "assistant_model"])
def test_streamers_and_stopping_criteria_get_what_generate_gives_them(tiny, entry):
    """A streamer gets the prompt, then one token per put (shape [1]) even where a step accepted several, and a
    criterion gets the scores so far where output_scores keeps them: one that reads them (a stop after 5 scores)
    stops where plain decoding does (before, the loop put whole runs and passed scores=None, so it never fired)."""
    target, draft = tiny
    run = _entry_points(target, hf_spec.DraftModelDrafter(draft, 3))[entry]
    plain_streamer, streamer = _RecordingStreamer(), _RecordingStreamer()
    plain = target.generate(PROMPT, max_new_tokens=12, do_sample=False, streamer=plain_streamer)
    out = run(PROMPT, max_new_tokens=12, do_sample=False, streamer=streamer)
    assert torch.equal(out, plain) and streamer.ended
    assert [p.shape for p in streamer.puts] == [p.shape for p in plain_streamer.puts]
    assert all(torch.equal(a, b) for a, b in zip(streamer.puts, plain_streamer.puts))
    for kw in (dict(return_dict_in_generate=True, output_scores=True), {}):
        criterion, plain_criterion = _ScoresCriterion(5), _ScoresCriterion(5)
        plain = target.generate(PROMPT, max_new_tokens=12, do_sample=False,
                                stopping_criteria=StoppingCriteriaList([plain_criterion]), **kw)
        out = run(PROMPT, max_new_tokens=12, do_sample=False, stopping_criteria=StoppingCriteriaList([criterion]), **kw)
        sequences = out.sequences if kw else out
        assert torch.equal(sequences, plain.sequences if kw else plain)
        assert sequences.shape[1] - PROMPT.shape[1] == (5 if kw else 12)
        if kw:  # each call: the scores of the tokens so far, the last one the scores that chose the newest token
            for length, scores in criterion.seen:
                assert len(scores) == length - PROMPT.shape[1] and scores[-1].shape == (1, out.scores[0].shape[-1])
                torch.testing.assert_close(scores[-1][0], out.scores[len(scores) - 1][0])
        else:
            assert all(scores is None for _, scores in criterion.seen)


class _WholeBatch(StoppingCriteria):
    """Judges the batch as a whole: one bool (every row ends on ``token``), or per-row budgets indexed by the row's
    place in the batch."""

    def __init__(self, form: str, token: int = 5):
        self.form, self.token = form, token

    def __call__(self, input_ids, scores, **kwargs):
        if self.form == "bool":
            return bool((input_ids[:, -1] == self.token).all())
        if self.form == "0-dim":
            return (input_ids[:, -1] == self.token).all()
        return input_ids.shape[1] - BATCH.shape[1] >= torch.tensor([4, 12, 6])  # budgets by batch position


class _RowWise(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return torch.isin(input_ids[:, -1], torch.tensor([6, 14, 10]))  # each row by its own last token


@pytest.mark.parametrize("entry", ["custom_generate", "assistant_model"])
def test_a_stopping_criterion_that_judges_the_whole_batch_is_refused_and_a_row_wise_one_is_exact(tiny, entry):
    """hf-spec asks the criteria about one row at a time ([1, L]). One that answers for the batch (a bool, a 0-dim
    tensor, values indexed by batch position) silently stopped rows where generate does not (a break-it finding:
    both rows ended at the first row's budget); it is refused, naming it. A row-wise one stops as in generate."""
    target, draft = tiny
    run = _entry_points(target, hf_spec.DraftModelDrafter(draft, 3))[entry]
    for form in ("bool", "0-dim", "budgets"):
        with pytest.raises(ValueError, match=r"_WholeBatch returned .* one row of a batch of 3.*BoolTensor of shape \[1\]"):
            run(BATCH, attention_mask=BATCH_MASK, max_new_tokens=12, do_sample=False,
                stopping_criteria=StoppingCriteriaList([_WholeBatch(form)]))
    kw = dict(attention_mask=BATCH_MASK, max_new_tokens=12, do_sample=False)
    plain = target.generate(BATCH, stopping_criteria=StoppingCriteriaList([_RowWise()]), **kw)
    assert plain.shape[1] < BATCH.shape[1] + 12 and (plain[:, -1] == target.generation_config.pad_token_id).any()
    assert torch.equal(run(BATCH, stopping_criteria=StoppingCriteriaList([_RowWise()]), **kw), plain)
    # one sequence: the batch is its row, so whole-batch answers mean what they mean in generate
    single = dict(max_new_tokens=12, do_sample=False, stopping_criteria=StoppingCriteriaList([_WholeBatch("bool", 9)]))
    assert torch.equal(run(PROMPT, **single), target.generate(PROMPT, **single))


def test_other_decoding_algorithms_and_transformers_assisted_settings_are_refused(tiny):
    """What the loop would otherwise ignore without a word (it ran greedy decoding): contrastive search, DoLa,
    beam search, and transformers' own assisted-generation settings on the custom_generate entry point."""
    target, _ = tiny
    cases = {"contrastive search": dict(penalty_alpha=0.6, top_k=4), "DoLa": dict(dola_layers="high"),
             "beam search": dict(num_beams=2), "assisted-generation settings": dict(prompt_lookup_num_tokens=3)}
    cases.update({f"assisted-generation settings \\({key}\\)": {key: value} for key, value in (
        ("num_assistant_tokens", 5), ("assistant_confidence_threshold", 0.3), ("max_matching_ngram_size", 2))})
    for message, kw in cases.items():
        with pytest.raises(ValueError, match=message):
            target.generate(PROMPT, max_new_tokens=4, custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(2),
                            **kw)


def test_inputs_the_loop_cannot_take_get_errors_that_name_them(tiny):
    target, draft = tiny
    run = dict(max_new_tokens=4, custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(2))
    with pytest.raises(ValueError, match="synced_gpus=True"):  # generate's own lockstep across processes
        target.generate(PROMPT, synced_gpus=True, **run)
    with pytest.raises(ValueError, match="inputs_embeds is not supported"):
        target.generate(inputs_embeds=target.get_input_embeddings()(PROMPT), **run)
    holed = BATCH_MASK.clone()
    holed[1, 4] = 0  # a 0 between a row's tokens: not padding on either side
    with pytest.raises(ValueError, match="row 1 of attention_mask masks tokens between"):
        target.generate(BATCH, attention_mask=holed, **run)
    # no mask, the pad token (5) inside the prompt: transformers infers a mask with holes; the error says what to pass
    with pytest.raises(ValueError, match=r"attention_mask=torch.ones_like\(input_ids\)"):
        target.generate(PROMPT, pad_token_id=5, eos_token_id=1, **run)
    assert target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), pad_token_id=5, eos_token_id=1,
                           do_sample=False, **run).shape[1] > PROMPT.shape[1]
    enabled = hf_spec.enable_drafters(pickle.loads(pickle.dumps(target)))
    with pytest.raises(ValueError, match="synced_gpus=True"):  # the assistant entry point reaches the same check
        enabled.generate(PROMPT, assistant_model=draft, synced_gpus=True, max_new_tokens=4)
    with pytest.raises(ValueError, match="two drafters"):
        enabled.generate(PROMPT, assistant_model=draft, drafter=hf_spec.NgramDrafter(2), max_new_tokens=4)
    streamer = _RecordingStreamer()  # spec_streamer= beside assistant_model= is the streamer, as with custom_generate
    out = enabled.generate(PROMPT, assistant_model=draft, spec_streamer=streamer, max_new_tokens=4, do_sample=False)
    assert streamer.ended and torch.equal(torch.cat(streamer.puts[1:]), out[0, PROMPT.shape[1]:])


@pytest.mark.parametrize("num_tree_nodes", [None, 5])
def test_token_type_ids_reach_every_forward_as_generate_extends_them(num_tree_nodes):
    """GPT-2 adds a token-type embedding at every position; generate gives each new token its row's last prompt type.
    The loop had dropped token_type_ids and decoded as if there were none (single rows and left-padded batches)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=32, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=None,
                     pad_token_id=1)
    target = GPT2LMHeadModel(cfg).eval()
    draft = GPT2LMHeadModel(cfg).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.05 * p.std() * torch.randn_like(p))
    types = torch.stack([(torch.arange(8) >= 5).long(), torch.ones(8, dtype=torch.long), torch.zeros(8, dtype=torch.long)])
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=1)
    for ids, mask, tt in ((PROMPT, torch.ones_like(PROMPT), torch.ones_like(PROMPT)), (BATCH, BATCH_MASK, types)):
        plain = target.generate(ids, attention_mask=mask, token_type_ids=tt, **kw)
        assert not torch.equal(plain, target.generate(ids, attention_mask=mask, **kw))  # the types matter here
        for drafter in (hf_spec.DraftModelDrafter(draft), hf_spec.SuffixDrafter() if num_tree_nodes else hf_spec.NgramDrafter(2)):
            spec = target.generate(ids, attention_mask=mask, token_type_ids=tt, custom_generate=hf_spec.generate,
                                   drafter=drafter, num_speculative_tokens=3, num_tree_nodes=num_tree_nodes, **kw)
            assert torch.equal(spec, plain), type(drafter).__name__


def test_text_calls_of_multimodal_models_run_on_the_loop():
    """A multimodal processor gives a text-only prompt all-zero token types (Gemma 3's token_type_ids, Qwen2-VL's
    mm_token_type_ids): no image, so the call runs on hf-spec's loop (it had been refused), through either entry point,
    and continues from its cache. Image calls: tests/test_multimodal.py."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    torch.manual_seed(0)
    gemma = Gemma3ForConditionalGeneration(Gemma3Config(
        text_config=Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=64,
                                     layer_types=["sliding_attention", "full_attention"], bos_token_id=2,
                                     eos_token_id=1, pad_token_id=0),
        vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=63, boi_token_index=61, eoi_token_index=62)).eval()
    ids = torch.tensor([[2, 5, 9, 5, 9, 7, 11, 5, 9]])
    kw = dict(max_new_tokens=10, do_sample=False)
    text = dict(token_type_ids=torch.zeros_like(ids), **kw)
    enabled = hf_spec.enable_drafters(gemma)
    try:
        out = enabled.generate(ids, **text, prompt_lookup_num_tokens=3, return_dict_in_generate=True)
        assert torch.equal(out.sequences, gemma.generate(ids, **text)) and out.stats.num_draft_tokens > 0
    finally:
        hf_spec.disable_drafters(gemma)
    qwen = Qwen2VLForConditionalGeneration(Qwen2VLConfig(
        text_config=dict(vocab_size=40, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, bos_token_id=0, eos_token_id=1,
                         pad_token_id=1),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=64, num_heads=2, patch_size=2, spatial_merge_size=1,
                           temporal_patch_size=1, in_chans=3),
        image_token_id=30, video_token_id=31, vision_start_token_id=32, vision_end_token_id=33)).eval()
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=1)
    text = torch.tensor([[0, 7, 11, 5, 9, 5, 9, 7]])
    plain = qwen.generate(text, mm_token_type_ids=torch.zeros_like(text), **kw)
    out = qwen.generate(text, mm_token_type_ids=torch.zeros_like(text), custom_generate=hf_spec.generate,
                        return_dict_in_generate=True, drafter=hf_spec.NgramDrafter(3), **kw)
    assert torch.equal(out.sequences, plain)
    more = torch.cat([plain, torch.tensor([[4, 6, 8]])], 1)
    ref = qwen.generate(more, cache=copy.deepcopy(out.cache), **kw)
    assert torch.equal(qwen.generate(more, cache=out.cache, custom_generate=hf_spec.generate,
                                     drafter=hf_spec.NgramDrafter(3), **kw), ref)


def test_encoder_decoder_models_and_model_names_get_errors_that_say_what_to_do(tiny):
    """An encoder-decoder target (T5) through either entry point, drafter or none: an error naming it and plain
    generate, where the loop blamed a cache the caller never passed (EncoderDecoderCache); the same for such a
    draft. A draft model or a hybrid's model source given by name: the spec to build it from, where a bare
    AttributeError ('str' object has no attribute 'config') or a type name came."""
    from transformers import T5Config, T5ForConditionalGeneration

    _, draft = tiny
    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16, vocab_size=64,
                                             decoder_start_token_id=0, pad_token_id=0)).eval()
    for drafter in (hf_spec.NgramDrafter(2), None):
        with pytest.raises(ValueError, match="T5ForConditionalGeneration is an encoder-decoder model.*plain model.generate"):
            t5.generate(PROMPT, max_new_tokens=4, custom_generate=hf_spec.generate, drafter=drafter)
    with pytest.raises(ValueError, match="is an encoder-decoder model"):  # a decoder-only draft for it
        hf_spec.enable_drafters(t5).generate(PROMPT, assistant_model=draft, max_new_tokens=4)
    # what transformers' own assisted generation runs for such a target, it runs after enable_drafters too
    plain = hf_spec.disable_drafters(t5).generate(PROMPT, max_new_tokens=6, do_sample=False)
    enabled = hf_spec.enable_drafters(t5)
    for assisted in (dict(assistant_model=pickle.loads(pickle.dumps(t5))), dict(prompt_lookup_num_tokens=2)):
        assert torch.equal(enabled.generate(PROMPT, max_new_tokens=6, do_sample=False, **assisted), plain)
    # hf-spec's own settings on a call transformers runs: said so, where transformers' "model_kwargs are not used" came
    with pytest.raises(ValueError, match="runs on transformers' own generate \\(hf-spec hands it over.*num_tree_nodes"):
        enabled.generate(PROMPT, max_new_tokens=6, prompt_lookup_num_tokens=2, num_tree_nodes=4)
    with pytest.raises(ValueError, match="names no assistant_model .*drafter: drop them"):
        enabled.generate(PROMPT, max_new_tokens=6, drafter=hf_spec.NgramDrafter(2))
    assert torch.equal(enabled.generate(PROMPT, max_new_tokens=6, do_sample=False, event_listeners=[]), plain)  # none
    hf_spec.disable_drafters(t5)
    with pytest.raises(ValueError, match="the draft T5ForConditionalGeneration is an encoder-decoder model"):
        hf_spec.DraftModelDrafter(t5)
    with pytest.raises(TypeError, match=r"make_drafter\('draft:smollm2-135m'"):
        hf_spec.DraftModelDrafter("smollm2-135m")
    with pytest.raises(TypeError, match="takes a loaded causal LM .* got int"):
        hf_spec.DraftModelDrafter(3)
    with pytest.raises(TypeError, match=r"make_drafter\('hybrid:draft:smollm2-135m'"):
        hf_spec.HybridDrafter("smollm2-135m")


def test_a_processor_with_state_across_calls_is_refused_and_a_watermark_without_runs_exactly(tiny):
    """SynthID's watermark keeps its n-gram context from call to call (one call per token for the whole batch
    assumed): the loop gave plain greedy output without the watermark, silently. Kirchenbauer's reads only the
    sequence: hf-spec's output equals plain generate's with it."""
    from transformers import SynthIDTextWatermarkingConfig, WatermarkingConfig

    target, draft = tiny
    run = dict(max_new_tokens=10, do_sample=False, custom_generate=hf_spec.generate,
               drafter=hf_spec.DraftModelDrafter(draft, 2))
    for drafter in (run["drafter"], None):  # without a drafter too: the loop still processes rows one by one
        with pytest.raises(ValueError, match="SynthIDTextWatermarkLogitsProcessor keeps state from call to call"):
            target.generate(PROMPT, **{**run, "drafter": drafter},
                            watermarking_config=SynthIDTextWatermarkingConfig(keys=[654, 400, 836, 123], ngram_len=2))
    config = WatermarkingConfig(bias=8.0, greenlist_ratio=0.5, seeding_scheme="lefthash")
    plain = target.generate(PROMPT, max_new_tokens=10, do_sample=False, watermarking_config=config)
    assert not torch.equal(plain, target.generate(PROMPT, max_new_tokens=10, do_sample=False))  # it changes the text
    assert torch.equal(target.generate(PROMPT, watermarking_config=config, **run), plain)


@pytest.mark.parametrize("new_tokens", [6, 12, 20, 25])
def test_caller_cache_after_batch_continues_exactly(tiny, new_tokens):
    """transformers' multi-turn pattern: pass a DynamicCache, then continue from the same object with the extended
    input_ids. After a batched hf-spec call the cache must not hold the loop's ragged layout (holes where one row
    rejected drafts, rows dropped when they finished): continuing from it gave other tokens, or a shape error."""
    from transformers import DynamicCache

    target, draft = tiny
    cache = DynamicCache(config=target.config)
    out = target.generate(input_ids=BATCH, attention_mask=BATCH_MASK, max_new_tokens=new_tokens, cache=cache,
                          custom_generate=hf_spec.generate, drafter=hf_spec.DraftModelDrafter(draft, 3),
                          do_sample=False)
    assert torch.equal(out, target.generate(input_ids=BATCH, attention_mask=BATCH_MASK, max_new_tokens=new_tokens,
                                            do_sample=False))
    follow = torch.tensor([[4, 6, 8]] * 3)
    ids = torch.cat([out, follow], 1)
    mask = torch.cat([BATCH_MASK, torch.ones(3, ids.shape[1] - BATCH_MASK.shape[1], dtype=torch.long)], 1)
    fresh = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    again = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False, cache=cache)
    assert torch.equal(again, fresh)


@pytest.mark.parametrize("num_tree_nodes", [None, 6])
def test_one_rows_cache_is_plain_decodings_and_continues_exactly(num_tree_nodes):
    """One row fills the caller's cache in plain decoding's layout and returns it as ``out.cache``, as generate
    does: the sequence but its last token, also when EOS ends the row inside an accepted draft (the target is its
    own draft here, so every draft is accepted and the stop falls inside one); continuing from it is exact."""
    from transformers import DynamicCache

    target, draft = tiny_pair()
    plain = target.generate(input_ids=PROMPT, max_new_tokens=12, do_sample=False)
    new = plain[0, PROMPT.shape[1]:].tolist()
    eos = next(t for i, t in enumerate(new) if i >= 4 and t not in new[:i])  # a token first made at step 5 or later
    run = dict(input_ids=PROMPT, max_new_tokens=12, do_sample=False, eos_token_id=eos, return_dict_in_generate=True)
    ref = target.generate(**run, cache=DynamicCache(config=target.config))
    cache = DynamicCache(config=target.config)
    out = target.generate(**run, cache=cache, custom_generate=hf_spec.generate, num_tree_nodes=num_tree_nodes,
                          drafter=hf_spec.DraftModelDrafter(target, 4), num_speculative_tokens=4)
    assert torch.equal(out.sequences, ref.sequences) and out.sequences[0, -1] == eos
    assert out.stats.num_accepted_tokens > 0 and out.stats.num_target_forwards < len(new)
    assert out.cache is cache and cache.get_seq_length() == ref.cache.get_seq_length() == out.sequences.shape[1] - 1
    for mine, theirs in zip(cache.layers, ref.cache.layers):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-5)
    ids = torch.cat([out.sequences, torch.tensor([[4, 6, 8]])], 1)
    fresh = target.generate(input_ids=ids, max_new_tokens=10, do_sample=False)
    assert torch.equal(target.generate(input_ids=ids, max_new_tokens=10, do_sample=False, cache=copy.deepcopy(cache)),
                       fresh)
    # the next turn on hf-spec from the same cache (multi-turn prompt caching): refused before, now plain's tokens, on
    # both entry points, and the cache again holds every token but the last
    again = target.generate(input_ids=ids, max_new_tokens=10, do_sample=False, cache=cache, return_dict_in_generate=True,
                            custom_generate=hf_spec.generate, num_tree_nodes=num_tree_nodes,
                            drafter=hf_spec.DraftModelDrafter(draft, 4))
    assert torch.equal(again.sequences, fresh) and again.stats.num_target_forwards < 10
    assert again.cache is cache and cache.get_seq_length() == fresh.shape[1] - 1
    prefix = DynamicCache(config=target.config)  # a prefix filled by one forward, as transformers' docs show
    target(input_ids=ids[:, :7], cache=prefix)
    enabled = hf_spec.enable_drafters(copy.deepcopy(target))
    assert torch.equal(enabled.generate(input_ids=ids, max_new_tokens=10, do_sample=False, cache=prefix,
                                        prompt_lookup_num_tokens=3), fresh)


@pytest.mark.parametrize("kind", ["chain", "tree", "hybrid", "sampled"])
def test_a_continued_call_feeds_its_draft_model_only_what_its_cache_lacks(tiny, kind):
    """A call continuing from the cache an earlier hf-spec call returned takes over that call's draft-model cache
    (carried on the cache object): the draft is fed only the tokens it has not seen, not the whole conversation, on
    both entry points, after the caller cropped and changed the conversation's tail, and the output stays plain
    decoding's (greedy) or seeded-identical to the same call without the carried cache (sampled). What cannot
    resume is ignored: another draft model, a draft cast since, a batch; a deep copy of the cache copies the draft's
    cache, not the draft model; a pickled cache carries nothing."""
    from transformers import DynamicCache

    from hf_spec.drafters.draft_model import CarriedDraftCache, _common_prefix
    from hf_spec.loop import CARRIED

    target, draft = tiny
    fed = []
    hook = draft.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True)

    def make():
        chain = hf_spec.DraftModelDrafter(draft, 4)
        return hf_spec.HybridDrafter(chain) if kind == "hybrid" else chain

    sample = kind == "sampled"
    run = dict(do_sample=sample, **({"top_k": 5} if sample else {}), **({"num_tree_nodes": 6} if kind == "tree" else {}))

    def turn(ids, cache, entry="custom_generate", drafter=None, seed=0):
        fed.clear()
        torch.manual_seed(seed)
        drafter = drafter or make()
        if entry == "custom_generate":
            return target.generate(input_ids=ids, max_new_tokens=12, cache=cache, custom_generate=hf_spec.generate,
                                   drafter=drafter, num_speculative_tokens=4, **run)
        enabled = hf_spec.enable_drafters(copy.copy(target))
        return enabled.generate(input_ids=ids, max_new_tokens=12, cache=cache, assistant_model=drafter,
                                num_speculative_tokens=4, **run)

    try:
        cache = DynamicCache(config=target.config)
        out = turn(PROMPT, cache)
        carried = getattr(cache, CARRIED)
        assert isinstance(carried, CarriedDraftCache) and carried.model() is draft
        ids = torch.cat([out, torch.tensor([[4, 6, 8, 5]])], 1)
        for entry in ("custom_generate", "assistant_model"):
            mine = copy.deepcopy(cache)
            assert getattr(mine, CARRIED).model() is draft  # the draft model is not copied with the cache
            held = getattr(mine, CARRIED).tokens
            spec = turn(ids, mine, entry)
            # the first draft follows the target's first token of the call: the sequence is one longer than ids
            assert fed[0] == ids.shape[1] + 1 - _common_prefix(held, ids[0]) < ids.shape[1] - PROMPT.shape[1], entry
            if sample:  # the same seed without the carried cache: the same draws (the draft's cache is the same)
                assert torch.equal(spec, turn(ids, DynamicCache(config=target.config), entry))
            else:
                assert torch.equal(spec, target.generate(input_ids=ids, max_new_tokens=12, do_sample=False)), entry
            assert _common_prefix(getattr(mine, CARRIED).tokens, spec[0]) > ids.shape[1]  # this call's, for the next
        # the caller crops the cache to a shorter shared prefix and changes the tail: rolled back, still exact
        mine = copy.deepcopy(cache)
        mine.crop(-3)
        other = torch.cat([out[:, :-3], torch.tensor([[9, 9, 4, 6]])], 1)
        held = getattr(mine, CARRIED).tokens
        spec = turn(other, mine)
        if kind != "hybrid":  # (the hybrid drafted this one from its suffix source alone)
            assert fed[0] == other.shape[1] + 1 - _common_prefix(held, other[0]) <= 6
        if not sample:
            assert torch.equal(spec, target.generate(input_ids=other, max_new_tokens=12, do_sample=False))
        # not resumed: another draft model (which leaves its own for the next call); this draft changed in place
        mine = copy.deepcopy(cache)
        turn(ids, mine, drafter=hf_spec.DraftModelDrafter(target, 4))
        assert fed == [] and getattr(mine, CARRIED).model() is target
        mine = copy.deepcopy(cache)
        with torch.no_grad():
            draft.lm_head.weight.mul_(1.0)  # an in-place edit (the same values): its keys and values are not trusted
        turn(ids, mine)
        assert fed[0] == ids.shape[1] + 1
        # a call whose drafter carries nothing drops the state (it would keep the draft's cache alive)
        mine = copy.deepcopy(cache)
        turn(ids, mine, drafter=hf_spec.SuffixDrafter(3))
        assert getattr(mine, CARRIED, None) is None
        # a batch decodes in a cache of its own: nothing carried in or out
        batch_cache = DynamicCache(config=target.config)
        target.generate(input_ids=BATCH, attention_mask=BATCH_MASK, max_new_tokens=4, cache=batch_cache,
                        custom_generate=hf_spec.generate, drafter=make(), **run)
        assert getattr(batch_cache, CARRIED, None) is None
        # saved with its cache as an empty tensor, which torch.load(weights_only=True) reads and nothing resumes
        assert getattr(pickle.loads(pickle.dumps(cache)), CARRIED).numel() == 0
        saved = io.BytesIO()
        torch.save(cache, saved)
        saved.seek(0)
        with torch.serialization.safe_globals([DynamicCache, type(cache.layers[0])]):
            loaded = torch.load(saved, weights_only=True)
        assert loaded.get_seq_length() == cache.get_seq_length() and getattr(loaded, CARRIED).numel() == 0
        if not sample:  # and continues as the cache it was saved from
            assert torch.equal(turn(ids, loaded), turn(ids, copy.deepcopy(cache)))
        with torch.inference_mode():  # a draft made there keeps no version counters: carried and resumed as well
            made_there = tiny_pair()[1]
        mine = DynamicCache(config=target.config)
        turn(PROMPT, mine, drafter=hf_spec.DraftModelDrafter(made_there, 4))
        assert getattr(mine, CARRIED).model() is made_there
    finally:
        hook.remove()
