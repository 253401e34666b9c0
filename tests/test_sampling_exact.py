"""Sampling is distribution-exact, end to end through the loop: on a tiny model whose full distribution
over the first three generated tokens we can enumerate, the empirical distribution of speculative samples
matches the target's processed distribution (temperature, top-k, top-p) by a chi-square test; and the same
test fails when the acceptance rule is deliberately wrong."""


import pytest
import torch
from scipy.stats import chisquare
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation import (MaxLengthCriteria, SuppressTokensLogitsProcessor, TemperatureLogitsWarper,
                                     TopKLogitsWarper, TopPLogitsWarper)

import hf_spec
import hf_spec.acceptance
import hf_spec.loop

from .conftest import tiny_llama
from .test_acceptance import wrong_residual

ALPHA = 1e-3  # false-alarm rate of each test
N_RUNS = 1500
V = 10
PROMPT = torch.tensor([[0, 4, 7]])
NEW = 3


@pytest.fixture(scope="module")
def pair():
    target, draft = tiny_llama(vocab_size=V, seed=10), tiny_llama(vocab_size=V, seed=11)
    with torch.no_grad():  # peaky, disagreeing distributions so that a wrong rule shows
        target.lm_head.weight.mul_(12.0)
        draft.lm_head.weight.mul_(12.0)
    return target, draft


def processors(temperature, top_k=4, top_p=0.9):
    return LogitsProcessorList([TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)])


@torch.no_grad()
def exact_distribution(model, procs, prompt=PROMPT):
    """P(t1, t2, t3 | prompt) under the processed target distribution, by enumeration."""
    probs = {}

    def step(prefix):
        logits = model(input_ids=prefix).logits[:, -1].float()
        return procs(prefix, logits).softmax(-1)[0]

    p1 = step(prompt)
    for a in range(V):
        if p1[a] == 0:
            continue
        pa = torch.cat([prompt, torch.tensor([[a]])], 1)
        p2 = step(pa)
        for b in range(V):
            if p2[b] == 0:
                continue
            p3 = step(torch.cat([pa, torch.tensor([[b]])], 1))
            for c in range(V):
                if p3[c] > 0:
                    probs[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return probs


def sample_counts(target, draft, procs, k=2, seed=0, drafter=None, num_speculative_tokens=None):
    """Counts of the first NEW sampled tokens over N_RUNS speculative runs (a draft model by default)."""
    torch.manual_seed(seed)
    # one token more than we count, so that the first speculative step drafts k=2 tokens (t2, t3)
    cfg = GenerationConfig(do_sample=True, max_length=PROMPT.shape[1] + NEW + 1)
    stop = StoppingCriteriaList([MaxLengthCriteria(cfg.max_length)])
    counts = {}
    drafter = drafter if drafter is not None else hf_spec.DraftModelDrafter(draft, k)
    for _ in range(N_RUNS):
        out = hf_spec.speculative_decode(target, PROMPT, drafter, logits_processor=procs, stopping_criteria=stop,
                                         generation_config=cfg, num_speculative_tokens=num_speculative_tokens)
        key = tuple(out.sequences[0, PROMPT.shape[1]:PROMPT.shape[1] + NEW].tolist())
        counts[key] = counts.get(key, 0) + 1
    return counts


def pvalue(counts, exact):
    assert set(counts) <= set(exact), "sampled a sequence the target gives probability 0"
    keys = sorted(exact, key=exact.get, reverse=True)
    n = sum(counts.values())
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for key in keys:  # pool the rare outcomes into one bin (expected count >= 5 per bin)
        if exact[key] * n >= 5:
            obs.append(counts.get(key, 0))
            exp.append(exact[key] * n)
        else:
            rest_o += counts.get(key, 0)
            rest_e += exact[key] * n
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    scale = sum(obs) / sum(exp)
    return chisquare(obs, [e * scale for e in exp]).pvalue


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_speculative_sampling_is_distribution_exact(pair, temperature):
    target, draft = pair
    procs = processors(temperature)
    exact = exact_distribution(target, procs)
    assert abs(sum(exact.values()) - 1) < 1e-4
    counts = sample_counts(target, draft, procs, seed=int(temperature * 10))
    assert pvalue(counts, exact) > ALPHA


def test_the_end_to_end_test_fails_for_a_wrong_rule(pair, monkeypatch):
    target, draft = pair
    procs = processors(1.0)
    exact = exact_distribution(target, procs)
    monkeypatch.setattr(hf_spec.acceptance, "_residual", wrong_residual)
    counts = sample_counts(target, draft, procs, seed=3)
    assert pvalue(counts, exact) < ALPHA


def test_draft_and_target_disagree(pair):
    """Guard for the test's power: the draft's first-token distribution differs from the target's."""
    target, draft = pair
    procs = processors(1.0)
    with torch.no_grad():
        p = procs(PROMPT, target(input_ids=PROMPT).logits[:, -1]).softmax(-1)
        q = procs(PROMPT, draft(input_ids=PROMPT).logits[:, -1]).softmax(-1)
    assert 0.5 * (p - q).abs().sum() > 0.3


def corpus_drafters(target, draft, procs):
    """A suffix drafter whose corpus continues the prompt with the target's likelier 3-token continuations (its
    drafts are sometimes accepted, sometimes not), alone and as the hybrid drafter's suffix source."""
    exact = exact_distribution(target, procs)
    likely = sorted(exact, key=exact.get, reverse=True)[:4]
    corpus = [PROMPT[0].tolist() + list(c) for c in likely]
    suffix = hf_spec.SuffixDrafter(2, corpus=corpus, min_token_prob=0.0)
    return {"suffix": suffix, "hybrid": hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 2), suffix)}


@pytest.mark.parametrize("kind", ["suffix", "hybrid"])
def test_suffix_and_hybrid_sampling_is_distribution_exact(pair, kind):
    """Suffix drafts are deterministic (one-hot q); the hybrid drafter mixes them with the draft model's sampled
    drafts, step by step: both keep the target's distribution, and the hybrid's runs used both sources."""
    target, draft = pair
    procs = processors(1.0)
    exact = exact_distribution(target, procs)
    drafter = corpus_drafters(target, draft, procs)[kind]
    sources = {}

    def listen(event):
        for s in event.sources or []:
            sources[s] = sources.get(s, 0) + 1

    torch.manual_seed(5)
    cfg = GenerationConfig(do_sample=True, max_length=PROMPT.shape[1] + NEW + 1)
    stop = StoppingCriteriaList([MaxLengthCriteria(cfg.max_length)])
    counts, accepted = {}, 0
    for _ in range(N_RUNS):
        out = hf_spec.speculative_decode(target, PROMPT, drafter, logits_processor=procs, stopping_criteria=stop,
                                         generation_config=cfg, event_listeners=[listen])
        key = tuple(out.sequences[0, PROMPT.shape[1]:PROMPT.shape[1] + NEW].tolist())
        counts[key] = counts.get(key, 0) + 1
        accepted += out.stats.num_accepted_tokens
    assert pvalue(counts, exact) > ALPHA
    assert accepted > N_RUNS // 4  # the drafts were verified and often kept: the test exercised acceptance
    if kind == "hybrid":
        assert sources.get("suffix", 0) > 0 and sources.get("draft", 0) > 0, sources


def test_the_hybrid_test_fails_for_a_wrong_rule(pair, monkeypatch):
    target, draft = pair
    procs = processors(1.0)
    exact = exact_distribution(target, procs)
    drafter = corpus_drafters(target, draft, procs)["hybrid"]
    monkeypatch.setattr(hf_spec.acceptance, "_residual", wrong_residual)
    counts = sample_counts(target, draft, procs, seed=3, drafter=drafter)
    assert pvalue(counts, exact) < ALPHA


#: every token followed by two different ones, and no pair of tokens twice: after any first sampled token t1 but 0,
#: the suffix drafter's longest match is t1 alone, and its tree has two children (t1 + 1, t1 + 2), each with its one
#: continuation under it
BRANCHY = torch.tensor([list(range(V)) + [0, 2, 4, 6, 8, 1, 3, 5, 7, 9]])


def test_suffix_tree_sampling_is_distribution_exact_and_a_wrong_sibling_rule_fails(pair, monkeypatch):
    """The suffix drafter's speculation trees (deterministic siblings, one-hot q) keep the target's distribution:
    the first NEW sampled tokens after a prompt whose every token has two continuations, in batches of rows that
    sample on their own; trying a later sibling against the target's full p instead of what the rejections left
    of it fails the same test."""
    from .test_tree_acceptance import wrong_sibling_rule

    target, _ = pair
    procs = processors(1.0)
    exact = exact_distribution(target, procs, BRANCHY)
    cfg = GenerationConfig(do_sample=True, max_length=BRANCHY.shape[1] + NEW + 1)
    stop = StoppingCriteriaList([MaxLengthCriteria(cfg.max_length)])

    def counts(seed):
        torch.manual_seed(seed)
        found, siblings = {}, 0

        def listen(event):
            nonlocal siblings
            siblings += sum(len(set(p)) < len(p) for p in event.parents or [])

        for _ in range(N_RUNS // 300):
            out = hf_spec.speculative_decode(target, BRANCHY.expand(300, -1), hf_spec.SuffixDrafter(2),
                                             logits_processor=procs, stopping_criteria=stop, generation_config=cfg,
                                             num_tree_nodes=6, event_listeners=[listen])
            for row in out.sequences[:, BRANCHY.shape[1]:BRANCHY.shape[1] + NEW].tolist():
                found[tuple(row)] = found.get(tuple(row), 0) + 1
        assert siblings > 0  # trees branched
        return found

    assert pvalue(counts(7), exact) > ALPHA
    monkeypatch.setattr(hf_spec.loop, "speculative_sample_tree", wrong_sibling_rule)
    assert pvalue(counts(8), exact) < ALPHA


def test_num_return_sequences_are_independent_exact_samples(pair):
    """``num_return_sequences=n`` through generate: n rows per prompt (generate repeats the prompts, the loop
    decodes them as a batch), prompts in order as plain sampling returns them, and the rows are samples of the
    target's processed distribution: 1,500 rows of one call pass the chi-square test (refused before)."""
    target, draft = pair
    torch.manual_seed(3)
    run = dict(do_sample=True, temperature=0.8, top_k=4, top_p=0.9, max_new_tokens=NEW + 1, min_new_tokens=NEW + 1,
               custom_generate=hf_spec.generate, drafter=hf_spec.DraftModelDrafter(draft, 2))
    out = target.generate(PROMPT, num_return_sequences=N_RUNS, **run)
    assert out.shape == (N_RUNS, PROMPT.shape[1] + NEW + 1)
    counts = {}
    for row in out[:, PROMPT.shape[1]:PROMPT.shape[1] + NEW].tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    # min_new_tokens keeps EOS (token 1) out first, then generate's warpers in processors()' order
    no_eos = LogitsProcessorList([SuppressTokensLogitsProcessor([1]), *processors(0.8)])
    assert pvalue(counts, exact_distribution(target, no_eos)) > ALPHA
    two = torch.tensor([[0, 4, 7], [0, 2, 5]])
    out = target.generate(two, attention_mask=torch.ones_like(two), num_return_sequences=3, **run)
    assert out.shape[0] == 6 and out[:3, :3].eq(two[0]).all() and out[3:, :3].eq(two[1]).all()
    with pytest.raises(ValueError, match="num_return_sequences"):  # generate's own rule: greedy has one answer
        target.generate(PROMPT, num_return_sequences=2, **dict(run, do_sample=False))


def test_a_call_given_a_generator_draws_every_random_number_from_it(pair):
    """speculative_decode(generator=...): the target's samples, the acceptance's uniforms and the draft model's sampled
    tokens all come from it, so a seeded call repeats whatever torch's global RNG does meanwhile (another thread's
    calls); the draft's tokens had come from the global RNG."""
    target, draft = pair
    cfg = GenerationConfig(do_sample=True, max_length=PROMPT.shape[1] + 12)
    stop = StoppingCriteriaList([MaxLengthCriteria(cfg.max_length)])
    outputs = set()
    for global_seed in range(3):
        torch.manual_seed(global_seed)
        out = hf_spec.speculative_decode(target, PROMPT, hf_spec.DraftModelDrafter(draft, 3),
                                         logits_processor=processors(1.0), stopping_criteria=stop, generation_config=cfg,
                                         generator=torch.Generator().manual_seed(7))
        outputs.add(tuple(out.sequences[0].tolist()))
    assert len(outputs) == 1
