"""The settings of ``hf-spec train-medusa`` (:class:`TrainSettings`), apart from the training code in
:mod:`hf_spec.medusa.train` so that the command line reads their defaults without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrainSettings"]


@dataclass
class TrainSettings:
    """What ``hf-spec train-medusa`` does; every field is a CLI flag.

    Attributes:
        heads: N, the number of heads (head i predicts the token i + 2 positions ahead).
        layers: L residual blocks per head.
        variant: ``full`` (own vocabulary projection per head) or ``shared-lm-head``.
        epochs: passes over the training positions.
        lr: AdamW learning rate.
        batch_size: positions per optimizer step.
        seed: seeds the sampling of texts, the initialisation and the batches.
        max_tokens: the most tokens per text (prompt + answer, or a text chunk).
        response_tokens: for question data, the target's answer length (greedy, ended by EOS).
        max_texts: use at most this many texts, a seeded random sample (0: all).
        holdout_fraction: texts kept out of training for the agreement report.
        negatives: random vocabulary entries added to each batch's softmax (a sampled softmax), or ``"all"``:
            the softmax over the whole vocabulary (the vocabulary projection in the target's dtype).
        checkpoint_every: steps between checkpoints.
        exclude_per_category: for question data, the first M questions of each category are never
            trained on (the benchmark and the docs evaluate on the first few of each category).
        truncated_vocab_size: V' > 0 and under the vocabulary's size: the saved heads get a token map of V' ids
            (:func:`frequent_tokens` over the training texts; vLLM's ``truncated_vocab_size``), so that they draft
            over those ids only (on Qwen2.5-Coder-1.5B: the same held-out agreement, a cheaper step; see
            docs/medusa.md); 0, or V' at least the vocabulary's size: the whole vocabulary. Training does not
            depend on it (a rerun with another value resumes the finished checkpoint and only re-saves the heads).
    """

    heads: int = 4
    layers: int = 1
    variant: str = "shared-lm-head"
    epochs: int = 3
    lr: float = 3e-3
    batch_size: int = 64
    seed: int = 0
    max_tokens: int = 512
    response_tokens: int = 128
    max_texts: int = 0
    holdout_fraction: float = 0.1
    negatives: int | str = 1024
    checkpoint_every: int = 200
    exclude_per_category: int = 5
    gen_batch_size: int = 16
    truncated_vocab_size: int = 32768

    def check(self) -> None:
        """Raise ``ValueError`` for settings that cannot work."""
        for name in ("heads", "layers", "epochs", "batch_size", "max_tokens", "checkpoint_every", "gen_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.variant not in ("full", "shared-lm-head"):
            raise ValueError(f"--variant must be full or shared-lm-head, got {self.variant!r}")
        if not 0 < self.lr < float("inf"):  # NaN fails too; inf trained NaN heads and saved them
            raise ValueError(f"--lr must be a finite number > 0 (3e-3 is usual), got {self.lr}")
        if not 0 < self.holdout_fraction < 1:
            raise ValueError(f"--holdout-fraction must be in (0, 1), got {self.holdout_fraction}")
        if self.negatives != "all" and not (isinstance(self.negatives, int) and self.negatives >= 0):
            raise ValueError(f"--negatives must be a count >= 0 or 'all', got {self.negatives!r}")
        if self.response_tokens < 0 or self.max_texts < 0 or self.exclude_per_category < 0:
            raise ValueError("--response-tokens, --max-texts and --exclude-per-category must be >= 0")
        if isinstance(self.truncated_vocab_size, bool) or not isinstance(self.truncated_vocab_size, int) \
                or self.truncated_vocab_size < 0:
            raise ValueError(f"--truncated-vocab-size must be a count >= 0 (0: the whole vocabulary), got "
                             f"{self.truncated_vocab_size!r}")
