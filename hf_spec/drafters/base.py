"""The drafter interface: propose up to k tokens per row, and hear what the target computed after every forward.

The loop (:mod:`hf_spec.loop`) drives a drafter through five methods, and owns everything else (k, the
budget near ``max_length``, verification, caches of the target)::

    session = drafter.start(target, input_ids, generation_config, logits_processor)  # a per-call copy
    session.update(VerifyOutput(...))                  # after the prefill forward
    while rows are running:
        session.keep_rows(index)                       # rows finished (they leave the batch): select_rows
        tokens, num_drafted, scores = session.draft(rows, k)   # skipped on a plain step (k = 0)
        ... one target forward over [last token, drafts] per row, the acceptance rule ...
        session.update(VerifyOutput(...))              # after every forward, plain or speculative
    session.finish(outputs)                            # each row's generated tokens, when the call ends

:meth:`Drafter.start` returns a shallow copy of the drafter bound to one call: what :meth:`Drafter.prepare`
sets lives on the copy, so the caller's object is never changed by a call and one drafter can serve several
calls at once (threads); what ``__init__`` made (a draft model, Medusa heads, a corpus) is shared by every call,
and so is what a drafter chooses to learn across calls (a suffix drafter's remembered outputs, a hybrid drafter's
model acceptance and suffix scale).

hf-spec's drafters are not ``transformers`` ``CandidateGenerator`` s: transformers has no public way to hand a
candidate generator to ``generate`` (it builds its own from ``assistant_model`` / ``prompt_lookup_num_tokens``),
and its contract (one row, the generator choosing its own length, no target hidden states) cannot express
what the loop needs: ragged batches, per-row draft lengths, k chosen by the loop, and the target's hidden
states after every forward. They plug into ``model.generate`` through ``custom_generate=hf_spec.generate``
or ``assistant_model=`` after :func:`hf_spec.enable_drafters`.
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList

from ..processors import process_scores, row_processors

__all__ = ["Drafter", "VerifyOutput", "DEFAULT_NUM_SPECULATIVE_TOKENS", "check_num_speculative_tokens",
           "check_drafter_type", "logit_rows"]

#: k when neither the call nor the drafter says otherwise (a Medusa checkpoint defaults to its head count).
#: 3 was the best fixed k of the draft model and of n-gram lookup on Spec-Bench on this project's CPUs
#: (docs/benchmarks.md); with ``"auto"`` it is the drafter's k that the controller measures after k = 1.
DEFAULT_NUM_SPECULATIVE_TOKENS = 3


def check_num_speculative_tokens(k, name: str = "num_speculative_tokens") -> int:
    """Validate k (``num_speculative_tokens``, or the setting ``name`` that gives it, such as transformers'
    ``prompt_lookup_num_tokens``): an integer >= 1 (numpy integers too); returns it as an ``int``.

    Raises:
        ValueError: k is not an integer >= 1.
    """
    if not isinstance(k, bool) and isinstance(k, numbers.Integral):
        k = int(k)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        if name == "num_speculative_tokens":
            raise ValueError(f"{name} must be an integer >= 1 or \"auto\", got {k!r}; use 1..12 (3 is a good start), "
                             "\"auto\" to let hf-spec choose per step, or drafter=None to decode without speculation")
        raise ValueError(f"{name} must be an integer >= 1, got {k!r}; use 1..12 (3 is a good start) or leave it unset "
                         "to decode without speculation")
    return k


def check_drafter_type(value, argument: str = "drafter", models: bool = False) -> None:
    """Refuse, with what to pass instead, a value given where a drafter goes that is none: a spec string, a
    drafter class rather than an instance, a model where only drafters go, or anything else.

    Args:
        value: what the call passed (not ``None``).
        argument: the keyword it came in, for the message: ``drafter`` (hf-spec's loop) or ``assistant_model``
            (``generate`` after :func:`hf_spec.enable_drafters`).
        models: whether a ``torch.nn.Module`` (a draft model) is accepted there too, as by ``assistant_model``.

    Raises:
        TypeError: ``value`` is neither a :class:`Drafter` instance nor (with ``models``) a model.
    """
    if isinstance(value, Drafter) or (models and isinstance(value, torch.nn.Module)):
        return
    accepted = ("a draft model (a transformers model) or an hf_spec Drafter" if models
                else "an hf_spec Drafter (DraftModelDrafter, NgramDrafter, ...)")
    if isinstance(value, type) and issubclass(value, Drafter):
        raise TypeError(f"{argument} must be {accepted} instance, got the class {value.__name__}: pass "
                        f"{value.__name__}(...)")
    if isinstance(value, str):
        raise TypeError(f"{argument} must be {accepted}, got the string {value!r}: build it from its spec "
                        f"with hf_spec.make_drafter({value!r}, target=model, tokenizer=tokenizer)")
    if isinstance(value, torch.nn.Module):
        raise TypeError(f"{argument} must be {accepted}, got the model {type(value).__name__}: wrap a draft model "
                        "in hf_spec.DraftModelDrafter(model)")
    raise TypeError(f"{argument} must be {accepted}, got {type(value).__name__}")


def logit_rows(model) -> int:
    """The number of rows of a causal LM's logits: its ``lm_head``'s (padded vocabularies included), else
    ``config.vocab_size``."""
    head = model.get_output_embeddings()
    if head is not None and isinstance(getattr(head, "out_features", None), int):  # an int8 head's weight is a method
        return head.out_features
    return head.weight.shape[0] if head is not None and hasattr(head, "weight") else \
        model.config.get_text_config().vocab_size


@dataclass
class VerifyOutput:
    """What one target forward computed, told to the drafter right after it (the prefill included).

    Attributes:
        step: 0 for the prefill, then 1, 2, ... (as :class:`~hf_spec.events.StepEvent`).
        num_drafted: ``LongTensor[B]``, drafted tokens verified per row (a tree's nodes; 0 at the prefill and on
            plain steps).
        num_accepted: ``LongTensor[B]``, drafted tokens accepted per row (``0..num_drafted``); each row then got
            one token of the target's own (correction or bonus) unless a stop ended it inside the accepted run.
        hidden_states: ``Tensor[B, n, H]``, the target's last hidden states (after its final norm: what its
            ``lm_head`` reads) at the n positions scored in this forward, or ``None`` unless the drafter sets
            :attr:`Drafter.needs_hidden_states`. Column j scored the token after the row's j-th block token: at a
            step the block is ``[last token, drafted tokens]`` (n = k + 1), at the prefill n = 1 (the prompt's
            last position). Column ``num_accepted[b]`` is therefore the position that predicted row b's newest
            token, the one a Medusa head continues from.
        seconds: wall time of this forward and its acceptance rule, in seconds (the device synchronised), for
            drafters that weigh their own cost against it (the hybrid drafter).
        path: after a draft tree (:meth:`Drafter.draft` returned parents), ``LongTensor[B, D]``: the accepted
            nodes from the root's child down, padded with -1; ``hidden_states`` then holds the root's column and
            the accepted path's, in that order, so column ``num_accepted[b]`` is again the newest token's.
            ``None`` after a chain.
        positions: positions per row this forward scored: at the prefill the prompt positions it ran over (the
            prompt's length with its padding, less the tokens a cache passed in already held), 1 on plain steps, else
            1 + the draft's width, which may exceed 1 + ``num_drafted.max()``; 0 where not given.
        depths: after a draft tree, ``LongTensor[B]``: the depth of each row's tree as verified (the drafted
            positions it reached; ``num_drafted`` counts its nodes), after the loop dropped the nodes past
            ``max_length``; ``None`` after a chain, whose length is ``num_drafted``.
        head_logits: ``Tensor[B, n, r, V]``, the target's ``lm_head`` applied to the ``r`` rows per position the
            drafter asked for with :meth:`Drafter.head_rows` (columns as :attr:`hidden_states`), projected in the
            target's forward; ``None`` where that was measured not to pay or the ``lm_head`` is not a plain
            ``nn.Linear`` (:func:`hf_spec.kernels.extra_rows`), or the drafter asked for none.
    """

    step: int
    num_drafted: torch.LongTensor
    num_accepted: torch.LongTensor
    hidden_states: torch.Tensor | None = None
    seconds: float = 0.0
    path: torch.LongTensor | None = None
    positions: int = 0
    depths: torch.LongTensor | None = None
    head_logits: torch.Tensor | None = None

    def last_hidden_state(self) -> torch.Tensor:
        """``Tensor[B, H]``: per row, the hidden state that predicted its newest token (column
        ``num_accepted[b]`` of :attr:`hidden_states`).

        Raises:
            RuntimeError: no hidden states (the drafter did not set ``needs_hidden_states``).
        """
        if self.hidden_states is None:
            raise RuntimeError("no hidden states: set needs_hidden_states = True on the drafter class")
        index = self.num_accepted.to(self.hidden_states.device)
        return self.hidden_states[torch.arange(len(index), device=index.device), index]

    def last_head_logits(self) -> torch.Tensor | None:
        """``Tensor[B, r, V]``: per row, :attr:`head_logits` at column ``num_accepted[b]`` (the rows made from the
        hidden state that predicted its newest token), or ``None`` without them."""
        if self.head_logits is None:
            return None
        index = self.num_accepted.to(self.head_logits.device)
        return self.head_logits[torch.arange(len(index), device=index.device), index]


class Drafter:
    """Base class of hf-spec's drafters.

    Args:
        num_speculative_tokens: this drafter's k (>= 1): used when a call gives none, and the k that
            ``"auto"`` measures after k = 1. Default :attr:`default_num_speculative_tokens`
            (:data:`DEFAULT_NUM_SPECULATIVE_TOKENS` unless the class knows better), or
            :attr:`max_num_speculative_tokens` where that is smaller. A call never changes it: the loop passes
            each step's k to :meth:`draft`.

    Raises:
        ValueError: ``num_speculative_tokens`` not an integer >= 1 (``"auto"`` included: that is a call's choice),
            or above :attr:`max_num_speculative_tokens`.

    Subclasses implement :meth:`draft` and, as they need them, :meth:`prepare` (per-call state),
    :meth:`update` (what the target computed), :meth:`select_rows` (per-row state when rows leave the batch),
    and for the drafter registry :meth:`from_spec` / :meth:`check_spec`. ``docs/architecture.md``, "Writing a
    drafter", shows a whole one.
    """

    #: short name used in statistics and metric labels
    method: str = "drafter"
    #: True when the drafter samples its tokens and returns the distributions (scores) it sampled from
    returns_scores: bool = False
    #: True to get the target's last hidden states in :meth:`update` (Medusa, EAGLE-style heads): the loop then
    #: reads what the target's ``lm_head`` reads at each forward (:class:`hf_spec.loop.LmHeadInput`; the last of
    #: ``output_hidden_states`` for a model without output embeddings)
    needs_hidden_states: bool = False
    #: rows per scored position that :meth:`head_rows` makes for the target's ``lm_head`` to project in its own
    #: forward (Medusa heads sharing it: one per head); 0: none (the default)
    head_rows_per_position: int = 0
    #: the most tokens the drafter can propose per step (``None``: no limit); bounds k and adaptive k
    max_num_speculative_tokens: int | None = None
    #: what follows ``name:`` in a drafter spec (e.g. ``"MODEL"`` in ``draft:MODEL``), several forms separated by
    #: ``" | "`` (the hybrid's ``"draft:MODEL | medusa:DIR"``); ``None``: no argument
    spec_argument: str | None = None
    #: True when :meth:`from_spec` takes ``corpus=`` (texts to draft from: ``--corpus FILE...``)
    takes_corpus: bool = False
    #: after :meth:`draft`, optionally: per row, the name of the source that drafted it (the hybrid drafter's
    #: ``"suffix"``, its model drafter's method, or that method + ``"+suffix"`` for a model tree with the suffix
    #: proposal folded in); the loop copies it into ``StepEvent.sources``
    last_sources: list[str] | None = None
    #: True when :meth:`draft_tree` drafts trees (the loop calls it when a call sets ``num_tree_nodes``)
    drafts_trees: bool = False
    #: this class's k when none is given (within :attr:`max_num_speculative_tokens`)
    default_num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS
    #: True when the drafter ends a row's draft early where it doubts its next token (a draft model's confidence
    #: stop), so that k is only a cap: ``"auto"`` then keeps the drafter's k and only switches speculation on or off
    stops_when_unsure: bool = False

    def __init__(self, num_speculative_tokens: int | None = None):
        cap = self.max_num_speculative_tokens
        if num_speculative_tokens is None:
            k = self.default_num_speculative_tokens if cap is None else min(self.default_num_speculative_tokens, cap)
        else:
            if isinstance(num_speculative_tokens, str) and num_speculative_tokens == "auto":
                raise ValueError(f"a {type(self).__name__}'s own k is a number: \"auto\" is chosen per call; build "
                                 "the drafter with its own k (or none) and pass num_speculative_tokens=\"auto\" to "
                                 "generate")
            k = check_num_speculative_tokens(num_speculative_tokens)
            if cap is not None and k > cap:
                raise ValueError(f"num_speculative_tokens={k} but this {self.method} drafter proposes at most {cap} "
                                 f"tokens per step; use k <= {cap}")
        self.num_speculative_tokens = k
        self.generation_config: GenerationConfig | None = None
        self.logits_processor = LogitsProcessorList()
        self._row_processors: list[LogitsProcessorList] | None = None  # per call, per row (start)

    # ---- the registry ---------------------------------------------------------------------------
    @classmethod
    def check_spec(cls, argument: str | None, num_speculative_tokens: int | None = None) -> None:
        """Check a drafter spec's argument (and the k it will be built with, when known) before any model
        loads: e.g. that a folder exists, or that k fits a checkpoint.

        Raises:
            ValueError: a bad argument, with what to give instead.
        """
        if cls.spec_argument is None and argument is not None:
            raise ValueError(f"takes no argument after the name, got {argument!r}")
        if cls.spec_argument is not None and not argument:
            raise ValueError(f"needs {cls.spec_argument.replace(' | ', ' or ')} after the colon")

    @classmethod
    def spec_num_speculative_tokens(cls, argument: str | None) -> int:
        """The k a drafter built from this spec argument gets when none is given (its own default), known
        before anything loads: :attr:`default_num_speculative_tokens` (:data:`DEFAULT_NUM_SPECULATIVE_TOKENS`; a
        draft model with its confidence stop: 6) within a class-level :attr:`max_num_speculative_tokens`; a Medusa
        checkpoint's head count. The benchmark reads it."""
        cap, k = cls.max_num_speculative_tokens, cls.default_num_speculative_tokens
        return min(k, cap) if isinstance(cap, int) else k

    @classmethod
    def from_spec(cls, argument: str | None, *, num_speculative_tokens: int | None = None, target=None,
                  tokenizer=None, draft_dtype=None) -> "Drafter":
        """Build the drafter from its spec's argument (:func:`hf_spec.drafters.registry.make_drafter` calls it).

        Args:
            argument: what followed ``name:`` in the spec (``None`` when nothing did).
            num_speculative_tokens: k, or ``None`` for the drafter's default.
            target: the target model (drafters that read it, e.g. Medusa heads bound to it).
            tokenizer: the target's tokenizer (drafters that check vocabularies).
            draft_dtype: ``"auto"`` or a dtype, for drafters that load a model (``hf_spec.device.draft_dtype``).

        The default builds ``cls(num_speculative_tokens=k)`` (``cls(k)`` where ``__init__`` takes no such keyword);
        a drafter whose ``__init__`` needs more arguments overrides it.
        """
        import inspect

        try:
            takes_keyword = "num_speculative_tokens" in inspect.signature(cls.__init__).parameters
        except (TypeError, ValueError):  # no signature to read
            takes_keyword = False
        return cls(num_speculative_tokens=num_speculative_tokens) if takes_keyword else cls(num_speculative_tokens)

    # ---- binding to one generate call -----------------------------------------------------------
    def start(self, target, input_ids: torch.LongTensor, generation_config: GenerationConfig,
              logits_processor: LogitsProcessorList | None = None, generator: torch.Generator | None = None
              ) -> "Drafter":
        """A copy of this drafter bound to one generate call (the loop calls it; the caller's object stays as
        it is). Shallow: objects made in ``__init__`` are shared; :meth:`prepare` sets the per-call state.

        Args:
            target: the target ``PreTrainedModel``.
            input_ids: ``LongTensor[B, L]``, the prompt (left-padded in a batch).
            generation_config: the call's prepared generation config (``do_sample``, ``max_length``).
            logits_processor: the call's logits processors (temperature, top-k, top-p, penalties, ...).
            generator: the call's random generator (``speculative_decode(generator=...)``), from which
                :meth:`choose` samples drafted tokens; ``None``: torch's global one.

        Raises:
            ValueError: the drafter cannot serve this target (from :meth:`prepare`).
        """
        session = copy.copy(self)
        session.generator = generator
        session.generation_config = generation_config
        session.logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
        # each row's view of the processors' per-row state; rows reach draft() without their left padding
        session._row_processors = row_processors(session.logits_processor, input_ids.shape[0], padded=False)
        session.prepare(target, input_ids)
        return session

    def keep_rows(self, rows: torch.LongTensor) -> None:
        """Keep only these batch rows (the loop calls it when rows finished): the per-row logits processors
        here, then :meth:`select_rows` for the drafter's own state."""
        if self._row_processors is not None:
            self._row_processors = [self._row_processors[int(r)] for r in rows]
        self.select_rows(rows)

    def prepare(self, target, input_ids: torch.LongTensor) -> None:
        """Check compatibility with ``target`` and set per-call state (on the copy :meth:`start` made;
        ``self.generation_config`` and ``self.logits_processor`` are set already).

        Raises:
            ValueError: the drafter cannot serve this target (e.g. a vocabulary mismatch).
        """

    # ---- what the loop calls --------------------------------------------------------------------
    def draft(
        self, sequences: list[torch.LongTensor], k: int
    ) -> tuple[torch.LongTensor, torch.LongTensor, torch.Tensor | None]:
        """Propose up to k tokens after each row's sequence.

        Args:
            sequences: B ``LongTensor[L_b]``, each row's tokens so far (prompt without padding, then the
                generated tokens); rows may differ in length.
            k: the most tokens to propose per row (>= 1), chosen by the loop for this step.

        Returns:
            ``(tokens, num_drafted, scores)``: ``LongTensor[B, k']`` (``k' <= k``; row b's columns from
            ``num_drafted[b]`` on are filler), ``LongTensor[B]``, and for a drafter that samples, the
            processed logits ``Tensor[B, k', V]`` each token was drawn from (``None`` for a deterministic one).

            Or a tree, ``(tokens, num_drafted, scores, parents)``: ``N`` nodes per row (any number; at most k
            deep), ``parents LongTensor[B, N]`` the parent of each node (``-1``: a child of the row's last
            token; otherwise an earlier node). Scores are then the distribution each node's token was drawn
            from (at its parent), each node drawn independently of its siblings (repeats allowed), or ``None``
            for deterministic nodes (:func:`~hf_spec.acceptance.speculative_sample_tree`). The target verifies
            every node in one forward with a tree attention mask.
        """
        raise NotImplementedError

    def draft_tree(self, sequences: list[torch.LongTensor], k: int, num_nodes: int):
        """Propose a tree of at most ``num_nodes`` nodes and k deep after each row's sequence (drafters with
        :attr:`drafts_trees`; the loop calls it instead of :meth:`draft` when a call sets ``num_tree_nodes``).

        Returns:
            ``(tokens [B, N], num_drafted [B], scores [B, N, V] or None, parents [B, N])``, ``N <= num_nodes``:
            the tree form of :meth:`draft`'s return.
        """
        raise NotImplementedError(f"the {self.method} drafter drafts chains only")

    def catch_up_cost(self, sequences: list[torch.LongTensor]) -> float:
        """The one-off work the next :meth:`draft` on ``sequences`` would do before its usual per-step work, in
        tokens of the target's prefill: a draft model's forward over the tokens it has not seen (the whole prompt
        at the first draft, the tokens of an off period after one), scaled by its compute per token relative to
        the target's. The loop turns it into seconds with the target's measured prefill time per token, and under
        ``"auto"`` does not start speculating where the tokens left before ``max_length`` cannot repay it
        (:meth:`~hf_spec.adaptive.AdaptiveK.catch_up_pays`). An estimate, read before every speculative step of
        ``"auto"``: it must be cheap and must not change the drafter's state.

        Args:
            sequences: as for :meth:`draft`.

        Returns:
            ``>= 0``; the default 0 suits drafters whose every step costs about the same (n-gram lookup, heads).
        """
        return 0.0

    def head_rows(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Rows for the target's ``lm_head`` to project in the forward that computed ``hidden_states`` (for drafters
        with :attr:`head_rows_per_position` > 0 and :attr:`needs_hidden_states`); the loop hands the projection
        back in :attr:`VerifyOutput.head_logits`, where that was measured to pay (one read of the weights instead
        of two), else the drafter projects its rows itself. Called inside the target's forward: it must not
        change the drafter's state.

        Args:
            hidden_states: ``Tensor[B, n, H]``, the target's last hidden states at the positions this forward
                scores (columns as :attr:`VerifyOutput.hidden_states` before a tree's gather).

        Returns:
            ``Tensor[B, n, r, H]`` with ``r`` = :attr:`head_rows_per_position`.
        """
        raise NotImplementedError(f"the {self.method} drafter has no rows for the target's lm_head")

    def update(self, verified: VerifyOutput) -> None:
        """Hear what the target's forward just computed (after the prefill and after every step, plain ones
        included), for the rows of the current batch. The default ignores it."""

    def select_rows(self, rows: torch.LongTensor) -> None:
        """Keep only these batch rows (``LongTensor[B']``, indices into the current batch): the loop dropped
        finished ones."""

    def finish(self, outputs: list[torch.LongTensor]) -> None:
        """The call ended (normally; not after an error): ``outputs`` holds each row's generated tokens
        (``LongTensor[new_b]``, in the batch's original order, without the prompt and the padding after a
        row's end). The default ignores it; a drafter that learns across calls (the suffix drafter's
        ``remember_outputs``) keeps them."""

    def carry_over(self):
        """What a later call that continues this call's sequence from its cache may reuse, or ``None`` (the default:
        nothing); a draft model's drafter returns its own KV cache and the tokens it holds.

        The loop asks after :meth:`finish` when a one-sequence call leaves its tokens in the caller's cache object
        (``out.past_key_values``; docs/user-guide.md, "A second turn from the first turn's cache"), and keeps the
        value on that object for the next call given it, which hands it to :meth:`resume` (where this returns
        ``None`` the loop removes what an earlier call left there). The value lives as long as the cache object and
        is copied with it (``copy.deepcopy`` of a prompt cache), so it must not hold a strong reference to a model
        (:class:`weakref.ref` is copied as itself)."""
        return None

    def resume(self, carried) -> bool:
        """Take over ``carried``, what an earlier call's :meth:`carry_over` returned, in a call that continues from
        that call's cache (after :meth:`prepare`, before the first :meth:`draft`); return whether it was taken
        (the default: ``False``). A drafter takes only what fits it (its own model with the same weights, one row) and
        must stay correct whatever the earlier call's tokens were: carried state saves work, and the target
        verifies every draft either way."""
        return False

    # ---- helpers for subclasses -----------------------------------------------------------------
    def choose(self, sequences: list[torch.LongTensor], logits: torch.Tensor) -> tuple[torch.LongTensor, torch.Tensor]:
        """Pick each row's drafted token the way the target picks its own: the call's logits processors on
        ``logits [B, V]`` (row b's prefix is ``sequences[b]``), then argmax (greedy) or a sample.

        Returns:
            ``(token LongTensor[B], processed scores [B, V])``; the scores are q under sampling.
        """
        processors = self._row_processors if self._row_processors is not None else self.logits_processor
        processed = process_scores(processors, sequences, logits)
        if self.generation_config is not None and self.generation_config.do_sample:
            generator = getattr(self, "generator", None)  # the call's (start), on the device it samples on
            generator = generator if generator is not None and generator.device == processed.device else None
            return torch.multinomial(processed.softmax(dim=-1), 1, generator=generator).squeeze(1), processed
        return processed.argmax(dim=-1), processed
