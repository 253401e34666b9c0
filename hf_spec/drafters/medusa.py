"""Medusa drafter: the target's own hidden state, through Medusa heads, proposes the next k tokens.

Medusa (Cai et al. 2024) drafts with no extra model forward: the hidden state the target computed at the
last accepted position, in the verify forward that just ran, goes through N small heads; head i proposes
the token i + 2 positions ahead (the target's own ``lm_head`` gave the token at i + 1, which the loop has
already emitted). hf-spec proposes the top-1 chain (one candidate per head, no tree) and verifies it with
the same acceptance rule as every drafter, so greedy output is token-identical to the target's and
sampling is distribution-exact: under sampling each head's token is drawn from the head's logits after the
call's logits processors, and that distribution is q in speculative sampling.

The drafter asks the loop for the target's hidden states (``needs_hidden_states``): after every target
forward, plain or speculative, the loop hands it the last hidden states (after the final norm, what
``lm_head`` reads) of the positions it scored, and the drafter keeps, per row, the one that predicted the
row's newest token (:meth:`~hf_spec.drafters.base.VerifyOutput.last_hidden_state`). Nothing is hooked into
the target, so any number of calls and threads can share it. Medusa's "typical acceptance" (accepting
tokens the target finds merely plausible) is lossy and is not offered.
"""

from __future__ import annotations

import os

import torch

from ..medusa.heads import MedusaHeads
from .base import Drafter, VerifyOutput, check_num_speculative_tokens

__all__ = ["MedusaDrafter"]


class MedusaDrafter(Drafter):
    """Speculate with Medusa heads on the target's last hidden state.

    Args:
        heads: :class:`~hf_spec.medusa.heads.MedusaHeads`, or the path of a heads folder (vLLM's or
            FasterDecoding's layout, see :mod:`hf_spec.medusa.heads`) or the short name of shipped heads.
        num_speculative_tokens: k, tokens drafted per step; at most the number of heads (default: all heads).

    Raises:
        ValueError: k < 1 or k > the number of heads.
        MedusaCheckpointError: (here or from ``start``) unreadable heads, or heads whose hidden size or
            vocabulary differ from the target's.
    """

    method = "medusa"
    returns_scores = True
    needs_hidden_states = True
    spec_argument = "DIR"

    def __init__(self, heads: MedusaHeads | str | os.PathLike, num_speculative_tokens: int | None = None):
        if not isinstance(heads, MedusaHeads):
            heads = MedusaHeads.from_pretrained(heads)
        self.heads = heads
        if num_speculative_tokens is not None:
            self._check_k(num_speculative_tokens)  # names the head count
        super().__init__(heads.num_heads if num_speculative_tokens is None else num_speculative_tokens)
        self._last: torch.Tensor | None = None  # [B, H]: per row, the hidden state that predicted its newest token

    @property
    def max_num_speculative_tokens(self) -> int:
        """One token per head."""
        return self.heads.num_heads

    def _check_k(self, k: int) -> None:
        check_num_speculative_tokens(k)
        if k > self.heads.num_heads:
            raise ValueError(
                f"num_speculative_tokens={k} but the Medusa checkpoint has {self.heads.num_heads} heads; "
                f"use k <= {self.heads.num_heads} (or leave k unset: all heads) or train more heads "
                "(hf-spec train-medusa --heads N)")

    @classmethod
    def check_spec(cls, argument, num_speculative_tokens=None) -> None:
        """``medusa:DIR``: DIR must be a heads folder (or the name of shipped or cached heads) with a config and
        weights, and a given k at most its head count (read from the config; nothing is loaded)."""
        super().check_spec(argument, num_speculative_tokens)
        from ..medusa.heads import checkpoint_num_heads, heads_path

        path = heads_path(argument)  # MedusaCheckpointError (a ValueError) names what is missing
        heads = checkpoint_num_heads(path)
        if isinstance(num_speculative_tokens, int) and isinstance(heads, int) and num_speculative_tokens > heads:
            raise ValueError(f"k={num_speculative_tokens} but the Medusa checkpoint {path} has {heads} heads (one "
                             f"drafted token each); use k <= {heads}, or leave k unset (all heads)")

    @classmethod
    def spec_num_speculative_tokens(cls, argument) -> int:
        """``medusa:DIR``: the checkpoint's head count (from its config; nothing is loaded)."""
        from ..medusa.heads import _read_config, heads_path

        heads = _read_config(heads_path(argument)).get("medusa_num_heads")
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
            raise ValueError(f"{heads_path(argument)}/config.json: medusa_num_heads must be an integer >= 1, got {heads!r}")
        return heads

    @classmethod
    def from_spec(cls, argument, *, num_speculative_tokens=None, target=None, tokenizer=None, draft_dtype=None):
        """``medusa:DIR``: the heads in DIR (or shipped / cached under that name), checked against and bound
        to ``target``; k defaults to the number of heads."""
        heads = MedusaHeads.from_pretrained(argument, target=target)
        if target is not None:
            heads.to(target.get_output_embeddings().weight.device)
        return cls(heads, num_speculative_tokens)

    def prepare(self, target, input_ids) -> None:
        self.heads.check_target(target)  # MedusaCheckpointError on a size mismatch
        # this call's projection: the shared heads are never rebound, so calls on other targets cannot change it
        self._lm_head = target.get_output_embeddings().weight
        if next(self.heads.parameters()).device != self._lm_head.device:
            raise ValueError(f"the Medusa heads are on {next(self.heads.parameters()).device}, the target's lm_head on "
                             f"{self._lm_head.device}: put them on one device (heads.to(device)) before generating")
        self._last = None

    def update(self, verified: VerifyOutput) -> None:
        self._last = verified.last_hidden_state()

    def select_rows(self, rows):
        if self._last is not None:
            self._last = self._last[rows.to(self._last.device)]

    @torch.no_grad()
    def draft(self, sequences, k):
        if self._last is None or self._last.shape[0] != len(sequences):
            raise RuntimeError("MedusaDrafter.draft() before the target's first forward: the loop calls start() "
                               "and update() first")
        logits = self.heads(self._last, num_heads=k, lm_head=self._lm_head).float()  # [B, k, V]
        seqs = [s.to(logits.device) for s in sequences]
        tokens, scores = [], []
        for i in range(k):
            token, processed = self.choose(seqs, logits[:, i])
            tokens.append(token)
            scores.append(processed)
            if i < k - 1:
                seqs = [torch.cat([s, t[None]]) for s, t in zip(seqs, token)]
        num_drafted = torch.full((len(seqs),), k, dtype=torch.long)
        do_sample = bool(self.generation_config.do_sample)
        return torch.stack(tokens, dim=1), num_drafted, (torch.stack(scores, dim=1) if do_sample else None)
