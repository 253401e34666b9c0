"""Medusa drafter: the target's own hidden state, through Medusa heads, proposes the next k tokens.

Medusa (Cai et al. 2024) drafts with no extra model forward: the hidden state the target computed at the
last accepted position, in the verify forward that just ran, goes through N small heads; head i proposes
the token i + 2 positions ahead (the target's own ``lm_head`` gave the token at i + 1, which the loop has
already emitted). hf-spec proposes the top-1 chain (one candidate per head, no tree) and verifies it with
the same acceptance rule as every drafter, so greedy output is token-identical to the target's and
sampling is distribution-exact: under sampling each head's token is drawn from the head's logits after the
call's logits processors, and that distribution is q in speculative sampling.

The hidden states are read with a forward pre-hook on the target's ``lm_head`` (its input is the last
hidden state after the final norm, for the positions whose logits are computed). Medusa's "typical
acceptance" (accepting tokens the target finds merely plausible) is lossy and is not offered.
"""

from __future__ import annotations

import os

import torch

from ..medusa.heads import MedusaHeads
from .base import Drafter, check_num_speculative_tokens

__all__ = ["MedusaDrafter"]


class MedusaDrafter(Drafter):
    """Speculate with Medusa heads on the target's last hidden state.

    Args:
        heads: :class:`~hf_spec.medusa.heads.MedusaHeads`, or the path of a heads folder (FasterDecoding
            format, see :mod:`hf_spec.medusa.heads`).
        num_speculative_tokens: k, tokens drafted per step; at most the number of heads (default: all heads).

    Raises:
        ValueError: k < 1 or k > the number of heads.
        MedusaCheckpointError: (here or from :meth:`prepare`) unreadable heads, or heads whose hidden size
            or vocabulary differ from the target's.
    """

    method = "medusa"
    returns_scores = True

    def __init__(self, heads: MedusaHeads | str | os.PathLike, num_speculative_tokens: int | None = None):
        if not isinstance(heads, MedusaHeads):
            heads = MedusaHeads.from_pretrained(heads)
        self.heads = heads
        super().__init__(heads.num_heads if num_speculative_tokens is None else num_speculative_tokens)
        self._check_k(self.num_speculative_tokens)
        self._target = None
        self._hook = None
        self._capture = True
        self._hidden: torch.Tensor | None = None  # [B, W, H]: the lm_head input of the target's last forward
        self._fed_end: list[int] | None = None  # per row: sequence length covered by that forward

    @property
    def max_num_speculative_tokens(self) -> int:
        """One token per head."""
        return self.heads.num_heads

    def _check_k(self, k: int) -> None:
        check_num_speculative_tokens(k)
        if k > self.heads.num_heads:
            raise ValueError(
                f"num_speculative_tokens={k} but the Medusa checkpoint has {self.heads.num_heads} heads; "
                f"use k <= {self.heads.num_heads} or train more heads (hf-spec train-medusa --heads N)")

    def prepare(self, target, input_ids, generation_config, logits_processor=None) -> None:
        super().prepare(target, input_ids, generation_config, logits_processor)
        self._check_k(self.num_speculative_tokens)
        if target is not self._target:
            self.heads.bind(target)  # raises MedusaCheckpointError on a size mismatch
            if self._hook is not None:
                self._hook.remove()
            self._hook = target.get_output_embeddings().register_forward_pre_hook(self._on_lm_head)
            self._target = target
            device = target.get_output_embeddings().weight.device
            if next(self.heads.parameters()).device != device:
                self.heads.to(device)
        self._hidden, self._fed_end = None, None

    def _on_lm_head(self, module, args) -> None:
        if self._capture:
            self._hidden = args[0].detach()

    def select_rows(self, rows):
        if self._hidden is not None:
            self._hidden = self._hidden[rows.to(self._hidden.device)]
        if self._fed_end is not None:
            self._fed_end = [self._fed_end[int(r)] for r in rows]

    @torch.no_grad()
    def draft(self, sequences, k):
        if self.generation_config is None:
            raise RuntimeError("MedusaDrafter.prepare() must be called before drafting (the loop does it)")
        self._check_k(k)
        lengths = [len(s) for s in sequences]
        bsz = len(sequences)
        if self._hidden is None or self._hidden.shape[0] != bsz:
            # no target forward seen yet for these rows: nothing to draft from this step
            self._fed_end = lengths
            return torch.zeros(bsz, 0, dtype=torch.long), torch.zeros(bsz, dtype=torch.long), None
        width = self._hidden.shape[1]
        # the hidden state that predicted each row's last token sits at position len - 2; the last forward
        # covered positions up to fed_end - 1 (its last `width` positions); without a record (the first
        # step after prefill) the last captured column is the one
        ends = self._fed_end if self._fed_end is not None else [n - 1 for n in lengths]
        cols = [width - 1 - (end - 1 - (n - 2)) for end, n in zip(ends, lengths)]
        if min(cols) < 0 or max(cols) >= width:
            raise RuntimeError(f"Medusa drafter lost track of the target's hidden states (columns {cols} of {width})")
        index = torch.tensor(cols, device=self._hidden.device)
        last = self._hidden[torch.arange(bsz, device=index.device), index]  # [B, H]
        self._capture = False  # the shared lm_head must not record the heads' own projections
        try:
            logits = self.heads(last, num_heads=k).float()  # [B, k, V]
        finally:
            self._capture = True
        do_sample = bool(self.generation_config.do_sample)
        seqs = [s.to(logits.device) for s in sequences]
        tokens, scores = [], []
        for i in range(k):
            token, processed = self.choose(seqs, logits[:, i])
            tokens.append(token)
            scores.append(processed)
            if i < k - 1:
                seqs = [torch.cat([s, t[None]]) for s, t in zip(seqs, token)]
        out = torch.stack(tokens, dim=1)
        # the loop verifies [last token, k drafts]: that forward covers the sequence up to len + k
        self._fed_end = [n + k for n in lengths]
        num_drafted = torch.full((bsz,), k, dtype=torch.long)
        return out, num_drafted, (torch.stack(scores, dim=1) if do_sample else None)

    def close(self) -> None:
        """Remove the hook from the target's ``lm_head``."""
        if self._hook is not None:
            self._hook.remove()
        self._hook, self._target, self._hidden = None, None, None

