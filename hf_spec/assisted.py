"""``model.generate(assistant_model=<hf-spec drafter>)``: the one line of set-up that makes it work.

transformers' own assisted generation builds its ``AssistedCandidateGenerator`` from ``assistant_model``
and expects a model there. :func:`enable_drafters` wraps one model's ``generate`` so that when
``assistant_model`` is an hf-spec :class:`~hf_spec.drafters.base.Drafter`, the call runs through the
public ``custom_generate`` hook with hf-spec's loop (:func:`hf_spec.loop.generate`): the same tokens and
statistics as calling that loop directly. Any other call goes to the original ``generate`` unchanged.
No private transformers function is used.
"""

from __future__ import annotations

import functools
import types

from transformers import StoppingCriteriaList, StopStringCriteria

from .drafters.base import Drafter
from .loop import generate as spec_generate

__all__ = ["enable_drafters"]


def enable_drafters(model):
    """Let ``model.generate(..., assistant_model=drafter)`` take hf-spec drafters. Returns ``model``.

    Example::

        hf_spec.enable_drafters(model)
        out = model.generate(**inputs, assistant_model=hf_spec.NgramDrafter(5), max_new_tokens=64)

    With a drafter, the call returns :class:`hf_spec.loop.SpeculativeOutput` (``.sequences``, ``.stats``)
    when ``return_dict_in_generate=True``, else the sequences tensor, as ``generate`` does. ``streamer=``
    and ``stop_strings=`` (with ``tokenizer=``) work as in ``generate``. Idempotent.

    The model gets a bound method, not a closure over it: ``copy.deepcopy(model)`` is enabled too and runs the
    copy's own weights; a pickled model unpickles with transformers' plain ``generate`` (enable it again).
    """
    if getattr(model.generate, "_hf_spec_enabled", False):
        return model
    model.generate = types.MethodType(generate, model)
    return model


def generate(self, *args, **kwargs):
    """``generate`` of a model after :func:`enable_drafters`: hf-spec's loop for an hf-spec drafter as
    ``assistant_model``, transformers' own ``generate`` (of the model's class) for everything else."""
    original = functools.partial(type(self).generate, self)
    drafter = kwargs.get("assistant_model")
    if not isinstance(drafter, Drafter):
        return original(*args, **kwargs)
    kwargs.pop("assistant_model")
    return_dict = kwargs.pop("return_dict_in_generate", None)
    if return_dict is None:
        return_dict = bool(getattr(self.generation_config, "return_dict_in_generate", False))
    streamer = kwargs.pop("streamer", None)
    stop_strings = kwargs.pop("stop_strings", None)
    if stop_strings:
        # transformers 5 drops `tokenizer=` before custom_generate's stopping criteria are built
        tokenizer = kwargs.get("tokenizer")
        if tokenizer is None:
            raise ValueError("stop_strings need the tokenizer: pass tokenizer=... to generate")
        criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
        criteria.append(StopStringCriteria(tokenizer, stop_strings))
        kwargs["stopping_criteria"] = criteria
    out = original(*args, custom_generate=spec_generate, return_dict_in_generate=True, drafter=drafter, spec_streamer=streamer, **kwargs)
    return out if return_dict else out.sequences


generate._hf_spec_enabled = True
