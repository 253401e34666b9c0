"""Running the benchmark: methods interleaved prompt by prompt, timed the same way, with a resume journal.

Every method is timed the same way (the device synchronised before each clock read, :func:`hf_spec.device.clock`):
wall time of the ``generate`` call, and a streamer's time stamps for the
first token (TTFT) and for each target forward's tokens. hf-spec's acceptance comes from its statistics;
transformers' from its candidate generators' draft lengths (recorded by wrapping ``get_candidates``, which
changes nothing) and the streamer's per-forward token counts, fed through the same
:class:`~hf_spec.metrics.SpecStats`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from transformers.generation import candidate_generator as hf_candidates
from transformers.generation.streamers import BaseStreamer

from ..device import OtherCpu, clock
from ..device import draft_dtype as resolve_draft_dtype
from ..drafters.draft_model import load_draft_model
from ..drafters.base import DEFAULT_NUM_SPECULATIVE_TOKENS
from ..drafters.hybrid import HybridDrafter
from ..drafters.registry import DRAFTERS, drafter_specs, make_drafter, parse_drafter
from ..drafters.suffix import SuffixDrafter
from ..events import StepEvent
from ..loop import generate as spec_generate
from ..metrics import SpecStats
from ..prompts import Question, chat_inputs, check_context, counted, model_context

__all__ = ["Method", "parse_methods", "run_bench", "PEERS"]

#: transformers' own speculative methods, run beside hf-spec's at the same fixed k (``hf-assisted-defaults``: at
#: transformers' own defaults, whatever k)
PEERS = ("hf-assisted", "hf-assisted-defaults", "hf-prompt-lookup")

#: what transformers' assisted generation does when a call sets nothing (its generation config's defaults in
#: transformers 5; without scikit-learn installed the threshold stays where it is)
HF_ASSISTED_DEFAULTS = {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
                        "assistant_confidence_threshold": 0.4}


@dataclass
class Method:
    """One benchmarked configuration.

    Attributes:
        name: the key in ``results.json`` (the ``--methods`` entry, with ``@k=K`` in a k sweep).
        kind: ``baseline`` (plain ``generate``), ``hf-spec`` (hf-spec's loop with a drafter), ``hf-assisted``
            or ``hf-prompt-lookup`` (transformers' own).
        k: num_speculative_tokens: an int, "auto" or a controller such as :class:`~hf_spec.adaptive.CycleK`
            (hf-spec's methods only), or None for the baseline.
        spec: the drafter spec of an hf-spec method (``draft:NAME``, ``ngram``, ``medusa:DIR``, ...; see
            :mod:`hf_spec.drafters.registry`), or the draft model's name for ``hf-assisted``.
        tree: num_tree_nodes of an hf-spec method whose drafter drafts trees: 0 (a chain), N or ``"auto"``.
    """

    name: str
    kind: str
    k: int | str | object | None = None
    spec: str | None = None
    tree: int | str = 0


def parse_methods(spec: str, ks: list, draft_name: str | None = None, trees: list | None = None, *,
                  flags_used: bool = True) -> list[Method]:
    """Parse ``--methods`` (comma-separated: ``baseline``, transformers' peers, and any drafter spec) for one k
    or a sweep of ks, and each tree setting in ``trees`` (``--tree``: 0 = a chain, N nodes, ``"auto"``; default
    ``[0]``) for methods whose drafters draft trees, named ``METHOD@tree=N`` unless 0 (other methods run as
    chains, once). Drafter specs are checked by the registry before any model loads.

    ``ks == [None]`` (no k given): each method at its own default, a drafter's own k
    (:meth:`~hf_spec.drafters.base.Drafter.spec_num_speculative_tokens`: 3, a Medusa checkpoint's head count)
    and :data:`~hf_spec.drafters.base.DEFAULT_NUM_SPECULATIVE_TOKENS` for transformers' peers. ``ks == ["auto"]``:
    hf-spec's methods at ``"auto"``, transformers' peers (which have no such mode) at that default; in a sweep
    with ``auto``, the peers run at the sweep's fixed ks only.

    Raises:
        ValueError: an unknown method or bad drafter spec, ``hf-assisted`` without a draft model, an empty list,
            k < 1; with ``flags_used`` (the command line's ``--draft`` and ``--tree``; not when reading back a saved
            run) a ``draft_name`` without ``hf-assisted``, trees asked of methods that draft none.
    """
    trees = list(dict.fromkeys(trees or [0]))
    # a method or k given twice would run twice per prompt under one name (its median then the slower of two)
    names = list(dict.fromkeys(m.strip() for m in spec.split(",") if m.strip()))
    ks = list(dict.fromkeys(ks))
    if not names:
        raise ValueError("--methods is empty; e.g. baseline,draft:qwen2.5-coder-0.5b,ngram,hf-assisted,hf-prompt-lookup")
    if None in ks and len(ks) > 1:
        raise ValueError(f"a sweep needs every k, got {ks}")
    if any(k is not None and k != "auto" and (isinstance(k, bool) or not isinstance(k, int) or k < 1) for k in ks):
        raise ValueError(f"k must be an integer >= 1 or auto, got {ks}")
    drafts = [n.split(":", 1)[1] for n in names if n.startswith("draft:")]
    draft_name = draft_name or None  # --draft "": none
    if flags_used and draft_name is not None and not any(n.startswith("hf-assisted") for n in names):
        raise ValueError(f"--draft {draft_name} names the draft model of hf-assisted, which --methods does not "
                         "run: add hf-assisted to --methods, or drop --draft (hf-spec's draft model is draft:NAME)")
    draft_name = draft_name or (drafts[0] if drafts else None)
    out = [Method("baseline", "baseline")]
    for n in names:
        if n == "baseline":
            continue
        if n in PEERS:
            assisted = n.startswith("hf-assisted")
            if assisted and draft_name is None:
                raise ValueError(f"{n} needs a draft model: add draft:NAME to --methods or pass --draft NAME")
            kind, arg = n, (draft_name if assisted else None)
        else:
            if n.partition(":")[0] not in DRAFTERS and n != "none":
                raise ValueError(f"unknown method {n!r}; use baseline, {', '.join(PEERS)} or a drafter: "
                                 f"{drafter_specs()}")
            # a bad argument (a missing folder, no model name, k above a checkpoint's heads) fails here, with why
            parsed = parse_drafter(n, max((k for k in ks if isinstance(k, int)), default=None))
            if parsed is None:
                raise ValueError("'none' is plain decoding: the baseline, which every run includes")
            kind, arg = "hf-spec", str(parsed)
        if kind == "hf-assisted-defaults":  # its own k, whatever the run's
            out.append(Method(n, kind, HF_ASSISTED_DEFAULTS["num_assistant_tokens"], arg))
            continue
        shapes = trees if kind == "hf-spec" and parsed.cls.drafts_trees else [0]
        for k in ks:
            if k == "auto" and kind in PEERS:
                if len(ks) > 1:
                    continue  # transformers' peers run at the fixed ks of a sweep only
                k = None  # -k auto: hf-spec's methods choose k, transformers' peers run at their default
            if k is None:  # no k given: the method's own
                k = parsed.cls.spec_num_speculative_tokens(parsed.argument) if kind == "hf-spec" else \
                    DEFAULT_NUM_SPECULATIVE_TOKENS
            for tree in shapes:
                name = n if len(ks) == 1 else f"{n}@k={k}"
                out.append(Method(name if not tree else f"{name}@tree={tree}", kind, k, arg, tree))
    if flags_used and any(trees) and not any(m.tree for m in out):  # as generate refuses it: else all ran as chains
        trees_by = sorted(name for name, cls in DRAFTERS.items() if cls.drafts_trees)
        raise ValueError(f"--tree {','.join(map(str, trees))}: no method of --methods drafts trees; trees are drafted "
                         f"by {', '.join(trees_by)}; drop --tree or add such a method")
    return out


def _digest(corpus) -> str | None:
    """A short fingerprint of a corpus (texts or token ids) for the journal's key; ``None`` without one."""
    import hashlib

    return None if corpus is None else hashlib.sha256(repr(list(corpus)).encode()).hexdigest()[:16]


class _Timer(BaseStreamer):
    """Time stamps of each ``put`` after the prompt's (the device synchronised first), and how many tokens
    each brought."""

    def __init__(self, device=None):
        self.device = device
        self.prompt_seen = False
        self.times: list[float] = []
        self.chunks: list[int] = []

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(clock(self.device))
        self.chunks.append(int(value.numel()))

    def end(self):
        pass


def _assistant_call_warning(record: logging.LogRecord) -> bool:
    """False (drop) for the deprecation warning transformers logs about its own call of the assistant's
    ``generate`` (a ``generation_config`` with ``min_new_tokens``/``max_new_tokens``): nothing a bench user can
    change. Installed only around that call."""
    return not record.getMessage().startswith("Passing `generation_config` together with generation-related")


@contextlib.contextmanager
def _count_hf_drafts(record: list[int]):
    """Record the number of tokens each transformers candidate generator drafts (observation only)."""
    classes = [hf_candidates.AssistedCandidateGenerator, hf_candidates.PromptLookupCandidateGenerator]
    originals = {c: c.__dict__["get_candidates"] for c in classes}
    generation_logger = logging.getLogger("transformers.generation.utils")

    def wrap(original):
        def get_candidates(self, input_ids, *args, **kwargs):
            generation_logger.addFilter(_assistant_call_warning)
            try:
                out = original(self, input_ids, *args, **kwargs)
            finally:
                generation_logger.removeFilter(_assistant_call_warning)
            record.append(int(out[0].shape[1] - input_ids.shape[1]))
            return out
        return get_candidates

    for c, f in originals.items():
        c.get_candidates = wrap(f)
    try:
        yield
    finally:
        for c, f in originals.items():
            c.get_candidates = f


def _hf_stats(chunks: list[int], drafted: list[int]) -> SpecStats:
    """Acceptance statistics of a transformers run, through the same :class:`SpecStats` as hf-spec's: one
    chunk of tokens per target forward, whose draft length ``drafted`` recorded; the first forward of
    assisted generation already verifies a draft, so every forward is a step (no prefill event)."""
    stats = SpecStats()
    for i, (emitted, nd) in enumerate(zip(chunks, drafted)):
        stats(StepEvent(i + 1, nd, [[0] * nd], [max(0, min(emitted - 1, nd))], [[0] * emitted], 0.0, 0.0, 0.0,
                        [False]))
    return stats


def _run_once(model, method: Method, inputs, gen_kwargs, drafters, hf_draft, seed: int) -> dict:
    timer = _Timer(model.device)
    record: list[int] = []
    kwargs = dict(gen_kwargs)
    if method.kind == "baseline":
        kwargs["streamer"] = timer
    elif method.kind == "hf-spec":
        kwargs.update(custom_generate=spec_generate, return_dict_in_generate=True, drafter=drafters[method.spec], spec_streamer=timer,
                      num_speculative_tokens=method.k, **({"num_tree_nodes": method.tree} if method.tree else {}))
    elif method.kind.startswith("hf-assisted"):
        # transformers 5 reads these from the assistant's own generation config, not from generate's kwargs
        hf_draft.generation_config.update(**(HF_ASSISTED_DEFAULTS if method.kind == "hf-assisted-defaults" else dict(
            num_assistant_tokens=method.k, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)))
        kwargs.update(assistant_model=hf_draft, streamer=timer)
    elif method.kind == "hf-prompt-lookup":
        kwargs.update(prompt_lookup_num_tokens=method.k, max_matching_ngram_size=3, streamer=timer)
    torch.manual_seed(seed)
    with _count_hf_drafts(record), OtherCpu() as other:
        t0 = clock(model.device)
        out = model.generate(**inputs, **kwargs)
        total = clock(model.device) - t0
    sequences = out.sequences if hasattr(out, "sequences") else out
    tokens = sequences[0, inputs["input_ids"].shape[1]:].tolist()
    n = len(tokens)
    ttft = timer.times[0] - t0 if timer.times else total
    row = {"new_tokens": n, "total_s": total, "ttft_s": ttft, "tpot_s": (total - ttft) / (n - 1) if n > 1 else 0.0,
           "tokens_per_s": n / total, "tokens": tokens, "other_cpu_s": other.other_s, "steal_s": other.steal_s}
    if method.kind == "hf-spec":
        row["stats"] = out.stats
    elif method.kind in PEERS:
        row["stats"] = _hf_stats(timer.chunks, record)
    return row


def _name_differences(target, tokenizer, prompt, kept: dict) -> None:
    """Add ``first_difference`` to each greedy run whose tokens are not the baseline's: the first differing new
    token, the two tokens, the target's logits and their gap there (:func:`hf_spec.divergence.first_difference`),
    ``near_tie`` (the gap within the compute's rounding bound; ``None`` where none was measured) and ``bound``."""
    from ..divergence import first_difference, near_tie, tie_bound

    base = kept["baseline"]["tokens"]
    for name, run in kept.items():
        if name == "baseline" or run["tokens"] == base:
            continue
        diff = first_difference(target, tokenizer, prompt, torch.tensor(base), torch.tensor(run["tokens"]))
        if diff is None:  # one output is a prefix of the other (one stopped earlier)
            diff = {"new_token": min(len(base), len(run["tokens"])), "plain": None, "speculative": None,
                    "logit_gap": None}
        diff["near_tie"] = near_tie(diff["logit_gap"], target, target.dtype) if diff["logit_gap"] is not None else False
        diff["bound"] = tie_bound(target, target.dtype)[1]
        run["first_difference"] = diff


def journal_settings(methods: list[Method], questions: list[Question], *, max_new_tokens: int, temperature: float,
                     sampling: dict | None, repeats: int, seed: int, corpus) -> dict:
    """The settings of a bench run that are known before any model loads, as the journal's key holds them
    (:func:`run_bench` adds the target's name, dtype and device and the draft's dtype)."""
    method_keys = [[m.name, m.kind, m.k if isinstance(m.k, (int, str, type(None))) else type(m.k).__name__, m.spec]
                   for m in methods]
    return {"methods": method_keys, "questions": [q.question_id for q in questions], "max_new_tokens": max_new_tokens,
            "temperature": temperature, "sampling": sampling or {}, "repeats": repeats, "seed": seed,
            "corpus": _digest(corpus)}


def check_journal(path: str | Path, settings: dict) -> None:
    """Refuse, before any model loads, a bench journal at ``path`` (if there is one) that cannot be resumed with
    ``settings`` (a subset of its key, e.g. from :func:`journal_settings`).

    Raises:
        ValueError: the journal is unreadable, or was written with other settings (which ones are named).
    """
    _Journal(path, settings).check()


class _Journal:
    """Each finished prompt's measurements, saved atomically as JSON as the run goes, under a key of the run's
    settings: a run with the same settings resumes from it; other settings are refused. (JSON, not pickle: the
    file sits in a folder the user names, and reading it must not run code.)"""

    def __init__(self, path: str | Path | None, key: dict):
        self.path = Path(path) if path is not None else None
        self.key = key

    def _read(self) -> dict | None:
        if self.path is None or not self.path.exists():
            return None
        try:
            state = json.loads(self.path.read_text())
            state["prompts"] = {p["question_id"]: p for p in state["prompts"]}
            for p in state["prompts"].values():
                for run in p["runs"].values():
                    if "stats" in run:
                        run["stats"] = SpecStats(**run["stats"])
        except Exception as e:  # truncated, or not a journal
            raise ValueError(f"{self.path} is not a readable bench journal ({type(e).__name__}); delete it (the run "
                             "starts over) or use another --out") from None
        return state

    def check(self, state: dict | None = None) -> None:
        """Raise ``ValueError`` if the journal was written under settings other than this key's (those it names)."""
        state = self._read() if state is None else state
        if state is None:
            return
        saved = state.get("key")
        saved = saved if isinstance(saved, dict) else {}  # an older journal's key: every setting counts as changed
        changed = [name for name, value in self.key.items() if saved.get(name) != value]
        if changed:
            raise ValueError(f"{self.path} holds a partial run with other settings ({', '.join(changed)}); "
                             "use another --out or delete it")

    def load(self) -> dict[str, dict]:
        state = self._read()
        if state is None:
            return {}
        self.check(state)
        return state["prompts"]

    def save(self, prompts: list[dict]) -> None:
        if self.path is None:
            return
        per_row = {"per_row"}  # bench rows are single prompts: SpecStats' own fields but the per-row split
        plain = [p | {"runs": {name: run | ({"stats": {f.name: getattr(run["stats"], f.name)
                                                        for f in fields(SpecStats) if f.name not in per_row}}
                                            if "stats" in run else {})
                               for name, run in p["runs"].items()}} for p in prompts]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"key": self.key, "prompts": plain}))
        os.replace(tmp, self.path)


def check_questions_fit(target, tokenizer, questions: list[Question], max_new_tokens: int) -> None:
    """Refuse questions whose prompt (chat template included) and ``max_new_tokens`` pass the target's context
    (:func:`~hf_spec.prompts.check_context`): past it a model writes garbage, or fails with an index error (learned
    positions). ``bench`` and ``tune`` ask before any drafter loads.

    Raises:
        ValueError: naming the first such question, by how much, and what fits.
    """
    context = model_context(target)
    if context is None:
        return
    lengths = [(chat_inputs(tokenizer, q.text)["input_ids"].shape[1], q) for q in questions]
    too_long = [q for n, q in lengths if n >= context]
    if too_long:  # every one named at once: a retry per question is no way to find them
        names = ", ".join(f"{q.question_id} ({q.category})" for q in too_long[:6]) + (", ..." if len(too_long) > 6 else "")
        raise ValueError(f"{counted(len(too_long), 'question')} of {len(questions)} reach past the context of the "
                         f"model, {context} positions, as it reads them: {names}; leave their categories out "
                         "(--categories) or give --questions of your own")
    longest, q = max(lengths, key=lambda item: item[0])
    check_context(target, longest, max_new_tokens, what=f"The longest question, {q.question_id} ({q.category}),")


def run_bench(
    target,
    tokenizer,
    methods: list[Method],
    questions: list[Question],
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    repeats: int = 1,
    draft_dtype="auto",
    seed: int = 0,
    progress: bool = True,
    label: str = "bench",
    journal: str | Path | None = None,
    drafters: dict | None = None,
    corpus: list[str] | None = None,
    sampling: dict | None = None,
) -> dict:
    """Run every method on every question, interleaved, and return per-prompt measurements.

    Each prompt runs every method once per repeat, in an order that turns by one method from one prompt (or
    repeat) to the next, so no method always runs first or after the same other one.

    Args:
        target: the target model.
        tokenizer: its tokenizer.
        methods: from :func:`parse_methods` (``baseline`` first).
        questions: prompts (turn 1 goes through the chat template).
        max_new_tokens: new tokens per prompt.
        temperature: 0 = greedy; > 0 samples.
        repeats: runs per prompt and method; the median run (by total time) is kept.
        draft_dtype: dtype of draft models (``"auto"``: :func:`hf_spec.device.draft_dtype`), on the target's device.
        progress: whether to show progress on stderr, named ``label``: a tqdm bar in a terminal, a line per
            measured prompt where stderr is a log.
        journal: a file where each finished prompt's measurements are saved (atomically) as the run goes;
            a run with the same settings and journal skips the prompts already there (resume after an
            interruption). Machine drift between the sessions hits every method alike, since methods are
            interleaved within each prompt. What earlier calls taught the process (adaptive k's plain-step
            times, a hybrid drafter's priors) is not in the journal: a resumed run learns it again.
        drafters: drafters already built, by spec (the others are built with
            :func:`~hf_spec.drafters.registry.make_drafter`; ``hybrid:SPEC`` reuses SPEC's drafter when it runs too).
        corpus: texts for the drafters that draft from a corpus (``suffix``, ``hybrid:...``).
        sampling: with ``temperature > 0``, more sampling settings for every method, e.g. a shipped instruct
            config's ``{"top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}``; its ``repetition_penalty`` applies
            under greedy decoding too (where the rest would do nothing).

    Returns:
        ``{"prompts": [{"question_id", "category", "prompt_tokens", "runs": {METHOD: measurement}}]}``; a
        measurement holds ``new_tokens``, ``tokens`` (the new token ids), ``total_s``, ``ttft_s``, ``tpot_s``,
        ``tokens_per_s``, ``other_cpu_s`` and ``steal_s`` (CPU seconds other processes and the hypervisor took
        meanwhile: :class:`~hf_spec.device.OtherCpu`) and, for hf-spec's and transformers' speculative methods,
        ``stats`` (:class:`~hf_spec.metrics.SpecStats`).

    Raises:
        ValueError: no questions, or repeats < 1, or a journal written with other settings (which ones are named), or
            a question whose prompt and ``max_new_tokens`` pass the target's context (before any run).
    """
    from tqdm import tqdm

    # everything a measurement depends on: a resumed run with any of it changed is refused, not mixed in
    key = journal_settings(methods, questions, max_new_tokens=max_new_tokens, temperature=temperature,
                           sampling=sampling, repeats=repeats, seed=seed, corpus=corpus)
    key.update(target=getattr(target, "name_or_path", ""), dtype=str(target.dtype), device=str(target.device),
               draft_dtype=str(resolve_draft_dtype(target.dtype, draft_dtype, target.device)))
    saved = _Journal(journal, key)
    done = saved.load()
    if not questions:
        raise ValueError("no questions selected: check --categories / --questions")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    check_questions_fit(target, tokenizer, questions, max_new_tokens)  # before any drafter loads or any run
    # one drafter per spec, shared by every k of a sweep: the loop passes each run's k
    given = drafters or {}
    drafters = {m.spec: given.get(m.spec) for m in methods if m.kind == "hf-spec"}
    for spec in sorted(drafters, key=lambda s: s.startswith("hybrid:")):  # a hybrid's model drafter first
        if drafters[spec] is not None:
            continue
        name, _, inner = spec.partition(":")
        takes = DRAFTERS[name].takes_corpus and corpus is not None
        if name == "hybrid" and drafters.get(inner) is not None:  # one draft model in memory for both methods
            drafters[spec] = HybridDrafter(drafters[inner], SuffixDrafter(corpus=corpus if takes else None,
                                                                          tokenizer=tokenizer))
        else:
            drafters[spec] = make_drafter(spec, target=target, tokenizer=tokenizer, draft_dtype=draft_dtype,
                                          **({"corpus": corpus} if takes else {}))
    hf_draft = None
    hf_names = {m.spec for m in methods if m.kind.startswith("hf-assisted")}
    if hf_names:  # a separate copy: hf-spec's drafter patches its draft's prefill (see kernels.py)
        hf_draft, _ = load_draft_model(hf_names.pop(), target, draft_dtype)  # the same kind of draft as hf-spec's
    warpers = dict(sampling or {})  # all but the repetition penalty, which changes greedy decoding too
    penalty = {"repetition_penalty": warpers.pop("repetition_penalty")} if "repetition_penalty" in warpers else {}
    gen_kwargs = dict(max_new_tokens=max_new_tokens, do_sample=temperature > 0, **penalty)
    gen_kwargs.update(dict(temperature=temperature, **warpers) if temperature > 0
                      else dict(temperature=None, top_p=None, top_k=None))

    warm = chat_inputs(tokenizer, "Write one sentence about the sea.")
    for m in methods:  # one-time costs (allocations, kernels) land on nobody's measurement
        _run_once(target, m, warm, dict(gen_kwargs, max_new_tokens=8), drafters, hf_draft, seed)

    prompts = []
    if progress and (resumed := sum(q.question_id in done for q in questions)):
        print(f"hf-spec: resuming from {saved.path}: {resumed} of {len(questions)} prompts already measured",
              file=sys.stderr)
    lines = progress and not sys.stderr.isatty()  # a log: a line per prompt, not a bar's \r updates
    bar = tqdm(total=len(questions) * len(methods) * repeats, desc=label, disable=not progress or lines)
    for qi, q in enumerate(questions):
        if q.question_id in done:
            prompts.append(done[q.question_id])
            bar.update(len(methods) * repeats)
            continue
        inputs = chat_inputs(tokenizer, q.text)
        runs: dict[str, list] = {m.name: [] for m in methods}
        for r in range(repeats):
            # the order turns by one method per prompt and repeat: a method that always ran first (or right after
            # the same other method) would carry whatever the machine does at that point of each round
            shift = (qi * repeats + r) % len(methods)
            for m in methods[shift:] + methods[:shift]:
                runs[m.name].append(_run_once(target, m, inputs, gen_kwargs, drafters, hf_draft, seed + qi))
                bar.update()
        kept = {name: sorted(rs, key=lambda r: r["total_s"])[len(rs) // 2] for name, rs in runs.items()}
        if temperature == 0:  # greedy: name every output that is not plain decoding's
            _name_differences(target, tokenizer, inputs["input_ids"][0], kept)
        prompts.append({"question_id": q.question_id, "category": q.category,
                        "prompt_tokens": int(inputs["input_ids"].shape[1]), "runs": kept})
        saved.save(prompts)
        if lines:
            print(f"{label}: prompt {qi + 1} of {len(questions)} measured ({q.category}, {len(methods) * repeats} "
                  "runs)", file=sys.stderr, flush=True)
    bar.close()
    return {"prompts": prompts}
