"""Draft-model drafter: a smaller causal LM with the target's tokenizer proposes k tokens.

The draft keeps its own KV cache across steps: after a verification it is cropped to the longest prefix
it shares with the accepted sequence, and only the tokens it has not seen are fed next time (no
re-prefill). A call that continues from the target's returned cache takes over the draft cache of the call that
filled it (:meth:`DraftModelDrafter.carry_over`), so a second chat turn feeds the draft only what it has not
seen (the new turn, and any tokens of the reply the chat template tokenized otherwise).
Tokens are chosen the way the target chooses them: argmax under greedy decoding, or sampled from the draft's
logits after the call's logits processors, whose distribution is returned as q for speculative sampling
(Leviathan et al. 2023).

With ``num_tree_nodes=N`` in the call it drafts a tree instead (:meth:`DraftModelDrafter.draft_tree`): the chain
it would draft, each token with the draft's next likeliest tokens beside it, reranked by cumulative probability as
EAGLE-2 reranks; the draft runs the chain's forwards only.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import weakref
from dataclasses import dataclass

import torch

from ..kernels import install_upcast_prefill, upcast_prefill
from ..device import cpu_has_native_bf16, draft_dtype as _draft_dtype
from ..ragged import RaggedCache
from ..processors import process_scores, reads_sequences
from ..prompts import model_context
from .base import DEFAULT_NUM_SPECULATIVE_TOKENS, Drafter, logit_rows

logger = logging.getLogger("hf_spec")

__all__ = ["DraftModelDrafter", "CarriedDraftCache", "weights_version", "VocabularyMismatchError", "TREE_WIDTH",
           "DEFAULT_CONFIDENCE_THRESHOLD"]

#: :class:`DraftModelDrafter`'s ``confidence_threshold`` when none is given: a row stops drafting after a token its
#: draft gave under this probability (docs/benchmarks.md, "The draft model's confidence stop")
DEFAULT_CONFIDENCE_THRESHOLD = 0.5

#: the most tokens a chain node of a draft tree branches into (:meth:`DraftModelDrafter.tree_width`): its chain
#: child and the draft's next likeliest tokens; a CPU's verify grows soon with the tree's width
TREE_WIDTH = 8


@dataclass
class CarriedDraftCache:
    """A draft model's KV cache kept from one call for the next that continues the same sequence
    (:meth:`DraftModelDrafter.carry_over`): the loop keeps it on the target's returned cache object.

    Attributes:
        model: a weak reference to the draft model that filled it (a ``copy.deepcopy`` of the target's cache copies
            this object, not the model).
        weights: :func:`weights_version` of the draft then: a draft cast, moved, quantized or changed in place since
            is not resumed (its keys and values would be the old weights').
        ragged: the draft's :class:`~hf_spec.ragged.RaggedCache` (one row).
        tokens: ``LongTensor[T]``, the tokens the cache holds (the sequence so far and drafts fed after it).
    """

    model: weakref.ref
    weights: int
    ragged: RaggedCache
    tokens: torch.LongTensor

    def __copy__(self):
        return dataclasses.replace(self)

    def __deepcopy__(self, memo):  # a deep copy of the target's cache copies the draft's cache, not the draft model
        return dataclasses.replace(self, ragged=copy.deepcopy(self.ragged, memo), tokens=self.tokens.clone())

    def __reduce_ex__(self, protocol):
        # pickled with its cache (torch.save): a weak reference cannot be, so it is saved as an empty tensor, which
        # torch.load(weights_only=True) takes without an allowlist and no drafter resumes
        return torch.empty(0).__reduce_ex__(protocol)


def weights_version(model) -> int:
    """A number that changes when ``model``'s weights do: a hash of each parameter's and buffer's storage address,
    dtype and in-place version counter (``Tensor._version``, which ``copy_``, ``load_state_dict`` and other in-place
    edits raise; tensors made under ``torch.inference_mode`` count none); a cast, a move or a quantization makes new
    tensors. Reads no weights (~0.1 ms for a 0.5B draft)."""
    def version(t: torch.Tensor) -> int:
        try:
            return t._version
        except RuntimeError:  # an inference tensor
            return -1

    return hash(tuple((t.data_ptr(), t.dtype, version(t)) for t in (*model.parameters(), *model.buffers())))


class VocabularyMismatchError(ValueError):
    """Draft and target do not share a vocabulary."""


class DraftModelDrafter(Drafter):
    """Speculate with a draft model that shares the target's tokenizer.

    Args:
        draft_model: a ``transformers`` causal LM (``PreTrainedModel``) with the target's vocabulary.
        num_speculative_tokens: k, the most tokens a row drafts per step (>= 1); default 6 with the confidence
            stop, :data:`~hf_spec.drafters.base.DEFAULT_NUM_SPECULATIVE_TOKENS` (3) with ``confidence_threshold=0``.
        tokenizer: optional, the target's tokenizer; when it and ``draft_tokenizer`` are both given their
            vocabularies (token -> id maps) must be identical, and then the two models' logits may have
            different numbers of rows (padded vocabularies: Qwen2.5-0.5B has 151,936, Qwen2.5-7B 152,064): the
            draft's logits are cut or padded (with -inf, so q is 0 there) to the target's rows, which keeps
            speculative sampling exact. Without both tokenizers the row counts must be equal.
        draft_tokenizer: optional, the draft's tokenizer (see ``tokenizer``).
        confidence_threshold: p in ``[0, 1)``; a row stops drafting after a token the draft gave a probability
            under p (its softmax, after the call's logits processors when there are any), so k is the most a row
            drafts: the draft stops where it is likely to be wrong, and drafting ends when every row has stopped.
            transformers' ``assistant_confidence_threshold`` (ConfidenceCriteria; dynamic speculation lookahead,
            Mamou et al. 2024). Default :data:`DEFAULT_CONFIDENCE_THRESHOLD`; 0 drafts k tokens every step.
            Exact either way: stopping depends only on the tokens drafted so far, so greedy output and the
            sampled distribution are the target's. A tree (:meth:`draft_tree`) stops growing where its chain
            would stop.

    Raises:
        TypeError: ``draft_model`` is a name or path (build the drafter with ``make_drafter("draft:NAME", ...)``)
            or not a model.
        ValueError: ``num_speculative_tokens`` < 1; ``confidence_threshold`` outside ``[0, 1)``; an
            encoder-decoder draft; (from :meth:`prepare`) a draft offloaded with accelerate.
        VocabularyMismatchError: (from :meth:`prepare`) the vocabularies differ; the message names both.
    """

    method = "draft"
    #: with the confidence stop k is a cap, not a length, and a larger one pays (docs/benchmarks.md, "The draft
    #: model's confidence stop"); without the stop (``confidence_threshold=0``) the shared default
    #: :data:`~hf_spec.drafters.base.DEFAULT_NUM_SPECULATIVE_TOKENS`
    default_num_speculative_tokens = 6
    returns_scores = True
    drafts_trees = True
    spec_argument = "MODEL"

    def __init__(self, draft_model, num_speculative_tokens: int | None = None, tokenizer=None, draft_tokenizer=None,
                 confidence_threshold: float | None = None):
        if confidence_threshold is None:
            confidence_threshold = DEFAULT_CONFIDENCE_THRESHOLD
        if not 0.0 <= confidence_threshold < 1.0:  # NaN fails too
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold!r}; 0 drafts k "
                             "tokens every step, 0.4 is transformers' assistant_confidence_threshold default")
        if num_speculative_tokens is None:
            num_speculative_tokens = self._default_k(confidence_threshold)
        if isinstance(draft_model, (str, os.PathLike)):
            raise TypeError(f"DraftModelDrafter takes a loaded causal LM, got the name {str(draft_model)!r}: build it "
                            f"from its spec, hf_spec.make_drafter('draft:{draft_model}', target=model, "
                            "tokenizer=tokenizer), which loads the draft in a dtype and on a device that suit the "
                            f"target, or pass a model (hf_spec.load({str(draft_model)!r})[0])")
        if not callable(draft_model) or not hasattr(draft_model, "config"):
            raise TypeError(f"DraftModelDrafter takes a loaded causal LM (a transformers PreTrainedModel), got "
                            f"{type(draft_model).__name__}")
        if getattr(draft_model.config, "is_encoder_decoder", False):
            raise ValueError(f"the draft {type(draft_model).__name__} is an encoder-decoder model; a draft model must be "
                             "a decoder-only causal LM with the target's tokenizer")
        if callable(getattr(draft_model, "can_generate", None)) and not draft_model.can_generate():
            # a base model (LlamaModel, model.model) returns hidden states, not logits: it failed on .logits later
            raise TypeError(f"the draft {type(draft_model).__name__} has no language-model head (it cannot generate); "
                            "a draft model is a causal LM such as ...ForCausalLM: load it with "
                            "AutoModelForCausalLM or hf_spec.load")
        super().__init__(num_speculative_tokens)
        self.confidence_threshold = float(confidence_threshold)
        self.draft_model = draft_model
        self.config = draft_model.config
        if tokenizer is not None and draft_tokenizer is not None and tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise VocabularyMismatchError(
                f"the draft tokenizer ({getattr(draft_tokenizer, 'name_or_path', '?')}, {len(draft_tokenizer)} tokens) "
                f"differs from the target tokenizer ({getattr(tokenizer, 'name_or_path', '?')}, {len(tokenizer)} tokens); "
                "a draft model must use the target's tokenizer: pick a draft of the target's family, draft without "
                "a model (the suffix or ngram drafter), or let transformers' universal assisted decoding take another "
                "tokenizer's draft (generate(..., assistant_model=draft, tokenizer=..., assistant_tokenizer=...), "
                "which hf_spec.enable_drafters leaves to transformers)"
            )
        self._same_tokenizer = tokenizer is not None and draft_tokenizer is not None
        self._ragged: RaggedCache | None = None
        self._cached: list[torch.LongTensor] = []
        self._context: int | None = None  # the positions the draft reads (prepare)
        self._past_context_noted = False

    @property
    def stops_when_unsure(self) -> bool:  # the confidence stop: k is a cap
        return self.confidence_threshold > 0

    @classmethod
    def _default_k(cls, confidence_threshold: float) -> int:
        """k when none is given: :attr:`default_num_speculative_tokens` (6) with a stop, the shared default without."""
        return cls.default_num_speculative_tokens if confidence_threshold > 0 else DEFAULT_NUM_SPECULATIVE_TOKENS

    @classmethod
    def spec_num_speculative_tokens(cls, argument) -> int:
        """The k of a ``draft:MODEL`` spec: :meth:`_default_k` of :data:`DEFAULT_CONFIDENCE_THRESHOLD`."""
        return cls._default_k(DEFAULT_CONFIDENCE_THRESHOLD)

    @classmethod
    def check_spec(cls, argument, num_speculative_tokens=None) -> None:
        """``draft:MODEL``: MODEL must be an offline short name, a folder or a hub name (checked, not loaded)."""
        super().check_spec(argument, num_speculative_tokens)
        from ..models import check_name

        check_name(argument)

    @classmethod
    def from_spec(cls, argument, *, num_speculative_tokens=None, target=None, tokenizer=None, draft_dtype=None):
        """``draft:MODEL``: load MODEL (an offline short name, a folder or a hub name) with
        :func:`hf_spec.load` in :func:`hf_spec.device.draft_dtype` of the target's dtype (or ``draft_dtype``), on
        the target's device; with ``tokenizer``, its vocabulary must equal the draft's."""
        model, draft_tokenizer = load_draft_model(argument, target, draft_dtype)
        return cls(model, num_speculative_tokens, tokenizer=tokenizer, draft_tokenizer=draft_tokenizer)

    def prepare(self, target, input_ids) -> None:
        if self.device.type == "meta" or any(p.device.type == "meta" for p in self.draft_model.parameters()):
            raise ValueError(
                "the draft model is partly offloaded (device meta): it runs k forwards per step, so reading weights "
                "from disk would cost more than it saves; load it whole on one device (no device_map), in a "
                "smaller dtype if memory is short"
            )
        t_vocab, d_vocab = logit_rows(target), logit_rows(self.draft_model)
        if t_vocab != d_vocab and not self._same_tokenizer:
            raise VocabularyMismatchError(
                f"vocabulary mismatch: target {target.name_or_path or type(target).__name__} has {t_vocab} logit rows, "
                f"draft {self.draft_model.name_or_path or type(self.draft_model).__name__} has {d_vocab}. Models of "
                "one family often pad their vocabularies differently: build the drafter with both tokenizers, "
                "hf_spec.DraftModelDrafter(draft, tokenizer=..., draft_tokenizer=...) (as drafter= or "
                "assistant_model=), so that hf-spec can compare them (the command line does). A draft with another "
                "tokenizer cannot draft for this target in hf-spec; transformers' own universal assisted decoding "
                "takes one: generate(..., assistant_model=draft, tokenizer=..., assistant_tokenizer=...), which "
                "enable_drafters leaves to transformers"
            )
        self._target_vocab = t_vocab
        # compute per token relative to the target's (for catch_up_cost): non-embedding parameters, the prefill's
        # FLOPs; a rough estimate of time, as the two models may differ in dtype
        self._relative_cost = _compute_parameters(self.draft_model) / max(1, _compute_parameters(target))
        if (self.device.type == "cpu" and self.draft_model.dtype in (torch.bfloat16, torch.float16)
                and not cpu_has_native_bf16()):
            install_upcast_prefill(self.draft_model)  # prompt prefill in float32: ~3x faster here
        # the positions the draft was made to read (GPT-2's n_positions, a rotary model's trained context): a row
        # longer than that is not fed (learned positions have no row there, rotary ones draft garbage) and drafts
        # nothing; a row near it drafts no token whose feeding would pass it (_budget)
        self._context = model_context(self.draft_model)
        self._past_context_noted = False
        # the draft's own cache, rolled back to what it shares with the accepted sequence at every draft
        self._ragged = RaggedCache(self.draft_model.config, input_ids.shape[0], self.device, role="draft")
        self._cached = [row[:0] for row in input_ids.to(self.device)]

    @property
    def device(self) -> torch.device:
        return self.draft_model.device

    def select_rows(self, rows):
        if self._ragged is not None:
            self._ragged.select(rows)
            self._cached = [self._cached[int(r)] for r in rows]

    def carry_over(self) -> "CarriedDraftCache | None":
        """This call's draft cache and the tokens it holds (one row), for a call that continues from the target's
        cache (:meth:`Drafter.carry_over`); ``None`` for a batch."""
        if self._ragged is None or len(self._cached) != 1:
            return None
        return CarriedDraftCache(weakref.ref(self.draft_model), weights_version(self.draft_model), self._ragged,
                                 self._cached[0])

    def resume(self, carried) -> bool:
        """Take over an earlier call's draft cache (:meth:`carry_over`) where it came from this draft model with the
        same weights (:func:`weights_version`: not cast, moved, quantized or edited since) and this call has one
        row: :meth:`_catch_up` then rolls it back to the longest prefix it shares with the sequence and feeds the
        draft only the rest, instead of the whole conversation."""
        if (not isinstance(carried, CarriedDraftCache) or carried.model() is not self.draft_model
                or self._ragged is None or len(self._cached) != 1 or carried.ragged.lengths.shape != (1,)
                or carried.weights != weights_version(self.draft_model)):
            return False
        self._ragged, self._cached = carried.ragged, [carried.tokens]
        return True

    def catch_up_cost(self, sequences) -> float:
        """The tokens the draft has not seen beyond the one every step feeds (B x the widest row: the block is
        rectangular) x the draft's compute per token relative to the target's; in tokens of the target's
        prefill. The whole prompt before the first draft, ~0-1 token between two speculative steps."""
        if self._ragged is None:
            return 0.0
        keep = self._reusable([s.to(self.device) for s in sequences])
        unseen = [len(s) - n if self._fits(s) else 0 for n, s in zip(keep, sequences)]  # not fed (_catch_up)
        return len(unseen) * max(0, max(unseen, default=1) - 1) * self._relative_cost

    def _fits(self, sequence) -> bool:
        """Whether the draft reads every position of ``sequence`` (its context: :meth:`prepare`)."""
        return self._context is None or len(sequence) <= self._context

    def _reusable(self, seqs) -> list[int]:
        """How many of each row's first tokens the draft's cache serves: the longest common prefix of what it holds
        and the row, or 0 for every row where the cache cannot roll back to that (a sliding-window draft's cache
        resumed for a conversation whose text differs within the last window: :meth:`RaggedCache.can_truncate`)."""
        keep = [_common_prefix(c, s) for c, s in zip(self._cached, seqs)]
        return keep if self._ragged.can_truncate(torch.tensor(keep, dtype=torch.long)) else [0] * len(keep)

    def _catch_up(self, sequences) -> tuple[list[torch.LongTensor], torch.Tensor | None]:
        """Feed the draft what it has not seen of each row (its cache rolled back to the longest prefix it shares
        with the row): ``(sequences on the draft's device, logits [B, V'] after each row's last token)``. A row
        longer than the draft's context is not fed (its logits are filler; :meth:`_budget` gives it no token);
        the logits are ``None`` where no row is fed."""
        if self.generation_config is None:
            raise RuntimeError("draft() on a DraftModelDrafter not bound to a call: the loop calls start() first")
        seqs = [s.to(self.device) for s in sequences]
        keep = self._reusable(seqs)
        if not any(keep) and any(len(c) for c in self._cached):  # a carried cache that cannot roll back this far
            self._ragged = RaggedCache(self.draft_model.config, len(seqs), self.device, role="draft")
            self._cached = [s[:0] for s in seqs]
        self._ragged.truncate(torch.tensor(keep, dtype=torch.long))
        fits = [self._fits(s) for s in seqs]
        if not all(fits) and not self._past_context_noted:
            self._past_context_noted = True
            logger.warning("the draft model reads at most %d positions (its config): rows longer than that are "
                           "decoded without drafts from here on", self._context)
        new = [s[n:] if ok else s[:0] for s, n, ok in zip(seqs, keep, fits)]
        self._cached = [s if ok else s[:n] for s, n, ok in zip(seqs, keep, fits)]
        if not any(fits):
            return seqs, None
        if len(new) == 1:  # a batch of one: the block is its new tokens, nothing to align
            block, block_valid = new[0][None], None
        else:
            width = max(len(t) for t in new)
            block = torch.zeros(len(seqs), width, dtype=torch.long, device=self.device)
            block_valid = torch.zeros(len(seqs), width, dtype=torch.bool, device=self.device)
            for b, t in enumerate(new):  # right-aligned: every row's last real token is the last column
                block[b, width - len(t):] = t
                block_valid[b, width - len(t):] = True
        with upcast_prefill():  # a prompt's rows in float32 where install_upcast_prefill routed them (prepare)
            return seqs, self._ragged.forward(self.draft_model, block, block_valid).logits[:, -1]

    @torch.no_grad()
    def draft(self, sequences, k):
        seqs, logits = self._catch_up(sequences)
        if logits is None:  # every row past the draft's context
            return torch.zeros(len(seqs), 0, dtype=torch.long, device=self.device), \
                torch.zeros(len(seqs), dtype=torch.long, device=self.device), None
        held = self._cached  # what the cache holds of each row (_catch_up)
        do_sample = bool(self.generation_config.do_sample)
        # greedy without processors: the argmax of the draft's own logits (no float32 copy, no processing)
        raw_argmax = not do_sample and len(self.logits_processor) == 0
        reads = reads_sequences(self.logits_processor)  # only then do the processors need the drafted prefix
        threshold = self.confidence_threshold
        bsz = len(seqs)
        budget = self._budget(seqs, k)
        num_drafted = budget.clamp(min=0, max=k)
        running = budget > 0  # a row at max_length - 1 drafts nothing (not even a first token the stop counts)
        fed_count = torch.zeros(bsz, dtype=torch.long, device=self.device)
        tokens, scores = [], []
        for i in range(k):
            logits = _pad_or_cut(logits, self._target_vocab)
            if raw_argmax:
                token = logits.argmax(dim=-1)
                scored = logits
            else:
                token, scored = self.choose(seqs, logits.float())
                scores.append(scored)
            tokens.append(token)
            if i == k - 1:
                break
            if threshold > 0:
                # the draft's probability of the token it drafted (no [B, V] softmax); a row stops after a token
                # it doubts
                scored = scored.float()
                confidence = (scored.gather(1, token[:, None]).squeeze(1) - scored.logsumexp(dim=-1)).exp()
                stops = running & (confidence < threshold)
                num_drafted = torch.where(stops, i + 1, num_drafted)
                running &= ~stops
            running &= budget > i + 1  # and at max_length (see _budget)
            if not bool(running.any()):
                break
            if reads:
                seqs = [torch.cat([s, t[None]]) for s, t in zip(seqs, token)]
            # a stopped row's token is filler (a hole in its cache), so the draft never sees past where it stopped
            valid = None if bool(running.all()) else running[:, None]
            logits = self._ragged.forward(self.draft_model, token[:, None], valid).logits[:, -1]
            fed_count += running
        out = torch.stack(tokens, dim=1)
        # what the cache now holds: each sequence and the drafts fed after it
        self._cached = [torch.cat([s, t[:n]]) for s, t, n in zip(held, out, fed_count.tolist())]
        return out, num_drafted, (torch.stack(scores, dim=1) if do_sample else None)

    @torch.no_grad()
    def draft_tree(self, sequences, k, num_nodes):
        """A draft tree: the draft's likeliest token after each of its own, up to k (the chain :meth:`draft` drafts
        under greedy decoding), stopping where :meth:`draft` would stop, with the draft's next W - 1 likeliest
        tokens beside each chain token as leaves; then the ``num_nodes`` nodes of highest cumulative probability
        (the product of the draft's probabilities along their path) are the tree, as EAGLE-2 reranks its candidates (Li et al. 2024,
        "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees", section 4.2; a node's
        probability is never above its parent's, so every node's parent is in it).

        This is EAGLE-2's expansion with one node expanded per level, and that node is the chain's: the draft
        runs exactly the forwards of :meth:`draft` (one token each, on its own cache, which keeps them for the
        next step as after a chain), and each level's W likeliest tokens come from the same logits. Where a verify
        of a few more positions costs about what one of the chain's does (up to ~7 positions in bfloat16 on the
        2-core CPU of docs/benchmarks.md, issue 22), the siblings are nearly free, and the target takes one
        wherever it rejects the chain's token for the draft's second or third guess. Expanding W nodes per level,
        as EAGLE-2 does, made every level's draft forward and the verify dearer there than what it gained; even
        2 nodes per level, over a tree mask on the draft's cache, gained less than a 2-position forward of an
        int4 draft costs on a CPU with AMX (docs/benchmarks.md, "EAGLE-2's expansion for draft-model trees"). ``W =
        num_nodes`` within ``1..TREE_WIDTH``; the rerank puts the siblings where the draft is unsure. A
        row stops growing after a chain token the draft gave under ``confidence_threshold`` (the chain's stop;
        its later nodes are left out) or at its ``max_length`` budget (:meth:`_budget`: no node deeper than the
        tokens the row may still draft), and drafting ends when every row has stopped. Probabilities are the draft's
        after the call's logits processors (temperature, top-k, top-p, penalties, with the chain so far as
        prefix); nodes with probability 0 are left out.

        The nodes are deterministic given the text (the most likely tokens, never sampled), so under sampling q is
        one-hot and recursive rejection sampling keeps the target's distribution
        (:func:`~hf_spec.acceptance.speculative_sample_tree`); a row's sibling tokens then cover the draft's most
        likely continuations.

        Returns:
            ``(tokens [B, N], num_drafted [B], None, parents [B, N])``, ``N <= num_nodes``, nodes in the order
            they were made (a parent before its children); row b's nodes from ``num_drafted[b]`` on are filler.
        """
        seqs, logits = self._catch_up(sequences)
        bsz, device = len(seqs), self.device
        if logits is None:  # every row past the draft's context
            nothing = torch.zeros(bsz, 0, dtype=torch.long, device=device)
            return nothing, torch.zeros(bsz, dtype=torch.long, device=device), None, nothing.clone()
        held = self._cached  # what the cache holds of each row (_catch_up)
        width = self.tree_width(num_nodes)
        reads = reads_sequences(self.logits_processor)
        procs = self._row_processors if self._row_processors is not None else [self.logits_processor] * bsz
        stop = math.log(self.confidence_threshold) if self.confidence_threshold > 0 else -math.inf
        budget = self._budget(seqs, k)
        running = budget > 0  # rows whose chain the draft did not doubt, and that may still draft (see _budget)
        fed_count = torch.zeros(bsz, dtype=torch.long, device=device)
        chain_score = torch.zeros(bsz, device=device)  # the chain node's cumulative log-probability
        prefixes, fed, tokens, scores = seqs, [], [], []
        for level in range(k):
            logits = _pad_or_cut(logits, self._target_vocab).float()
            if len(self.logits_processor):
                logits = process_scores(procs, prefixes if reads else None, logits)
            top, child_token = logits.topk(width, dim=-1)  # [B, W]: the chain's token first
            top = top - logits.logsumexp(dim=-1, keepdim=True)  # their log-probabilities, no [B, V] log-softmax
            # a stopped row's further nodes are filler (probability 0), as a chain's tokens past its stop
            child_score = torch.where(running[:, None], chain_score[:, None] + top, -math.inf)
            running &= top[:, 0] >= stop  # the chain's own stop: a token the draft gave under the threshold
            chain_score = child_score[:, 0]
            tokens.append(child_token)
            scores.append(child_score)
            running &= budget > level + 1  # deeper nodes would sit past max_length (see _budget)
            if level == k - 1 or not bool(running.any()):
                break
            chain_token = child_token[:, 0]
            if reads:
                prefixes = [torch.cat([p, t[None]]) for p, t in zip(prefixes, chain_token)]
            fed.append(chain_token)
            valid = None if bool(running.all()) else running[:, None]  # a stopped row's token is a hole
            logits = self._ragged.forward(self.draft_model, chain_token[:, None], valid).logits[:, -1]
            fed_count += running
        # what the draft's cache now holds: each sequence and the chain tokens fed after it
        self._cached = ([torch.cat([s, t[:n]]) for s, t, n in zip(held, torch.stack(fed, dim=1), fed_count.tolist())]
                        if fed else held)
        token, score = torch.cat(tokens, dim=1), torch.cat(scores, dim=1)  # [B, levels x W], level by level
        score = score.masked_fill(score.isnan(), -math.inf)  # a row whose processed logits were all -inf: filler
        # level 0's nodes hang from the root, level l's from level l - 1's chain node (its first)
        parent = torch.tensor([-1] * width + [(level - 1) * width for level in range(1, len(tokens))
                                              for _ in range(width)], device=device).expand(bsz, -1)
        # the tree: the num_nodes most likely nodes (ties: the earlier made, so a parent before its child), in the
        # order they were made, nodes of probability 0 last (filler)
        n = min(num_nodes, token.shape[1])
        chosen = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :n]
        made = torch.isinf(score.gather(1, chosen)).to(torch.long) * token.shape[1] + chosen
        chosen = chosen.gather(1, made.argsort(dim=1))
        new_index = torch.full_like(token, -1).scatter_(1, chosen, torch.arange(n, device=device).expand(bsz, -1)
                                                        .contiguous())
        up = parent.gather(1, chosen)
        tree_parents = torch.where(up >= 0, new_index.gather(1, up.clamp(min=0)), -1)
        num_drafted = torch.isfinite(score.gather(1, chosen)).sum(dim=1)
        return token.gather(1, chosen), num_drafted, None, tree_parents

    def _budget(self, seqs, k: int) -> torch.Tensor:
        """``LongTensor[B]``: the most tokens each row may draft, ``max_length - len(row) - 1`` (the target's own
        token takes the last position; ``len(row)`` without the row's left padding, so this is at least the loop's
        cap, which counts the padding), k where the call has no ``max_length``. The draft is fed its token i only
        for a row that drafts token i + 1, so no position the draft sees reaches ``max_length``, where a draft
        with learned positions may have none (GPT-2's ``n_positions``); in a batch, a row that reached its budget,
        or stopped where the draft doubted it, is fed filler (a hole in its cache) while other rows draft on.
        Where the draft reads at most C positions (:func:`~hf_spec.prompts.model_context`: GPT-2's ``n_positions``,
        a rotary model's trained context) the budget is at most ``C - len(row) + 1`` (its last token fed at
        position C - 1), so a row at C drafts one token and a longer one (not fed by :meth:`_catch_up`) none: a
        sequence that outgrows a short draft is decoded on by the target alone, as vLLM skips speculation past the
        draft's ``max_model_len``."""
        max_length = getattr(self.generation_config, "max_length", None)
        budget = [k if max_length is None else max_length - len(s) - 1 for s in seqs]
        if self._context is not None:
            budget = [min(b, self._context - len(s) + 1) for b, s in zip(budget, seqs)]
        return torch.tensor(budget, device=self.device)

    @staticmethod
    def tree_width(num_nodes: int) -> int:
        """W, the tokens each chain node of :meth:`draft_tree` branches into (its chain child and W - 1 leaves):
        ``num_nodes`` within ``1..TREE_WIDTH``, whatever k, so that the rerank can put all of a tree's nodes beside
        one chain token where the draft doubts only that one (an earlier ``ceil(num_nodes / k)`` made every tree
        of ``num_nodes <= k`` a chain, and spread the others evenly over the levels)."""
        return max(1, min(TREE_WIDTH, num_nodes))


def _pad_or_cut(logits: torch.Tensor, rows: int) -> torch.Tensor:
    """``logits [B, V_draft]`` as ``[B, rows]``: extra draft rows cut (padding of the draft's vocabulary, which
    the shared tokenizer never produces), missing ones filled with -inf (probability 0 under the draft)."""
    if logits.shape[-1] == rows:
        return logits
    if logits.shape[-1] > rows:
        return logits[..., :rows]
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], rows - logits.shape[-1]), float("-inf"))], dim=-1)


def load_draft_model(name: str, target=None, draft_dtype=None):
    """``(model, tokenizer)`` of the draft model ``name`` (an offline short name, a folder or a hub name), loaded
    with :func:`hf_spec.load` in :func:`hf_spec.device.draft_dtype` of the target's dtype (or ``draft_dtype``) on
    the target's device; ``"int8"``: loaded in float32 and made int8 (:func:`hf_spec.kernels.quantize_draft_int8`);
    ``"int4"``: loaded in bfloat16 and given 4-bit weights (:func:`hf_spec.kernels.quantize_draft_int4`); where
    ``"auto"`` chose int4 and no layer can take it, the draft stays bfloat16 (a warning says why).

    Raises:
        ValueError: ``"int8"`` or ``"int4"`` beside a target that is not on the CPU, before anything loads.
    """
    from ..device import check_draft_dtype
    from ..kernels import quantize_draft_int4, quantize_draft_int8
    from ..models import load

    device = getattr(target, "device", None)
    dtype = _draft_dtype(getattr(target, "dtype", None), draft_dtype, device)
    if device is not None:
        check_draft_dtype(dtype, device)
    model, tokenizer = load(name, dtype={"int8": torch.float32, "int4": torch.bfloat16}.get(dtype, dtype))
    if dtype == "int8":
        quantize_draft_int8(model)
    elif dtype == "int4":
        try:
            quantize_draft_int4(model)
        except ValueError as e:
            if draft_dtype not in (None, "auto"):
                raise
            logger.warning("hf_spec: the draft stays bfloat16 (--draft-dtype auto chose int4, but %s)", e)
    elif device is not None and device.type not in ("cpu", "meta"):
        model.to(device)
    return model, tokenizer


def _compute_parameters(model) -> int:
    """Parameters a forward computes with per token: all but the input embeddings (a lookup); an int8 layer's
    packed weights count as parameters."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    embeddings = model.get_input_embeddings()
    skip = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
    # in x out, not weight().numel(): weight() unpacks the int8 matrix, ~2 s for a 0.5B draft at every call
    packed = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, DynamicLinear))
    return packed + sum(p.numel() for p in model.parameters() if id(p) not in skip)


def _common_prefix(cached: torch.LongTensor, seq: torch.LongTensor) -> int:
    """Length of the common prefix of ``cached`` and ``seq``, leaving at least the last token of ``seq``
    to feed (its logits give the first draft)."""
    n = min(len(cached), len(seq) - 1)
    if n <= 0:
        return 0
    same = cached[:n] == seq[:n]
    return n if bool(same.all()) else int(same.to(torch.long).argmin())
