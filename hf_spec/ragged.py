"""Per-row KV-cache bookkeeping for batched speculative decoding.

In a batch, each row accepts its own number of drafted tokens per step, so rows grow at different rates.
:class:`RaggedCache` keeps one rectangular ``transformers`` ``DynamicCache`` (``[B, heads, T, head_dim]``)
and a boolean ``valid`` mask ``[B, T]`` of the slots that hold a token of the row's sequence. A rejected
token's slot becomes a *hole*: it stays in the tensor but the 2D attention mask hides it, and position ids
count valid slots only, so every row's attention and rotary positions are exactly those of the row alone
(masked scores get exactly zero weight). Slots that are holes in every row at the tail are cropped, so a
batch of one never keeps a hole and the cache stays as long as the sequence.

This is the "per-row lengths" design (as in BASS, Qian et al. 2024, "BASS: Batched Attention-optimized
Speculative Sampling"), with the masking and position handling of ``transformers`` itself: the model gets
``attention_mask [B, T + n]`` and ``position_ids [B, n]``; ``transformers`` builds the causal mask.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

__all__ = ["RaggedCache", "crop_cache_to", "sliding_window", "check_sliding_window"]


def sliding_window(cache) -> int | None:
    """The smallest attention window of a ``transformers`` cache's layers (``DynamicSlidingWindowLayer``: Mistral,
    Gemma 2/3, Phi-3, Qwen2 with ``use_sliding_window``), or ``None`` when every layer attends to everything."""
    windows = [w for w in (getattr(layer, "sliding_window", None) for layer in getattr(cache, "layers", [])) if w]
    return min(windows) if windows else None


def check_sliding_window(window: int | None, slots: int, who: str) -> None:
    """Refuse a cache of ``slots`` positions past a sliding ``window``.

    Rolling a cache back after a rejection needs every slot it holds: a sliding-window layer drops the oldest
    ones once the window is full, and its mask counts slots, not the row's tokens (a batch's holes), so
    speculative decoding is exact only while the cache stays within the window.

    Raises:
        ValueError: ``slots > window``, saying what to do instead.
    """
    if window is not None and slots > window:
        raise ValueError(
            f"the {who} attends within a sliding window of {window} tokens and this call needs {slots} cache "
            f"positions: speculative decoding rolls caches back, which a sliding-window cache cannot do past its "
            f"window. Keep prompt + max_new_tokens within {window} tokens (a batch's left padding and rejected "
            "drafts count too), or decode this call without a drafter")


def crop_cache_to(cache, length: int) -> None:
    """Shrink a ``transformers`` cache to its first ``length`` positions (no-op when already shorter).

    ``Cache.crop(n)`` in transformers 5 takes a negative count of tokens to remove.
    """
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class RaggedCache:
    """A ``DynamicCache`` whose rows hold sequences of different lengths, with holes where tokens were rejected.

    Args:
        config: the model config (for ``DynamicCache(config=...)``).
        batch_size: B.
        device: where the masks live (the model's device).
        cache: an empty ``DynamicCache`` to fill (e.g. the one ``generate`` prepared); a new one when ``None``.
        max_slots: the most cache positions this call can need (prompt width + new tokens), given when the
            cache will be rolled back (speculative decoding): a sliding-window cache is then refused here, before
            any work, if that passes its window, and every forward checks it (a batch's holes take slots too).
            ``None``: no rollback planned, no check (plain decoding past a window is exact).
        name: what the messages call the model (``"target"``, ``"draft model"``).

    Raises:
        ValueError: (here or from :meth:`forward`) a rolled-back cache past a sliding window
            (:func:`check_sliding_window`).

    Attributes:
        cache: the wrapped ``DynamicCache``.
        valid: ``BoolTensor[B, T]``, which cache slots hold tokens of the row's sequence.
        lengths: ``LongTensor[B]``, the number of valid slots per row (the next position id).
    """

    def __init__(self, config, batch_size: int, device, cache: DynamicCache | None = None, max_slots: int | None = None,
                 name: str = "target"):
        self.cache = cache if cache is not None else DynamicCache(config=config)
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.window = sliding_window(self.cache) if max_slots is not None else None
        self.name = name
        check_sliding_window(self.window, max_slots or 0, name)

    def forward(self, model, block: torch.LongTensor, block_valid: torch.Tensor | None = None, logits_to_keep: int = 1,
                **model_kwargs):
        """Run ``model`` over a block of new tokens appended to every row, and keep them in the cache.

        Args:
            model: a ``transformers`` causal LM.
            block: ``LongTensor[B, n]``, the tokens to feed; filler tokens where ``block_valid`` is False.
            block_valid: ``BoolTensor[B, n]``, which block tokens are real (default: all). Filler tokens are
                hidden from every query and stay holes.
            logits_to_keep: how many trailing positions to compute logits for.
            **model_kwargs: passed to ``model`` (e.g. ``output_hidden_states``).

        Returns:
            the model output (``logits [B, logits_to_keep, V]``).
        """
        if block_valid is None:
            block_valid = torch.ones_like(block, dtype=torch.bool)
        check_sliding_window(self.window, self.valid.shape[1] + block.shape[1], self.name)
        block_valid = block_valid.to(self.valid.device)
        offsets = block_valid.to(torch.long).cumsum(dim=1) - 1
        position_ids = (self.lengths[:, None] + offsets).clamp(min=0)
        self.valid = torch.cat([self.valid, block_valid], dim=1)
        out = model(input_ids=block, attention_mask=self.valid.to(torch.long), position_ids=position_ids,
                    cache=self.cache, use_cache=True, logits_to_keep=logits_to_keep, **model_kwargs)
        self.lengths = self.lengths + block_valid.sum(dim=1)
        return out

    def truncate(self, keep: torch.Tensor) -> None:
        """Keep only the first ``keep[b]`` tokens of each row's sequence; later ones become holes.

        Args:
            keep: ``LongTensor[B]``, at most ``lengths``.
        """
        keep = keep.to(self.lengths.device)
        self.valid = self.valid & (self.valid.to(torch.long).cumsum(dim=1) <= keep[:, None])
        self.lengths = torch.minimum(self.lengths, keep)
        used = self.valid.any(dim=0).nonzero()
        total = int(used[-1]) + 1 if used.numel() else 0
        if total < self.valid.shape[1]:
            crop_cache_to(self.cache, total)
            self.valid = self.valid[:, :total]

    def select(self, rows: torch.LongTensor) -> None:
        """Keep only the given batch rows (drop finished ones).

        Args:
            rows: ``LongTensor[B']``, indices into the current batch.
        """
        rows = rows.to(self.valid.device)
        self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]
        self.lengths = self.lengths[rows]
        self.truncate(self.lengths)  # crop slots that only the dropped rows used
