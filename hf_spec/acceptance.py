"""The acceptance rule: one pair of pure tensor functions shared by every drafter.

Given k drafted tokens and the target's (processed) scores at the k+1 positions that one verify forward
returns, decide how many drafted tokens to keep and which token the target adds after them: the
*correction* (after a rejection) or the *bonus* token (when all k were accepted). Every step of
speculative decoding therefore emits between 1 and k+1 tokens.

- :func:`greedy_accept`: keep the longest prefix of the draft that equals the target's argmax; the next
  token is the target's argmax after it. The output is token-for-token the target's own greedy output.
- :func:`speculative_sample`: speculative (rejection) sampling, Leviathan et al. 2023, "Fast Inference
  from Transformers via Speculative Decoding", Algorithm 1; Chen et al. 2023, "Accelerating Large
  Language Model Decoding with Speculative Sampling". Accept drafted token x_i with probability
  ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection sample from ``normalize(max(p_i - q_i, 0))``;
  when all k are accepted sample the bonus token from ``p_{k+1}``. The emitted tokens are distributed
  exactly as tokens sampled from the target alone. A deterministic drafter (n-gram lookup) has one-hot q:
  pass ``draft_probs=None``.

Both work on a batch: every tensor has a leading batch dimension and the number of accepted tokens is
per row. Rows may draft different numbers of tokens: ``num_drafted[b]`` says how many of the k columns
of row b are real; the rest are filler that is never accepted, and the row's next token is then drawn
from the target alone at position ``num_drafted[b]`` (the bonus token of a shorter draft).
"""

from __future__ import annotations

import torch

__all__ = ["greedy_accept", "speculative_sample"]


def greedy_accept(
    draft_tokens: torch.Tensor, target_scores: torch.Tensor, num_drafted: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification.

    Args:
        draft_tokens: ``LongTensor[B, k]``, the drafted tokens (k may be 0).
        target_scores: ``Tensor[B, k+1, V]``, the target's processed scores (logits after logits
            processors) at the k+1 verified positions: position i scores the token after draft token i-1.
        num_drafted: optional ``LongTensor[B]`` in ``0..k``, how many leading draft columns are real per
            row (default: all k).

    Returns:
        ``(num_accepted, next_token)``: ``LongTensor[B]`` in ``0..k``, the length of the accepted draft
        prefix, and ``LongTensor[B]``, the target's token after it (correction or bonus token).

    Raises:
        ValueError: the shapes do not agree.
    """
    _check_shapes(draft_tokens, target_scores)
    k = draft_tokens.shape[1]
    target_tokens = target_scores.argmax(dim=-1)  # [B, k+1]
    matches = (draft_tokens == target_tokens[:, :k]) & _real(draft_tokens, num_drafted)
    num_accepted = matches.to(torch.long).cumprod(dim=-1).sum(dim=-1)
    next_token = target_tokens.gather(1, num_accepted[:, None]).squeeze(1)
    return num_accepted, next_token


def speculative_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    num_drafted: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative (rejection) sampling (Leviathan et al. 2023, Algorithm 1).

    Args:
        draft_tokens: ``LongTensor[B, k]``, tokens the drafter sampled.
        draft_probs: ``Tensor[B, k, V]``, the distributions the drafter sampled them from (after the same
            logits processors as the target), or ``None`` for a deterministic drafter (one-hot q).
        target_probs: ``Tensor[B, k+1, V]``, the target's processed distributions at the k+1 positions.
        generator: optional ``torch.Generator`` for the uniform draws and the residual sample.
        num_drafted: optional ``LongTensor[B]`` in ``0..k``, how many leading draft columns are real per
            row (default: all k). A row's filler columns are never accepted and never form a residual.

    Returns:
        ``(num_accepted, next_token)``, both ``LongTensor[B]``: accepted prefix length in ``0..k``, and the
        token sampled after it: from ``normalize(max(p - q, 0))`` at the first rejected position, or from
        ``p_{k+1}`` (the bonus token) when all k were accepted.

    Edge cases: ``q(x) = 0`` with ``p(x) > 0`` accepts (the ratio is infinite); ``p(x) = 0`` always
    rejects. A residual that is zero everywhere (p equal to q up to rounding, so a rejection had
    probability ~0) falls back to sampling from p, which is then the same distribution.

    Raises:
        ValueError: the shapes do not agree.
    """
    _check_shapes(draft_tokens, target_probs)
    bsz, k = draft_tokens.shape
    device = target_probs.device
    target_probs = target_probs.float()
    p_x = target_probs[:, :k].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, k]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)
    else:
        if draft_probs.shape != (bsz, k, target_probs.shape[-1]):
            raise ValueError(f"draft_probs has shape {tuple(draft_probs.shape)}, expected {(bsz, k, target_probs.shape[-1])}")
        draft_probs = draft_probs.float()
        q_x = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    u = torch.rand((bsz, k), device=device, generator=generator)
    accepted = (u * q_x < p_x) & _real(draft_tokens, num_drafted)  # u < p/q: q=0, p>0 accepts; p=0 rejects
    num_accepted = accepted.to(torch.long).cumprod(dim=-1).sum(dim=-1)  # [B]

    rows = torch.arange(bsz, device=device)
    p_next = target_probs[rows, num_accepted]  # [B, V]: p at the first rejected position, or the bonus p
    drafted = torch.full_like(num_accepted, k) if num_drafted is None else num_drafted.to(device)
    rejected = num_accepted < drafted  # a real draft token was rejected (not: the row's draft ran out)
    if k > 0 and bool(rejected.any()):
        pos = num_accepted.clamp(max=k - 1)
        if draft_probs is None:
            q_next = torch.zeros_like(p_next)
            q_next[rows, draft_tokens[rows, pos]] = 1.0
        else:
            q_next = draft_probs[rows, pos]
        residual = (p_next - q_next).clamp(min=0.0)
        mass = residual.sum(dim=-1, keepdim=True)
        residual = torch.where(mass > 0, residual, p_next)
        p_next = torch.where(rejected[:, None], residual, p_next)
    next_token = torch.multinomial(p_next / p_next.sum(dim=-1, keepdim=True), 1, generator=generator).squeeze(1)
    return num_accepted, next_token


def _real(draft_tokens: torch.Tensor, num_drafted: torch.Tensor | None) -> torch.Tensor:
    """``BoolTensor[B, k]``: which draft columns are real."""
    if num_drafted is None:
        return torch.ones_like(draft_tokens, dtype=torch.bool)
    cols = torch.arange(draft_tokens.shape[1], device=draft_tokens.device)
    return cols[None, :] < num_drafted.to(draft_tokens.device)[:, None]


def _check_shapes(draft_tokens: torch.Tensor, target: torch.Tensor) -> None:
    if draft_tokens.dim() != 2 or target.dim() != 3:
        raise ValueError(
            f"expected draft_tokens [B, k] and target scores [B, k+1, V], got {tuple(draft_tokens.shape)} "
            f"and {tuple(target.shape)}"
        )
    if target.shape[0] != draft_tokens.shape[0] or target.shape[1] != draft_tokens.shape[1] + 1:
        raise ValueError(
            f"target scores must cover k+1 = {draft_tokens.shape[1] + 1} positions for {draft_tokens.shape[0]} "
            f"rows, got shape {tuple(target.shape)}"
        )
