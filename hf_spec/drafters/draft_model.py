"""Draft-model drafter: a smaller causal LM with the target's tokenizer proposes k tokens.

The draft keeps its own KV cache across steps: after a verification it is cropped to the longest prefix
it shares with the accepted sequence, and only the tokens it has not seen are fed next time (no
re-prefill). Tokens are chosen the way the target chooses them: argmax under greedy decoding, or sampled
from the draft's logits after the call's logits processors, whose distribution is returned as q for
speculative sampling (Leviathan et al. 2023).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..kernels import install_upcast_prefill
from ..models import cpu_has_native_bf16
from .base import Drafter, crop_cache_to

__all__ = ["DraftModelDrafter", "VocabularyMismatchError"]


class VocabularyMismatchError(ValueError):
    """Draft and target do not share a vocabulary."""


def _vocab_size(model) -> int:
    return model.config.get_text_config().vocab_size


class DraftModelDrafter(Drafter):
    """Speculate with a draft model that shares the target's tokenizer.

    Args:
        draft_model: a ``transformers`` causal LM (``PreTrainedModel``) with the target's vocabulary.
        num_speculative_tokens: k, tokens drafted per step (>= 1).
        tokenizer / draft_tokenizer: optional; when both are given their vocabularies (token -> id maps)
            must be identical, a stricter check than equal vocabulary sizes.

    Raises:
        ValueError: ``num_speculative_tokens`` < 1.
        VocabularyMismatchError: (from :meth:`prepare`) the vocabularies differ; the message names both.
    """

    method = "draft"
    returns_scores = True

    def __init__(self, draft_model, num_speculative_tokens: int = 5, tokenizer=None, draft_tokenizer=None):
        super().__init__(num_speculative_tokens)
        self.draft_model = draft_model
        self.config = draft_model.config
        if tokenizer is not None and draft_tokenizer is not None and tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise VocabularyMismatchError(
                f"the draft tokenizer ({getattr(draft_tokenizer, 'name_or_path', '?')}, {len(draft_tokenizer)} tokens) "
                f"differs from the target tokenizer ({getattr(tokenizer, 'name_or_path', '?')}, {len(tokenizer)} tokens); "
                "a draft model must use the target's tokenizer"
            )
        self._cache: DynamicCache | None = None
        self._cached_ids: torch.LongTensor | None = None

    def prepare(self, target, input_ids, generation_config, logits_processor=None) -> None:
        super().prepare(target, input_ids, generation_config, logits_processor)
        t_vocab, d_vocab = _vocab_size(target), _vocab_size(self.draft_model)
        if t_vocab != d_vocab:
            raise VocabularyMismatchError(
                f"vocabulary mismatch: target {target.name_or_path or type(target).__name__} has {t_vocab} tokens, "
                f"draft {self.draft_model.name_or_path or type(self.draft_model).__name__} has {d_vocab}; "
                "use a draft model trained with the target's tokenizer (e.g. a smaller model of the same family)"
            )
        if (self.device.type == "cpu" and self.draft_model.dtype in (torch.bfloat16, torch.float16)
                and not cpu_has_native_bf16()):
            install_upcast_prefill(self.draft_model)  # prompt prefill in float32: ~3x faster here
        self._cache = DynamicCache(config=self.draft_model.config)
        self._cached_ids = input_ids[:, :0]

    @property
    def device(self) -> torch.device:
        return self.draft_model.device

    def _forward(self, ids: torch.LongTensor) -> torch.Tensor:
        out = self.draft_model(input_ids=ids, cache=self._cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    @torch.no_grad()
    def propose(self, input_ids, k):
        if self._cache is None:
            raise RuntimeError("DraftModelDrafter.prepare() must be called before drafting (the loop does it)")
        ids = input_ids.to(self.device)
        # reuse the cached prefix: the longest common prefix of what the cache holds and the sequence
        cached = self._cached_ids
        n = min(cached.shape[1], ids.shape[1] - 1)
        if n > 0:
            same = (cached[:, :n] == ids[:, :n]).all(dim=0)
            n = int(same.to(torch.long).cumprod(0).sum())
        crop_cache_to(self._cache, n)
        logits = self._forward(ids[:, n:])
        do_sample = bool(self.generation_config.do_sample)
        tokens, scores = [], []
        seq = ids
        for i in range(k):
            processed = self.logits_processor(seq, logits) if len(self.logits_processor) else logits
            if do_sample:
                token = torch.multinomial(processed.softmax(dim=-1), 1)
                scores.append(processed)
            else:
                token = processed.argmax(dim=-1, keepdim=True)
            tokens.append(token)
            seq = torch.cat([seq, token], dim=1)
            if i < k - 1:
                logits = self._forward(token)
        self._cached_ids = seq[:, :-1]
        out_tokens = torch.cat(tokens, dim=1)
        return out_tokens, (torch.stack(scores, dim=1) if do_sample else None)
