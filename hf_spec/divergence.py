"""Where a greedy speculative output first differs from plain decoding, and whether rounding explains it.

Greedy speculative decoding is token-identical to plain decoding except where the target's top two logits are
so close that a verify forward over k+1 positions (another summation order) settles them the other way: a
near-tie. :func:`first_difference` finds the first differing token and the target's logit gap there;
:func:`near_tie` classifies the gap against the measured rounding of the compute
(:data:`hf_spec.kernels.NEAR_TIE_BOUNDS`). ``hf-spec generate --compare`` and ``hf-spec bench`` report both.
"""

from __future__ import annotations

from .kernels import NEAR_TIE_BOUNDS

__all__ = ["first_difference", "tie_bound", "near_tie", "near_tie_verdict"]


def tie_bound(model, dtype) -> tuple[str, float | None]:
    """``(key, bound)``: the compute the model's logits come from (``"float32"``, ``"bfloat16"``, ``"awq"``, ...)
    and the largest logit gap its verify rounding explains, or ``None`` where none was measured."""
    quant = getattr(model.config, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    key = "awq" if getattr(method, "value", method) == "awq" else str(dtype).replace("torch.", "")
    return key, NEAR_TIE_BOUNDS.get(key)


def near_tie(gap: float, model, dtype) -> bool | None:
    """Whether a first difference's logit gap (plain minus speculative) is within the rounding bound of the
    compute, either way (a negative gap is this check's own forward scoring the speculative token higher: by more
    than rounding, that forward disagrees with plain decoding's own); ``None`` where no bound was measured."""
    _, bound = tie_bound(model, dtype)
    return None if bound is None else abs(gap) <= bound


def first_difference(model, tokenizer, prompt, plain_new, speculative_new) -> dict | None:
    """Where a greedy speculative output first differs from plain decoding, and the target's logits there.

    Args:
        model: the target.
        tokenizer: its tokenizer (to show the two tokens).
        prompt: ``LongTensor[P]``, the prompt without padding.
        plain_new: ``LongTensor[N1]``, the new tokens of plain decoding.
        speculative_new: ``LongTensor[N2]``, the new tokens of speculative decoding.

    Returns:
        ``None`` if one is a prefix of the other, else ``{"new_token", "plain", "speculative", "plain_logit",
        "speculative_logit", "logit_gap"}`` from one target forward over the common prefix (the gap is
        plain minus speculative: a near-tie when it is within the rounding of the compute dtype).
    """
    import torch

    n = min(len(plain_new), len(speculative_new))
    i = next((j for j in range(n) if plain_new[j] != speculative_new[j]), None)
    if i is None:
        return None
    prefix = torch.cat([prompt.to(model.device), plain_new[:i].to(model.device)])[None]
    with torch.no_grad():
        logits = model(input_ids=prefix).logits[0, -1].float()
    a, b = int(plain_new[i]), int(speculative_new[i])
    return {"new_token": i, "plain": tokenizer.decode([a]), "speculative": tokenizer.decode([b]),
            "plain_logit": float(logits[a]), "speculative_logit": float(logits[b]),
            "logit_gap": float(logits[a] - logits[b])}


def near_tie_verdict(gap: float, model, dtype) -> str:
    """Whether a first difference's logit gap is within what the compute's rounding explains
    (:data:`hf_spec.kernels.NEAR_TIE_BOUNDS`)."""
    key, bound = tie_bound(model, dtype)
    if bound is None:
        return f"no measured rounding bound for {key}; compare with --dtype float32"
    if abs(gap) <= bound:
        # the advice that can help: a float32 target's ties are as rare as they get, and a quantized target's
        # layers round alike whatever --dtype says
        hint = {"float32": "", "awq": "; AWQ-INT4 layers round in their own kernels whatever --dtype says, so such "
                "ties stay (a float32 target without quantization makes them rare)"}.get(
            key, "; --dtype float32 makes such ties rare")
        if gap < 0:  # this check's one forward over the prefix rounds differently from plain decoding's steps
            hint += ("; the gap is negative: in this check's forward over the whole prefix the speculative token "
                     "scores higher, in plain decoding's token-by-token forwards the plain one did")
        return f"a near-tie (under {bound:g}, what {key} verify rounding explains) settled the other way{hint}"
    return (f"larger than {key} verify rounding explains ({bound:g}): not a near-tie; please report it with the "
            "prompt and the command")
