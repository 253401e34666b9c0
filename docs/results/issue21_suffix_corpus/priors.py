"""Acceptance of suffix proposals by source (the current text's trie or the corpus) and match length, measured
leave-one-out on the corpus itself (corpus.jsonl: the target's greedy answers to Spec-Bench questions the bench
does not ask): each answer is replayed after its prompt with the other answers as the corpus, drafting as
SuffixDrafter.propose does (k = 8, at most 4 x the match length, min_token_prob 0.1), greedy acceptance exact
given the output. Prints per (source, match-length bucket of hybrid.SUFFIX_PRIORS): proposals, the first token's
acceptance, each later token's conditional acceptance; and the first token's acceptance by the proposal's own
empirical probability of it.
Run: .venv/bin/python docs/results/issue21_suffix_corpus/priors.py"""
import json, sys
from collections import defaultdict
from pathlib import Path
from transformers import AutoTokenizer
from hf_spec.drafters.suffix_index import SuffixArray, SuffixTrie
from hf_spec.drafters.hybrid import SUFFIX_PRIORS, suffix_bucket
from hf_spec.models import cache_dir
from hf_spec.prompts import load_questions, chat_inputs

here = Path(__file__).parent
sys.path.insert(0, str(here))
from sim_corpus import suffix_step  # noqa: E402  (SuffixDrafter.propose's choice, origin included)
rows = [json.loads(l) for l in (here / "corpus.jsonl").open()]
questions = {q.question_id: q for q in load_questions()}
tok = AutoTokenizer.from_pretrained(cache_dir() / "models" / "qwen2.5-coder-1.5b")
K, MIN_PROB = 8, 0.1  # and at most 4 x the match length (sim_corpus.limit)
first = defaultdict(lambda: [0, 0])   # (source, bucket) -> [proposals, first accepted]
later = defaultdict(lambda: [0, 0])   # (source, bucket) -> [later positions reached, accepted]
by_prob = defaultdict(lambda: [0, 0])  # (source, prob bin) -> [proposals, first accepted]
for i, r in enumerate(rows):
    corpus = SuffixArray([x["output"] for j, x in enumerate(rows) if j != i])
    prompt = chat_inputs(tok, questions[r["question_id"]].text)["input_ids"][0].tolist()
    out = r["output"]
    trie = SuffixTrie(32)
    state = trie.extend(prompt)
    pos = 0
    while pos < len(out):
        c = suffix_step(trie, state, prompt + out[:pos], K, 0, MIN_PROB, corpus, 1, MIN_PROB)
        a = 0
        if c is not None and c.tokens:
            while a < len(c.tokens) and pos + a < len(out) and c.tokens[a] == out[pos + a]:
                a += 1
            source = c.origin
            key = (source, suffix_bucket(c.match_length))
            first[key][0] += 1
            first[key][1] += a >= 1
            for j in range(1, min(a + 1, len(c.tokens))):
                later[key][0] += 1
                later[key][1] += a > j
            by_prob[(source, min(9, int(c.probs[0] * 10)))][0] += 1
            by_prob[(source, min(9, int(c.probs[0] * 10)))][1] += a >= 1
        step = min(a + 1, len(out) - pos)
        state = trie.extend(out[pos:pos + step], state)
        pos += step
print("| source | match length | proposals | first token accepted | later tokens accepted (conditional) | prior (first, later) |")
print("|---|---|---|---|---|---|")
for key in sorted(first):
    source, b = key
    f, l = first[key], later[key]
    shortest = SUFFIX_PRIORS[b][0]
    upper = SUFFIX_PRIORS[b + 1][0] - 1 if b + 1 < len(SUFFIX_PRIORS) else None
    print(f"| {source} | {shortest}{'-' + str(upper) if upper and upper != shortest else '+' if upper is None else ''} "
          f"| {f[0]} | {f[1] / f[0]:.2f} | {l[1] / max(1, l[0]):.2f} ({l[0]}) | {SUFFIX_PRIORS[b][1]}, {SUFFIX_PRIORS[b][2]} |")
print()
print("| source | empirical probability of the first token | proposals | first token accepted |")
print("|---|---|---|---|")
for key in sorted(by_prob):
    f = by_prob[key]
    print(f"| {key[0]} | {key[1] / 10:.1f}-{(key[1] + 1) / 10:.1f} | {f[0]} | {f[1] / f[0]:.2f} |")
