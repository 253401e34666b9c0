"""Offline simulation: the suffix drafter on the target's own greedy outputs (../issue21_suffix_tree_sim/outputs.jsonl,
13 categories x 2 prompts, 128 tokens, bfloat16), with and without a corpus of the target's answers to the other
Spec-Bench questions (corpus.jsonl from corpus.py), against transformers' prompt lookup. Greedy acceptance is exact
given the outputs; each forward is priced by the measured times by positions (../issue21_suffix_tree_sim/times.json).
The drafter's choice between sources is SuffixDrafter.propose's (most expected accepted tokens, then the longer
match; a corpus match shorter than the current text's is not used).
Run: .venv/bin/python docs/results/issue21_suffix_corpus/sim_corpus.py [MAX_CORPUS_ANSWERS]"""
import json, math, statistics, sys
from pathlib import Path
from hf_spec.drafters.suffix_index import SuffixArray, SuffixTrie
from hf_spec.adaptive import forward_time

here = Path(__file__).parent
sim = here.parent / "issue21_suffix_tree_sim"
sys.path.insert(0, str(sim))
from sim import accept  # noqa: E402  (greedy tree acceptance given the target's output)


def limit(n, k, factor=4.0):
    return max(1, min(k, math.ceil(factor * n)))


def suffix_step(trie, state, context, k, nodes, min_prob, index, corpus_min, corpus_prob):
    """The proposal SuffixDrafter.propose would choose (a Proposal with its origin; None: nothing matches), with
    the corpus rule as a parameter: its matches used from ``corpus_min`` tokens on and at least as long as the
    text's (``corpus_min`` 0: any), its chains cut at ``corpus_prob``."""
    n, node = trie.longest_match(state, 1, 16)
    cands = []
    if n and nodes:
        cands.append(trie.tree(node, n, nodes, limit(n, k), min_prob))
    elif n:
        cands.append(trie.continuation(node, n, limit(n, k), min_prob))
    if index is not None:
        m, lo, hi = index.match_of(context[-16:], 1, 16)
        if m and (m >= max(n, corpus_min) if corpus_min else m >= 1):  # corpus_min 0: even a shorter match
            lim = limit(m, k) if not nodes else min(limit(m, k), nodes)
            cands.append(index.continuation(m, lo, hi, lim, corpus_prob))
    best = None
    for c in cands:
        if best is None or (c.expected_accepted, c.match_length) > (best.expected_accepted, best.match_length):
            best = c
    return best


def lookup_step(seq, k, max_ngram=2):
    """transformers' PromptLookupCandidateGenerator: the earliest earlier occurrence of the last 2-gram, else 1-gram."""
    L = len(seq)
    for size in range(min(max_ngram, L - 1), 0, -1):
        tail = seq[-size:]
        for i in range(L - size):
            if seq[i:i + size] == tail:
                start = i + size
                end = min(start + k, L)
                if start < end:
                    return seq[start:end], None
    return [], None


def run(policy, prompt, out):
    kind = policy[0]
    trie = SuffixTrie(32)
    state = trie.extend(prompt)
    pos = forwards = 0
    seconds = 0.0
    while pos < len(out):
        seq = prompt + out[:pos]
        if kind == "lookup":
            tokens, parents = lookup_step(seq, policy[1])
        else:
            _, k, nodes, min_prob, use_corpus, corpus_min, corpus_prob = policy
            best = suffix_step(trie, state, seq, k, nodes, min_prob, corpus if use_corpus else None, corpus_min,
                               corpus_prob)
            tokens, parents = ([], None) if best is None else (best.tokens, best.parents)
        a = accept(tokens, parents, out[pos:])
        step = min(a + 1, len(out) - pos)
        if kind != "lookup":
            state = trie.extend(out[pos:pos + step], state)
        pos += step
        forwards += 1
        seconds += forward_time(times, 1 + len(tokens))
    return forwards, seconds


if __name__ == "__main__":  # importable: priors.py reuses suffix_step()
    rows = [json.loads(l) for l in (sim / "outputs.jsonl").open()]
    times = {int(k): v for k, v in json.loads((sim / "times.json").read_text()).items()}
    corpus_rows = [json.loads(l) for l in (here / "corpus.jsonl").open()]
    if len(sys.argv) > 1:
        corpus_rows = corpus_rows[:int(sys.argv[1])]
    eval_ids = {r["question_id"] for r in rows}
    assert not eval_ids & {r["question_id"] for r in corpus_rows}, "a benchmark question is in the corpus"
    corpus = SuffixArray([r["output"] for r in corpus_rows])
    print(f"corpus: {len(corpus_rows)} answers, {corpus.num_tokens} tokens")
    # (kind, k, tree nodes, min_token_prob, corpus?, shortest corpus match used (0: also one shorter than the current
    # text's), corpus min_token_prob)
    policies = [("suffix", 8, 0, 0.1, True, 0, 0.1), ("suffix", 8, 6, 0.1, True, 0, 0.1), ("suffix", 8, 0, 0.05, True, 1, 0.05),
                ("lookup", 3), ("lookup", 8),
                ("suffix", 8, 0, 0.1, False, 1, 0.1), ("suffix", 8, 0, 0.1, True, 1, 0.1),
                ("suffix", 8, 0, 0.1, True, 2, 0.1), ("suffix", 8, 0, 0.1, True, 3, 0.1),
                ("suffix", 8, 0, 0.1, True, 1, 0.3), ("suffix", 8, 0, 0.1, True, 2, 0.3),
                ("suffix", 8, 6, 0.1, False, 1, 0.1), ("suffix", 8, 6, 0.1, True, 1, 0.1),
                ("suffix", 8, 6, 0.1, True, 2, 0.3), ("suffix", 8, 8, 0.1, True, 2, 0.3)]
    results = {}
    for policy in policies:
        ratios, tpf, cats = [], [], {}
        for r in rows:
            f, s = run(policy, r["prompt"], r["output"])
            plain = len(r["output"]) * times[1]
            ratios.append(plain / s)
            tpf.append(len(r["output"]) / f)
            cats.setdefault(r["category"], []).append(plain / s)
        results[policy] = ratios
        print(f"{str(policy):42s} speedup median {statistics.median(ratios):.3f} mean {statistics.mean(ratios):.3f} "
              f"tokens/forward {statistics.mean(tpf):.2f}  "
              + " ".join(f"{c[:5]}:{statistics.median(v):.2f}" for c, v in cats.items()), flush=True)
    base = results[("lookup", 3)]
    for policy, ratios in results.items():
        print(f"{str(policy):42s} over lookup k=3, median per prompt "
              f"{statistics.median(a / b for a, b in zip(ratios, base)):.3f}")
