"""hf-spec's exact speculative decoding as a Hub ``custom_generate`` recipe.

``model.generate(**inputs, custom_generate="<this repo or folder>", trust_remote_code=True, drafter=..., ...)``
runs hf-spec's loop (``pip install hf-spec``; ``hf_spec.generate``). transformers hands this function
every argument of the ``generate`` call, ``streamer=`` included, before anything is prepared.

Extra arguments:
    drafter: an hf-spec drafter (``hf_spec.DraftModelDrafter(small_model)``, ``hf_spec.NgramDrafter(3)``,
        ``hf_spec.MedusaDrafter(heads)``) or a spec string (``"ngram"``, ``"draft:NAME"``, ``"medusa:DIR"``;
        ``"none"``: transformers' plain decoding). Without it, transformers' own settings choose one:
        ``assistant_model=<model>`` (a draft model) or ``prompt_lookup_num_tokens=N`` (n-gram lookup); with none of
        them, ``"ngram"``.
    num_speculative_tokens: k (an int), or ``"auto"`` for adaptive k; default: the drafter's own.

Returns what ``generate`` returns: the sequences, or with ``return_dict_in_generate=True`` transformers'
``GenerateDecoderOnlyOutput`` (``scores`` / ``logits`` when asked) with hf-spec's ``stats``.
"""

import hf_spec
from hf_spec.assisted import generate as _generate
from hf_spec.drafters.registry import drafter_specs
from hf_spec.loop import ending_streamer


def generate(model, drafter=None, **kwargs):
    with ending_streamer(kwargs.get("streamer")):  # a consumer must not wait for a call that failed here
        if drafter == "none":  # the registry's plain decoding: transformers' own generate, no drafter chosen for it
            given = [key for key in ("assistant_model", "prompt_lookup_num_tokens", "num_speculative_tokens")
                     if kwargs.get(key) is not None]
            if given:
                raise ValueError(f"drafter='none' decodes without speculation; drop {', '.join(given)}, or choose a "
                                 f"drafter ({drafter_specs()})")
            return type(model).generate(model, **{key: value for key, value in kwargs.items() if value is not None})
        if isinstance(drafter, str):
            k = kwargs.get("num_speculative_tokens")
            drafter = hf_spec.make_drafter(drafter, num_speculative_tokens=k if isinstance(k, int) else None,
                                           target=model, tokenizer=kwargs.get("tokenizer"))
        elif drafter is not None and not isinstance(drafter, hf_spec.Drafter):
            raise TypeError(f"drafter must be an hf-spec Drafter or a spec string ({drafter_specs()}), "
                            f"got {type(drafter).__name__}")
        if drafter is not None:
            if kwargs.get("assistant_model") is not None:
                raise ValueError("pass either drafter= or assistant_model=, not both")
            kwargs["assistant_model"] = drafter
        elif kwargs.get("assistant_model") is None and kwargs.get("prompt_lookup_num_tokens") is None and getattr(
                kwargs.get("generation_config") or model.generation_config, "prompt_lookup_num_tokens", None) is None:
            kwargs["assistant_model"] = hf_spec.NgramDrafter()
    return _generate(model, **{key: value for key, value in kwargs.items() if value is not None})
