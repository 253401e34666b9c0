"""Hybrid drafter: per step and row, the suffix drafter's proposal or a model drafter's (a draft model, Medusa
heads), whichever is predicted to emit more tokens per second.

Each source has its niche: suffix matches draft long runs for free where the answer repeats its context
(summaries, retrieval, code edits, extraction), a draft model drafts prose and reasoning. After SuffixDecoding's
hybrid mode (Oliaro et al. 2024, arXiv:2411.04975, section 4.3: speculate with the suffix tree when its match
score is high enough, else with the model), the choice here is made by the cost model of adaptive k
(:mod:`hf_spec.adaptive`, after Leviathan et al. 2023): per row, the expected tokens of a step,
``1 + sum_i prod_{j <= i} a_j``, over its cost, with

- the suffix proposal's acceptance a_j: the conditional acceptance measured for suffix drafts at position j
  (decayed counts), separately per match-length bucket (:data:`SUFFIX_PRIORS`: 1, 2-3, 4-9, 10 or more tokens),
  each with its own prior (:data:`PRIOR_WEIGHT` pseudo-observations) from the acceptance of suffix proposals
  measured offline by match length; a match in a corpus or in past outputs (``Proposal.origin``) apart from one in
  the text itself, with its own priors (:data:`CORPUS_PRIORS`): at the same length it predicts less (2-3 tokens:
  the first token accepted 30% against 54%), and priced as a match in the text it drew the hybrid to corpus
  proposals that lost to its draft model. One prior for every match length let a free proposal from a 1-token match
  (accepted about a quarter of the time) beat an unmeasured model, and judged long matches (three quarters) as
  weak as short ones. Those priors come from greedy outputs; all of them are multiplied by how this call's
  suffix drafts fared against them, pooled over the buckets (:meth:`HybridDrafter.suffix_prior_scale`, at most
  1, starting where the drafter's earlier calls of the same kind, greedy or sampled, left it:
  :meth:`HybridDrafter.suffix_history_scale`): when sampling, a one-hot token is accepted with the target's
  probability of it, and a bucket learning that alone paid a step per failed draft;
- the model's: the conditional acceptance measured for its drafts at position j, for the step's k (prior for the
  first position: the first-token acceptance of this drafter's model drafts in its earlier calls,
  :meth:`HybridDrafter.model_prior`, :data:`MODEL_PRIOR` before any; then the estimate of the position before):
  with 0.5 for every call, a draft model accepted at about 0.7 a position whose first 3 drafts of a call failed
  was priced below 1-token suffix matches for the rest of it (a sampled coding prompt: 73 suffix drafts, 7% of
  their tokens accepted, 1.11x against the draft model's 2.0x alone);
- each kind of draft's counts decay at every step, verified or not, so a source not chosen drifts back to the
  prior and is tried again: measured (issue 21, a coding prompt), the draft model written off on its first 3
  drafts (1 of 5 tokens accepted) was never chosen again while the suffix source drafted 39 times at 12%
  acceptance, 1.28x against the draft model's 2.56x alone; a source that did better than its prior drifts back
  to what it measured when it last drafted, not to the prior (fading to the prior, a draft model accepted at about
  0.7 a position was soon priced at 0.5 while suffix drafts were chosen, and lost steps to them under sampling);
- costs in seconds: the target's forward over the positions each choice verifies (1 for plain decoding, 1 + the
  draft's length for a source; :func:`~hf_spec.adaptive.forward_time` over the medians of the last forwards
  reported at each number of positions, as adaptive k prices its k: where verifying more positions costs more,
  float32 on a CPU, a 4-token suffix proposal from a 1-token match must beat a plain step that costs less than
  its verify, where one median over every forward priced all three alike), plus for the model its drafting time
  (k times the median time per drafted token of its last drafts) and, while it has a one-off
  catch-up to do (a draft model's prefill of a long prompt, :meth:`~hf_spec.drafters.base.Drafter.catch_up_cost`,
  priced with the target's measured prefill time per token), that cost spread over the steps the tokens left
  allow. The suffix drafter's own lookup is microseconds and left out.

A row drafts nothing (a plain step for it) when neither source is predicted to beat plain decoding, one token
per forward: a row without a suffix match whose model catch-up the tokens left cannot repay. When every row
takes its suffix proposal the model does not run (a draft model catches up on the tokens it missed at its next
draft). Each step's choice per row is in
:attr:`~hf_spec.drafters.base.Drafter.last_sources` (the loop copies it into ``StepEvent.sources``, and
:class:`~hf_spec.metrics.SpecStats` counts drafted and accepted tokens by source).

With ``num_tree_nodes`` in the call (:meth:`HybridDrafter.draft_tree`) each row drafts its chosen source's tree:
the suffix drafter's speculation tree or the model drafter's. A row that chose the model and has a suffix match of
:data:`MERGE_MIN_MATCH` tokens or more gets both in one tree: the suffix proposal is folded into the model's tree
as a branch (:func:`merge_into_tree`; tokens the model drafted too are shared), in nodes taken from the model's
tree (it drafts that many fewer, so the verify's positions stay within ``num_tree_nodes``), so that the target takes
whichever continues the text: the model's where the answer is new, the suffix proposal's where it copies, past
where the model's chain stopped unsure (SuffixDecoding's hybrid picks one source per step).

Exact like every drafter: suffix rows are deterministic (one-hot q), model rows keep the distributions they
were sampled from.
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time

import torch

from ..acceptance import tree_depths
from ..adaptive import forward_time
from .base import Drafter, VerifyOutput, logit_rows
from .suffix import SuffixDrafter

__all__ = ["CORPUS_PRIORS", "HybridDrafter", "MERGE_MIN_MATCH", "SUFFIX_PRIORS", "merge_into_tree"]

#: Suffix proposals' prior conditional acceptance by match length: ``(shortest match, first token, each later
#: token)`` per bucket. Measured offline (docs/results/issue21_hybrid_priors/, 2026-12-02) on the target's
#: (Qwen2.5-Coder-1.5B) greedy outputs for the 26 Spec-Bench questions the bench does not use (the 3rd and 4th
#: of each category), at the positions a suffix-only loop drafts at: 1-token matches 0.23 then 0.52-0.65, 2-3
#: tokens 0.49-0.50 then 0.67-0.72, 4-9 tokens 0.64-0.71 then 0.67-0.90, 10 or more 0.72 then 0.92.
SUFFIX_PRIORS = ((1, 0.25, 0.55), (2, 0.5, 0.7), (4, 0.65, 0.8), (10, 0.75, 0.85))

#: The same for proposals from a match in a corpus or in past outputs (``Proposal.origin`` ``"corpus"`` or
#: ``"memory"``), same buckets. Measured offline (docs/results/issue21_suffix_corpus/priors.py, 2026-12-05) leave one
#: out on the target's greedy answers to 264 Spec-Bench questions the bench does not ask, each replayed after its
#: prompt with the other 263 as the corpus: corpus matches of 1 token 0.21 then 0.42, 2-3 tokens 0.30 then 0.52,
#: 4-9 tokens 0.53 then 0.44, 10 or more 0.65 then 0.57 (34 proposals), where matches in the text itself gave
#: 0.26 / 0.57, 0.54 / 0.75, 0.71 / 0.79 and 0.92 / 0.94. Past outputs (``"memory"``) share these priors and counts
#: with the corpus: not measured apart (a server answering near-identical requests would find its memory matches
#: stronger, which the counts then learn within a call).
CORPUS_PRIORS = ((1, 0.2, 0.4), (2, 0.3, 0.5), (4, 0.5, 0.45), (10, 0.65, 0.55))


def _priors(origin: str):
    """:data:`SUFFIX_PRIORS` for a match in the text itself, :data:`CORPUS_PRIORS` for one in a corpus or past
    outputs."""
    return SUFFIX_PRIORS if origin == "text" else CORPUS_PRIORS


def suffix_bucket(match_length: int) -> int:
    """The index in :data:`SUFFIX_PRIORS` (and :data:`CORPUS_PRIORS`, whose buckets are the same) of the bucket a
    suffix match of ``match_length`` tokens falls in (the first for anything shorter than its shortest match)."""
    return max(0, bisect.bisect_right([shortest for shortest, _, _ in SUFFIX_PRIORS], match_length) - 1)


#: the shortest suffix match whose proposal joins a model row's tree (:meth:`HybridDrafter.draft_tree`): from 2
#: tokens on, the first suffix token was accepted about half the time (:data:`SUFFIX_PRIORS`), 1-token matches a quarter.
#: The same length for a match in a corpus or past outputs, whose 2-3-token matches are accepted 30% of the time
#: (:data:`CORPUS_PRIORS`): a folded branch costs the model's tree a few nodes, not a step; not measured apart yet
MERGE_MIN_MATCH = 2


def merge_into_tree(tokens: list[int], parents: list[int], chain: list[int]) -> tuple[list[int], list[int]]:
    """Fold ``chain`` (tokens that follow the root one after another) into a draft tree as a branch: its longest
    prefix that is already a root path of the tree is shared, the rest hangs below as new nodes, appended in order.

    Args:
        tokens: the tree's node tokens, ``[N]``.
        parents: each node's parent index, ``[N]`` (-1: the root; a parent before its children).
        chain: the tokens to fold in, ``[L]``.

    Returns:
        ``(tokens, parents)`` of the merged tree, ``N + (L - shared)`` nodes, the tree's own first and unchanged;
        every root path of either input is a root path of the result, and no two siblings are added with one token.
    """
    children = {(p, t): j for j, (t, p) in enumerate(zip(tokens, parents))}
    tokens, parents = list(tokens), list(parents)
    node = -1
    for t in chain:
        j = children.get((node, t))
        if j is None:
            tokens.append(t)
            parents.append(node)
            j = children[(node, t)] = len(tokens) - 1
        node = j
    return tokens, parents


#: the model drafter's prior first-token acceptance before it has drafted in any call of this drafter
MODEL_PRIOR = 0.5

#: weight kept per draft (one row's) by the counts carried from call to call (:meth:`HybridDrafter.model_prior`,
#: :meth:`HybridDrafter.suffix_history_scale`): about the last 100 drafts of a kind, a few single-row calls' worth
HISTORY_DECAY = 0.99

_HISTORY_LOCK = threading.Lock()  # calls in threads share their drafter's histories

#: the weight of a prior, in observations: one let a model drafter's first two rejected drafts write it off (a
#: translation prompt: 0 of 2, then no model draft for 10 steps where the model alone went on to accept 9 of 20)
PRIOR_WEIGHT = 3.0


def _remember(history: dict[bool, list[float]], key: bool, hits: float, total: float) -> None:
    """One more observation in a drafter's history across calls (``key``: do_sample -> ``[hits, total]``), the
    earlier ones decayed by :data:`HISTORY_DECAY`; under the lock, as calls in threads share it."""
    with _HISTORY_LOCK:
        counts = history.setdefault(key, [0.0, 0.0])
        counts[0] = counts[0] * HISTORY_DECAY + hits
        counts[1] = counts[1] * HISTORY_DECAY + total


def _recall(history: dict[bool, list[float]], key: bool, prior: float) -> float:
    """The history's rate of hits, with :data:`PRIOR_WEIGHT` pseudo-observations at ``prior``."""
    with _HISTORY_LOCK:
        hits, total = history.get(bool(key), (0.0, 0.0))
    return (hits + PRIOR_WEIGHT * prior) / (total + PRIOR_WEIGHT)


class _Acceptance:
    """Decayed per-position counts of one kind of draft: ``estimate(j)`` is the conditional acceptance at
    position j, each position's counts plus :data:`PRIOR_WEIGHT` pseudo-observations at the prior (``first`` for
    the first position, ``later`` for each later one, ``None``: the estimate of the position before), plus the
    weight its counts lost to fading since the kind last drafted, at the fade target: the larger of the prior and
    the acceptance the counts showed then (kept apart, decayed at the kind's own drafts only). While the kind
    drafts at every step nothing has faded and the estimate is its counts' with the prior's; when fully faded it is
    the counts it had when it last drafted, with the prior's, or the prior where it did worse than that.

    The counts fade at every step in which the kind was not verified, so a kind written off on a few drafts drifts
    back to the prior and is tried again; a kind that did better than its prior drifts back to what it did, not
    below it: fading to the prior, a draft model accepted at about 0.7 a position while suffix drafts were chosen
    was soon priced at 0.5 and lost steps to suffix proposals whose tokens were accepted 13% of the time
    (docs/benchmarks.md, the hybrid under sampling)."""

    def __init__(self, decay: float, first: float = 0.5, later: float | None = None):
        self.decay, self.reached, self.accepted = decay, [], []
        self.kept_reached, self.kept_accepted = [], []  # the same counts, decayed at this kind's drafts only
        self.first, self.later = first, later

    def add(self, num_drafted: int, num_accepted: int, asked: int | None = None) -> None:
        """One verified draft. ``asked``: the k the draft was asked for, where it may stop short of it (a draft
        model's confidence stop): the position after a fully accepted draft that stopped counts as a rejection,
        so ``expected_tokens(k)`` is what a draft asked for k tokens emits."""
        n = min(num_accepted + 1, num_drafted if asked is None else max(asked, num_drafted))
        self.fade()
        self.kept_reached[:] = [r * self.decay for r in self.kept_reached]
        self.kept_accepted[:] = [a * self.decay for a in self.kept_accepted]
        for reached, accepted in ((self.reached, self.accepted), (self.kept_reached, self.kept_accepted)):
            while len(reached) < n:
                reached.append(0.0)
                accepted.append(0.0)
            for i in range(n):
                reached[i] += 1
            for i in range(min(num_accepted, num_drafted)):
                accepted[i] += 1

    def fade(self) -> None:
        """Decay the counts by one observation's weight: before each verified draft (:meth:`add`), and at each step
        in which this kind of draft was not verified, so that its estimate drifts back to its fade target (the
        prior, or what the kind measured when it last drafted where that is higher) and a source written off on a
        few drafts is tried again."""
        self.reached[:] = [r * self.decay for r in self.reached]
        self.accepted[:] = [a * self.decay for a in self.accepted]

    def expected_tokens(self, length: int, scale: float = 1.0) -> float:
        """``1 + sum_{i < length} prod_{j <= i} a_j``: tokens a step emits with a draft of ``length``, its priors
        (``first``, a fixed ``later``) multiplied by ``scale``, the weight faded since the kind last drafted at
        its fade target (the class docstring)."""
        total, cum, estimate = 1.0, 1.0, self.first * scale
        for i in range(length):
            prior = self.first * scale if i == 0 else estimate if self.later is None else self.later * scale
            if i < len(self.reached):
                kept = self.kept_reached[i]
                target = max(prior, self.kept_accepted[i] / kept) if kept else prior
                faded = max(0.0, kept - self.reached[i])
                estimate = (self.accepted[i] + faded * target + PRIOR_WEIGHT * prior) / (kept + PRIOR_WEIGHT)
            else:
                estimate = prior
            cum *= estimate
            total += cum
        return total


class HybridDrafter(Drafter):
    """The suffix drafter and a model drafter, chosen per step and row by predicted tokens per second.

    Args:
        model_drafter: the model-based source (:class:`~hf_spec.drafters.draft_model.DraftModelDrafter`,
            :class:`~hf_spec.drafters.medusa.MedusaDrafter`, or a model-based drafter of your own: not a suffix,
            n-gram or hybrid drafter); its k is this drafter's default k.
        suffix: the model-free source (default: ``SuffixDrafter()``; give one with a ``corpus`` or
            ``remember_outputs``).
        num_speculative_tokens: k (default: the model drafter's).
        decay: per-step weight kept by past acceptance counts and the window of times (0 < decay < 1).

    Raises:
        ValueError: a bad k or decay.
        TypeError: a ``model_drafter`` that is not a Drafter (a name: build the hybrid with ``make_drafter``) or is
            a suffix, n-gram or hybrid drafter; a ``suffix`` that is not a SuffixDrafter.
    """

    method = "hybrid"
    spec_argument = "draft:MODEL | medusa:DIR"
    takes_corpus = True
    #: trees (``num_tree_nodes``) where its model drafter drafts them, as the draft model and Medusa heads of its
    #: specs do (an instance takes its model drafter's)
    drafts_trees = True

    def __init__(self, model_drafter: Drafter, suffix: SuffixDrafter | None = None,
                 num_speculative_tokens: int | None = None, decay: float = 0.9):
        if not isinstance(model_drafter, Drafter) or isinstance(model_drafter, (SuffixDrafter, HybridDrafter)):
            hint = (f": build the hybrid from its spec, hf_spec.make_drafter('hybrid:draft:{model_drafter}', target=model, "
                    "tokenizer=tokenizer) (or 'hybrid:medusa:DIR')" if isinstance(model_drafter, str) else "")
            raise TypeError(f"model_drafter must be a model-based Drafter (draft model, Medusa), got "
                            f"{type(model_drafter).__name__}{hint}")
        suffix = SuffixDrafter() if suffix is None else suffix
        if not isinstance(suffix, SuffixDrafter):
            raise TypeError(f"suffix must be a SuffixDrafter, got {type(suffix).__name__}")
        if not 0 < decay < 1:
            raise ValueError(f"need 0 < decay < 1, got {decay!r}")
        self.model_drafter, self.suffix, self.decay = model_drafter, suffix, decay
        # over this drafter's calls, greedy and sampled apart (do_sample -> [hits, total], decayed by HISTORY_DECAY
        # per draft; shared by every call's session, start() copying shallowly): the model drafts' first tokens
        # accepted and drafted, the suffix drafts' tokens accepted and those the priors expected
        self._model_history: dict[bool, list[float]] = {}
        self._suffix_history: dict[bool, list[float]] = {}
        super().__init__(num_speculative_tokens if num_speculative_tokens is not None
                         else model_drafter.num_speculative_tokens)
        self.returns_scores = model_drafter.returns_scores
        self.needs_hidden_states = model_drafter.needs_hidden_states
        self.drafts_trees = model_drafter.drafts_trees

    @property
    def max_num_speculative_tokens(self):  # the model drafter's bound (a Medusa checkpoint's heads)
        return self.model_drafter.max_num_speculative_tokens

    @property
    def head_rows_per_position(self) -> int:  # the model drafter's (Medusa heads sharing the target's lm_head)
        model = getattr(self, "_model", None)
        return model.head_rows_per_position if model is not None else 0

    def head_rows(self, hidden_states):
        return self._model.head_rows(hidden_states)

    @property
    def stops_when_unsure(self) -> bool:  # suffix proposals end with their evidence; model drafts as the model's
        return self.model_drafter.stops_when_unsure

    # ---- the registry ---------------------------------------------------------------------------
    @classmethod
    def _inner(cls, argument):
        from .registry import parse_drafter

        inner = parse_drafter(argument or "")
        if inner is None or inner.cls in (SuffixDrafter, HybridDrafter) or issubclass(inner.cls, SuffixDrafter):
            raise ValueError(f"hybrid:SPEC takes a model drafter, draft:MODEL or medusa:DIR, not {argument!r}")
        return inner

    @classmethod
    def check_spec(cls, argument, num_speculative_tokens=None) -> None:
        """``hybrid:draft:MODEL`` or ``hybrid:medusa:DIR``: the inner spec is checked as its own."""
        super().check_spec(argument, num_speculative_tokens)
        inner = cls._inner(argument)
        inner.cls.check_spec(inner.argument, num_speculative_tokens)

    @classmethod
    def spec_num_speculative_tokens(cls, argument) -> int:
        inner = cls._inner(argument)
        return inner.cls.spec_num_speculative_tokens(inner.argument)

    @classmethod
    def from_spec(cls, argument, *, num_speculative_tokens=None, target=None, tokenizer=None, draft_dtype=None,
                  corpus=None):
        """Build a :class:`SuffixDrafter` with ``corpus`` (first: a bad corpus is refused before a model loads), and
        the inner model drafter from its spec."""
        from .registry import make_drafter

        suffix = SuffixDrafter(corpus=corpus, tokenizer=tokenizer)
        model = make_drafter(str(cls._inner(argument)), num_speculative_tokens=num_speculative_tokens, target=target,
                             tokenizer=tokenizer, draft_dtype=draft_dtype or "auto")
        return cls(model, suffix, num_speculative_tokens)

    # ---- one call -------------------------------------------------------------------------------
    def prepare(self, target, input_ids) -> None:
        self._model = self.model_drafter.start(target, input_ids, self.generation_config, self.logits_processor,
                                               getattr(self, "generator", None))
        self._suffix = self.suffix.start(target, input_ids, self.generation_config, self.logits_processor)
        self._vocab = logit_rows(target)
        # suffix drafts' counts by match-length bucket: matches in the text, and in a corpus or past outputs
        self._suffix_acceptance = [_Acceptance(self.decay, first, later) for _, first, later in SUFFIX_PRIORS]
        self._corpus_acceptance = [_Acceptance(self.decay, first, later) for _, first, later in CORPUS_PRIORS]
        self._sampling = bool(self.generation_config is not None and self.generation_config.do_sample)
        self._model_acceptance = _Acceptance(self.decay, self.model_prior(self._sampling))
        self._suffix_evidence = [0.0, 0.0]  # suffix draft tokens accepted, and those the priors expected (decayed)
        self._suffix_scale_prior = self.suffix_history_scale(self._sampling)
        self._forward_s: dict[int, list[float]] = {}  # positions per row verified -> the latest forwards' seconds
        # (seconds, or None for a draft that caught up on a long stretch; k asked; levels drafted: a chain's tokens,
        # a tree's depth) of its latest drafts
        self._model_s: list[tuple[float | None, int, int]] = []
        self._model_tree_scores = False  # whether the model drafter's last tree came with scores (sampled nodes)
        # per row of the last draft: (source, match length, k asked, the suffix match's origin)
        self._chosen: list[tuple[str, int, int, str]] | None = None
        self._prefill_s_per_token = 0.0  # the target's prefill seconds per prompt token (prices a catch-up)
        self._prompt_len = int(input_ids.shape[1])
        self.last_sources = None

    def select_rows(self, rows) -> None:
        self._model.keep_rows(rows)
        self._suffix.keep_rows(rows)
        if self._chosen is not None:
            self._chosen = [self._chosen[int(r)] for r in rows]

    def update(self, verified: VerifyOutput) -> None:
        self._model.update(verified)
        if verified.step == 0:
            # per prompt token the prefill ran over (a continued call's cache held the others)
            rows = verified.num_drafted.shape[0]
            self._prefill_s_per_token = verified.seconds / max(1, rows * (verified.positions or self._prompt_len))
        elif verified.seconds:
            # the positions the forward scored: a model draft is as wide as its longest row, also where that row
            # took another source, so 1 + the longest row verified can fall short of it
            n = verified.positions or 1 + max(verified.num_drafted.tolist(), default=0)
            self._forward_s[n] = (self._forward_s.get(n, []) + [verified.seconds])[-9:]
        if self._chosen is not None and verified.step > 0:
            unverified = [*self._suffix_acceptance, *self._corpus_acceptance, self._model_acceptance]
            # a tree's drafted positions are its depth as verified (the loop may have cut it at max_length)
            drafted = (verified.num_drafted if verified.depths is None else verified.depths).tolist()
            for (source, match_length, asked, origin), d, a in zip(self._chosen, drafted,
                                                                   verified.num_accepted.tolist()):
                if d:
                    kind = (self._suffix_kind(origin, match_length) if source == "suffix"
                            else self._model_acceptance)
                    kind.add(d, a, None if source == "suffix" else asked)
                    if source == "model":
                        _remember(self._model_history, self._sampling, float(a > 0), 1.0)
                    if source == "suffix":
                        _, first, later = _priors(origin)[suffix_bucket(match_length)]
                        expected = first + later * (min(a + 1, d) - 1)
                        evidence = self._suffix_evidence
                        evidence[0] = evidence[0] * self.decay + min(a, d)
                        evidence[1] = evidence[1] * self.decay + expected
                        _remember(self._suffix_history, self._sampling, min(a, d), expected)
                    unverified = [u for u in unverified if u is not kind]
            for kind in unverified:
                kind.fade()
        self._chosen = None

    def finish(self, outputs) -> None:
        self._suffix.finish(outputs)
        self._model.finish(outputs)

    def carry_over(self):  # the model drafter's (a draft model's cache); the suffix index is rebuilt per call
        return self._model.carry_over()

    def resume(self, carried) -> bool:
        return self._model.resume(carried)

    def model_prior(self, do_sample: bool = False) -> float:
        """The prior first-token acceptance of the model's drafts in a new call: the share of this drafter's model
        drafts (per row) in its earlier calls (and this one so far) whose first token was accepted, greedy and
        sampled calls apart (``do_sample``: sampling accepts fewer), the last ~100 weighted (:data:`HISTORY_DECAY`),
        with :data:`PRIOR_WEIGHT` pseudo-drafts at :data:`MODEL_PRIOR`. The drafter's model drafts for the same
        target from call to call, so their acceptance carries over where 0.5 did not know it (as adaptive k carries
        the target's step time); a call's own drafts then move the estimate as before."""
        return _recall(self._model_history, do_sample, MODEL_PRIOR)

    def suffix_history_scale(self, do_sample: bool = False) -> float:
        """Where a new call's :meth:`suffix_prior_scale` starts: the suffix draft tokens this drafter's earlier calls
        (and this one so far) had accepted over those the priors expected, greedy and sampled calls apart, the last
        ~100 suffix drafts weighted (:data:`HISTORY_DECAY`), with :data:`PRIOR_WEIGHT` pseudo-tokens at 1; at most 1.
        The priors come from greedy outputs; under sampling each call had to learn afresh that they promise too much
        (RAG under sampling, 5 seeds: the suffix drafts that failed came in a call's first 15 steps, the scale at 1
        then), as :meth:`model_prior` carries the model's acceptance."""
        return min(1.0, _recall(self._suffix_history, do_sample, 1.0))

    def suffix_prior_scale(self) -> float:
        """The factor (<= 1) on every suffix prior: this call's suffix draft tokens accepted over those the priors
        expected at the positions verified, pooled over the match-length buckets, with :data:`PRIOR_WEIGHT`
        pseudo-tokens at where the drafter's earlier calls left it (:meth:`suffix_history_scale`; 1 before any),
        decayed at each suffix draft only: it stands for the call's regime (greedy or sampled,
        the temperature), which a call keeps, so unlike a kind's counts it does not drift back while the suffix
        is not chosen (docs/benchmarks.md: drifting back, it sent a RAG prompt under sampling back to failing
        suffix drafts); the buckets' own counts still fade, so suffix proposals are tried again. The priors were
        measured on greedy outputs; a one-hot draft token is accepted with the target's probability of it when
        sampling, and each bucket learning that alone (its later positions
        never reached after a rejected first token) cost a step per failed draft (docs/benchmarks.md, the hybrid
        drafter under sampling)."""
        accepted, expected = self._suffix_evidence
        return min(1.0, (accepted + PRIOR_WEIGHT * self._suffix_scale_prior) / (expected + PRIOR_WEIGHT))

    def _suffix_kind(self, origin: str, match_length: int) -> _Acceptance:
        """The counts that price and learn from a suffix proposal of this origin and match length."""
        return (self._suffix_acceptance if origin == "text" else self._corpus_acceptance)[suffix_bucket(match_length)]

    def choose_source(self, proposal_length: int, match_length: int, k: int, catch_up_s: float = 0.0,
                      remaining_tokens: int | None = None, origin: str = "text") -> str:
        """``"suffix"``, ``"model"`` or ``"none"`` for a row whose suffix proposal has ``proposal_length`` tokens
        after a match of ``match_length`` tokens in ``origin`` (``Proposal.origin``: the text, or a corpus or past
        outputs, priced by :data:`CORPUS_PRIORS`): the highest predicted tokens per second, plain decoding's one
        token per forward included (see the module docstring). ``catch_up_s``: the model's one-off catch-up in
        seconds, spread over the ``remaining_tokens / E[tokens per step]`` steps left."""
        medians = {n: statistics.median(t) for n, t in self._forward_s.items() if t}

        def forward(positions: float) -> float:
            return forward_time(medians, positions) if medians else 1.0

        # priced per drafted token: a draft model's time grows with k, and the controller changes k (a time
        # measured at k = 8 charged to a draft at k = 1 made plain steps look faster than the model); a draft that
        # stops when unsure (the confidence stop) drafts a share of the k it is asked for
        share = statistics.median(n / max(1, asked) for _, asked, n in self._model_s) if self._model_s else 1.0
        per_token = [t / n for t, _, n in self._model_s if t is not None and n]
        model_s = k * statistics.median(per_token) * share if per_token else 0.0
        model_tokens = self._model_acceptance.expected_tokens(k)
        if catch_up_s and remaining_tokens:
            model_s += catch_up_s * model_tokens / max(1, remaining_tokens)
        rates = {"none": 1.0 / forward(1), "model": model_tokens / (forward(1 + round(k * share)) + model_s)}
        if proposal_length:
            rates["suffix"] = (self._suffix_kind(origin, match_length).expected_tokens(
                proposal_length, self.suffix_prior_scale()) / forward(1 + proposal_length))
        return max(("suffix", "model", "none"), key=lambda s: rates.get(s, -1.0))

    def draft(self, sequences, k):
        """Each row's chosen source's chain; a tree for every row (suffix rows as chains in it) where the model
        drafter's own :meth:`~hf_spec.drafters.base.Drafter.draft` returned one."""
        tokens, num, scores, parents = self._draft(sequences, k, 0)
        return (tokens, num, scores) if parents is None else (tokens, num, scores, parents)

    def draft_tree(self, sequences, k, num_nodes):
        """The tree form of :meth:`draft` (``num_tree_nodes`` in the call): each row's source is chosen as for a
        chain (their chain proposals priced alike), then drafts its tree of at most ``num_nodes`` nodes and k
        deep: the suffix drafter SuffixDecoding's speculation tree, the model drafter its own
        (:meth:`~hf_spec.drafters.draft_model.DraftModelDrafter.draft_tree`,
        :meth:`~hf_spec.drafters.medusa.MedusaDrafter.draft_tree`). A model row with a suffix match of
        :data:`MERGE_MIN_MATCH` tokens or more also gets its suffix proposal (the chain it would draft, at most
        ``num_nodes // 2`` tokens) folded in (:func:`merge_into_tree`); the model then drafts that many nodes
        fewer (in a batch, the most any row folds in, for every model row: one call drafts every row's tree), so
        no row passes ``num_nodes``; its source reads ``"<model>+suffix"`` in :attr:`last_sources`, and
        its acceptance counts as the model's (the merged tree is what a model row drafts). Only into trees whose
        nodes are deterministic (the model drafter returns no scores for them: a draft model's and Medusa's trees),
        where one-hot q keeps sampling exact; after a model tree that came with scores, no nodes are held back. A
        row's acceptance statistics count its tree's depth, not its nodes, as drafted positions, and the model's
        drafting time is priced per level.

        Returns:
            ``(tokens [B, N], num_drafted [B], scores [B, N, V] or None, parents [B, N])``, ``N <= num_nodes``;
            scores only where the model drafter samples its nodes (suffix rows one-hot).

        Raises:
            NotImplementedError: a row chose the model and the model drafter drafts chains only
                (:attr:`drafts_trees` is then False, and the loop refuses ``num_tree_nodes`` before drafting).
        """
        return self._draft(sequences, k, num_nodes)

    def _draft(self, sequences, k, num_nodes):
        """:meth:`draft` (``num_nodes`` 0: chains, parents ``None``) and :meth:`draft_tree`: ``(tokens, num_drafted,
        scores, parents)``."""
        self._suffix.index(sequences)
        proposals = [self._suffix.propose(b, seq, k) for b, seq in enumerate(sequences)]
        catch_up_tokens = self._model.catch_up_cost(sequences)
        catch_up_s = catch_up_tokens * self._prefill_s_per_token
        max_length = self.generation_config.max_length if self.generation_config is not None else None
        sources = [self.choose_source(len(p.tokens), p.match_length, k, catch_up_s,
                                      max_length - len(seq) if max_length else None, origin=p.origin)
                   for p, seq in zip(proposals, sequences)]
        if num_nodes:  # the suffix rows' trees (the choice above priced their chains, as a chain step would)
            proposals = [self._suffix.propose(b, seq, k, num_nodes) if source == "suffix" else p
                         for b, (seq, p, source) in enumerate(zip(sequences, proposals, sources))]
        n = len(sequences)
        # model rows with a suffix match long enough: their suffix chain joins the model's tree
        # (not where the model drafter's trees came with scores last time: sampled nodes, nothing one-hot joins them)
        merge = ({b: p.tokens[:num_nodes // 2] for b, (p, s) in enumerate(zip(proposals, sources))
                  if s == "model" and p.match_length >= MERGE_MIN_MATCH and p.tokens}
                 if num_nodes > 1 and not self._model_tree_scores else {})
        model_tokens = model_scores = model_parents = None
        if "model" in sources:
            t0 = time.perf_counter()
            if num_nodes:
                model_nodes = num_nodes - max(map(len, merge.values()), default=0)
                model_tokens, model_num, model_scores, model_parents = self._model.draft_tree(sequences, k,
                                                                                             model_nodes)
            else:  # a chain, or a tree where the model drafter's draft() returns one (the Drafter interface allows it)
                model_tokens, model_num, model_scores, *rest = self._model.draft(sequences, k)
                model_parents = rest[0] if rest else None
            if model_parents is None:
                levels = model_tokens.shape[1]
            else:
                levels = int(tree_depths(model_parents, model_num).max()) if model_parents.shape[1] else 0
            # a draft that also caught up on a long stretch (the prompt at the first draft; catch_up_tokens is in
            # the target's prefill tokens) is not what a draft costs: the catch-up is priced on its own (catch_up_s),
            # and counted here too it kept the model from being chosen after its first draft. Its length still
            # counts: until one is measured the model is priced at a verify of k + 1 positions, the dearest (a RAG
            # prompt under sampling: the model's first draft a catch-up, then suffix proposals chosen 57 times).
            # A tree's time is per level: a draft model runs one forward per level, whatever the width (Medusa's
            # heads run once for every level)
            seconds = time.perf_counter() - t0 if catch_up_tokens <= k + 1 else None
            self._model_s = (self._model_s + [(seconds, k, levels)])[-9:]
        if num_nodes and model_tokens is not None:
            self._model_tree_scores = model_scores is not None
        if model_scores is not None:  # sampled nodes with their q: nothing one-hot joins them
            merge = {}
        merged = {}  # row -> (tokens, parents) of its model tree with its suffix chain folded in
        for b, chain in merge.items():
            m = int(model_num[b])
            merged[b] = merge_into_tree(model_tokens[b, :m].tolist(), model_parents[b, :m].tolist(), chain)
        width = max([len(p.tokens) for p, s in zip(proposals, sources) if s == "suffix"]
                    + ([model_tokens.shape[1]] if model_tokens is not None else [])
                    + [len(t) for t, _ in merged.values()] + [0])
        tokens = torch.zeros(n, width, dtype=torch.long)
        num = torch.zeros(n, dtype=torch.long)
        parents = torch.full((n, width), -1, dtype=torch.long) if num_nodes or model_parents is not None else None
        scores = None
        if self.returns_scores and self.generation_config.do_sample and (model_scores is not None or not num_nodes):
            # model rows keep their q, suffix rows one-hot
            scores = (model_scores.new_zeros(n, width, model_scores.shape[-1]) if model_scores is not None
                      else torch.zeros(n, width, self._vocab))
        for b, (p, source) in enumerate(zip(proposals, sources)):
            if source == "none":
                continue
            if b in merged:
                row_tokens, row_parents = merged[b]
                m = len(row_tokens)
                tokens[b, :m] = torch.tensor(row_tokens, dtype=torch.long)
                parents[b, :m] = torch.tensor(row_parents, dtype=torch.long)
                num[b] = m
            elif source == "model":
                m = int(model_num[b])
                tokens[b, :m] = model_tokens[b, :m].cpu()
                num[b] = m
                if parents is not None:
                    parents[b, :m] = model_parents[b, :m].cpu()
                if scores is not None:
                    scores[b, :m] = model_scores[b, :m]
            else:
                m = len(p.tokens)
                tokens[b, :m] = torch.tensor(p.tokens, dtype=torch.long)
                num[b] = m
                if parents is not None:
                    parents[b, :m] = torch.tensor(p.parents if p.parents is not None else list(range(-1, m - 1)))
                if scores is not None:
                    scores[b, :m] = float("-inf")
                    scores[b, torch.arange(m), tokens[b, :m].to(scores.device)] = 0.0
        self._chosen = [(s, p.match_length, k, p.origin) for p, s in zip(proposals, sources)]
        self.last_sources = [(self.model_drafter.method + ("+suffix" if b in merged else "")) if s == "model" else s
                             for b, s in enumerate(sources)]
        return tokens, num, scores, parents
