"""The suffix drafter's indexes against a brute-force reference on random token sequences, its memory bound and
corpus, and the n-gram drafter that now reads the same index."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from transformers import GenerationConfig

import hf_spec
from hf_spec.drafters.base import VerifyOutput
from hf_spec.drafters.suffix_index import MERGE_FACTOR, SuffixArray, SuffixArrayLevels, SuffixTrie

from .conftest import tiny_pair


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def occurrences(docs, pattern, depth=math.inf):
    """(global position, next token) of every occurrence of ``pattern`` followed by a token, in document
    order, counting only substrings of length <= depth (the trie's bound)."""
    out, base, n = [], 0, len(pattern)
    for doc in docs:
        for p in range(len(doc) - n):
            if n + 1 <= depth and doc[p:p + n] == pattern:
                out.append((base + p, doc[p + n]))
        base += len(doc) + 1
    return out


def ref_match(docs, context, min_match, max_match, depth=math.inf):
    for n in range(min(max_match, len(context), depth - 1), min_match - 1, -1):
        if occurrences(docs, context[len(context) - n:], depth):
            return n
    return 0


def ref_continuation(docs, pattern, max_tokens, min_prob, most_recent, depth=math.inf):
    tokens, probs, cum = [], [], 1.0
    pattern = list(pattern)
    while len(tokens) < max_tokens:
        occ = occurrences(docs, pattern, depth)
        if not occ:
            break
        counts, latest = {}, {}
        for pos, t in occ:
            counts[t] = counts.get(t, 0) + 1
            latest[t] = max(latest.get(t, -1), pos)
        t = max(counts, key=lambda t: latest[t]) if most_recent else max(counts, key=lambda t: (counts[t], latest[t]))
        p = counts[t] / len(occ)
        if cum * p < min_prob:
            break
        cum *= p
        tokens.append(t)
        probs.append(p)
        pattern.append(t)
    return tokens, probs


def random_docs(rng, n_docs, vocab):
    # a small vocabulary and repeated chunks: many matches, many ties
    docs = []
    for _ in range(n_docs):
        doc = []
        while len(doc) < rng.randint(1, 60):
            doc += rng.choice([[rng.randrange(vocab)], [1, 2, 3], [2, 3, 1, 2], [rng.randrange(vocab)] * 3])
        docs.append(doc)
    return docs


def growing(trie, docs):
    """Index all documents but the last into ``trie``, then the last token by token: yields ``(prefix, state,
    seen)`` after each token (the last document so far, its trie state, every document as indexed)."""
    for doc in docs[:-1]:
        trie.extend(doc)
    last, state = docs[-1], []
    for i, token in enumerate(last):
        state = trie.append(state, token)
        yield last[:i + 1], state, docs[:-1] + [last[:i + 1]]


@pytest.mark.parametrize("seed", range(6))
def test_trie_matches_brute_force_as_it_grows(seed):
    """Every prefix of the last document (the text the trie is updated with token by token): the longest match
    of its end, and both continuations (most frequent, most recent) with a probability floor, equal the
    reference computed from scratch on the same documents."""
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5, 8, 40])
    docs = random_docs(rng, rng.randint(1, 3), rng.choice([3, 5, 9]))
    trie = SuffixTrie(depth)
    for prefix, state, seen in growing(trie, docs):
        min_match, max_match = rng.randint(1, 2), rng.randint(2, 12)
        n, node = trie.longest_match(state, min_match, max_match)
        assert n == ref_match(seen, prefix, min_match, max_match, depth)
        assert (n, node) == trie.match_of(prefix, min_match, max_match)
        if n:
            for most_recent in (False, True):
                max_tokens, min_prob = rng.randint(1, 8), rng.choice([0.0, 0.3, 0.6])
                got = trie.continuation(node, n, max_tokens, min_prob, most_recent)
                want = ref_continuation(seen, prefix[-n:], max_tokens, min_prob, most_recent, depth)
                assert (got.tokens, got.probs) == want
    # counts: every substring's occurrences, and no node beyond the depth
    last = docs[-1]
    for length in range(1, min(depth, 4) + 1):
        for start in range(len(last) - length + 1):
            pattern = last[start:start + length]
            node = trie.find(pattern)
            assert trie.count[node] == sum(d[p:p + length] == pattern for d in docs for p in range(len(d) - length + 1))
    assert trie.find(last[:depth + 1]) == -1 or len(last) <= depth


def ref_tree_paths(docs, pattern, max_depth, min_prob, depth=math.inf):
    """Every continuation path of ``pattern`` at most ``max_depth`` long whose probability (the product of
    each token's share of the occurrences of the pattern and the path before it) is >= min_prob: {path: prob}."""
    out, frontier = {}, [((), 1.0)]
    while frontier:
        path, cum = frontier.pop()
        if len(path) == max_depth:
            continue
        occ = occurrences(docs, list(pattern) + list(path), depth)
        for t in {t for _, t in occ}:
            p = cum * sum(u == t for _, u in occ) / len(occ)
            if p >= min_prob:
                out[path + (t,)] = p
                frontier.append((path + (t,), p))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_trie_speculation_tree_matches_brute_force(seed):
    """SuffixTrie.tree, at every prefix of a growing document: each node's path and probability are the
    reference's, parents come first, and the nodes are the max_nodes most likely paths (the multiset of
    probabilities of the reference's top max_nodes: ties may pick other paths of the same probability)."""
    rng = random.Random(200 + seed)
    depth = rng.choice([5, 8, 40])
    docs = random_docs(rng, rng.randint(1, 3), rng.choice([3, 5]))
    trie = SuffixTrie(depth)
    for prefix, state, seen in growing(trie, docs):
        n, node = trie.longest_match(state, 1, rng.randint(1, 6))
        if not n:
            continue
        max_nodes, max_depth, min_prob = rng.randint(1, 12), rng.randint(1, 5), rng.choice([0.0, 0.05, 0.3])
        got = trie.tree(node, n, max_nodes, max_depth, min_prob)
        want = ref_tree_paths(seen, prefix[-n:], max_depth, min_prob, depth)
        paths, cums = [], []
        for t, up, p in zip(got.tokens, got.parents, got.probs):
            assert up < len(paths)
            paths.append((paths[up] if up >= 0 else ()) + (t,))
            cums.append(p * (cums[up] if up >= 0 else 1.0))
        assert len(set(paths)) == len(paths)
        for path, cum in zip(paths, cums):
            assert want[path] == pytest.approx(cum)
        assert sorted(cums, reverse=True) == pytest.approx(sorted(want.values(), reverse=True)[:max_nodes])
        assert got.expected_accepted == pytest.approx(sum(cums))
        assert got.match_length == (n if paths else 0)


def test_trie_speculation_tree_breaks_ties_as_the_chain_does():
    """Equally likely children: the tree's first node is the child the chain takes (seen last), not the one
    indexed last; no nodes asked, none given."""
    trie = SuffixTrie(8)
    for doc in ([7, 2], [7, 3], [7, 3], [7, 2]):
        trie.extend(doc)
    node = trie.find([7])
    assert trie.continuation(node, 1, 1).tokens == [2]
    assert trie.tree(node, 1, 1, 1).tokens == [2]
    assert trie.tree(node, 1, 2, 1).tokens == [2, 3]
    empty = trie.tree(node, 1, 0, 1)
    assert (empty.tokens, empty.match_length) == ([], 0)


#: prompts whose repeats give the tiny target's greedy text matches with several continuations, where the suffix
#: drafter's tree accepted a node that is not its parent's likeliest child (found by trying random repeats)
BRANCHING_PROMPTS = ([0, 3, 19, 10, 6, 26, 17, 3, 19, 10, 6, 26, 17, 3, 19, 10, 6],
                     [0, 7, 29, 18, 7, 29, 18, 7, 29, 18, 31, 3, 31, 3])
#: no token twice: the first draft finds no match (an empty tree, a plain step through the tree path)
DISTINCT_PROMPT = [0, 5, 9, 13, 21, 2]


def test_suffix_tree_greedy_is_the_targets_own_output_and_takes_later_siblings(pair):
    """SuffixDrafter.draft_tree through the loop: greedy output is the target's own, single and in a left-padded
    batch (rows with and without a match: an empty tree is a plain step); a tree accepted a later sibling, and
    every tree is within its bounds (num_tree_nodes, k deep)."""
    from .test_tree_loop import _took_a_later_sibling

    target, _ = pair
    width = max(map(len, BRANCHING_PROMPTS))
    batch = dict(input_ids=torch.tensor([[1] * (width - len(p)) + p for p in BRANCHING_PROMPTS]),
                 attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in BRANCHING_PROMPTS]))
    later, empty = 0, 0
    for inputs in [dict(input_ids=torch.tensor([p])) for p in BRANCHING_PROMPTS + (DISTINCT_PROMPT,)] + [batch]:
        ref = target.generate(**inputs, max_new_tokens=30, min_new_tokens=30, do_sample=False)
        events = []
        out = target.generate(**inputs, max_new_tokens=30, min_new_tokens=30, do_sample=False,
                              custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=hf_spec.SuffixDrafter(4), num_tree_nodes=8, event_listeners=[events.append])
        assert out.sequences.tolist() == ref.tolist()
        trees = [(e.drafted[i], e.parents[i], e.emitted[i][:e.num_accepted[i]])
                 for e in events[1:] if e.parents for i in range(len(e.emitted))]
        assert all(len(d) <= 8 for d, _, _ in trees)
        empty += sum(all(not d for d in e.drafted) for e in events[1:] if e.num_speculative_tokens)
        if inputs["input_ids"][0].tolist() != DISTINCT_PROMPT:
            assert any(len(set(p)) < len(p) for _, p, _ in trees)  # some trees branched
            assert out.stats.num_target_forwards < 30
        later += sum(_took_a_later_sibling(*t) for t in trees)
    assert later > 0 and empty > 0


@pytest.mark.parametrize("seed", range(6))
def test_suffix_array_matches_brute_force(seed):
    """Matches of arbitrary contexts (from the documents and random) and their continuations, with no depth
    bound; documents never match across their boundary."""
    rng = random.Random(100 + seed)
    vocab = rng.choice([3, 5, 9])
    docs = random_docs(rng, rng.randint(1, 4), vocab)
    index = SuffixArray(docs)
    assert len(index) == sum(map(len, docs))
    # the suffix array is sorted
    text = index.text.tolist()
    suffixes = [text[i:] for i in index.sa.tolist()]
    assert suffixes == sorted(suffixes)
    for _ in range(40):
        if rng.random() < 0.5:
            d = rng.choice(docs)
            a = rng.randrange(len(d))
            context = d[:a + 1]
        else:
            context = [rng.randrange(vocab) for _ in range(rng.randint(1, 10))]
        min_match, max_match = rng.randint(1, 2), rng.randint(2, 12)
        n, lo, hi = index.match_of(context, min_match, max_match)
        assert n == ref_match(docs, context, min_match, max_match)
        if n:
            for most_recent in (False, True):
                max_tokens, min_prob = rng.randint(1, 8), rng.choice([0.0, 0.3])
                got = index.continuation(n, lo, hi, max_tokens, min_prob, most_recent)
                assert (got.tokens, got.probs) == ref_continuation(docs, context[len(context) - n:], max_tokens,
                                                                    min_prob, most_recent)
    # across a document boundary: the end of one and the start of the next never match together
    two = SuffixArray([[1, 2], [3, 4]])
    assert two.match_of([2, 3], 2, 2)[0] == 0


@pytest.mark.parametrize("seed", range(6))
def test_levels_of_past_outputs_answer_as_one_array_over_the_kept_ones(seed):
    """SuffixArrayLevels (past outputs: each call's indexed as a level of its own, merged log-structured, the oldest
    dropped past the bound) against the brute-force reference over the documents it keeps, after every add: the
    longest match and both continuations (most frequent, most recent) with a probability floor, counted over all
    levels together; the documents kept are the newest that fit; the levels stay few."""
    rng = random.Random(seed)
    bound = rng.choice([20, 60, 200])
    levels, added = SuffixArrayLevels(bound), []
    for _ in range(40):
        new = random_docs(rng, rng.randint(1, 3), rng.choice([3, 5]))
        levels.add(new)
        added += [d[-bound:] for d in new]
        kept = [d.tolist() for d in levels.documents]
        n_kept = 0  # the newest documents whose tokens fit the bound
        while n_kept < len(added) and sum(map(len, added[len(added) - n_kept - 1:])) <= bound:
            n_kept += 1
        assert kept == added[len(added) - n_kept:] and levels.num_tokens <= bound
        assert levels.max_token() == max(t for d in kept for t in d)
        sizes = [len(level.array.text) for level in levels.levels]
        assert len(sizes) <= 2 + math.log(bound, MERGE_FACTOR) * 2
        for _ in range(8):
            context = rng.choice(kept)[: rng.randint(1, 6)] + [rng.randrange(5)] * rng.randint(0, 1)
            min_match, max_match = rng.randint(1, 2), rng.randint(2, 8)
            n, *where = levels.match_of(context, min_match, max_match)
            assert n == ref_match(kept, context, min_match, max_match)
            if n:
                for most_recent in (False, True):
                    max_tokens, min_prob = rng.randint(1, 8), rng.choice([0.0, 0.3])
                    got = levels.continuation(n, *where, max_tokens, min_prob, most_recent)
                    assert (got.tokens, got.probs) == ref_continuation(kept, context[-n:], max_tokens, min_prob,
                                                                       most_recent)
                    assert got.origin == "memory"
    with pytest.raises(ValueError, match=">= 0"):
        levels.add([[1, -2]])

    class OnGpu(torch.Tensor):  # what a GPU call's outputs do: numpy reads host memory only
        def numpy(self, *args, **kwargs):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu()")

        __array__ = numpy

        def cpu(self, *args, **kwargs):
            return self.as_subclass(torch.Tensor)

    gpu = SuffixArrayLevels(10)
    gpu.add([torch.tensor([4, 5, 6]).as_subclass(OnGpu)])  # raised TypeError at every call's end (a break-it finding)
    assert [d.tolist() for d in gpu.documents] == [[4, 5, 6]]
    # ties across levels go to the latest occurrence, counts add up across levels
    levels = SuffixArrayLevels(100)
    levels.add([[1, 3], [7] * 10])
    levels.add([[1, 5]])  # a level of its own: the older one holds more than MERGE_FACTOR times its tokens
    assert len(levels.levels) == 2
    assert levels.continuation(*levels.match_of([1], 1, 1), 1).tokens == [5]  # 3 and 5 once each: the later
    levels.add([[9, 1, 3]])
    assert levels.continuation(*levels.match_of([1], 1, 1), 1).probs == [2 / 3]  # 3 twice of three


def _call(drafter, target, prompt, k=3, new=12, **kw):
    ids = torch.tensor([prompt])
    return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                           custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter,
                           num_speculative_tokens=k, **kw)


def test_remembered_outputs_are_bounded_and_drafted_from(pair):
    """remember_outputs keeps the latest outputs up to the bound (oldest dropped), indexed as a fresh suffix array
    over exactly those would be; a second call with the same prompt drafts the first call's answer from memory."""
    target, _ = pair
    d = hf_spec.SuffixDrafter(4, remember_outputs=30, min_token_prob=0.0)
    plain = target.generate(torch.tensor([[5, 9, 2, 7]]), max_new_tokens=12, do_sample=False)
    first = _call(d, target, [5, 9, 2, 7])
    assert torch.equal(first.sequences, plain)
    assert d.memory.documents and d.memory.num_tokens <= 30
    second = _call(d, target, [5, 9, 2, 7])
    assert torch.equal(second.sequences, plain)
    # the answer is in memory: most of it arrives as accepted drafts
    assert second.stats.num_accepted_tokens > first.stats.num_accepted_tokens
    for seed in range(5):
        rng = random.Random(seed)
        outputs = [[rng.randrange(9) for _ in range(rng.randint(1, 14))] for _ in range(6)]
        d.finish([torch.tensor(o) for o in outputs])
        kept = [doc.tolist() for doc in d.memory.documents]
        assert sum(map(len, kept)) == d.memory.num_tokens <= 30
        assert kept[-1] == outputs[-1][-30:]  # the newest always stays
        for context in ([rng.randrange(9) for _ in range(rng.randint(1, 5))] for _ in range(20)):
            n, *where = d.memory.match_of(context, 1, 6)
            assert n == ref_match(kept, context, 1, 6)
            if n:
                got = d.memory.continuation(n, *where, 6)
                assert (got.tokens, got.probs) == ref_continuation(kept, context[-n:], 6, 0.0, False)


def test_a_proposal_names_the_source_its_match_is_in(pair):
    """propose() says where its match was found (Proposal.origin): the text, the corpus or past outputs; the
    hybrid drafter prices a match in the text apart from one in a corpus or past outputs."""
    target, _ = pair
    d = hf_spec.SuffixDrafter(4, corpus=[[20, 21, 22, 23, 24, 25]], remember_outputs=50, min_token_prob=0.0)
    d.memory.add([[10, 11, 12, 13, 14]])
    call = d.start(target, torch.tensor([[5, 9, 2, 5, 9]]), GenerationConfig(max_length=64))
    for seq, origin, tokens in (([5, 9, 2, 5, 9], "text", [2, 5, 9]), ([7, 20, 21, 22], "corpus", [23, 24, 25]),
                                ([7, 11, 12], "memory", [13, 14])):
        seq = torch.tensor(seq)
        call.prepare(target, seq[None])
        call.index([seq])
        p = call.propose(0, seq, 4)
        assert (p.origin, p.tokens[:len(tokens)]) == (origin, tokens)


def test_corpus_texts_tokens_and_bad_input(pair, monkeypatch):
    target, _ = pair
    prompt = [5, 9, 2, 7]
    plain = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    answer = plain[0, len(prompt):].tolist()
    # a corpus holding the answer after the prompt's end: drafted from it, output unchanged
    d = hf_spec.SuffixDrafter(4, corpus=[[20, 21] + prompt + answer])
    out = _call(d, target, prompt)
    assert torch.equal(out.sequences, plain)
    assert out.stats.num_accepted_tokens >= len(answer) - 4
    with pytest.raises(ValueError, match="tokenizer="):
        hf_spec.SuffixDrafter(corpus=["some text"])
    # floats (numpy's too) were truncated to ids, bytes, numeric strings and booleans converted
    for bad in ([object()], [[1.0, 2.0]], [torch.tensor([1.5, 2.0])], [np.array([1.5, 2.7], dtype=np.float32)],
                [b"hello"], [["12", "7"]], [[True, False]], [torch.tensor([True])], [5]):
        with pytest.raises(ValueError, match="not a text or a sequence of integer token ids"):
            hf_spec.SuffixDrafter(corpus=bad)
    for bad in (5, torch.tensor(5), b"ids"):
        with pytest.raises(ValueError, match="corpus must be a list of documents"):
            hf_spec.SuffixDrafter(corpus=bad)
    with pytest.raises(ValueError, match=r"lone surrogate \(\\ud83d\) at character 4"):
        hf_spec.SuffixDrafter(corpus=["abc \ud83d def"], tokenizer=lambda *a, **k: {"input_ids": [1]})
    # integer arrays of any kind are token ids
    assert len(hf_spec.SuffixDrafter(corpus=[np.array([3, 4], dtype=np.int32), (np.int64(5), 6)]).corpus) == 4
    with pytest.raises(ValueError, match="corpus is a mapping"):  # a tokenizer's output: iterating gives its keys
        hf_spec.SuffixDrafter(corpus={"input_ids": [[1, 2]], "attention_mask": [[1, 1]]})
    for bad in ([[1, -2]], [[2 ** 63]]):  # 2**63 overflowed the index's int64 with a bare OverflowError
        with pytest.raises(ValueError, match=">= 0"):
            hf_spec.SuffixDrafter(corpus=bad)
    with pytest.raises(ValueError, match="logit rows"):
        _call(hf_spec.SuffixDrafter(corpus=[[10**6]]), target, prompt)
    with pytest.raises(ValueError, match="min_match"):
        hf_spec.SuffixDrafter(min_match=0)
    with pytest.raises(ValueError, match="max_spec_factor"):
        hf_spec.SuffixDrafter(max_spec_factor=float("nan"))
    for bad in (-1, True):  # True was read as 1 token
        with pytest.raises(ValueError, match="remember_outputs"):
            hf_spec.SuffixDrafter(remember_outputs=bad)
    with pytest.raises(ValueError, match="min_match"):
        hf_spec.SuffixDrafter(max_match=True)
    # the hybrid's corpus is checked before its draft model loads (it was refused 18 s later)
    import hf_spec.drafters.registry as registry

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the corpus was checked")
    monkeypatch.setattr(registry, "make_drafter", no_model)
    with pytest.raises(ValueError, match="tokenizer="):
        hf_spec.HybridDrafter.from_spec("draft:smollm2-135m", corpus=["some text"])
    monkeypatch.undo()
    with pytest.raises(ValueError, match="does not draft from a corpus"):
        hf_spec.make_drafter("ngram", corpus=["x"])


def test_remembered_outputs_of_another_vocabulary_are_refused():
    """The corpus was checked against the target's vocabulary, past outputs were not: a drafter shared between
    targets failed later, blaming the draft."""
    from .conftest import tiny_llama

    big, small = tiny_llama(vocab_size=64, seed=1), tiny_llama(vocab_size=32)
    d = hf_spec.SuffixDrafter(3, remember_outputs=100, min_token_prob=0.0)
    _call(d, big, [40, 50, 60, 40, 50], min_new_tokens=12)
    assert d.memory.max_token() >= 32  # an output token the small target has no row for
    with pytest.raises(ValueError, match="remembers outputs with token ids up to .* one SuffixDrafter per target"):
        _call(d, small, [5, 9, 2, 7])


def test_corpus_texts_are_tokenized_with_the_tokenizer(tokenizer):
    text = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
    d = hf_spec.make_drafter("suffix", corpus=[text], tokenizer=tokenizer)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert d.corpus.text[:len(ids)].tolist() == ids
    assert len(d.corpus) == len(ids)


def old_prompt_lookup(seq, k, max_ngram, min_ngram):
    """The n-gram drafter before it read the suffix index: a rescan of the sequence per step."""
    length = len(seq)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = seq[length - n:]
        for start in range(length - n - 1, -1, -1):
            if seq[start:start + n] == suffix:
                follow = seq[start + n:start + n + k]
                if follow:
                    return follow
    return []


@pytest.mark.parametrize("seed", range(4))
def test_ngram_drafter_proposes_what_prompt_lookup_did(seed, pair):
    """NgramDrafter proposes the most recent occurrence's continuation, as the rescanning version did, except
    where that occurrence runs into the end of the text: then the index continues from an earlier occurrence
    of the longer pattern, so the old proposal is a prefix of the new one."""
    rng = random.Random(seed)
    seq = random_docs(rng, 1, 4)[0] * 2
    k, max_ngram = rng.randint(1, 6), rng.randint(1, 4)
    d = hf_spec.NgramDrafter(k, max_ngram=max_ngram).start(pair[0], torch.zeros(1, 1, dtype=torch.long), GenerationConfig())
    for i in range(2, len(seq) + 1):
        prefix = torch.tensor(seq[:i])
        tokens, num, _ = d.draft([prefix], k)
        new = tokens[0, :int(num[0])].tolist()
        old = old_prompt_lookup(seq[:i], k, max_ngram, 1)
        assert new[:len(old)] == old and (len(new) == len(old) or len(old) < k)


@pytest.mark.parametrize("make", [lambda k: hf_spec.NgramDrafter(k),
                                  lambda k: hf_spec.SuffixDrafter(k, max_spec_factor=math.inf)], ids=["ngram", "suffix"])
def test_a_huge_k_keeps_the_index_bounded_and_proposes_up_to_its_depth(make, pair):
    """A k of 10,000 (``prompt_lookup_num_tokens=10000``) had made the call's index k deep: a node per token and
    depth, millions on a few thousand tokens; the continuation indexed is capped at MAX_CONTINUATION tokens, and a
    proposal from a long repeat runs to it."""
    from hf_spec.drafters.suffix import MAX_CONTINUATION

    rng = random.Random(0)
    text = [rng.randrange(1, 100) for _ in range(300)]
    seq = torch.tensor(text + text[:5])  # the text, then its start again: 295 tokens follow the match
    d = make(10_000).start(pair[0], seq[None], GenerationConfig())
    tokens, num, _ = d.draft([seq], 10_000)
    assert d._trie.max_depth == d.max_match + MAX_CONTINUATION
    assert len(d._trie) <= len(seq) * d._trie.max_depth
    n = int(num[0])  # the depth left below the match (5 tokens, or max_ngram)
    assert MAX_CONTINUATION <= n < d._trie.max_depth and tokens[0, :n].tolist() == text[5:5 + n]


def test_hybrid_chooses_by_predicted_tokens_per_second(pair):
    """The hybrid drafter's choice per row: the source with the most expected tokens per second from measured
    acceptance and times, plain decoding (one token per forward) included."""
    target, draft = pair
    d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3)).start(target, torch.tensor([[5, 9, 2, 7]]),
                                                                          GenerationConfig(max_length=64))
    d._forward_s, d._model_s = {1: [0.1]}, [(0.15, 3, 3)]  # the model drafts 3 tokens in 0.15 s
    for _ in range(20):  # the model's drafts: 2 of 3 accepted; short suffix matches: rejected
        d._model_acceptance.add(3, 2)
        d._suffix_acceptance[0].add(4, 0)
        d._suffix_acceptance[3].add(4, 4)
    assert d.choose_source(4, match_length=1, k=3) == "model"
    assert d.choose_source(4, match_length=12, k=3) == "suffix"
    assert d.choose_source(0, match_length=1, k=3) == "model"
    # a catch-up (a draft model's prefill of a long prompt) that a few tokens left cannot repay: not the model
    assert d.choose_source(0, match_length=1, k=3, catch_up_s=5.0, remaining_tokens=8) == "none"
    assert d.choose_source(4, match_length=12, k=3, catch_up_s=5.0, remaining_tokens=8) == "suffix"
    assert d.choose_source(0, match_length=1, k=3, catch_up_s=5.0, remaining_tokens=10_000) == "model"
    # drafting is priced per token: after drafts at k = 8 (0.4 s), a draft at k = 1 costs 0.05 s, and at
    # 1.67 tokens per 0.15 s beats plain decoding's 1 per 0.1 s (charged 0.4 s it lost: 1.67 per 0.5 s)
    d._model_s = [(0.4, 8, 8)] * 5
    assert d.choose_source(0, match_length=1, k=1) == "model"
    # a draft that stops when unsure drafts a share of its k: asked for 8, it drafted 2 (0.1 s); at k = 8 the
    # model is priced 0.1 s (~3 tokens per 0.2 s beats plain's 1 per 0.1 s), not 8 tokens' 0.4 s (3 per 0.5 s)
    d._model_s = [(0.1, 8, 2)] * 5
    assert d.choose_source(0, match_length=1, k=8) == "model"
    d._model_s = [(0.4, 8, 8)] * 5
    assert d.choose_source(0, match_length=1, k=8) == "none"
    with pytest.raises(TypeError, match="model-based"):
        hf_spec.HybridDrafter(hf_spec.SuffixDrafter())


def test_hybrid_prices_each_choice_by_the_positions_it_verifies(pair):
    """Where verifying more positions costs more (float32 on a CPU), a 4-token suffix proposal from a 1-token
    match (first token accepted ~1 in 4) loses to a plain step, while a 2-token one, whose verify is priced on
    the line through the measured times, still pays; where positions are nearly free (native bfloat16) the
    4-token proposal wins. One median over every forward (0.13 s here) priced all choices alike and chose the
    4-token proposal in both."""
    target, draft = pair
    d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3)).start(target, torch.tensor([[5, 9, 2, 7]]),
                                                                          GenerationConfig(max_length=64))
    d._model_s = [(0.3, 3, 3)]  # a model whose drafting costs 3 target forwards: never the best here
    d._forward_s = {1: [0.1] * 3, 5: [0.16] * 3}  # a 5-position verify costs 1.6 plain steps
    assert d.choose_source(4, match_length=1, k=4) == "none"  # 1.51 tokens per 0.16 s < 1 per 0.1 s
    assert d.choose_source(2, match_length=1, k=4) == "suffix"  # 1.39 tokens per 0.13 s (interpolated)
    assert d.choose_source(4, match_length=12, k=4) == "suffix"
    d._forward_s = {1: [0.1] * 3, 5: [0.1] * 3}
    assert d.choose_source(4, match_length=1, k=4) == "suffix"
    # without the loop's positions, a report is filed under 1 + the longest row verified (a plain step: 1)
    d._forward_s, d._chosen = {}, [("suffix", 1, 4, "text")]
    d.update(VerifyOutput(step=1, num_drafted=torch.tensor([3]), num_accepted=torch.tensor([1]), seconds=0.2))
    d.update(VerifyOutput(step=2, num_drafted=torch.tensor([0]), num_accepted=torch.tensor([0]), seconds=0.1))
    assert d._forward_s == {4: [0.2], 1: [0.1]}


def test_the_loop_reports_the_positions_each_forward_scored(pair):
    """A draft can be wider than its longest row (the hybrid's model draft where that row took another source;
    rows cut at max_new_tokens): the forward then scores 1 + the width. Read as 1 + the longest row, adaptive k
    and the hybrid drafter filed a 4-position forward as a 2-position one. The loop now says how many positions
    each forward scored, to drafters (VerifyOutput.positions) and to listeners (StepEvent.positions)."""
    from hf_spec.adaptive import AdaptiveK
    from hf_spec.drafters.base import Drafter

    told = []

    class Wide(Drafter):  # every row drafts 3 tokens; the first keeps 1, the others none
        method = "wide"

        def draft(self, sequences, k):
            n, w = len(sequences), min(3, k)
            return torch.full((n, w), 3, dtype=torch.long), torch.tensor([1] + [0] * (n - 1)), None

        def update(self, verified):
            told.append(verified.positions)

    target, _ = pair
    events = []
    target.generate(torch.tensor([[5, 9, 2, 7], [5, 9, 2, 8]]), attention_mask=torch.ones(2, 4, dtype=torch.long),
                    custom_generate=hf_spec.generate, drafter=Wide(3), num_speculative_tokens=3, max_new_tokens=4,
                    min_new_tokens=4, do_sample=False, event_listeners=[events.append])
    steps = [e for e in events if e.step > 0]
    assert [e.positions for e in steps] == told[1:] and told[0] == 4  # the prefill: the prompt's 4 positions
    assert [e.positions for e in steps] == [1 + min(3, e.num_speculative_tokens) for e in steps]
    wide = next(e for e in steps if e.positions > 2)
    assert max(len(d) for d in wide.drafted) == 1
    controller = AdaptiveK()
    controller(wide)
    assert set(controller.t_verify) == {wide.positions}
    d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(pair[1], 6)).start(target, torch.tensor([[5, 9, 2, 7]]),
                                                                            GenerationConfig(max_length=64))
    d.update(VerifyOutput(step=1, num_drafted=torch.tensor([1, 0]), num_accepted=torch.tensor([1, 0]), seconds=0.5,
                          positions=7))
    assert d._forward_s == {7: [0.5]}
    # the prefill is priced per prompt token it ran over: 2 of the 4 when a cache passed in held the first 2
    d.update(VerifyOutput(step=0, num_drafted=torch.tensor([0]), num_accepted=torch.tensor([0]), seconds=0.5,
                          positions=2))
    assert d._prefill_s_per_token == 0.25


def test_a_model_draft_that_caught_up_counts_for_its_length_not_its_time(pair, monkeypatch):
    """The model's first draft also prefills the prompt into the draft model: its time is not what a draft
    costs (the catch-up is priced apart), but its length is what the model drafts. Counted for neither, the model
    stayed priced at a verify of k + 1 positions, the dearest, while suffix proposals were priced at theirs."""
    target, draft = pair
    prompt = torch.tensor([[5, 9, 2, 7] * 10])  # 40 tokens: more than k + 1 to catch up on at the first draft
    d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 6)).start(target, prompt, GenerationConfig(max_length=128))
    monkeypatch.setattr(d, "choose_source", lambda *args, **kwargs: "model")
    tokens, num, _ = d.draft([torch.cat([prompt[0], torch.tensor([3])])], 6)
    assert d._model_s == [(None, 6, tokens.shape[1])]
    d._model_s = [(None, 6, 2)]  # asked for 6, it stopped when unsure after 2
    d._forward_s = {1: [0.1], 3: [0.11], 5: [0.16], 7: [0.4]}
    d._model_acceptance.add(2, 2, 6)
    monkeypatch.undo()
    assert d.choose_source(4, match_length=1, k=6) == "model"  # 3 positions, 0.11 s; not 7 positions, 0.4 s


def test_hybrid_priors_follow_the_match_length(pair):
    """Before anything is measured, a suffix proposal is judged by its match length's prior (measured offline):
    a free proposal from a 1-token match (first token accepted ~1 in 4) loses to an unmeasured model, one from a
    12-token match wins; a verified suffix draft updates the counts of its own match-length bucket only. With one
    prior of 0.5 for every match the 1-token proposal won and was verified first (translation: 0 of 5)."""
    from hf_spec.drafters.hybrid import suffix_bucket

    assert [suffix_bucket(n) for n in (1, 2, 3, 4, 9, 10, 100)] == [0, 1, 1, 2, 2, 3, 3]
    target, draft = pair
    d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3)).start(target, torch.tensor([[5, 9, 2, 7]]),
                                                                          GenerationConfig(max_length=64))
    d._forward_s = {1: [0.1]}
    assert d.choose_source(4, match_length=1, k=3) == "model"
    assert d.choose_source(8, match_length=12, k=3) == "suffix"
    d._chosen = [("suffix", 12, 3, "text")]
    d.update(VerifyOutput(step=1, num_drafted=torch.tensor([8]), num_accepted=torch.tensor([0]), seconds=0.1))
    assert d._suffix_acceptance[3].reached[:1] == [1.0] and d._suffix_acceptance[3].accepted[:1] == [0.0]
    assert all(not a.reached for a in d._suffix_acceptance[:3])
    # a tree's drafted positions are its depth as verified, not its nodes: 8 nodes 2 deep, both levels accepted,
    # reach no third
    d._chosen = [("suffix", 12, 3, "text")]
    d.update(VerifyOutput(step=2, num_drafted=torch.tensor([8]), num_accepted=torch.tensor([2]), seconds=0.1,
                          depths=torch.tensor([2])))
    assert len(d._suffix_acceptance[3].reached) == 2
    # two rejected model drafts (asked for 6, stopped when unsure after 1 and 3 tokens) do not write the model
    # off: with a prior of one observation it fell under plain decoding (a translation prompt, where the model
    # alone went on to accept 9 of 20)
    d._model_s = [(0.02, 6, 1), (0.06, 6, 3)]
    d._model_acceptance.add(1, 0, 6)
    d._model_acceptance.add(3, 0, 6)
    assert d.choose_source(0, match_length=0, k=6) == "model"


def test_hybrid_prices_a_corpus_match_apart_from_one_in_the_text(pair):
    """A match in a corpus or past outputs predicts less than one of the same length in the text itself (2-3 tokens:
    the first token accepted 30% against 54%, measured leave one out on the target's answers): the hybrid prices it
    by CORPUS_PRIORS and learns from it in counts of its own. Priced as a text match, an 8-token proposal from a
    3-token corpus match beat an unmeasured model, and with a corpus the hybrid fell to 0.95 of its draft model."""
    from hf_spec.drafters.hybrid import CORPUS_PRIORS, PRIOR_WEIGHT, SUFFIX_PRIORS

    assert [len(b) for b in (CORPUS_PRIORS, SUFFIX_PRIORS)] == [4, 4]
    assert [b[0] for b in CORPUS_PRIORS] == [b[0] for b in SUFFIX_PRIORS]  # the same match-length buckets
    target, draft = pair
    d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3)).start(target, torch.tensor([[5, 9, 2, 7]]),
                                                                          GenerationConfig(max_length=64))
    d._forward_s = {1: [0.1]}
    assert d.choose_source(8, match_length=3, k=3) == "suffix"  # 1 + 0.5 + 0.5 * 0.7 + ... = 2.57 > 1.875
    assert d.choose_source(8, match_length=3, k=3, origin="corpus") == "model"  # 1 + 0.3 + 0.3 * 0.5 + ... = 1.6
    assert d.choose_source(8, match_length=3, k=3, origin="memory") == "model"
    assert d.choose_source(8, match_length=12, k=3, origin="corpus") == "suffix"
    d._chosen = [("suffix", 3, 3, "corpus")]
    d.update(VerifyOutput(step=1, num_drafted=torch.tensor([8]), num_accepted=torch.tensor([0]), seconds=0.1))
    assert d._corpus_acceptance[1].reached[:1] == [1.0] and d._corpus_acceptance[1].accepted[:1] == [0.0]
    assert all(not a.reached for a in d._suffix_acceptance)
    # the call's pooled factor compares the draft with its own origin's prior (0.3 expected, none accepted)
    assert d.suffix_prior_scale() == pytest.approx(PRIOR_WEIGHT / (0.3 + PRIOR_WEIGHT))


def test_the_hybrid_drafts_and_learns_a_corpus_proposal_as_one(pair):
    """Through the hybrid's own draft (chain and tree form): a row whose only match is in the corpus takes the
    corpus proposal, remembers its origin, and its verification lands in the corpus counts, not the text's."""
    target, draft = pair
    corpus = list(range(10, 31))
    seq = torch.tensor([5] + list(range(10, 22)))  # its last 12 tokens are in the corpus, nothing repeats in the text
    for num_nodes in (0, 8):
        d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3), hf_spec.SuffixDrafter(corpus=[corpus])).start(
            target, seq[None], GenerationConfig(max_length=64))
        d._forward_s = {1: [0.1]}
        tokens, num, *_ = d.draft_tree([seq], 3, num_nodes) if num_nodes else d.draft([seq], 3)
        assert tokens[0, :int(num[0])].tolist() == [22, 23, 24] and d.last_sources == ["suffix"]
        assert d._chosen == [("suffix", 12, 3, "corpus")]
        d.update(VerifyOutput(step=1, num_drafted=num, num_accepted=torch.tensor([2]), seconds=0.1))
        assert d._corpus_acceptance[3].reached[:3] == [1.0, 1.0, 1.0] and d._corpus_acceptance[3].accepted[:2] == [1.0, 1.0]
        assert all(not a.reached for a in d._suffix_acceptance)


def test_hybrid_lowers_every_suffix_prior_when_its_drafts_are_accepted_less_than_the_priors_expect(pair):
    """Sampling accepts a one-hot suffix token with the target's probability of it, under the greedy priors: three
    long-match proposals rejected at their first token lower every suffix prior (pooled over the buckets), so a
    long match no longer beats a model whose drafts are accepted. Without the pooled factor the bucket's later
    positions, never reached, kept their prior of 0.85 and the proposal still won. A call whose suffix drafts
    do better than the priors leaves them as they are (the factor is at most 1)."""
    target, draft = pair
    d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 6)).start(target, torch.tensor([[5, 9, 2, 7]]),
                                                                          GenerationConfig(max_length=512))
    d._forward_s, d._model_s = {1: [0.2]}, [(0.1, 6, 4)]  # the model drafts 4 of the 6 asked in half a forward
    for _ in range(6):
        d._model_acceptance.add(4, 2, 6)
    assert d.choose_source(6, match_length=12, k=6) == "suffix"
    assert d.suffix_prior_scale() == 1.0
    for step in range(1, 4):
        d._chosen = [("suffix", 12, 6, "text")]
        d.update(VerifyOutput(step=step, num_drafted=torch.tensor([6]), num_accepted=torch.tensor([0]), seconds=0.2))
    assert d.suffix_prior_scale() < 0.65
    assert d.choose_source(6, match_length=12, k=6) == "model"
    scale = d.suffix_prior_scale()
    for step in range(4, 40):  # steps without a suffix draft: the call's factor stays, the bucket's counts fade
        d._chosen = [("model", 0, 6, "text")]
        d.update(VerifyOutput(step=step, num_drafted=torch.tensor([4]), num_accepted=torch.tensor([2]), seconds=0.2))
    assert d.suffix_prior_scale() == scale and d._suffix_acceptance[3].reached[0] < 0.1
    for step in range(40, 56):  # then suffix drafts accepted in full: the factor climbs back, never above 1
        d._chosen = [("suffix", 12, 6, "text")]
        d.update(VerifyOutput(step=step, num_drafted=torch.tensor([6]), num_accepted=torch.tensor([6]), seconds=0.2))
    assert d.suffix_prior_scale() == 1.0
    assert d.choose_source(6, match_length=12, k=6) == "suffix"


def test_hybrid_tries_again_a_source_it_stopped_choosing(pair):
    """A source written off on a few drafts is measured again: the counts of a kind of draft not verified in a
    step decay as if observed, so its estimate drifts back to the prior (a coding prompt measured the draft
    model at 1 of 5 on its first 3 drafts, then never chose it again while suffix drafts were accepted 12%)."""
    target, draft = pair
    d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3)).start(target, torch.tensor([[5, 9, 2, 7]]),
                                                                          GenerationConfig(max_length=512))
    d._forward_s, d._model_s = {1: [0.1]}, [(0.03, 3, 3)]  # drafting 3 tokens costs 0.3 of a target forward
    for a in (0, 1, 0):  # the model's first drafts: 1 of 3 tokens accepted, then nothing
        d._model_acceptance.add(3, a, 3)
    for _ in range(4):
        d._suffix_acceptance[0].add(4, 0)
    d._suffix_acceptance[0].add(4, 2)
    assert d.choose_source(4, match_length=1, k=3) == "suffix"
    steps = []
    for step in range(1, 60):  # suffix drafts accepted 1 in 8 steps, as long as the suffix is chosen
        if d.choose_source(4, match_length=1, k=3) != "suffix":
            break
        d._chosen = [("suffix", 1, 3, "text")]
        d.update(VerifyOutput(step=step, num_drafted=torch.tensor([4]), num_accepted=torch.tensor([int(step % 8 == 0)]),
                              seconds=0.1))
        steps.append(step)
    assert len(steps) < 59, "the model was never tried again"
    assert d.choose_source(4, match_length=1, k=3) == "model"


def test_hybrid_keeps_pricing_a_source_at_what_it_measured_while_another_is_chosen(pair):
    """A source that did better than its prior fades back to what this call measured for it, not to the prior: a
    draft model accepted 5 of 6 tokens a draft, then unchosen for 40 steps while suffix drafts run, is still priced
    near what it did (fading to the prior 0.5 priced it at 1.875 tokens a step for k = 3, and a 1-token suffix
    match then beat it); one written off below its prior still drifts up to the prior (the test above)."""
    target, draft = pair
    d = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3)).start(target, torch.tensor([[5, 9, 2, 7]]),
                                                                          GenerationConfig(max_length=512))
    d._forward_s, d._model_s = {1: [0.1], 4: [0.1]}, [(0.03, 3, 3)]
    d._model_acceptance.add(3, 3, 3)  # one draft counts once: (1 accepted + 3 x 0.5) / (1 + 3) at its first position
    assert d._model_acceptance.expected_tokens(1) == pytest.approx(1 + 2.5 / 4)
    for a in (2, 3, 3, 3, 2):
        d._model_acceptance.add(3, a, 3)
    measured = d._model_acceptance.expected_tokens(3)
    for step in range(1, 41):
        d._chosen = [("suffix", 1, 3, "text")]
        d.update(VerifyOutput(step=step, num_drafted=torch.tensor([4]), num_accepted=torch.tensor([1]), seconds=0.1))
    assert d._model_acceptance.reached[0] < 0.1  # the recent counts have faded away
    faded = d._model_acceptance.expected_tokens(3)
    # at least what it measured (a later position that did worse than the one before fades to that prior), where
    # the prior alone gives 1 + 0.5 + 0.25 + 0.125 = 1.875
    assert faded >= measured - 1e-9 and faded > 2.6
    assert d.choose_source(4, match_length=1, k=3) == "model"


def _suffix_steps_until_the_model_is_tried_again(session) -> int:
    """Steps of 1-token suffix matches (a quarter of their drafts accepting one token) a session takes after its
    model's first 3 drafts of the call failed, until it chooses the model again (60: never)."""
    session._forward_s, session._model_s = {1: [0.1], 4: [0.1], 5: [0.1]}, [(0.03, 3, 3)]
    for step in range(1, 4):
        session._chosen = [("model", 0, 3, "text")]
        session.update(VerifyOutput(step=step, num_drafted=torch.tensor([3]), num_accepted=torch.tensor([0]),
                                    seconds=0.1))
    for step in range(4, 64):
        if session.choose_source(4, match_length=1, k=3) != "suffix":
            return step - 4
        session._chosen = [("suffix", 1, 3, "text")]
        session.update(VerifyOutput(step=step, num_drafted=torch.tensor([4]),
                                    num_accepted=torch.tensor([int(step % 4 == 0)]), seconds=0.1))
    return 60


def test_hybrid_carries_what_its_suffix_drafts_showed_from_call_to_call(pair):
    """The suffix priors (measured on greedy outputs) promise too much under sampling; a call learned that
    afresh each time (RAG under sampling: its failed suffix drafts came in the first 15 steps, at a scale of 1).
    A new call's scale starts where the drafter's earlier calls of the same kind (greedy or sampled) left it."""
    target, draft = pair
    prompt = torch.tensor([[5, 9, 2, 7]])
    used = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3))
    sampled = GenerationConfig(max_length=512, do_sample=True)
    earlier = used.start(target, prompt, sampled)
    assert earlier.suffix_prior_scale() == 1.0
    for step in range(1, 11):  # a sampled call: 2-token suffix matches, 1 token in 10 drafts accepted
        earlier._chosen = [("suffix", 2, 3, "text")]
        earlier.update(VerifyOutput(step=step, num_drafted=torch.tensor([4]),
                                    num_accepted=torch.tensor([int(step == 5)]), seconds=0.1))
    carried = used.suffix_history_scale(do_sample=True)
    assert carried < 0.5 and used.suffix_history_scale(do_sample=False) == 1.0  # greedy calls: nothing learned
    session = used.start(target, prompt, sampled)
    assert session.suffix_prior_scale() == pytest.approx(carried)
    assert used.start(target, prompt, GenerationConfig(max_length=512)).suffix_prior_scale() == 1.0
    # a call's own drafts still move it: a run of accepted drafts takes it back up
    for step in range(1, 11):
        session._chosen = [("suffix", 2, 3, "text")]
        session.update(VerifyOutput(step=step, num_drafted=torch.tensor([4]), num_accepted=torch.tensor([4]),
                                    seconds=0.1))
    assert session.suffix_prior_scale() > carried


def test_hybrid_carries_its_model_drafts_acceptance_from_call_to_call(pair):
    """A drafter's model keeps its acceptance from call to call: after a call whose model drafts were accepted,
    the next call's model prior is what they showed, not 0.5, and a model whose first drafts of a call fail is
    tried again sooner than by a drafter that never ran (a sampled coding prompt: 3 failed model drafts, then 73
    suffix drafts at 7%). Calls share the history through the drafter, not through one session."""
    from hf_spec.drafters.hybrid import MODEL_PRIOR

    target, draft = pair
    prompt = torch.tensor([[5, 9, 2, 7]])
    fresh = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3))
    used = hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3))
    assert used.model_prior() == MODEL_PRIOR
    earlier = used.start(target, prompt, GenerationConfig(max_length=512))
    for step in range(1, 31):  # an earlier call: 4 in 5 model drafts accepted at their first token
        earlier._chosen = [("model", 0, 3, "text")]
        earlier.update(VerifyOutput(step=step, num_drafted=torch.tensor([3]),
                                    num_accepted=torch.tensor([3 if step % 5 else 0]), seconds=0.1))
    assert 0.7 < used.model_prior() < 0.8 and fresh.model_prior() == MODEL_PRIOR
    assert used.model_prior(do_sample=True) == MODEL_PRIOR  # greedy calls' acceptance is not a sampled call's prior
    session = used.start(target, prompt, GenerationConfig(max_length=512))
    assert session._model_acceptance.first == pytest.approx(used.model_prior())
    before = _suffix_steps_until_the_model_is_tried_again(fresh.start(target, prompt, GenerationConfig(max_length=512)))
    after = _suffix_steps_until_the_model_is_tried_again(session)
    assert after < before, (after, before)
