"""Draft-model drafter: a smaller causal LM with the target's tokenizer proposes k tokens.

The draft keeps its own KV cache across steps: after a verification it is cropped to the longest prefix
it shares with the accepted sequence, and only the tokens it has not seen are fed next time (no
re-prefill). Tokens are chosen the way the target chooses them: argmax under greedy decoding, or sampled
from the draft's logits after the call's logits processors, whose distribution is returned as q for
speculative sampling (Leviathan et al. 2023).

With ``num_tree_nodes=N`` in the call it drafts a tree instead (:meth:`DraftModelDrafter.draft_tree`), grown as
EAGLE-2 grows one: each level's likeliest trusted nodes expanded in one draft forward over a tree attention mask,
all candidates reranked by cumulative probability; the draft's cache keeps the branch the target accepted.
"""

from __future__ import annotations

import logging
import math

import torch

from ..kernels import install_upcast_prefill
from ..device import cpu_has_native_bf16, draft_dtype as _draft_dtype
from ..ragged import RaggedCache
from ..processors import process_scores, reads_sequences
from .base import DEFAULT_NUM_SPECULATIVE_TOKENS, Drafter, logit_rows

logger = logging.getLogger("hf_spec")

__all__ = ["DraftModelDrafter", "VocabularyMismatchError", "TREE_WIDTH", "TREE_EXPAND", "EXPAND_MIN_PROB",
           "DEFAULT_CONFIDENCE_THRESHOLD"]

#: :class:`DraftModelDrafter`'s ``confidence_threshold`` when none is given: a row stops drafting after a token its
#: draft gave under this probability (docs/benchmarks.md, "The draft model's confidence stop")
DEFAULT_CONFIDENCE_THRESHOLD = 0.5

#: the most nodes of one level of a draft tree that :meth:`DraftModelDrafter.draft_tree` expands (EAGLE-2's top-k
#: expansion): one draft forward per level over this many positions
TREE_EXPAND = 2

#: a draft tree's node that the draft gave under ``confidence_threshold`` is still expanded where its cumulative
#: probability is at least this and its level is expanded anyway (:meth:`DraftModelDrafter.draft_tree`)
EXPAND_MIN_PROB = 0.1

#: the most children an expanded node of a draft tree offers (:meth:`DraftModelDrafter.tree_width`): the draft's
#: likeliest tokens after it; the rerank keeps the likeliest of all
TREE_WIDTH = 8


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
            sampled distribution are the target's. A tree (:meth:`draft_tree`) goes a level deeper only where
            the chain's stop lets it, and there also expands likely second guesses.

    Raises:
        ValueError: ``num_speculative_tokens`` < 1; ``confidence_threshold`` outside ``[0, 1)``; (from
            :meth:`prepare`) a draft offloaded with accelerate.
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
        super().__init__(num_speculative_tokens)
        self.confidence_threshold = float(confidence_threshold)
        self.draft_model = draft_model
        self.config = draft_model.config
        if tokenizer is not None and draft_tokenizer is not None and tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise VocabularyMismatchError(
                f"the draft tokenizer ({getattr(draft_tokenizer, 'name_or_path', '?')}, {len(draft_tokenizer)} tokens) "
                f"differs from the target tokenizer ({getattr(tokenizer, 'name_or_path', '?')}, {len(tokenizer)} tokens); "
                "a draft model must use the target's tokenizer"
            )
        self._same_tokenizer = tokenizer is not None and draft_tokenizer is not None
        self._ragged: RaggedCache | None = None
        self._cached: list[torch.LongTensor] = []
        # the last tree's expanded nodes in the draft's cache, per branch slot: token, parent slot, real [B, S]
        self._branches: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

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
                "one family often pad their vocabularies differently: pass tokenizer= and draft_tokenizer= so that "
                "hf-spec can compare the tokenizers (the command line does); a draft with another tokenizer cannot "
                "draft for this target"
            )
        self._target_vocab = t_vocab
        # compute per token relative to the target's (for catch_up_cost): non-embedding parameters, the prefill's
        # FLOPs; a rough estimate of time, as the two models may differ in dtype
        self._relative_cost = _compute_parameters(self.draft_model) / max(1, _compute_parameters(target))
        if (self.device.type == "cpu" and self.draft_model.dtype in (torch.bfloat16, torch.float16)
                and not cpu_has_native_bf16()):
            install_upcast_prefill(self.draft_model)  # prompt prefill in float32: ~3x faster here
        # the draft's own cache, rolled back to what it shares with the accepted sequence at every draft
        self._ragged = RaggedCache(self.draft_model.config, input_ids.shape[0], self.device)
        self._cached = [row[:0] for row in input_ids.to(self.device)]
        self._branches = None

    @property
    def device(self) -> torch.device:
        return self.draft_model.device

    def select_rows(self, rows):
        if self._ragged is not None:
            self._ragged.select(rows)
            self._cached = [self._cached[int(r)] for r in rows]
            if self._branches is not None:
                self._branches = tuple(t[rows.to(t.device)] for t in self._branches)

    def catch_up_cost(self, sequences) -> float:
        """The tokens the draft has not seen beyond the one every step feeds (B x the widest row: the block is
        rectangular) x the draft's compute per token relative to the target's; in tokens of the target's
        prefill. The whole prompt before the first draft, ~0-1 token between two speculative steps."""
        if self._ragged is None:
            return 0.0
        unseen = [len(s) - _common_prefix(c, s.to(self.device)) for c, s in zip(self._cached, sequences)]
        return len(unseen) * max(0, max(unseen, default=1) - 1) * self._relative_cost

    def _keep_branch(self, seqs: list[torch.LongTensor]) -> None:
        """After :meth:`draft_tree`: keep in the draft's cache, for each row, the root path of expanded nodes that
        the row's sequence went on with (the target accepted it), as the next tokens of its sequence; the other
        branches are dropped. The last token of each sequence is never kept, so the next forward has one to feed."""
        token, parent, real = (t.tolist() for t in self._branches)
        self._branches = None
        paths = []
        for b, seq in enumerate(seqs):
            path, cached = [], self._cached[b]
            if len(seq) > len(cached) and bool((seq[:len(cached)] == cached).all()):
                tail, node = seq[len(cached):len(seq) - 1].tolist(), -1
                for t in tail:
                    node = next((j for j, (tj, pj, rj) in enumerate(zip(token[b], parent[b], real[b]))
                                 if rj and pj == node and tj == t), None)
                    if node is None:
                        break
                    path.append(node)
            paths.append(path)
        depth = max(map(len, paths))
        slots = torch.tensor([p + [0] * (depth - len(p)) for p in paths], dtype=torch.long).reshape(len(seqs), depth)
        self._ragged.keep_branch(slots, torch.tensor([len(p) for p in paths], dtype=torch.long))
        self._cached = [torch.cat([c, s[len(c):len(c) + len(p)]]) for c, s, p in zip(self._cached, seqs, paths)]

    def _catch_up(self, sequences) -> tuple[list[torch.LongTensor], torch.Tensor]:
        """Feed the draft what it has not seen of each row (its cache rolled back to the longest prefix it shares
        with the row): ``(sequences on the draft's device, logits [B, V'] after each row's last token)``."""
        if self.generation_config is None:
            raise RuntimeError("draft() on a DraftModelDrafter not bound to a call: the loop calls start() first")
        seqs = [s.to(self.device) for s in sequences]
        if self._branches is not None:
            self._keep_branch(seqs)
        # reuse each row's cached prefix: the longest common prefix of what the cache holds and the sequence
        keep = [_common_prefix(c, s) for c, s in zip(self._cached, seqs)]
        self._ragged.truncate(torch.tensor(keep, dtype=torch.long))
        new = [s[n:] for s, n in zip(seqs, keep)]
        if len(new) == 1:  # a batch of one: the block is its new tokens, nothing to align
            block, block_valid = new[0][None], None
        else:
            width = max(len(t) for t in new)
            block = torch.zeros(len(seqs), width, dtype=torch.long, device=self.device)
            block_valid = torch.zeros(len(seqs), width, dtype=torch.bool, device=self.device)
            for b, t in enumerate(new):  # right-aligned: every row's last real token is the last column
                block[b, width - len(t):] = t
                block_valid[b, width - len(t):] = True
        self._cached = seqs
        return seqs, self._ragged.forward(self.draft_model, block, block_valid).logits[:, -1]

    @torch.no_grad()
    def draft(self, sequences, k):
        seqs, logits = self._catch_up(sequences)
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
        tokens, scores, fed = [], [], seqs
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
        self._cached = [torch.cat([s, t[:n]]) for s, t, n in zip(fed, out, fed_count.tolist())]
        return out, num_drafted, (torch.stack(scores, dim=1) if do_sample else None)

    @torch.no_grad()
    def draft_tree(self, sequences, k, num_nodes):
        """A draft tree grown as EAGLE-2 grows one (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models
        with Dynamic Draft Trees", section 4): level by level, each expanded node offers the draft's W likeliest
        tokens after it as children, scored by cumulative probability (the product of the draft's probabilities
        along the path); of a level's children the :data:`TREE_EXPAND` likeliest are expanded in turn, one draft
        forward per level over all of them (a tree attention mask on the draft's cache,
        :meth:`~hf_spec.ragged.RaggedCache.forward_branches`); then the ``num_nodes`` nodes of highest cumulative
        probability are the tree (EAGLE-2's rerank, section 4.2; a node's probability is never above its parent's,
        so every node's parent is in it). At most k levels.

        A child is expanded only where the draft trusts it: its own probability at least ``confidence_threshold``
        (the chain's stop: the likeliest path is the chain :meth:`draft` drafts, cut where it cuts), or, in a
        level where some child passes that test, its cumulative probability at least :data:`EXPAND_MIN_PROB` (a
        second guess likely enough to be the target's rides along in a forward the draft runs anyway); with
        ``confidence_threshold=0`` every child may be. So the draft runs a forward per level the stop lets it go
        on, of up to :data:`TREE_EXPAND` positions (on the AMX Xeon of docs/benchmarks.md an int4 draft's forward
        over 2 positions costs ~1.15 of one, over 4 ~1.4: hence 2, and no level for second guesses alone). A
        row also stops at its ``max_length`` budget (:meth:`_budget`: no node deeper than the tokens the row may
        still draft); drafting ends when no row has a node to expand. ``W = num_nodes`` within
        ``1..TREE_WIDTH``. Probabilities are the draft's after the call's logits processors (temperature, top-k,
        top-p, penalties, with each node's path as prefix); nodes with probability 0 are left out.

        The draft's cache keeps every expanded node until the next call, which keeps the one root path the target
        accepted as the next tokens of its sequence (no draft forward re-reads them).

        The nodes are deterministic given the text (the most likely tokens, never sampled), so under sampling q is
        one-hot and recursive rejection sampling keeps the target's distribution
        (:func:`~hf_spec.acceptance.speculative_sample_tree`).

        Returns:
            ``(tokens [B, N], num_drafted [B], None, parents [B, N])``, ``N <= num_nodes``, nodes in the order
            they were made (a parent before its children); row b's nodes from ``num_drafted[b]`` on are filler.

        Raises:
            ValueError: a draft model whose attention implementation takes no custom 4D mask (load it with
                ``attn_implementation="sdpa"``, or draft chains).
        """
        seqs, logits = self._catch_up(sequences)
        bsz, device = len(seqs), self.device
        width = self.tree_width(num_nodes)
        reads = reads_sequences(self.logits_processor)
        procs = self._row_processors if self._row_processors is not None else [self.logits_processor] * bsz
        stop = math.log(self.confidence_threshold) if self.confidence_threshold > 0 else -math.inf
        budget = self._budget(seqs, k)
        rows = torch.arange(bsz, device=device)
        # the frontier: the nodes expanded at the last level (the root at first), [B, F]
        front_score = torch.zeros(bsz, 1, device=device)  # cumulative log-probability
        front_node = torch.full((bsz, 1), -1, dtype=torch.long, device=device)  # node index (-1: the root)
        front_slot = torch.full((bsz, 1), -1, dtype=torch.long, device=device)  # branch slot in the draft's cache
        front_paths = [[s] for s in seqs] if reads else None  # each frontier node's prefix, for the processors
        sees = torch.zeros(bsz, 1, 0, dtype=torch.bool, device=device)  # each frontier node's ancestors' slots
        tokens, scores, parents = [], [], []
        slot_token, slot_parent, slot_real = [], [], []  # per branch slot: token, parent slot (-1: root), real
        logits = logits[:, None]  # [B, F, V]
        for level in range(k):
            num_front = front_node.shape[1]
            flat = _pad_or_cut(logits.reshape(bsz * num_front, -1), self._target_vocab).float()
            if len(self.logits_processor):
                flat = process_scores([p for p in procs for _ in range(num_front)],
                                      [x for paths in front_paths for x in paths] if reads else None, flat)
            top, child = flat.topk(width, dim=-1)  # [B x F, W], each node's likeliest first
            top = top - flat.logsumexp(dim=-1, keepdim=True)  # log-probabilities, no [B, V] log-softmax
            top, child = top.view(bsz, num_front * width), child.view(bsz, num_front * width)
            child_score = front_score.repeat_interleave(width, dim=1) + top
            # filler: a row's nodes past its budget (see _budget), and rows whose processed logits were all -inf
            child_score = child_score.masked_fill(child_score.isnan() | (budget <= level)[:, None], -math.inf)
            offset = sum(t.shape[1] for t in tokens)
            tokens.append(child)
            scores.append(child_score)
            parents.append(front_node.repeat_interleave(width, dim=1))
            if level == k - 1:
                break
            # the next frontier: the TREE_EXPAND likeliest children the draft trusts, where the row may go deeper
            # the chain's rule goes on (a child the draft gave at least confidence_threshold); where it does, likely
            # second guesses ride along in the same forward
            deeper = torch.isfinite(child_score) & (budget > level + 1)[:, None]
            trusted = (top >= stop) & deeper
            trusted |= (child_score >= math.log(EXPAND_MIN_PROB)) & deeper & trusted.any(dim=1, keepdim=True)
            ranked = child_score.masked_fill(~trusted, -math.inf)
            num_next = min(TREE_EXPAND, ranked.shape[1])
            best, pick = ranked.topk(num_next, dim=1)  # [B, F']
            real = torch.isfinite(best)
            if not bool(real.any()):
                break
            parent_of = pick // width  # the frontier entry each picked child hangs from
            block = child.gather(1, pick)
            # each new node sees its parent's ancestors and its parent's slot (the root's is in the sequence)
            new_sees = sees[rows[:, None], parent_of]  # [B, F', S]
            parent_slot = front_slot.gather(1, parent_of)
            first = sees.shape[2]
            slot_range = torch.arange(first, device=device)
            new_sees = new_sees | (slot_range[None, None, :] == parent_slot[:, :, None])
            depth = torch.where(real, new_sees.sum(dim=-1) + 1, 0)  # filler at the last token's position
            logits = self._ragged.forward_branches(self.draft_model, block, real, new_sees, depth).logits
            slot_token.append(block)
            slot_parent.append(torch.where(real, parent_slot, -2))
            slot_real.append(real)
            front_slot = first + torch.arange(num_next, device=device).expand(bsz, -1)
            sees = torch.cat([new_sees, torch.zeros(bsz, num_next, num_next, dtype=torch.bool, device=device)], dim=2)
            front_score = best
            front_node = offset + pick
            if reads:
                front_paths = [[torch.cat([front_paths[b][int(f)], block[b, j:j + 1]])
                                for j, f in enumerate(parent_of[b].tolist())] for b in range(bsz)]
        # what the draft's cache now holds: each sequence, and the expanded nodes as branches (see _catch_up)
        self._branches = ((torch.cat(slot_token, dim=1), torch.cat(slot_parent, dim=1), torch.cat(slot_real, dim=1))
                          if slot_token else None)
        token, score, parent = torch.cat(tokens, dim=1), torch.cat(scores, dim=1), torch.cat(parents, dim=1)
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
        or stopped where the draft doubted it, is fed filler (a hole in its cache) while other rows draft on."""
        max_length = getattr(self.generation_config, "max_length", None)
        return torch.tensor([k if max_length is None else max_length - len(s) - 1 for s in seqs], device=self.device)

    @staticmethod
    def tree_width(num_nodes: int) -> int:
        """W, the children each expanded node of :meth:`draft_tree` offers: ``num_nodes`` within
        ``1..TREE_WIDTH``, whatever k, so that the rerank can put all of a tree's nodes under one node where the
        draft doubts only that one (an earlier ``ceil(num_nodes / k)`` made every tree of ``num_nodes <= k`` a
        chain, and spread the others evenly over the levels)."""
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
