"""The speculative decoding loop: prefill, then draft k -> verify k+1 in one target forward -> accept ->
crop caches -> emit an event, until a stopping criterion ends the sequence.

:func:`generate` is a ``transformers`` ``custom_generate`` decoding loop::

    out = model.generate(**inputs, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter,
                         num_speculative_tokens=5, max_new_tokens=128)
    out.sequences, out.stats          # without return_dict_in_generate: the sequences tensor, as generate

``transformers`` prepares the generation config, the logits processors (temperature, top-k, top-p,
repetition penalty, ...), the stopping criteria (EOS, ``max_new_tokens``, stop strings) and the cache, then
calls this loop, which verifies with the one acceptance rule of :mod:`hf_spec.acceptance`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import numbers
import sys
import threading
from dataclasses import dataclass
from typing import Iterable

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, StopStringCriteria, StoppingCriteriaList
from transformers.generation import logits_process
from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .acceptance import LAZY_DEVICES, chain_parents, greedy_accept_tree, speculative_sample_tree, tree_depths
from .adaptive import AdaptiveK, TreeSize, make_controller, remember_plain_times, remembered_plain_times
from .device import clock
from .drafters.base import Drafter, VerifyOutput, check_drafter_type, check_num_speculative_tokens, logit_rows
from .events import EventListener, StepEvent
from .kernels import extra_rows, install_verify_linear, measuring_seconds, route_extra_rows, verify_linear
from .metrics import SpecStats
from .quantization import bitsandbytes_bf16_layers
from .processors import process_scores, reads_sequences, row_processors
from .ragged import (RaggedCache, check_block_forward, check_cache_layers, check_key_selection, check_tree_model,
                     crop_cache_to, positions_from_slots, slot_window)

__all__ = ["generate", "SpeculativeOutput", "speculative_decode", "plan_num_speculative_tokens", "generated_length"]

logger = logging.getLogger("hf_spec")


@dataclass
class SpeculativeOutput(GenerateDecoderOnlyOutput):
    """What :func:`generate` returns with ``return_dict_in_generate=True``: transformers'
    ``GenerateDecoderOnlyOutput`` (an instance of it) plus this call's statistics.

    Attributes:
        sequences: ``LongTensor[B, L + new]``, prompt and generated tokens.
        scores: with ``output_scores=True``, a tuple of ``new`` tensors ``[B, V]``: the processed target scores that
            chose each emitted token, as plain ``generate`` reports them.
        logits: with ``output_logits=True``, the same for the unprocessed target logits.
        cache: for one sequence (B = 1) the call's ``DynamicCache`` in plain decoding's layout (every token but the
            last; a window layer its last W - 1 of them), which plain ``generate`` can continue from; ``None`` for a
            batch.
        stats: :class:`~hf_spec.metrics.SpecStats` of this call.
    """

    stats: SpecStats | None = None


#: the attribute of a caller's cache object under which a one-sequence call leaves its drafter's
#: :meth:`~hf_spec.drafters.base.Drafter.carry_over` (a draft model's own cache) for the next call given that object;
#: a call whose drafter carries nothing (or that has none) removes it, and so may a user:
#: ``vars(cache).pop(hf_spec.loop.CARRIED, None)``
CARRIED = "_hf_spec_carried"


def generate(
    model,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    drafter: Drafter | None = None,
    num_speculative_tokens: int | str | AdaptiveK | None = None,
    num_tree_nodes: int | str | TreeSize | None = None,
    spec_streamer=None,
    event_listeners: Iterable[EventListener] | None = None,
    tokenizer=None,
    **model_kwargs,
) -> SpeculativeOutput:
    """Speculative decoding as a ``transformers`` ``custom_generate`` callable.

    Call it through ``model.generate(..., custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=..., ...)``; the
    arguments up to ``streamer`` are supplied by ``generate``.

    Args:
        model: the target model.
        input_ids: ``LongTensor[B, L]``, prepared by ``generate``; a batch must be left-padded
            (``tokenizer.padding_side = "left"``) with its ``attention_mask`` in ``model_kwargs``.
        logits_processor: prepared by ``generate`` (temperature, top-k, top-p, penalties, ...).
        stopping_criteria: prepared by ``generate`` (max length, EOS, stop strings).
        generation_config: prepared by ``generate``.
        drafter: an hf-spec :class:`~hf_spec.drafters.base.Drafter`; ``None`` decodes without speculation. The
            call works on a copy bound to it (:meth:`~hf_spec.drafters.base.Drafter.start`): the object passed
            is never changed, so one drafter can serve many calls, threads included.
        num_speculative_tokens: k for this call (an int >= 1); ``None`` uses the drafter's own k. ``"auto"``
            (or an :class:`~hf_spec.adaptive.AdaptiveK` with chosen settings) picks k before every step from
            running measurements and switches speculation off where it does not pay. Never written onto the
            drafter: the loop passes each step's k to ``drafter.draft``.
        num_tree_nodes: draft a tree of at most this many nodes per row and step (at most k deep), verified in
            one forward with a tree attention mask; ``None`` or 0: a chain. ``"auto"`` (or a
            :class:`~hf_spec.adaptive.TreeSize` with chosen sizes) measures a few sizes, the chain included, and
            keeps the one with the most tokens per second. The drafter must draft trees
            (:attr:`~hf_spec.drafters.base.Drafter.drafts_trees`: Medusa heads, a draft model, the suffix drafter, the
            hybrid drafter).
        spec_streamer: a ``transformers`` streamer (``TextStreamer``, ``TextIteratorStreamer``), the prompt
            put first. ``streamer=`` works too: transformers 5 puts the prompt into it and does not hand it on to
            ``custom_generate`` callables, so the loop takes it from ``generate``'s frame.
        event_listeners: callables that receive each :class:`~hf_spec.events.StepEvent`.
        tokenizer: the target tokenizer (needed for ``stop_strings``; ``generate`` uses it for them).
        **model_kwargs: prepared by ``generate`` (``cache``, ``attention_mask``, ``position_ids``, ...).

    Returns:
        As ``generate``: the sequences ``LongTensor[B, L + new]``, or with ``return_dict_in_generate=True`` a
        :class:`SpeculativeOutput` (transformers' ``GenerateDecoderOnlyOutput`` with ``sequences``, ``scores`` /
        ``logits`` when asked, ``stats``, and for one sequence ``cache``: the call's ``DynamicCache`` holding
        every token but the last, as ``generate`` leaves it (a next call given it with the whole sequence as
        ``input_ids`` continues from it, as ``generate`` does; so does one given a prefix cache a forward filled);
        ``None`` for a batch, whose cache passed in stays empty; a sliding-window model decodes in a cache of
        its own and hands its tokens to the cache passed at the end, window layers keeping their last W - 1).

    Raises:
        TypeError: ``drafter`` is not an hf-spec Drafter instance (a class, or a spec string: build it with
            :func:`~hf_spec.drafters.registry.make_drafter`), or a subclass that skipped ``super().__init__``.
        ValueError: an encoder-decoder target (T5, BART: use plain ``generate``); a decoding algorithm other than
            greedy decoding or sampling (beam search, contrastive search,
            DoLa, constrained beam search) or ``num_return_sequences`` > 1 outside ``generate`` (which repeats the
            prompts for it); transformers' own assisted-generation
            settings (``prompt_lookup_num_tokens``, ``num_assistant_tokens``, ...: :data:`ASSISTED_SETTINGS`), which
            this loop does not read; ``synced_gpus=True``; ``inputs_embeds``, or model inputs the loop does not
            feed the target (those a model reads at every step besides the tokens: :func:`unread_model_inputs`;
            ``token_type_ids`` are fed, each new token taking its row's last prompt type as ``generate`` extends them;
            images and other media go into the prompt's forward: :data:`PREFILL_MODEL_INPUTS`); an image in the
            uncached part of a conversation continued from a sliding-window model's cache; an empty prompt or
            all-padding row, a right-padded batch or a row whose mask has holes; k < 1 or above what the drafter can
            propose; a streamer with batch size > 1; a cache that cannot be cropped, or a filled cache with a batch,
            a multimodal-RoPE model holding an image's position deltas without ``generate``'s positions (a direct
            :func:`speculative_decode` call), left padding, or as
            many tokens as ``input_ids`` (it must hold their first tokens); a draft tree on a model that cannot
            place sibling nodes at one position (ALiBi: Bloom, MPT, Falcon with ``alibi=True``; no ``position_ids``;
            an attention implementation without 4D masks), or a batch on a model that places keys by cache slot
            (:func:`~hf_spec.ragged.positions_from_slots`: MPT); a batch or a tree on a model whose layers window
            attention by cache slot (:func:`~hf_spec.ragged.slot_window`: GPT-Neo's local layers); a call on Doge
            that passes its ``keep_window_size`` (:func:`~hf_spec.ragged.check_key_selection`); a model whose
            forward over several tokens differs from one token at a time (:func:`~hf_spec.ragged.check_block_forward`:
            Dory with ``recurrent_kv_cache_mode="last_loop"``); an offloaded cache where hf-spec decodes in a cache
            of its own (a batch, or a sliding-window model); a stopping criterion that answers for the whole batch
            (not a ``BoolTensor[1]`` for the row it is asked about).

    Streamers get the prompt first, then one new token per ``put`` (``LongTensor[1]``), as ``generate`` gives them;
    stopping criteria are called per row (``input_ids [1, L]``) after each new token, with the row's scores so far
    (a tuple of ``[1, V]``) where ``output_scores`` keeps them, else ``None``, as ``generate`` calls them.
    """
    # transformers' generate puts the prompt into its streamer= and then drops it for custom_generate callables
    # (5.x): take it from generate's frame, so the tokens and end() reach it and a TextIteratorStreamer ends
    caller = _calling_generate()
    if caller is not None:
        # the call's own settings only, as keyword arguments or in its generation_config=: generate fills its
        # defaults into a prepared config (num_assistant_tokens=20, ...), and enable_drafters maps these settings
        # (a model's generation config may keep them for it)
        if keys := _assisted_settings_of_call(model, caller, generation_config):
            raise ValueError(
                f"custom_generate=hf_spec.generate does not read transformers' own assisted-generation settings "
                f"({', '.join(keys)}): pass drafter= (e.g. hf_spec.NgramDrafter() for prompt lookup, "
                "hf_spec.DraftModelDrafter(draft) for an assistant model) and num_speculative_tokens=k (or \"auto\"), "
                "or call hf_spec.enable_drafters(model) and keep transformers' arguments without custom_generate"
                + ("; assistant_ensemble_weight is transformers' lossy ensemble verification, which hf-spec does not "
                   "do (it verifies losslessly): enable_drafters hands such a call to transformers' own assisted "
                   "generation" if "assistant_ensemble_weight" in keys else ""))
    if synced_gpus or _synced_gpus(model, caller):
        raise ValueError(
            "synced_gpus=True (set by generate under DeepSpeed ZeRO-3 or FSDP with several processes) keeps the "
            "processes' forwards in lockstep, which hf-spec's loop does not do (each step's forward is as wide as its "
            "own draft): run speculative decoding with the whole model in one process, or plain generate sharded")
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError(
            "inputs_embeds is not supported: the drafter and the verify forwards work on token ids; pass input_ids "
            "(the tokenized prompt) instead")
    # (an encoder-decoder target's encoder_outputs: refused below as such a target)
    if not model.config.is_encoder_decoder and (unread := unread_model_inputs(model_kwargs)):
        raise ValueError(
            f"hf-spec's loop feeds the target token ids (with their attention_mask and token_type_ids, and images and "
            f"other media to the prompt's forward) and would drop {', '.join(unread)}, which the model reads at every "
            "step: decode such a call with plain generate, or call hf_spec.enable_drafters(model) and pass "
            "assistant_model=<a draft model> or prompt_lookup_num_tokens= without custom_generate (it hands such a "
            "call to transformers' own assisted generation)")
    if streamer is None and caller is not None:
        streamer = caller.get("streamer")
    with ending_streamer(streamer), ending_streamer(spec_streamer):
        if caller is not None and caller.get("assistant_model") is not None:
            raise ValueError(
                "custom_generate=hf_spec.generate takes its drafter as drafter=, and transformers drops "
                "assistant_model= before this loop sees it: pass drafter=hf_spec.DraftModelDrafter(model), or call "
                "hf_spec.enable_drafters(model) and pass assistant_model= without custom_generate (a pipeline built "
                "with assistant_model= passes it to every call: build it without one to pass drafter=)")
        if spec_streamer is not None:
            if streamer is not None and streamer is not spec_streamer:
                raise ValueError("pass one streamer: streamer= or spec_streamer=, not both")
            if streamer is None and input_ids.shape[0] == 1:  # a batch gets the loop's error below
                spec_streamer.put(input_ids.cpu())  # the prompt first, as generate does with its own streamer
            streamer = spec_streamer
    if caller is not None and (generation_config.num_return_sequences or 1) > 1:
        # generate repeated each prompt num_return_sequences times already (it refuses this under greedy decoding):
        # the rows sample independently, as plain sampling's do
        generation_config = copy.deepcopy(generation_config)
        generation_config.num_return_sequences = 1
    out = speculative_decode(
        model,
        input_ids,
        drafter,
        attention_mask=model_kwargs.get("attention_mask"),
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        generation_config=generation_config,
        num_speculative_tokens=num_speculative_tokens,
        num_tree_nodes=num_tree_nodes,
        cache=model_kwargs.get("cache", model_kwargs.get("past_key_values")),  # the latter before transformers 5.24
        token_type_ids=model_kwargs.get("token_type_ids"),
        media=media_inputs(model_kwargs),
        position_ids=model_kwargs.get("position_ids"),
        streamer=streamer,
        event_listeners=event_listeners,
    )
    return out if generation_config.return_dict_in_generate else out.sequences


#: the model inputs ``generate`` hands a ``custom_generate`` callable that this loop reads or may leave: the loop
#: builds each forward's ``position_ids`` and ``logits_to_keep`` itself, as plain decoding does from the mask (it
#: follows ``generate``'s multimodal RoPE positions, ``[3 or 4, B, L]``, where it hands those)
READ_MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "cache", "past_key_values", "use_cache",
                     "position_ids", "logits_to_keep", "output_attentions", "output_hidden_states", "cache_position")

try:  # transformers' own list of the inputs its prepare_inputs_for_generation feeds the prefill only
    from transformers.generation.utils import MULTIMODAL_INPUTS_TO_DROP_OUTSIDE_PREFILL as _MEDIA_INPUTS
except ImportError:  # an older transformers: the inputs of the images generate encodes first
    _MEDIA_INPUTS = ("mm_encoder_outputs", "pixel_values", "pixel_values_videos", "image_sizes",
                     "pixel_attention_mask")

#: the model inputs that this loop feeds the target's prompt forward only, as ``generate`` feeds its prefill: images
#: and other media (raw or encoded into ``mm_encoder_outputs``; transformers' list of them), the grids that place
#: them or mask them (Qwen2-Audio's ``feature_attention_mask``, read with its ``input_features`` only), and
#: ``mm_token_type_ids`` (which token is an image's: the new tokens are text, zeros, which a model given
#: ``position_ids`` and a mask reads as nothing). The prompt's forward then runs on the model's own masks
#: (:meth:`~hf_spec.ragged.RaggedCache.forward`'s ``model_masks``: an image's bidirectional attention).
PREFILL_MODEL_INPUTS = tuple(_MEDIA_INPUTS) + ("image_grid_thw", "video_grid_thw", "second_per_grid_ts",
                                               "feature_attention_mask", "mm_token_type_ids")


def _given(name: str, value) -> bool:
    """Whether a model input has anything to feed: not ``None``, not an empty dict (``generate`` hands a multimodal
    model's text-only call ``mm_encoder_outputs={}``), not a token-type tensor of zeros only (a multimodal
    processor's ``mm_token_type_ids`` for a text-only prompt: no token is an image's)."""
    if isinstance(value, dict):
        return any(v is not None for v in value.values())
    if name.endswith("token_type_ids") and isinstance(value, torch.Tensor):
        return bool(value.any())
    return value is not None


def unread_model_inputs(model_kwargs: dict) -> list[str]:
    """The names of the model inputs in ``model_kwargs`` (given: :func:`_given`) that this loop does not feed the
    target, sorted: those a model reads at every step besides the tokens (Mllama's ``cross_attention_mask``, ...).
    Images and other media are fed to the prompt's forward (:data:`PREFILL_MODEL_INPUTS`); ``inputs_embeds`` is
    refused on its own."""
    return sorted(k for k, v in model_kwargs.items()
                  if k not in READ_MODEL_INPUTS + PREFILL_MODEL_INPUTS + ("inputs_embeds",) and _given(k, v))


def media_inputs(model_kwargs: dict) -> dict:
    """The :data:`PREFILL_MODEL_INPUTS` in ``model_kwargs`` that have anything to feed (:func:`_given`)."""
    return {k: v for k, v in model_kwargs.items() if k in PREFILL_MODEL_INPUTS and _given(k, v)}


def _calling_generate() -> dict | None:
    """The locals of transformers' ``generate`` when it called this loop as ``custom_generate`` (directly, or
    through a few frames of the caller's own wrapper), else ``None``. Its ``streamer`` has the prompt already;
    its ``assistant_model`` was dropped on the way here."""
    frame = sys._getframe(2)  # here -> generate(), the custom_generate callable -> its caller
    for _ in range(4):
        if frame is None:
            return None
        if frame.f_code.co_name == "generate" and frame.f_globals.get("__name__") == "transformers.generation.utils":
            return frame.f_locals
        frame = frame.f_back
    return None


def _assisted_settings_of_call(model, caller: dict, generation_config: GenerationConfig) -> list[str]:
    """The :data:`ASSISTED_SETTINGS` that a ``generate`` call set itself: as keyword arguments, or in a
    ``generation_config=`` it passed (read in the prepared config, where generate also fills its own defaults,
    num_assistant_tokens=20 and the like, and the model's generation config's: a value that differs from what
    generate prepares for a call that sets nothing came from the call)."""
    keys = [key for key in ASSISTED_SETTINGS if (caller.get("kwargs") or {}).get(key) is not None]
    try:
        untouched = model._prepare_generation_config(None)[0]  # what a call that sets nothing gets
    except Exception:  # another transformers: the keyword arguments still count
        return keys
    return keys + [key for key in ASSISTED_SETTINGS if key not in keys and getattr(generation_config, key, None)
                   is not None and getattr(generation_config, key, None) != getattr(untouched, key, None)]


def _synced_gpus(model, caller: dict | None) -> bool:
    """Whether the calling ``generate`` runs with ``synced_gpus`` (which it does not hand on to a callable
    ``custom_generate``): the call's own value, else generate's default, on under DeepSpeed ZeRO-3 or FSDP with
    several processes."""
    if caller is None:
        return False
    if caller.get("synced_gpus") is not None:
        return bool(caller["synced_gpus"])
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
    from transformers.integrations.fsdp import is_fsdp_managed_module

    several = torch.distributed.is_available() and torch.distributed.is_initialized() and \
        torch.distributed.get_world_size() > 1
    return several and (is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model))


@contextlib.contextmanager
def ending_streamer(streamer):
    """Inside the block, an exception ends ``streamer`` (when given) before it propagates, so a
    ``TextIteratorStreamer`` consumer never waits for a call that failed before its loop ran."""
    try:
        yield
    except BaseException:
        if streamer is not None:
            with contextlib.suppress(Exception):  # the error that ended the call is the one to report
                streamer.end()
        raise


def _validate(model, input_ids, drafter, generation_config, cache, logits_processor) -> None:
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"{type(model).__name__} is an encoder-decoder model; hf-spec decodes decoder-only causal language models "
            "(its loop verifies drafts against one self-attention cache, not a decoder's cross-attention over an "
            "encoder's output): use plain model.generate(...) without custom_generate=hf_spec.generate; after "
            "hf_spec.enable_drafters(model), prompt lookup (prompt_lookup_num_tokens=) or an encoder-decoder "
            "assistant_model runs on transformers' own assisted generation (a decoder-only draft cannot draft for it)")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"empty prompt: input_ids has shape {tuple(input_ids.shape)}; give at least one token")
    if model.device.type == "meta":
        raise ValueError(
            "the target's input embeddings are offloaded (device meta), so there is no device to run on: keep "
            "them in memory in device_map (e.g. {'model.embed_tokens': 'cpu', ...}); decoder layers may be offloaded"
        )
    _check_generation_mode(generation_config)
    if generation_config.return_dict_in_generate and (generation_config.output_attentions
                                                      or generation_config.output_hidden_states):
        raise ValueError(
            "output_attentions / output_hidden_states are not returned by speculative decoding (the target scores "
            "several positions per forward); drop them, or call generate without a drafter for them. output_scores "
            "and output_logits are returned")
    if (generation_config.num_return_sequences or 1) > 1:
        raise ValueError("num_return_sequences > 1 repeats each prompt, which model.generate does before it calls "
                         "hf-spec: call it through generate(..., custom_generate=hf_spec.generate), or repeat the "
                         "prompts yourself (input_ids.repeat_interleave(n, dim=0))")
    if drafter is not None and any(isinstance(p, UnbatchedClassifierFreeGuidanceLogitsProcessor)
                                   for p in logits_processor or []):
        raise ValueError(
            "guidance_scale (classifier-free guidance) runs its own unconditional forward with a cache of its own, one "
            "token at a time: it cannot score k+1 drafted positions at once nor roll back rejected ones; decode "
            "with guidance_scale without a drafter (drafter=None)")
    if stateful := [type(p).__name__ for p in logits_processor or [] if isinstance(p, STATEFUL_PROCESSORS)]:
        raise ValueError(
            f"{stateful[0]} keeps state from call to call, as if it were called once per generated token for the "
            "whole batch (SynthID text watermarking: its n-gram context); speculative decoding processes several "
            "positions per step and each row of a batch on its own, so its output would silently differ. Generate "
            "without hf-spec (no custom_generate=hf_spec.generate, no drafter or assistant) for it (the Kirchenbauer "
            "watermark, "
            "watermarking_config=WatermarkingConfig(...), reads only the sequence and works with hf-spec)")
    if drafter is not None:
        check_drafter_type(drafter)
    if drafter is not None and not hasattr(drafter, "num_speculative_tokens"):  # a Drafter, but not set up
        raise TypeError(f"{type(drafter).__name__}.__init__ did not call super().__init__(num_speculative_tokens): a "
                        "Drafter's __init__ sets its k (and the call's logits processors); call it first")
    if cache is not None and not isinstance(cache, DynamicCache):
        implementation = getattr(generation_config, "cache_implementation", None)
        if not implementation:
            given, fix = (f"a {type(cache).__name__} passed as the cache (cache= or past_key_values=)",
                          "pass a DynamicCache or none")
        elif getattr(model.generation_config, "cache_implementation", None) == implementation:  # the model's own
            given = (f"cache_implementation={implementation!r} (a {type(cache).__name__}), set in the model's "
                     "generation_config (as torch.compile recipes do)")
            fix = ("pass cache_implementation=None to this call, or set model.generation_config.cache_implementation "
                   "= None")
        else:
            given, fix = f"cache_implementation={implementation!r} (a {type(cache).__name__})", "drop cache_implementation"
        raise ValueError(
            f"unsupported cache: {given}; speculative decoding rolls the cache back after each rejection, which "
            f"only transformers' DynamicCache (the default) allows here: {fix}"
        )
    if not getattr(model, "_hf_spec_checked_bnb", False):  # once per model: it walks every module
        model._hf_spec_checked_bnb = True
        if layers := bitsandbytes_bf16_layers(model):
            logger.warning(
                "the target's bitsandbytes 4-bit layers compute in bfloat16 on this CPU (bitsandbytes' fused "
                "AVX512-BF16 kernel) although their compute dtype is %s: greedy output equals the target's own "
                "only up to bfloat16 near-ties. For float32 exactness call "
                "hf_spec.quantization.honor_bitsandbytes_compute_dtype(model) right after loading, or load with "
                "hf_spec.load(..., quantization='nf4'), which does.", layers[0].compute_dtype)
    if cache is not None:
        check_cache_layers(model.config, cache)  # before anything asks a linear-attention cache for its length


def _continued_length(model, cache, input_ids: torch.LongTensor, pad_len: list[int], rope_rows: bool = False) -> int:
    """How many of the prompt's first tokens ``cache`` already holds (0 for none): ``generate``'s continuation from a
    cache it returned or a prefix a forward filled (multi-turn prompt caching), whose prefill runs over the rest.

    Raises:
        ValueError: a filled cache with a batch (it decodes in a per-row cache of its own), left padding, a
            multimodal-RoPE model holding an image's position deltas without ``generate``'s positions (``rope_rows``
            False: they carry the deltas), or as many tokens as ``input_ids``.
    """
    cached = cache.get_seq_length() if cache is not None else 0
    if not cached:
        return 0
    fix = "pass the whole sequence as input_ids and no cache"
    if input_ids.shape[0] > 1:
        raise ValueError("continuing from a filled cache is supported for one sequence: a batch decodes in a per-row "
                         f"cache of its own; {fix}")
    if cached >= input_ids.shape[1]:
        raise ValueError(
            f"the cache passed holds {cached} tokens and input_ids {input_ids.shape[1]}: continuing from a filled "
            "cache needs the whole sequence as input_ids, the cache holding its first tokens (as the cache "
            "generate returned, which holds every token but the last)")
    if pad_len[0]:
        raise ValueError("continuing from a filled cache takes a prompt without padding: drop the left padding "
                         "from input_ids and attention_mask")
    if not rope_rows and any(isinstance(getattr(m, "rope_deltas", None), torch.Tensor) and bool(m.rope_deltas.any())
                             for m in model.modules()):
        # multimodal RoPE (Qwen2-VL and its kin): an image in the cached turns takes fewer positions than tokens, and
        # generate offsets every later position by the deltas the model stored when it encoded it (none, or zeros,
        # after text only: positions then follow the cache, as here)
        raise ValueError(
            f"continuing from a filled cache is not supported for {type(model).__name__}: its multimodal RoPE "
            "offsets the positions after an image by deltas the model keeps from the call that encoded it, which "
            f"hf-spec's position ids do not read; {fix.replace('sequence', 'conversation')}")
    return cached


#: transformers' assisted-generation settings, which hf-spec's loop does not read (its drafter and
#: num_speculative_tokens stand for them): refused in a custom_generate call; :func:`hf_spec.assisted.enable_drafters`
#: maps the ones it knows and drops them all before the loop runs
ASSISTED_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
                     "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_lookbehind",
                     "target_lookbehind", "assistant_early_exit", "use_mtp", "assistant_ensemble_weight")


#: transformers' logits processors that keep state from call to call (they assume one call per generated token for
#: the whole batch): the loop calls processors for several positions per step and row by row, so they are refused
#: (classifier-free guidance, which runs a forward of its own, is refused apart, with a drafter)
STATEFUL_PROCESSORS = tuple(getattr(logits_process, name) for name in (
    "SynthIDTextWatermarkLogitsProcessor", "DiaEOSDelayPatternLogitsProcessor") if hasattr(logits_process, name))


def _check_generation_mode(generation_config: GenerationConfig) -> None:
    """Refuse every decoding algorithm but greedy decoding and sampling, which speculative decoding reproduces (the
    loop would otherwise run greedy decoding in their place without a word): the settings by which
    ``GenerationConfig.get_generation_mode`` chooses another algorithm."""
    def get(name):  # settings a later transformers may drop
        return getattr(generation_config, name, None)

    if (get("num_beams") or 1) > 1:
        what = "beam search (num_beams > 1)"
    elif get("constraints") is not None or get("force_words_ids") is not None:
        what = "constrained beam search (constraints / force_words_ids)"
    elif not get("do_sample") and (get("penalty_alpha") or 0) > 0 and (get("top_k") or 0) > 1:
        what = "contrastive search (penalty_alpha > 0 with top_k > 1)"
    elif get("dola_layers") is not None:
        what = "DoLa decoding (dola_layers)"
    else:
        return
    raise ValueError(
        f"{what} cannot be combined with speculative decoding, which reproduces greedy decoding or sampling "
        "exactly; drop those settings, or call generate without hf-spec (no custom_generate=hf_spec.generate, no "
        "drafter or assistant)")


class LmHeadInput:
    """While entered, the input of ``head`` (a target's ``lm_head``) at its latest forward in this thread:
    ``value``, ``[B, P, H]`` for the P positions whose logits the forward kept (``logits_to_keep``), ``None`` before
    the first. What :attr:`~hf_spec.drafters.base.VerifyOutput.hidden_states` gives the drafter and what
    ``hf-spec train-medusa`` trains heads on (its hook reads the same input). Forwards in other threads (calls on the
    same model at once) are not seen.
    """

    def __init__(self, head: torch.nn.Module):
        self.head, self.value, self._thread = head, None, threading.get_ident()

    def _hook(self, module, args, kwargs):
        if threading.get_ident() == self._thread:
            self.value = args[0] if args else next(iter(kwargs.values()), None)

    def __enter__(self) -> "LmHeadInput":
        self._handle = self.head.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()
        self.value = None


def speculative_decode(model, input_ids: torch.LongTensor, drafter: Drafter | None, *, streamer=None, **kwargs
                       ) -> SpeculativeOutput:
    """The loop itself, on already-prepared inputs (see :func:`generate` for the arguments).

    A batch is left-padded (``attention_mask [B, L]``, zeros first). Each row accepts its own number of
    tokens per step and stops on its own; a finished row leaves the batch (its cache rows are dropped), so it
    costs nothing afterwards. Per-row cache state is kept by :class:`~hf_spec.ragged.RaggedCache`.
    ``stopping_criteria`` must end every row (it holds at least ``max_length``); ``generate`` builds it.
    As transformers' decoding loops, it puts the new tokens into ``streamer`` (not the prompt: the caller
    does) and ends it, on an error too, so a ``TextIteratorStreamer`` consumer never waits forever.
    With ``generation_config.return_dict_in_generate`` and ``output_scores`` / ``output_logits``, the output
    carries one ``[B, V]`` float32 tensor per generated position (see :func:`_per_token`).
    ``media=`` (a dict of :data:`PREFILL_MODEL_INPUTS`: images, encoded or not) goes into the prompt's forward only;
    ``position_ids=`` (``generate``'s ``[R, B, L]`` multimodal RoPE positions) places the prompt and, offset as its
    last token's, every later token; :func:`generate` hands both on from ``generate``.
    ``generator=`` (a ``torch.Generator`` on the target's device): every random draw of a sampled call (the target's
    tokens, the acceptance's uniforms, the drafter's sampled tokens) comes from it, so a seeded call repeats
    whatever else uses torch's global generator meanwhile (other threads' calls); ``None``: the global one.
    """
    with ending_streamer(streamer), contextlib.ExitStack() as call:
        out = _speculative_decode(model, input_ids, drafter, streamer=streamer, call=call, **kwargs)
    if streamer is not None:
        streamer.end()
    return out


@torch.no_grad()
def _speculative_decode(
    model,
    input_ids: torch.LongTensor,
    drafter: Drafter | None,
    *,
    attention_mask: torch.Tensor | None = None,
    logits_processor: LogitsProcessorList | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig,
    num_speculative_tokens: int | str | AdaptiveK | None = None,
    num_tree_nodes: int | str | TreeSize | None = None,
    cache: DynamicCache | None = None,
    token_type_ids: torch.LongTensor | None = None,
    media: dict | None = None,
    position_ids: torch.LongTensor | None = None,
    streamer=None,
    event_listeners: Iterable[EventListener] | None = None,
    generator: torch.Generator | None = None,
    call: contextlib.ExitStack,
) -> SpeculativeOutput:
    """:func:`speculative_decode`'s body; ``call`` holds what must be undone when the call ends, on an error too."""
    _validate(model, input_ids, drafter, generation_config, cache, logits_processor)
    k_call, controller = plan_num_speculative_tokens(num_speculative_tokens, drafter)
    num_tree_nodes, sizer = _check_tree_nodes(num_tree_nodes, drafter)
    if drafter is not None and (num_tree_nodes or (sizer is not None and max(sizer.sizes) > 0)):
        check_tree_model(model)  # before any work (RaggedCache checks again at each tree's forward)
    bsz = input_ids.shape[0]
    if drafter is not None and bsz > 1 and positions_from_slots(model):
        raise ValueError(
            f"{type(model).__name__} places each key by its cache slot (its forward takes no position_ids: ALiBi "
            "biases or learned positions counted from the cache), so the slots a batch leaves empty where a row "
            "rejected drafts would move its later tokens: decode one sequence per call (batch size 1) with this "
            "model, or use plain generate for the batch")
    if drafter is not None and bsz > 1 and (window := slot_window(model)) is not None:
        raise ValueError(
            f"{type(model).__name__}'s local attention layers keep a window of {window} cache slots (not positions), "
            "so the slots a batch leaves empty where a row rejected drafts would narrow a row's window: decode one "
            "sequence per call (batch size 1) with this model, or use plain generate for the batch")
    if drafter is not None:
        check_key_selection(model, generation_config.max_length)
        check_block_forward(model)
    if streamer is not None and bsz > 1:
        raise ValueError("a streamer takes one sequence; use batch size 1, or event_listeners for a batch")
    logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
    if stopping_criteria is None or len(stopping_criteria) == 0:
        raise ValueError("stopping_criteria must include a max length; call through model.generate")
    device = model.device
    input_ids = input_ids.to(device, torch.long)  # generate's output is int64 whatever the prompt's integer dtype
    pad_len = _left_padding(attention_mask, input_ids)
    # multimodal RoPE (Qwen2-VL and its kin): generate hands position_ids [R, B, L] placing the tokens after an image
    # at their positions plus the image's deltas; each row's later tokens keep its last token's offset, as generate
    # extends them (one more per token)
    rope_rows = position_ids is not None and position_ids.dim() == 3 and position_ids.shape[1:] == input_ids.shape
    cached = _continued_length(model, cache, input_ids, pad_len, rope_rows)  # before any drafter work
    # token types as generate extends them: each new token takes its row's last prompt type (GPT-2 and BERT-style
    # embeddings read them at every position; a multimodal processor's all-text zeros change nothing)
    if token_type_ids is not None and token_type_ids.shape != input_ids.shape:
        raise ValueError(f"token_type_ids {tuple(token_type_ids.shape)} must have input_ids' shape "
                         f"{tuple(input_ids.shape)}")
    types_of_new = token_type_ids[:, -1].to(device) if token_type_ids is not None else None
    do_sample = bool(generation_config.do_sample)
    max_length = generation_config.max_length
    vocab_size = logit_rows(model)
    # the drafter of this call: a copy bound to it, so the caller's object never changes
    session = drafter.start(model, input_ids, generation_config, logits_processor, generator) \
        if drafter is not None else None
    user_listeners = list(event_listeners or [])
    listeners = [stats := SpecStats()] + user_listeners
    if controller is not None:
        # T_1 depends on the target, device, batch size and context length, not on the text: start from the
        # last call's with that shape
        controller.reset(k_call, drafter.max_num_speculative_tokens)
        if session.stops_when_unsure:  # k is a cap the drafter shortens itself: the controller says on or off
            controller.keep_drafter_k()
        controller.start_from(remembered_plain_times(model, bsz, input_ids.shape[1]))
        listeners.append(controller)
    if sizer is not None:
        sizer.reset()
        listeners.append(sizer)
    # drafters that read the target's hidden states get what its lm_head reads, as train-medusa's heads learned
    # from: the input of its latest forward (LmHeadInput); the last of output_hidden_states is that for most
    # architectures, not for Gemma 3n ([2, B, T, H]: its AltUp streams, combined before the final norm), and is
    # asked for only where the model has no output embeddings (transformers then keeps the other layers' as None)
    tap = hidden_kwargs = None
    if session is not None and session.needs_hidden_states:
        head = model.get_output_embeddings()
        if isinstance(head, torch.nn.Module):
            tap = call.enter_context(LmHeadInput(head))
        else:
            hidden_kwargs = {"output_hidden_states": -1}
    hidden_kwargs = hidden_kwargs or {}
    if drafter is not None and device.type == "cpu" and model.dtype == torch.float32:
        install_verify_linear(model)  # exact F.linear outside verify forwards; see hf_spec.kernels
    # rows the drafter wants the target's lm_head to project in its own forward (Medusa heads sharing it)
    head_rows = session.head_rows_per_position if tap is not None or hidden_kwargs else 0
    if head_rows and not route_extra_rows(model.get_output_embeddings()):
        head_rows = 0

    def hidden_of(out) -> torch.Tensor | None:
        """The target's last hidden states at the positions its forward ``out`` kept, for drafters that read them:
        taken right after that forward (a drafter's own use of the lm_head later must not replace them)."""
        return tap.value if tap is not None else out.hidden_states[-1] if hidden_kwargs else None

    def target_forward(width: int, *args, **kwargs):
        """A step's ``ragged.forward(model, *args, **kwargs)``, its :func:`hidden_of`, and for a verify forward
        (``width`` > 1) the drafter's rows projected in it (``[B, width, head_rows, V]``, or None) from the last
        ``width`` positions' hidden states. Plain steps, like the prefill, keep plain decoding's one-row product (a
        plain step of ``"auto"`` costs what plain decoding does); the drafter projects its rows itself after them."""
        if types_of_new is not None:
            kwargs["token_type_ids"] = types_of_new[active][:, None].expand(-1, args[0].shape[1])
        if not head_rows or width < 2:
            out = ragged.forward(model, *args, **kwargs)
            return out, hidden_of(out), None
        with extra_rows(model.get_output_embeddings(), lambda x: session.head_rows(x[:, -width:]).flatten(1, 2),
                        width * head_rows, head_rows) as extra:
            out = ragged.forward(model, *args, **kwargs)
        return out, hidden_of(out), None if extra.output is None else extra.output.unflatten(1, (width, head_rows))
    scores_out, logits_out = (([[] for _ in range(bsz)] if generation_config.return_dict_in_generate and flag else None)
                              for flag in (generation_config.output_scores, generation_config.output_logits))

    # per row: its sequence as transformers' batched generate sees it (own left padding, then tokens)
    rows = [input_ids[b] for b in range(bsz)]
    active = list(range(bsz))  # original indices of the rows still in the batch
    finished = [False] * bsz

    # per caller's listener (by its place in listeners: 1.. after the call's statistics, before any controller):
    # the latest event it was handed
    handed: dict[int, StepEvent] = {}

    def emit(event: StepEvent) -> None:
        for i, listener in enumerate(listeners):
            if 0 < i <= len(user_listeners):
                handed[i] = event
            listener(event)

    reasons: dict[int, str] = {}  # a finished row's finish reason (finish_reason)

    def finish_reasons(batch_rows) -> list[str | None]:
        """Each row's finish reason (:func:`finish_reason`), ``None`` while it runs."""
        return [reasons.get(b) if finished[b] else None for b in batch_rows]

    def abort_unfinished(exc_type, exc, tb) -> bool:
        """When the call raises after its first event: to each of the caller's listeners that was handed an event,
        one event with the rows still running after the last one it was handed (a listener that raised on an
        event had it handed too), ``aborted`` and finish reason ``"abort"``, so that metrics can close those
        requests (vLLM counts them as aborted). No forward happened; the call's own listeners (statistics,
        controllers) do not get it. A listener that raises here is logged, so the call's own error is what
        propagates."""
        if exc_type is None:
            return False
        for i, listener in enumerate(user_listeners, start=1):
            last = handed.get(i)
            running = [] if last is None else [row for row, done in zip(last.rows, last.finished) if not done]
            if not running:
                continue
            event = StepEvent(last.step + 1, 0, [[] for _ in running], [0] * len(running), [[] for _ in running],
                              0.0, 0.0, clock(device) - t0, [True] * len(running), rows=running, method=method,
                              finish_reasons=["abort"] * len(running), aborted=True)
            try:
                listener(event)
            except Exception:  # the call's own error matters more
                logger.exception("hf_spec: an event listener raised on the abort event")
        return False

    call.push(abort_unfinished)

    def append_until_stop(b: int, new: list[int], new_scores: torch.Tensor | None) -> list[int]:
        """Append tokens to row b one by one, checking the stopping criteria after each (exact stop). With
        ``output_scores``, ``new_scores [len(new), V]`` are the tokens' processed scores: kept for the output, and
        the criteria get the row's scores so far (a tuple of ``[1, V]``), as ``generate`` passes its own."""
        kept = []
        for j, tok in enumerate(new):
            rows[b] = torch.cat([rows[b], rows[b].new_tensor([tok])])
            kept.append(tok)
            so_far = None
            if scores_out is not None:
                scores_out[b].append(new_scores[j].to(torch.float32, copy=True))
                so_far = tuple(s[None] for s in scores_out[b])
            if row_stops(rows[b][None], so_far):
                finished[b] = True
                reasons[b] = finish_reason(rows[b][None])
                break
        return kept

    def finish_reason(ids: torch.LongTensor) -> str:
        """vLLM's finish reason of a row that stopped (``ids [1, L]``): ``"length"`` at ``max_length`` (vLLM's
        scheduler checks the length before EOS), unless a stop string ended it there too (vLLM's detokenizer then
        says ``"stop"``); ``"stop"`` for EOS, a stop string or another criterion before it."""
        if ids.shape[1] < max_length:
            return "stop"
        strings = [c for c in stopping_criteria if isinstance(c, StopStringCriteria)]
        return "stop" if any(bool(c(ids, None).any()) for c in strings) else "length"

    def row_stops(ids: torch.LongTensor, so_far) -> bool:
        """Whether the stopping criteria end a row (``ids [1, L]``). In a batch each criterion's answer must be a
        row's (``BoolTensor[1]``): one that judges the whole batch (one bool for every row, or a tensor indexed by
        the row's place in the batch) would stop rows where ``generate`` does not, so it is refused, naming it."""
        if bsz == 1:
            return bool(stopping_criteria(ids, so_far).any())
        done = False
        for criterion in stopping_criteria:
            answer = criterion(ids, so_far)
            if not (torch.is_tensor(answer) and answer.shape == (1,)):
                got = (f"a tensor of shape {list(answer.shape)}" if torch.is_tensor(answer)
                       else f"a {type(answer).__name__}")
                raise ValueError(
                    f"the stopping criterion {type(criterion).__name__} returned {got} for one row of a batch of {bsz}: "
                    "hf-spec calls stopping criteria one row at a time (input_ids [1, L], as rows gain different "
                    "numbers of tokens per step) and needs each row's answer, a BoolTensor of shape [1]; a criterion "
                    "that judges the whole batch at once (one bool for every row, or values indexed by the row's "
                    "place in the batch) cannot be applied so: make it judge a row from that row's input_ids alone, "
                    "or decode one sequence per call")
            done |= bool(answer)
        return done

    def put(emitted: list[list[int]]) -> None:
        """The streamer gets row 0's new tokens one per call (``LongTensor[1]``), as ``generate`` puts them."""
        if streamer is not None:
            for tok in emitted[0]:
                streamer.put(torch.tensor([tok]))

    def record(per_row, values: torch.Tensor, emitted: list[list[int]]) -> None:
        """Keep ``values [n_rows, width, V]``: for each active row, one entry per token it emitted this step."""
        if per_row is not None:
            for i, b in enumerate(active):
                per_row[b].extend(values[i, : len(emitted[i])].to(torch.float32, copy=True).unbind(0))

    def tell_drafter(step: int, hidden: torch.Tensor | None, num_drafted: torch.Tensor, num_accepted: torch.Tensor,
                     width: int, seconds: float, columns: torch.Tensor | None = None, path: torch.Tensor | None = None,
                     depths: torch.Tensor | None = None, head_logits: torch.Tensor | None = None,
                     positions: int | None = None) -> None:
        if session is not None:
            hidden = hidden[:, -width:] if hidden is not None else None
            if hidden is not None and columns is not None:  # a tree: the root, then the accepted path
                hidden = hidden.gather(1, columns[:, :, None].expand(-1, -1, hidden.shape[-1]))
            if head_logits is not None and columns is not None:
                head_logits = head_logits.gather(1, columns[:, :, None, None].expand(-1, -1, *head_logits.shape[2:]))
            try:
                session.update(VerifyOutput(step, num_drafted, num_accepted, hidden, seconds, path,
                                            width if positions is None else positions, depths, head_logits))
            except Exception as e:
                _note(e, f"raised by {type(session).__name__}.update at step {step}")
                raise

    t0, m0 = clock(device), measuring_seconds()  # every clock of the statistics waits for the device's queued work
    # ---- prefill: the target alone chooses each row's first token --------------------------------
    # the caller's cache object (generate's own, or one passed to continue from later) is filled in place only for
    # one row, where the ragged layout is plain decoding's (no holes, no dropped rows); a batch's rows accept
    # different counts (holes) and leave when done, a layout no later forward can read, so a batch decodes in a
    # cache of its own and the caller's stays empty: a later call given it recomputes the prompt (exact)
    ragged = RaggedCache(model.config, bsz, device, cache if bsz == 1 else None)
    if rope_rows:
        own_last = torch.tensor([input_ids.shape[1] - 1 - pad for pad in pad_len], device=device)
        offset = position_ids[:, :, -1].to(device) - own_last[None]
        ragged.position_offset = offset if bool(offset.any()) else None
    if cache is not None and getattr(cache, "offloading", False) and ragged.cache is not cache:
        own = ("a batch in a per-row cache of its own" if bsz > 1 else "a sliding-window model in a cache of its own "
               "whose window layers keep positions past the window (rejected drafts roll back exactly)")
        raise ValueError(
            f"cache_implementation='offloaded' (layers offloaded to the CPU between forwards): hf-spec decodes {own}, "
            "which does not offload, so the memory you chose to save would be spent; drop cache_implementation"
            + ("; or decode one sequence per call with an offloaded cache" if ragged.window is None else ""))
    if cached:  # the cache holds the prompt's first tokens: the prefill runs over the rest, as plain generate's does
        ragged.continue_from(cached)
    # one row: the caller's cache gets the call's tokens (decoded in it, or handed back by a sliding-window model)
    fills = cache is not None and (ragged.cache is cache or ragged.caller is cache)
    if fills and session is not None and session.resume(getattr(cache, CARRIED, None)):  # an earlier call's draft
        vars(cache).pop(CARRIED, None)  # cache, taken off the cache object: a call that fails half-way leaves none
    types = {} if token_type_ids is None else {"token_type_ids": token_type_ids[:, cached:].to(device)}
    # token types are the tokens' own: the rest of a continued prompt's, as generate slices them
    media = {k: v[:, cached:] if k.endswith("token_type_ids") else v for k, v in (media or {}).items()}
    # the prompt's positions as generate made them: an image's tokens sit at their grid's positions even where the
    # tokens after it need no offset
    positions = position_ids[..., cached:].to(device) if rope_rows else None
    out = ragged.forward(model, input_ids[:, cached:], input_ids.new_ones(input_ids[:, cached:].shape, dtype=torch.bool)
                         if attention_mask is None else attention_mask[:, cached:].to(device).bool(), **hidden_kwargs,
                         **types, **media, positions=positions, model_masks=bool(media))
    row_procs = row_processors(logits_processor, bsz)  # each row's view of per-row state (row b of the batch)
    scores = process_scores(row_procs, rows, out.logits[:, -1].float())
    first = _choose(scores, do_sample, generator).tolist()
    emitted = [append_until_stop(b, [first[b]], scores[b, None]) for b in range(bsz)]
    record(logits_out, out.logits[:, -1:], emitted)
    none = input_ids.new_zeros(bsz)
    verify_time = clock(device) - t0 - (measuring_seconds() - m0)  # without one-time kernel measurements
    tell_drafter(0, hidden_of(out), none, none, 1, verify_time, positions=input_ids.shape[1] - cached)
    prefill_s_per_token = verify_time / input_ids[:, cached:].numel()  # prices a drafter's catch-up (catch_up_cost)
    put(emitted)
    method = session.method if session is not None else None  # the drafter's label in events and statistics
    emit(StepEvent(0, 0, [[] for _ in active], [0] * bsz, emitted, 0.0, verify_time,
                   clock(device) - t0, list(finished), rows=list(active), method=method,
                   prompt_tokens=[input_ids.shape[1] - pad for pad in pad_len], finish_reasons=finish_reasons(active)))

    step = 0
    score_checks = {"probabilities": True}  # the look for probabilities: until a step has drafted under sampling
    while True:
        keep = [i for i, b in enumerate(active) if not finished[b]]
        if not keep:
            break
        if len(keep) < len(active):  # finished rows leave the batch
            index = torch.tensor(keep, dtype=torch.long, device=device)
            ragged.select(index)
            if session is not None:
                session.keep_rows(index)
            active = [active[i] for i in keep]
        step += 1
        n_rows = len(active)
        # ---- draft: the loop chooses k (fixed, or the controller's; 0 = a plain step) -----------------
        t_draft, m_draft = clock(device), measuring_seconds()
        decision = None
        sequences = [rows[b][pad_len[b]:] for b in active]  # each row's tokens without its padding
        if controller is not None:
            k_asked, decision = controller.decide()
            if k_asked > 0 and not controller.catch_up_pays(
                    k_asked, session.catch_up_cost(sequences) * prefill_s_per_token,
                    max(max_length - len(rows[b]) for b in active)):
                k_asked, decision = 0, controller.pending
        else:
            k_asked = k_call
        # per row: no more drafts than can still be emitted before max_length (the +1 is the target's token)
        budget = torch.tensor([max(0, min(k_asked, max_length - len(rows[b]) - 1)) for b in active], device=device)
        k_step = int(budget.max())
        sources = parents = None
        if k_step > 0:
            nodes = num_tree_nodes
            if sizer is not None:
                changes = len(sizer.choices)
                nodes = sizer.decide(step)
                if len(sizer.choices) > changes:  # a new size: recorded with the step, as the controller's k
                    decision = {**(decision or {}), "num_tree_nodes": nodes, "tree_reason": sizer.choices[-1][2]}
            try:
                proposal = session.draft_tree(sequences, k_step, nodes) if nodes else session.draft(sequences, k_step)
            except Exception as e:
                _note(e, f"raised by {type(session).__name__}.{'draft_tree' if nodes else 'draft'} at step {step} "
                         f"(k={k_step}{f', num_nodes={nodes}' if nodes else ''}; rows {active})")
                raise
            drafts, num_drafted, draft_q, parents, depths = _checked_draft(
                session, proposal, n_rows, k_step, vocab_size, do_sample, device, nodes, score_checks)
            if parents is None:  # a chain's tokens past a row's budget become filler (masked, never accepted)
                num_drafted = torch.minimum(num_drafted, budget)
            elif bool((budget < k_step).any()):  # a tree's nodes past a row's budget are dropped: they would sit
                # past max_length, where plain decoding never goes (GPT-2's wpe has none at n_positions); only near
                # max_length, so most steps skip the depth pass _checked_draft already made
                drafts, num_drafted, draft_q, parents = _within_budget(drafts, num_drafted, draft_q,
                                                                            parents, budget)
                depths = torch.minimum(depths, budget)  # a tree has a node at every depth above its deepest
            sources = session.last_sources
        else:
            drafts, num_drafted, draft_q, depths = input_ids.new_zeros(n_rows, 0), budget, None, None
        k = drafts.shape[1]
        t_verify, m_verify = clock(device), measuring_seconds()
        # ---- verify k+1 positions per row in one target forward -------------------------------
        last = torch.stack([rows[b][-1] for b in active])[:, None]
        block = torch.cat([last, drafts], dim=1)
        cols = torch.arange(k + 1, device=device)
        before = ragged.lengths  # forward() rebinds lengths, so this stays the count before the block
        with verify_linear(k > 0):
            out, hidden, head_logits = target_forward(k + 1, block, cols[None, :] <= num_drafted[:, None],
                                              logits_to_keep=k + 1, parents=parents, **hidden_kwargs)
        logits = out.logits[:, -(k + 1):].float()
        drafts_list = drafts.tolist()
        parents_list = parents.tolist() if parents is not None else None

        def process(cols, scores: torch.Tensor) -> torch.Tensor:
            """The call's processors on ``scores [n_rows x len(cols), V]`` (rows major): position j of a row scores
            the token after the row and the draft's tokens up to column j - 1 (its root path)."""
            if not reads_sequences(logits_processor):  # temperature, top-k, top-p...: all in one call
                return process_scores(logits_processor, None, scores)
            return process_scores(
                [row_procs[b] for b in active for _ in cols],
                [torch.cat([rows[b], rows[b].new_tensor(
                    _root_path(drafts_list[i], parents_list[i] if parents_list else None, j - 1))])
                 for i, b in enumerate(active) for j in cols], scores)

        q = draft_q  # the drafter's q (its scores' softmax) under sampling, else None
        path = columns = target_scores = None
        walked = chain_parents(n_rows, k, device) if parents is None else parents  # a chain: one child per node
        if do_sample:
            if device.type in LAZY_DEVICES and scores_out is None:
                # on a CPU a position is processed (the penalty, top-k, top-p's sort of the vocabulary) when the
                # rejection walk first reads it: the root and each node it moves to, not the positions after a rejection
                def target_probs(j: int) -> torch.Tensor:
                    return process(range(j, j + 1), logits[:, j].contiguous()).softmax(dim=-1)
            else:
                target_scores = process(range(k + 1), logits.flatten(0, 1)).view_as(logits)  # every position at once
                target_probs = target_scores.softmax(dim=-1)
            num_accepted, path, next_token = speculative_sample_tree(drafts, walked, q, target_probs, generator,
                                                                     num_drafted)
        else:
            target_scores = process(range(k + 1), logits.flatten(0, 1)).view_as(logits)  # every position at once
            num_accepted, path, next_token = greedy_accept_tree(drafts, walked, target_scores, num_drafted)
        if parents is None:  # a chain: its accepted path is its first num_accepted tokens
            path = None
        if path is not None:  # a tree: the verified positions along the accepted path, the root (column 0) first
            columns = torch.cat([path.new_zeros(n_rows, 1), (path + 1).clamp(min=0)], dim=1)
        n_acc, nxt = num_accepted.tolist(), next_token.tolist()
        # each row's accepted nodes, root first (a chain's are its first n_acc tokens): its tokens, and the event's
        nodes = [list(range(n)) for n in n_acc] if path is None else [p[:n] for p, n in zip(path.tolist(), n_acc)]
        accepted_tokens = [[drafts_list[i][j] for j in nodes[i]] for i in range(n_rows)]
        along = (lambda t: t) if columns is None else \
            (lambda t: t.gather(1, columns[:, :, None].expand(-1, -1, t.shape[-1])))
        step_scores = along(target_scores) if scores_out is not None else None
        emitted = [append_until_stop(b, accepted_tokens[i] + [nxt[i]], None if step_scores is None else step_scores[i])
                   for i, b in enumerate(active)]
        record(logits_out, along(logits), emitted)
        # each row's cache keeps its sequence minus its last token, which the next forward feeds
        if path is None:
            ragged.truncate(before + 1 + num_accepted)
        else:
            ragged.keep_path(num_accepted, path)
        now, m_now = clock(device), measuring_seconds()
        # the step's times without one-time kernel measurements (hf_spec.kernels.measuring_seconds): adaptive k, the
        # tree size and the hybrid drafter judge by them; time_s (the call's clock) keeps everything
        draft_s, verify_s = t_verify - t_draft - (m_verify - m_draft), now - t_verify - (m_now - m_verify)
        tell_drafter(step, hidden, num_drafted, num_accepted, k + 1, verify_s, columns, path, depths, head_logits)
        put(emitted)
        ndr = num_drafted.tolist()
        emit(
            StepEvent(
                step, k_step, [drafts_list[i][: ndr[i]] for i in range(n_rows)],
                [min(n_acc[i], len(emitted[i]) - 1) for i in range(n_rows)], emitted,
                draft_s, verify_s, now - t0, [finished[b] for b in active], policy=decision,
                rows=list(active), sources=sources,
                parents=[parents_list[i][: ndr[i]] for i in range(n_rows)] if parents_list else None,
                positions=k + 1,
                accepted_path=[nodes[i][: len(emitted[i])] for i in range(n_rows)],
                method=method, finish_reasons=finish_reasons(active),
            )
        )
    if session is not None:
        session.finish([row[input_ids.shape[1]:] for row in rows])
    if controller is not None:
        remember_plain_times(model, bsz, input_ids.shape[1], controller.plain_times)
    logger.info("hf_spec: %s", stats.summary())
    kept = None
    if ragged.cache is cache is not None:  # one row: the caller's cache as generate leaves it, the sequence but its
        crop_cache_to(cache, len(rows[0]) - 1)  # last token (a stop inside an accepted run left the run's rest in it)
        kept = cache
    elif fills and ragged.hand_back(len(rows[0]) - 1):  # a sliding-window model decoded in a cache of its own
        kept = cache
    if kept is not None:  # what the drafter carries to a call continuing from this cache; none drops an earlier
        state = session.carry_over() if session is not None else None  # call's (a draft cache would linger)
        if state is not None:
            setattr(cache, CARRIED, state)
        else:
            vars(cache).pop(CARRIED, None)
    return SpeculativeOutput(sequences=_right_pad(rows, generation_config), stats=stats, cache=kept,
                             scores=_per_token(scores_out, generation_config),
                             logits=_per_token(logits_out, generation_config))


def _note(error: BaseException, note: str) -> None:
    """Say which drafter method raised ``error`` (a note under its traceback, Python 3.11+)."""
    if hasattr(error, "add_note"):
        error.add_note(note)


def _check_tree_nodes(num_tree_nodes, drafter: Drafter | None) -> tuple[int, TreeSize | None]:
    """A call's ``num_tree_nodes`` as ``(nodes, None)`` (0: chains) or ``(0, a fresh copy of the TreeSize)`` for
    ``"auto"`` or a :class:`~hf_spec.adaptive.TreeSize`.

    Raises:
        ValueError: not an integer >= 0, ``"auto"`` or a ``TreeSize``, or a tree asked of a drafter that drafts
            chains only.
    """
    if num_tree_nodes is None:
        return 0, None
    sizer = None
    if isinstance(num_tree_nodes, TreeSize):
        sizer = copy.copy(num_tree_nodes)
    elif isinstance(num_tree_nodes, str) and num_tree_nodes == "auto":
        sizer = TreeSize()
    elif isinstance(num_tree_nodes, bool) or not isinstance(num_tree_nodes, numbers.Integral) or num_tree_nodes < 0:
        raise ValueError(f"num_tree_nodes must be an integer >= 0 (0: a chain) or \"auto\", got {num_tree_nodes!r}")
    else:
        num_tree_nodes = int(num_tree_nodes)  # numpy integers too, as num_speculative_tokens
    if drafter is not None and (sizer is not None or num_tree_nodes):
        name, own_tree = type(drafter).__name__, type(drafter).draft_tree is not Drafter.draft_tree
        inner = getattr(drafter, "model_drafter", None)  # a hybrid draws trees where its model drafter does
        if drafter.drafts_trees and not own_tree:
            raise ValueError(f"num_tree_nodes={num_tree_nodes}: {name} sets drafts_trees = True but does not define "
                             "draft_tree(sequences, k, num_nodes); define it (docs/architecture.md, 'Writing a "
                             "drafter'), or drop num_tree_nodes")
        if not drafter.drafts_trees and own_tree and inner is None:
            raise ValueError(f"num_tree_nodes={num_tree_nodes}: {name} defines draft_tree but its drafts_trees is "
                             "False; set drafts_trees = True on the class to draft trees, or drop num_tree_nodes")
        if not drafter.drafts_trees and inner is not None:
            raise ValueError(f"num_tree_nodes={num_tree_nodes}: the hybrid drafter's model source ({inner.method}) "
                             "drafts chains only; drop num_tree_nodes, or give the hybrid a model drafter that "
                             "drafts trees (DraftModelDrafter, MedusaDrafter)")
        if not drafter.drafts_trees:
            raise ValueError(f"num_tree_nodes={num_tree_nodes}: the {drafter.method} drafter drafts chains only; drop "
                             "num_tree_nodes, or use a drafter that drafts trees (MedusaDrafter, DraftModelDrafter, "
                             "SuffixDrafter, HybridDrafter)")
    return (0, sizer) if sizer is not None else (num_tree_nodes, None)


def _within_budget(tokens, num_drafted, scores, parents, budget):
    """A batch of draft trees without the nodes deeper than each row's ``budget [B]`` (the drafted tokens it can
    still emit before ``max_length``): ``(tokens [B, N], num_drafted [B], scores [B, N, V] or None, parents [B, N])``
    with each row's kept nodes first, in their order, and parents re-indexed. A kept node's ancestors are
    shallower, so kept too: what remains is a tree, verified and accepted like any other (the greedy and the
    recursive rejection rules are exact for every tree)."""
    cols = torch.arange(tokens.shape[1], device=tokens.device)
    real = cols[None, :] < num_drafted[:, None]
    keep = real & (tree_depths(parents, num_drafted) <= budget[:, None])
    if bool((keep == real).all()):
        return tokens, num_drafted, scores, parents
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices  # kept nodes first, in order
    new_index = keep.to(torch.long).cumsum(dim=1) - 1  # a kept node's index after the drop
    moved = parents.gather(1, order)
    num_drafted = keep.sum(dim=1)
    parents = torch.where((moved >= 0) & (cols[None, :] < num_drafted[:, None]),
                          new_index.gather(1, moved.clamp(min=0)), -1)
    if scores is not None:
        scores = scores.gather(1, order[:, :, None].expand_as(scores))
    return tokens.gather(1, order), num_drafted, scores, parents


def _checked_draft(session: Drafter, out, n_rows: int, k: int, vocab_size: int, do_sample: bool, device,
                   num_tree_nodes: int = 0, score_checks: dict | None = None):
    """A drafter's ``draft`` (or ``draft_tree``) output, checked before the target sees it: ``(LongTensor[B, k' <= k],
    LongTensor[B] in 0..k', q [B, k', V] or None, parents [B, k'] or None, depths [B] or None)``, tokens and
    counts moved to ``device``; ``q`` is the drafter's scores as probabilities (a softmax) under sampling, ``None``
    under greedy decoding (where scores are not read) or for a deterministic drafter; for a tree, ``depths`` is each
    row's depth (from the check's own depth pass, so the loop tells the drafter without a second one), ``None`` for a
    chain; a drafter that samples must return its scores (without them the acceptance rule would take its tokens as
    certain, and sampling would not be exact), as logits of the distribution each token was drawn from: every real
    column a distribution over the target's vocabulary (no NaN, not all -inf), not probabilities, and giving its
    own drafted token a probability above 0. The NaN and zero checks read the drafted tokens' entries only, and
    with one host sync per step; the look for probabilities (a pass over the vocabulary) runs while
    ``score_checks["probabilities"]`` is true, which the first step with a drafted token under sampling clears (a
    drafter that returns probabilities does so at every step).

    Raises:
        ValueError: anything else, naming the drafter and what it returned.
    """
    name = type(session).__name__
    call = f"draft_tree(rows, k={k}, num_nodes={num_tree_nodes})" if num_tree_nodes else f"draft(rows, k={k})"

    def bad(what: str):
        if num_tree_nodes or (isinstance(out, tuple) and len(out) == 4):
            form = (f"(tokens LongTensor[{n_rows}, N], num_drafted LongTensor[{n_rows}] in 0..N, scores [B, N, V] or None, "
                    f"parents LongTensor[{n_rows}, N]) with N <= num_nodes nodes at most k deep")
        else:
            form = (f"(tokens LongTensor[{n_rows}, k' <= {k}], num_drafted LongTensor[{n_rows}] in 0..k', scores "
                    "[B, k', V] or None)")
        return ValueError(f"{name}.{call} for {n_rows} rows returned {what}; it must return {form}: see "
                          "docs/architecture.md, 'Writing a drafter'")

    if not (isinstance(out, tuple) and len(out) in (3, 4)):
        raise bad(f"{type(out).__name__} {len(out) if isinstance(out, (tuple, list)) else ''}".strip()
                  + " instead of a 3-tuple (a chain) or a 4-tuple (a tree: parents last)")
    tokens, num_drafted, scores = out[:3]
    parents = out[3] if len(out) == 4 else None
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.shape[0] != n_rows \
            or (parents is None and tokens.shape[1] > k) \
            or tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise bad(f"tokens of shape {shape} and dtype {getattr(tokens, 'dtype', None)}")
    if not isinstance(num_drafted, torch.Tensor) or tuple(num_drafted.shape) != (n_rows,) \
            or num_drafted.is_floating_point() or num_drafted.is_complex() or num_drafted.dtype == torch.bool:
        raise bad(f"num_drafted {num_drafted!r}")
    try:
        tokens, num_drafted = tokens.to(device=device, dtype=torch.long), num_drafted.to(device=device, dtype=torch.long)
    except (RuntimeError, NotImplementedError) as e:  # a meta tensor, a device this process cannot read
        raise bad(f"tensors on {tokens.device} that cannot be moved to the target's device {device} ({e})") from None
    if n_rows and (int(num_drafted.min()) < 0 or int(num_drafted.max()) > tokens.shape[1]):
        raise bad(f"num_drafted {num_drafted.tolist()} for {tokens.shape[1]} token columns")
    cols = torch.arange(tokens.shape[1], device=tokens.device)
    real = tokens[cols[None, :] < num_drafted.to(tokens.device)[:, None]]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab_size):
        raise bad(f"token ids outside the target's vocabulary 0..{vocab_size - 1} ({int(real.min())}..{int(real.max())})")
    if scores is not None and (not isinstance(scores, torch.Tensor) or tuple(scores.shape[:2]) != tuple(tokens.shape)
                               or scores.dim() != 3):
        raise bad(f"scores of shape {tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__}")
    if do_sample and session.returns_scores and scores is None and tokens.shape[1] > 0 and parents is None:
        raise bad("no scores under sampling although returns_scores is True")  # a tree without scores: deterministic
    q = None
    if do_sample and scores is not None:  # q: read by the acceptance rule under sampling only
        if scores.shape[2] != vocab_size:
            raise bad(f"scores over {scores.shape[2]} tokens; the target scores {vocab_size} (its logit rows: pad or "
                      "cut the drafter's logits to them, -inf where the drafter has no token)")
        if scores.is_complex() or scores.dtype == torch.bool:
            raise bad(f"scores of dtype {scores.dtype} (logits: a float tensor)")
        try:
            scores = scores.to(device)
        except (RuntimeError, NotImplementedError) as e:
            raise bad(f"scores on {scores.device} that cannot be moved to the target's device {device} ({e})") from None
        q = scores.float().softmax(dim=-1)
        real_cols = cols[None, :] < num_drafted[:, None]
        at = tokens.clamp(0, vocab_size - 1)[:, :, None]  # filler columns: any id, masked by real_cols
        # NaN, +inf or an all -inf column make the whole column's softmax NaN: its drafted token's q shows it
        flags = [real_cols.any(), (q.gather(2, at).squeeze(2).isnan() & real_cols).any(),
                 ((scores.gather(2, at).squeeze(2) == float("-inf")) & real_cols).any()]
        look = score_checks is None or score_checks.get("probabilities", True)
        if look:
            values = scores.float()
            low, high = values.aminmax(dim=-1)
            flags.append(((low >= 0) & (high <= 1) & ((values.sum(dim=-1) - 1).abs() < 1e-3) & real_cols).any())
        drafted, nan, zero, *probabilities = torch.stack(flags).tolist()  # one host sync
        if nan:
            raise bad("scores with NaN, +inf, or every token -inf in a drafted column (they must be the "
                      "logits each token was drawn from)")
        if probabilities and probabilities[0]:
            raise bad("scores that look like probabilities (in 0..1, summing to 1); return logits, the loop "
                      "takes their softmax: probs.log() where you have q")
        if zero:
            raise bad("a drafted token that its own scores give probability 0 (logit -inf): each token must "
                      "be drawn from the scores returned for it")
        if look and drafted and score_checks is not None:
            score_checks["probabilities"] = False
    if parents is not None:
        if not isinstance(parents, torch.Tensor) or tuple(parents.shape) != tuple(tokens.shape) \
                or parents.is_floating_point():
            raise bad(f"parents {parents!r} (a tree's parents: LongTensor of the tokens' shape)")
        parents = parents.to(device=device, dtype=torch.long)
        parents = torch.where(cols[None, :] < num_drafted[:, None], parents, -1)  # filler nodes: never read
        try:
            depth = tree_depths(parents, num_drafted)
        except ValueError as e:
            raise bad(f"a tree whose {e}") from None
        if n_rows and tokens.shape[1] and int(depth.max()) > k:
            raise bad(f"a tree {int(depth.max())} tokens deep (a tree is at most k deep)")
        if num_tree_nodes and tokens.shape[1] > num_tree_nodes:
            raise bad(f"a tree of {tokens.shape[1]} nodes (at most num_tree_nodes={num_tree_nodes})")
        depths = depth.amax(dim=1) if tokens.shape[1] else num_drafted.new_zeros(n_rows)
        return tokens, num_drafted, q, parents, depths
    return tokens, num_drafted, q, parents, None


def _root_path(tokens: list[int], parents: list[int] | None, node: int) -> list[int]:
    """The drafted tokens from the root down to ``node`` (included; ``-1``: none): a chain's first ``node + 1``
    tokens, or a tree's root path."""
    if parents is None:
        return tokens[: node + 1]
    path = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def plan_num_speculative_tokens(num_speculative_tokens, drafter: Drafter | None) -> tuple[int, AdaptiveK | None]:
    """One call's k, decided once: ``(k, None)`` for a fixed k, or ``(the drafter's k, controller)`` for
    ``"auto"`` / an :class:`~hf_spec.adaptive.AdaptiveK` (which measures the drafter's k after ``k_min``): a
    copy of the one given, reset by the loop, so one ``AdaptiveK`` can configure many calls, threads included.

    Args:
        num_speculative_tokens: an int >= 1, ``"auto"``, an ``AdaptiveK``, or ``None`` (the drafter's own k).
        drafter: the call's drafter; ``None`` (plain decoding) gives ``(0, None)`` after checking the value.

    Raises:
        ValueError: not one of the above, or a fixed k above what the drafter can propose per step.
    """
    controller = make_controller(num_speculative_tokens)
    if controller is None and num_speculative_tokens is not None:
        num_speculative_tokens = check_num_speculative_tokens(num_speculative_tokens)
    if drafter is None:
        return 0, None
    if controller is not None:
        # this call's own copy (its settings, fresh state), so concurrent calls never share a controller's state;
        # what it collects across calls in shared containers (CycleK.calls) still accumulates
        return drafter.num_speculative_tokens, copy.copy(controller)
    k = drafter.num_speculative_tokens if num_speculative_tokens is None else num_speculative_tokens
    cap = drafter.max_num_speculative_tokens
    if cap is not None and k > cap:
        raise ValueError(f"num_speculative_tokens={k} but this {drafter.method} drafter proposes at most {cap} tokens "
                         f"per step; use k <= {cap}, leave k unset (the drafter's own) or \"auto\"")
    return k, None


def _left_padding(attention_mask: torch.Tensor | None, input_ids: torch.LongTensor) -> list[int]:
    """Per-row count of left padding tokens; raises on right padding or an all-padding row."""
    if attention_mask is None:
        return [0] * input_ids.shape[0]
    mask = attention_mask.to(torch.long).cpu()
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(input_ids.shape)}")
    pads = (mask == 0).sum(dim=1)
    left = (mask.cumsum(dim=1) == 0).sum(dim=1)
    if bool((pads != left).any()):
        b = int((pads != left).nonzero()[0, 0])
        if bool(mask[b, -1] == 0):
            if mask.shape[0] == 1:
                raise ValueError("the prompt is right-padded (its attention_mask ends in 0): drop the trailing padding "
                                 "tokens, or pad on the left: tokenizer.padding_side = 'left'")
            raise ValueError("the batch is right-padded; pad on the left: tokenizer.padding_side = 'left'")
        raise ValueError(f"row {b} of attention_mask masks tokens between its first and last token (a 0 after a 1): "
                         "hf-spec takes left padding only (zeros, then ones); drop the masked tokens from the row "
                         "and pad it on the left. Passed no attention_mask? transformers made this one from the pad "
                         "token appearing inside the prompt (a separator such as Qwen's <|endoftext|>): pass "
                         "attention_mask=torch.ones_like(input_ids) to attend to it")
    if bool((pads == mask.shape[1]).any()):
        raise ValueError("empty prompt: a batch row is all padding; give every row at least one token")
    return pads.tolist()


def generated_length(tokens: list[int], eos_token_id) -> int:
    """How many of one output row's new ``tokens`` were generated: up to and including its first EOS
    (what follows is padding, as in transformers' batched ``generate``)."""
    eos = set(eos_token_id if isinstance(eos_token_id, (list, tuple)) else
              [eos_token_id] if eos_token_id is not None else [])
    return next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))


def _per_token(per_row: list[list[torch.Tensor]] | None, generation_config: GenerationConfig
               ) -> tuple[torch.Tensor, ...] | None:
    """Per-row lists of ``[V]`` scores, one per emitted token, as ``generate`` reports them: a tuple with one
    ``[B, V]`` tensor per generated position. A row that ended earlier gets, past its end, the scores of the pad
    token that fills its sequence there (0 for it, -inf elsewhere): plain ``generate`` computes real logits
    after a row's EOS; speculative decoding drops finished rows, so it has none to report."""
    if per_row is None:
        return None
    width = max(len(r) for r in per_row)
    pad = _pad_token(generation_config)
    filler = None
    out = []
    for t in range(width):
        column = []
        for r in per_row:
            if t < len(r):
                column.append(r[t])
            else:
                if filler is None:
                    filler = torch.full_like(per_row[0][0], float("-inf"))
                    filler[pad] = 0.0
                column.append(filler)
        out.append(torch.stack(column))
    return tuple(out)


def _pad_token(generation_config: GenerationConfig) -> int:
    """The id that fills rows that ended early: the pad token, else the (first) EOS, else 0 (as ``generate``)."""
    pad = generation_config.pad_token_id
    if pad is None:
        eos = generation_config.eos_token_id
        pad = (eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else 0
    return int(pad) if not isinstance(pad, torch.Tensor) else int(pad.flatten()[0])


def _right_pad(rows: list[torch.LongTensor], generation_config: GenerationConfig) -> torch.LongTensor:
    """Stack rows of different lengths into ``LongTensor[B, max_len]``, filling with the pad token (as
    transformers' batched generate does for rows that ended early)."""
    width = max(len(r) for r in rows)
    out = rows[0].new_full((len(rows), width), _pad_token(generation_config))
    for b, r in enumerate(rows):
        out[b, : len(r)] = r
    return out


def _choose(scores: torch.Tensor, do_sample: bool, generator: torch.Generator | None) -> torch.Tensor:
    """Pick one token per row from processed scores ``[B, V]``: argmax, or a sample."""
    if do_sample:
        return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator).squeeze(1)
    return scores.argmax(dim=-1)
