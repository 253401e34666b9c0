"""The speculative decoding loop: prefill, then draft k -> verify k+1 in one target forward -> accept ->
crop caches -> emit an event, until a stopping criterion ends the sequence.

:func:`generate` is a ``transformers`` ``custom_generate`` decoding loop::

    out = model.generate(**inputs, custom_generate=hf_spec.generate, drafter=drafter,
                         num_speculative_tokens=5, max_new_tokens=128)
    out.sequences, out.stats

``transformers`` prepares the generation config, the logits processors (temperature, top-k, top-p,
repetition penalty, ...), the stopping criteria (EOS, ``max_new_tokens``, stop strings) and the cache, then
calls this loop, which verifies with the one acceptance rule of :mod:`hf_spec.acceptance`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.utils import ModelOutput

from .acceptance import greedy_accept, speculative_sample
from .drafters.base import Drafter, check_num_speculative_tokens, crop_cache_to
from .events import EventListener, StepEvent
from .kernels import install_verify_linear, verify_linear
from .metrics import SpecStats

__all__ = ["generate", "SpeculativeOutput", "speculative_decode"]


@dataclass
class SpeculativeOutput(ModelOutput):
    """What :func:`generate` returns.

    Attributes:
        sequences: ``LongTensor[B, L + new]``, prompt and generated tokens.
        stats: :class:`~hf_spec.metrics.SpecStats` of this call.
    """

    sequences: torch.LongTensor | None = None
    stats: SpecStats | None = None


def generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    drafter: Drafter | None = None,
    num_speculative_tokens: int | None = None,
    spec_streamer=None,
    event_listeners: Iterable[EventListener] | None = None,
    tokenizer=None,
    **model_kwargs,
) -> SpeculativeOutput:
    """Speculative decoding as a ``transformers`` ``custom_generate`` callable.

    Call it through ``model.generate(..., custom_generate=hf_spec.generate, drafter=..., ...)``; the
    arguments up to ``streamer`` are supplied by ``generate``.

    Args:
        model: the target model.
        input_ids: ``LongTensor[B, L]`` (B = 1 for now), prepared by ``generate``.
        logits_processor, stopping_criteria, generation_config: prepared by ``generate``.
        drafter: an hf-spec :class:`~hf_spec.drafters.base.Drafter`; ``None`` decodes without speculation.
        num_speculative_tokens: k; overrides the drafter's own value when given.
        spec_streamer: a ``transformers`` streamer (``TextStreamer``, ``TextIteratorStreamer``). Pass it under
            this name: transformers 5 does not hand ``streamer=`` on to ``custom_generate`` callables.
        event_listeners: callables that receive each :class:`~hf_spec.events.StepEvent`.
        tokenizer: the target tokenizer (needed for ``stop_strings``; ``generate`` uses it for them).
        **model_kwargs: prepared by ``generate`` (``cache``, ``attention_mask``, ``position_ids``, ...).

    Returns:
        :class:`SpeculativeOutput` with ``sequences`` and ``stats``.

    Raises:
        ValueError: batch size > 1, beam search or ``num_return_sequences`` > 1, an empty prompt, k < 1,
            padding in the attention mask, or a cache that cannot be cropped.
    """
    if streamer is not None:  # a future transformers may pass it on
        spec_streamer = spec_streamer or streamer
    if spec_streamer is not None:
        spec_streamer.put(input_ids.cpu())
    cache = model_kwargs.get("cache")
    attention_mask = model_kwargs.get("attention_mask")
    if attention_mask is not None and not bool((attention_mask == 1).all()):
        raise ValueError("padded inputs are not supported yet: pass one unpadded prompt (batch size 1)")
    return speculative_decode(
        model,
        input_ids,
        drafter,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        generation_config=generation_config,
        num_speculative_tokens=num_speculative_tokens,
        cache=cache,
        streamer=spec_streamer,
        event_listeners=event_listeners,
    )


def _validate(model, input_ids, drafter, generation_config, num_speculative_tokens, cache) -> None:
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"empty prompt: input_ids has shape {tuple(input_ids.shape)}; give at least one token")
    if (generation_config.num_beams or 1) > 1:
        raise ValueError("beam search (num_beams > 1) cannot be combined with speculative decoding; use num_beams=1")
    if (generation_config.num_return_sequences or 1) > 1:
        raise ValueError("num_return_sequences > 1 is not supported; call generate once per sample")
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"batch size {input_ids.shape[0]} is not supported yet; run the prompts one at a time (batch size 1)"
        )
    if num_speculative_tokens is not None:
        check_num_speculative_tokens(num_speculative_tokens)
    if drafter is not None and not isinstance(drafter, Drafter):
        raise TypeError(
            f"drafter must be an hf_spec Drafter (DraftModelDrafter, NgramDrafter, ...), got {type(drafter).__name__}"
        )
    if cache is not None and not isinstance(cache, DynamicCache):
        raise ValueError(
            f"unsupported cache {type(cache).__name__}: speculative decoding rolls the cache back after each "
            "rejection; use the default DynamicCache (drop cache_implementation / the cache argument)"
        )
    if cache is not None and cache.get_seq_length() > 0:
        raise ValueError(
            "continuing from a filled cache is not supported: pass the whole sequence as input_ids and no cache"
        )


@torch.no_grad()
def speculative_decode(
    model,
    input_ids: torch.LongTensor,
    drafter: Drafter | None,
    *,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig,
    num_speculative_tokens: int | None = None,
    cache: DynamicCache | None = None,
    streamer=None,
    event_listeners: Iterable[EventListener] | None = None,
    generator: torch.Generator | None = None,
) -> SpeculativeOutput:
    """The loop itself, on already-prepared inputs (see :func:`generate` for the arguments).

    ``stopping_criteria`` must end the sequence (it holds at least ``max_length``); ``generate``
    builds it from the generation config.
    """
    _validate(model, input_ids, drafter, generation_config, num_speculative_tokens, cache)
    logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
    if stopping_criteria is None or len(stopping_criteria) == 0:
        raise ValueError("stopping_criteria must include a max length; call through model.generate")
    do_sample = bool(generation_config.do_sample)
    listeners = [stats := SpecStats()] + list(event_listeners or [])
    if drafter is not None:
        if num_speculative_tokens is not None:
            drafter.num_speculative_tokens = num_speculative_tokens
        drafter.prepare(model, input_ids, generation_config, logits_processor)
    cache = cache if cache is not None else DynamicCache(config=model.config)
    device = model.device
    if drafter is not None and device.type == "cpu" and model.dtype == torch.float32:
        install_verify_linear(model)  # exact F.linear outside verify forwards; see hf_spec.kernels
    input_ids = input_ids.to(device)

    def emit(event: StepEvent) -> None:
        for listener in listeners:
            listener(event)

    def score(seq: torch.LongTensor, logits: torch.Tensor, start: int) -> torch.Tensor:
        """Apply the logits processors at each of the n positions ``logits[:, i]`` (prefix ``seq[:, :start+i]``)."""
        if len(logits_processor) == 0:
            return logits
        return torch.stack(
            [logits_processor(seq[:, : start + i], logits[:, i]) for i in range(logits.shape[1])], dim=1
        )

    def append_until_stop(seq: torch.LongTensor, new: list[int]) -> tuple[torch.LongTensor, list[int], bool]:
        """Append tokens one by one, checking the stopping criteria after each (exact stop position)."""
        kept = []
        for tok in new:
            seq = torch.cat([seq, seq.new_tensor([[tok]])], dim=1)
            kept.append(tok)
            if bool(stopping_criteria(seq, None).any()):
                return seq, kept, True
        return seq, kept, False

    t0 = time.perf_counter()
    # ---- prefill: the target alone chooses the first token ---------------------------------------
    out = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
    scores = score(input_ids, out.logits[:, -1:].float(), input_ids.shape[1])
    first = _choose(scores[:, 0], do_sample, generator)
    seq, kept, done = append_until_stop(input_ids, [int(first[0])])
    verify_time = time.perf_counter() - t0
    if streamer is not None:
        streamer.put(torch.tensor(kept))
    emit(StepEvent(0, 0, [[]], [0], [kept], 0.0, verify_time, time.perf_counter() - t0, [done]))

    step = 0
    while not done:
        step += 1
        length = seq.shape[1]
        # ---- draft ------------------------------------------------------------------------------
        t_draft = time.perf_counter()
        k_asked = drafter.num_speculative_tokens if drafter is not None else 0
        if drafter is not None:
            candidates, draft_scores = drafter.get_candidates(seq)
            candidates = candidates.to(device)
        else:
            candidates, draft_scores = seq, None
        drafts = candidates[:, length:]
        k = drafts.shape[1]
        t_verify = time.perf_counter()
        # ---- verify k+1 positions in one target forward ---------------------------------------
        with verify_linear(k > 0):
            out = model(input_ids=candidates[:, length - 1:], cache=cache, use_cache=True, logits_to_keep=k + 1)
        target_scores = score(candidates, out.logits[:, -(k + 1):].float(), length)
        if do_sample:
            q = draft_scores.to(device).float().softmax(dim=-1) if draft_scores is not None else None
            num_accepted, next_token = speculative_sample(drafts, q, target_scores.softmax(dim=-1), generator)
        else:
            num_accepted, next_token = greedy_accept(drafts, target_scores)
        n = int(num_accepted[0])
        proposal = drafts[0, :n].tolist() + [int(next_token[0])]
        seq, kept, done = append_until_stop(seq, proposal)
        # the cache holds the sequence minus its last token, which the next forward feeds
        crop_cache_to(cache, seq.shape[1] - 1)
        now = time.perf_counter()
        if streamer is not None:
            streamer.put(torch.tensor(kept))
        if drafter is not None:
            drafter.update_candidate_strategy(seq, target_scores, n)
        emit(
            StepEvent(
                step, k_asked, [drafts[0].tolist()], [min(n, len(kept) - 1)], [kept],
                t_verify - t_draft, now - t_verify, now - t0, [done],
            )
        )
    if streamer is not None:
        streamer.end()
    return SpeculativeOutput(sequences=seq, stats=stats)


def _choose(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    """Pick one token per row from processed scores ``[B, V]``: argmax, or a sample."""
    if do_sample:
        return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator).squeeze(1)
    return scores.argmax(dim=-1)
