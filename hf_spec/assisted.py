"""One line that moves existing transformers code onto hf-spec's loop: :func:`enable_drafters`.

transformers' own speculative decoding is asked for with ``assistant_model=`` (a draft model, with
``num_assistant_tokens``) or ``prompt_lookup_num_tokens=`` (prompt lookup, with ``max_matching_ngram_size``).
After :func:`enable_drafters`, the same calls run hf-spec's loop (:func:`hf_spec.loop.generate`) with the matching
drafter through the public ``custom_generate`` hook, and an hf-spec
:class:`~hf_spec.drafters.base.Drafter` is accepted as ``assistant_model`` too; return values, streamers, stop
strings and statistics behave as in ``generate``. Everything else goes to the model class's own ``generate``
unchanged. No private transformers function is used.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import types

import torch
from transformers import GenerationConfig, StoppingCriteriaList, StopStringCriteria

from .drafters.base import Drafter, check_drafter_type, check_num_speculative_tokens
from .drafters.draft_model import DraftModelDrafter
from .drafters.ngram import NgramDrafter
from .loop import ASSISTED_SETTINGS, ending_streamer, unread_model_inputs
from .loop import generate as spec_generate

__all__ = ["enable_drafters", "disable_drafters", "drafter_for"]

logger = logging.getLogger("hf_spec")


def enable_drafters(model):
    """Run ``model.generate``'s speculative decoding calls on hf-spec's loop. Returns ``model``.

    After it, on this model instance:

    - ``generate(..., assistant_model=draft_model)`` (a transformers model with the target's tokenizer) runs a
      :class:`~hf_spec.drafters.draft_model.DraftModelDrafter`; ``num_assistant_tokens=N`` sets k (else the
      drafter's default k); ``num_assistant_tokens_schedule="heuristic"`` maps to hf-spec's adaptive k
      (``"auto"``); ``assistant_confidence_threshold=p`` sets the drafter's ``confidence_threshold`` (a row stops
      drafting after a token the draft gives less than p; unset: the drafter's default). transformers also moves
      that threshold during a call (with scikit-learn installed); hf-spec keeps it fixed. The output is exact
      either way.
    - ``generate(..., prompt_lookup_num_tokens=N, max_matching_ngram_size=M)`` runs an
      :class:`~hf_spec.drafters.ngram.NgramDrafter` with k = N and suffixes of M (default 2, as transformers)
      down to 1 tokens.
    - ``generate(..., assistant_model=<hf-spec Drafter>)`` runs that drafter.

    The settings may come from the call or from the generation config (``generation_config=``, whose unset values
    come from the model's, as ``generate`` merges them);
    for a draft model, ``num_assistant_tokens``, ``num_assistant_tokens_schedule`` and
    ``assistant_confidence_threshold`` also from the draft's own generation config, where transformers 5 reads
    them (the call's win over the draft's, the draft's over the target model's).
    A different-tokenizer draft (``assistant_tokenizer=``, universal assisted decoding), a draft model with
    ``assistant_ensemble_weight`` (transformers' lossy ensemble verification; hf-spec verifies losslessly), an
    encoder-decoder target (T5, BART) with prompt lookup or an encoder-decoder assistant, a call with model inputs
    hf-spec's loop does not feed the target (those read at every step besides the tokens, Mllama's
    ``cross_attention_mask``: :func:`hf_spec.loop.unread_model_inputs`; images run on hf-spec's loop), and every call
    without an assistant, go to transformers' own
    ``generate`` unchanged; hf-spec's own settings
    (:data:`SPEC_SETTINGS`: ``drafter=``, ``num_speculative_tokens=``, ...) on such a call raise a ``ValueError``
    saying so, where transformers would name them as unused model arguments.

    The call returns what ``generate`` returns: the sequences tensor, or with ``return_dict_in_generate=True``
    a :class:`hf_spec.loop.SpeculativeOutput` (transformers' ``GenerateDecoderOnlyOutput``: ``sequences``,
    ``scores`` / ``logits`` when asked, plus ``stats``). ``streamer=`` and ``stop_strings=`` (with
    ``tokenizer=``) work as in ``generate``. Idempotent; :func:`disable_drafters` undoes it.

    The model gets a bound method, not a closure over it: ``copy.deepcopy(model)`` is enabled too and runs the
    copy's own weights; a pickled model unpickles with transformers' plain ``generate`` (enable it again). A shallow
    ``copy.copy(model)`` shares the original's bound method, so its calls run as the original's (its generation
    config): call ``enable_drafters`` on the copy, which binds it to the copy.
    """
    inner = _wrapped(model)
    bound = inner.__dict__.get("generate")
    # a shallow copy (copy.copy) of an enabled model holds the original's bound method: bound here to the copy
    if not (getattr(bound, "_hf_spec_enabled", False) and getattr(bound, "__self__", None) is inner):
        inner.generate = types.MethodType(generate, inner)
    return model


def disable_drafters(model):
    """Undo :func:`enable_drafters`: ``model.generate`` is the model class's own again. Returns ``model``;
    a model that was not enabled is returned unchanged."""
    inner = _wrapped(model)
    if getattr(inner.__dict__.get("generate"), "_hf_spec_enabled", False):
        del inner.generate
    return model


#: the settings of hf-spec's loop (``hf_spec.generate``'s own arguments), which transformers' generate does not read
SPEC_SETTINGS = ("drafter", "num_speculative_tokens", "num_tree_nodes", "spec_streamer", "event_listeners")


def _unread_inputs(model, kwargs: dict) -> list[str]:
    """:func:`~hf_spec.loop.unread_model_inputs` of a ``generate`` call's keyword arguments: those that name an input
    of ``model``'s forward (``pixel_values``, ...), not a generation setting."""
    inputs = inspect.signature(model.forward).parameters
    return unread_model_inputs({k: v for k, v in kwargs.items() if k in inputs})


def _wrapped(model):
    """The model whose ``generate`` a call on ``model`` runs: a ``torch.compile``'d model (``OptimizedModule``) has
    no ``generate`` of its own and hands the attribute on to the module it wraps (``_orig_mod``), so the bound
    method goes there (set on the wrapper, it landed there anyway, bound to the wrapper, and broke deepcopy and
    pickling of both)."""
    while not hasattr(type(model), "generate") and isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
        model = model._orig_mod
    return model


def drafter_for(model, kwargs: dict) -> Drafter | None:
    """The hf-spec drafter that stands for a ``generate`` call's transformers assistant settings, or ``None``
    when the call asks for none, or for what transformers' own assisted generation runs and hf-spec does not: another
    tokenizer's assistant (``assistant_tokenizer=``) or lossy ensemble verification (``assistant_ensemble_weight``
    with a draft model). Removes the settings it used from ``kwargs``. Settings are read as ``generate`` merges
    them (:func:`call_config`).

    Args:
        model: the target.
        kwargs: the keyword arguments of a ``generate`` call (changed in place).

    Both ``assistant_model`` and ``prompt_lookup_num_tokens``: prompt lookup, as transformers (with a warning).

    Raises:
        ValueError: a k < 1; ``assistant_ensemble_weight`` with prompt lookup or an hf-spec drafter as the assistant;
            or stop strings in the model's own generation config (transformers merges them into
            every call and cannot build them for a custom loop; the message says how to move them to the call).
    """
    config = call_config(model, kwargs)

    def setting(key):
        return kwargs[key] if kwargs.get(key) is not None else getattr(config, key, None)

    assistant = kwargs.get("assistant_model")
    lookup = setting("prompt_lookup_num_tokens")
    if setting("assistant_ensemble_weight") is not None and (assistant is not None or lookup is not None):
        # transformers' lossy ensemble verification (w * p_target + (1 - w) * q_draft), which hf-spec does not do
        if isinstance(assistant, torch.nn.Module) and lookup is None:
            return None  # the caller asked for it by name: transformers' own assisted generation runs it
        raise ValueError("assistant_ensemble_weight (transformers' lossy ensemble verification) needs a draft model's "
                         "logits inside transformers' own assisted generation; it runs with assistant_model=<a model> "
                         "and no prompt lookup, while hf-spec's drafters verify losslessly: drop "
                         "assistant_ensemble_weight, or pass a draft model as assistant_model")
    if (assistant is not None or lookup is not None) and not isinstance(assistant, Drafter) and (
            (model.config.is_encoder_decoder and (assistant is None or assistant.config.is_encoder_decoder))
            or _unread_inputs(model, kwargs)):
        # an encoder-decoder target (T5, BART), or images, audio, ...: inputs hf-spec's loop does not feed the target;
        # transformers' own assisted generation runs both
        logger.info("hf_spec: transformers' own assisted generation runs this call (%s)",
                    "an encoder-decoder target" if model.config.is_encoder_decoder else "model inputs hf-spec's loop "
                    "does not read")
        return None
    if assistant is not None and lookup is not None:  # transformers then runs prompt lookup
        logger.warning("hf_spec: both assistant_model and prompt_lookup_num_tokens=%s are set; as transformers' "
                       "generate, the call runs prompt lookup (n-gram) and does not use the assistant", lookup)
        assistant = None
    if isinstance(assistant, Drafter):
        drafter = assistant
        if setting("num_assistant_tokens") is not None and kwargs.get("num_speculative_tokens") is None:
            kwargs["num_speculative_tokens"] = setting("num_assistant_tokens")
    elif assistant is not None:
        check_drafter_type(assistant, "assistant_model", models=True)  # a spec string, a class: said, not crashed on
        if kwargs.get("assistant_tokenizer") is not None:
            return None  # universal assisted decoding (another tokenizer): transformers' own loop

        def assistant_setting(key) -> tuple:
            """(value, where it came from, for messages): transformers 5 reads these from the assistant's own
            generation config (AssistedCandidateGenerator): the call's first here (keyword, then its
            generation_config=), then the assistant's, then the target's."""
            given = kwargs.get("generation_config")
            for source, value in (("", kwargs.get(key)), (" (in the call's generation_config)", getattr(given, key, None)),
                                  (" (in the draft's generation_config)",
                                   getattr(getattr(assistant, "generation_config", None), key, None)),
                                  (" (in the model's generation_config)", getattr(model.generation_config, key, None))):
                if value is not None:
                    return value, source
            return None, ""

        threshold, _ = assistant_setting("assistant_confidence_threshold")
        k, source = assistant_setting("num_assistant_tokens")
        if k is not None:
            try:
                k = check_num_speculative_tokens(k, "num_assistant_tokens")
            except ValueError:
                raise ValueError(f"num_assistant_tokens{source} must be an integer >= 1, got {k!r}: it is the draft's "
                                 "k; use 1..12 (3 is a good start), or drop assistant_model= to decode without "
                                 "speculation") from None
        drafter = DraftModelDrafter(assistant, k,
                                    **({} if threshold is None else {"confidence_threshold": float(threshold)}))
        if assistant_setting("num_assistant_tokens_schedule")[0] in ("heuristic", "heuristic_transient"):
            kwargs["num_speculative_tokens"] = "auto"
    elif lookup is not None:
        drafter = NgramDrafter(check_num_speculative_tokens(lookup, "prompt_lookup_num_tokens"),
                               max_ngram=setting("max_matching_ngram_size") or 2, min_ngram=1)
    else:
        return None
    if model.generation_config.stop_strings is not None:
        # generate fills every unset value of the call's config from the model's, so these reach transformers,
        # which cannot build them for a custom loop (it drops tokenizer= first) and would raise a misleading error
        raise ValueError(
            f"the model's generation_config sets stop_strings={model.generation_config.stop_strings!r}, which "
            "transformers cannot build for a custom decoding loop; move them to the call: "
            "stop = model.generation_config.stop_strings; model.generation_config.stop_strings = None; "
            "model.generate(..., stop_strings=stop, tokenizer=tokenizer)")
    kwargs.pop("assistant_model", None)
    for key in ASSISTED_SETTINGS:
        kwargs.pop(key, None)
    if any(getattr(config, key, None) is not None for key in ASSISTED_SETTINGS + ("stop_strings",)):
        # the loop must not see transformers' own assisted settings (its mode check would run on them), nor stop
        # strings, which transformers cannot build for a custom loop (it drops tokenizer=): generate adds them
        config = copy.deepcopy(config)
        if config.stop_strings is not None and kwargs.get("stop_strings") is None:
            kwargs["stop_strings"] = config.stop_strings
        for key in ASSISTED_SETTINGS + ("stop_strings",):
            setattr(config, key, None)
        kwargs["generation_config"] = config
    return drafter


def generate(self, *args, **kwargs):
    """``generate`` of a model after :func:`enable_drafters`: hf-spec's loop for a call with an assistant (see
    there), transformers' own ``generate`` (of the model's class) for everything else."""
    self = _wrapped(self)  # bound to the module a torch.compile wrapper wraps; unwrapped again for safety
    original = functools.partial(type(self).generate, self)
    if kwargs.get("custom_generate") is not None:  # the caller chose a decoding loop: theirs
        return original(*args, **kwargs)
    kwargs = _by_name(type(self).generate, args, kwargs)
    with ending_streamer(kwargs.get("streamer")):
        assistant = kwargs.get("assistant_model")
        drafter = drafter_for(self, kwargs)
        if drafter is None:  # kwargs as the call gave them
            if own := [key for key in SPEC_SETTINGS if kwargs.get(key) is not None and not (
                    isinstance(kwargs[key], (list, tuple)) and not kwargs[key])]:  # event_listeners=[]: none
                asked = any(kwargs.get(key) is not None or getattr(call_config(self, kwargs), key, None) is not None
                            for key in ("assistant_model", "prompt_lookup_num_tokens"))
                why = ("hf-spec hands it over: an assistant with another tokenizer or ensemble weighting, an "
                       "encoder-decoder target, or inputs such as images" if asked else "it names no assistant_model "
                       "or prompt_lookup_num_tokens")
                raise ValueError(
                    f"this call runs on transformers' own generate ({why}), which does not read hf-spec's "
                    f"{', '.join(own)}: drop them, or pass custom_generate=hf_spec.generate with drafter=... for "
                    "hf-spec's loop")
            for key in SPEC_SETTINGS:  # given as None or empty: nothing to read, and nothing transformers takes
                kwargs.pop(key, None)
            return original(**kwargs)
        if kwargs.get("drafter") is not None:
            raise ValueError("this call names two drafters: drafter=, and assistant_model= or "
                             "prompt_lookup_num_tokens= (in the call, its generation_config, or the model's "
                             "generation_config); pass one of them "
                             "(model.generation_config.prompt_lookup_num_tokens = None drops the model's)")
        if drafter is assistant and (unread := _unread_inputs(self, kwargs)):
            raise ValueError(
                f"an hf-spec drafter as assistant_model runs on hf-spec's loop, which does not feed the target "
                f"{', '.join(unread)} (an input the model reads at every step besides the tokens): pass a draft "
                "model as assistant_model or prompt_lookup_num_tokens= (transformers' own assisted generation then "
                "runs the call), or use plain generate")
        kwargs.pop("drafter", None)
        _refuse_unrunnable(self, kwargs)
        streamer, spec_streamer = kwargs.pop("streamer", None), kwargs.pop("spec_streamer", None)
        if streamer is not None and spec_streamer is not None and streamer is not spec_streamer:
            raise ValueError("pass one streamer: streamer= or spec_streamer=, not both")
        streamer = streamer if streamer is not None else spec_streamer
        stop_strings = kwargs.pop("stop_strings", None)
        if stop_strings:
            # transformers 5 drops `tokenizer=` before custom_generate's stopping criteria are built
            tokenizer = kwargs.get("tokenizer")
            if tokenizer is None:
                raise ValueError("stop_strings need the tokenizer: pass tokenizer=... to generate")
            criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
            criteria.append(StopStringCriteria(tokenizer, stop_strings))
            kwargs["stopping_criteria"] = criteria
        return original(custom_generate=spec_generate, drafter=drafter, spec_streamer=streamer, **kwargs)


def call_config(model, kwargs: dict) -> GenerationConfig:
    """The generation config a ``generate`` call runs under, before transformers' global defaults: the model's
    ``generation_config`` for a call without ``generation_config=``; else a copy of the call's with each unset
    (``None``) value taken from the model's, as ``GenerationMixin._prepare_generation_config`` merges them
    (transformers 5)."""
    given = kwargs.get("generation_config")
    if given is None:
        return model.generation_config
    merged = copy.deepcopy(given)
    merged.update(**model.generation_config.to_dict(), defaults_only=True, allow_custom_entries=True)
    return merged


def _refuse_unrunnable(model, kwargs: dict) -> None:
    """Refuse what an assisted call asks that transformers would not hand to a custom decoding loop: continuous
    batching (``cache_implementation="paged"``: generate switches to it before any loop runs, and would drop the
    drafter without a word where transformers' own generate refuses an assistant), and token healing (transformers
    drops ``tokenizer=`` for a custom loop, then fails asking for it).

    Raises:
        ValueError: saying what to do instead.
    """
    if kwargs.get("cache_implementation") == "paged":
        raise ValueError("cache_implementation='paged' switches generate to continuous batching, which runs no "
                         "assistant (transformers refuses assistant_model there too): drop cache_implementation for "
                         "speculative decoding, or drop the assistant for continuous batching")
    config = call_config(model, kwargs)
    if kwargs.get("token_healing") or (kwargs.get("token_healing") is None and getattr(config, "token_healing", False)):
        raise ValueError("token_healing needs the tokenizer inside generate, which transformers does not hand to a "
                         "custom decoding loop such as hf-spec's: heal the prompt first, "
                         "input_ids = model.heal_tokens(input_ids, tokenizer), then generate without token_healing")


def _by_name(function, args: tuple, kwargs: dict) -> dict:
    """``generate``'s positional arguments (``inputs``, ``generation_config``, ...) moved into ``kwargs`` by name,
    so a generation config passed positionally is read like one passed by keyword."""
    if not args:
        return kwargs
    names = [n for n in inspect.signature(function).parameters if n != "self"]
    if len(args) > len(names):
        raise TypeError(f"generate() takes at most {len(names)} positional arguments, got {len(args)}")
    named = dict(zip(names, args))
    if clash := sorted(set(named) & set(kwargs)):
        raise TypeError(f"generate() got multiple values for {', '.join(clash)}")
    return {**named, **kwargs}


generate._hf_spec_enabled = True
