"""Draft trees through the loop (issue 22): a drafter that returns parents gets its tree verified in one forward;
greedy output stays the target's own (tiny models, a left-padded batch, the real SmolLM2), sampled output keeps
the target's distribution (chi-square; a wrong sibling rule fails it), statistics count a tree's depth."""

import pytest
import torch
from transformers import GenerationConfig, StoppingCriteriaList
from transformers.generation import MaxLengthCriteria

import hf_spec
import hf_spec.loop
from hf_spec.drafters.base import Drafter

from .conftest import tiny_pair
from .test_sampling_exact import ALPHA, N_RUNS, NEW, PROMPT, exact_distribution, pair, processors, pvalue  # noqa: F401
from .test_tree_acceptance import wrong_sibling_rule


class ModelTreeDrafter(Drafter):
    """A test drafter: a small model's tree, ``width`` children of the root and ``width`` of each of them, then
    chains to depth k. Greedy: each node's siblings are the model's top tokens (deterministic); sampling: drawn
    i.i.d. from the model's processed distribution (repeats allowed), returned as scores. No cache: each node's
    distribution comes from a forward over its whole prefix (tiny models only)."""

    method = "model-tree"
    returns_scores = True

    def __init__(self, model, k=3, width=2):
        super().__init__(k)
        self.model, self.width = model, width

    @torch.no_grad()
    def _scores(self, prefixes: list[torch.Tensor]) -> torch.Tensor:
        """``[B, V]``: the processed next-token scores after each prefix (rows of equal length in one forward)."""
        out = [None] * len(prefixes)
        for n in {len(p) for p in prefixes}:
            rows = [b for b, p in enumerate(prefixes) if len(p) == n]
            ids = torch.stack([prefixes[b] for b in rows])
            scores = self.logits_processor(ids, self.model(input_ids=ids).logits[:, -1].float())
            for i, b in enumerate(rows):
                out[b] = scores[i]
        return torch.stack(out)

    def draft(self, sequences, k):
        sampling = bool(self.generation_config.do_sample)
        parents, frontier = [], [-1]  # the tree's shape, the same in every row
        for depth in range(k):
            nxt = []
            for parent in frontier:
                for _ in range(self.width if depth < 2 else 1):
                    parents.append(parent)
                    nxt.append(len(parents) - 1)
            frontier = nxt
        bsz, n = len(sequences), len(parents)
        tokens = torch.zeros(bsz, n, dtype=torch.long)
        scores = None
        for parent in [-1] + list(range(n)):
            children = [j for j, p in enumerate(parents) if p == parent]
            if not children:
                continue
            paths = []
            for b in range(bsz):
                path, node = [], parent
                while node >= 0:
                    path.append(int(tokens[b, node]))
                    node = parents[node]
                paths.append(torch.cat([sequences[b], sequences[b].new_tensor(path[::-1])]))
            at = self._scores(paths)  # [B, V]
            if scores is None:
                scores = torch.zeros(bsz, n, at.shape[-1])
            picked = (torch.multinomial(at.softmax(-1), len(children), replacement=True) if sampling
                      else at.topk(len(children)).indices)
            for i, j in enumerate(children):
                tokens[:, j], scores[:, j] = picked[:, i], at
        return (tokens, torch.full((bsz,), n), scores if sampling else None,
                torch.tensor(parents).expand(bsz, n).clone())


def noisy_pair(noise=0.2):
    """tiny_pair's target with a draft perturbed by ``noise`` of each matrix's spread: its top token is often
    wrong and its second often right, where a tree pays."""
    target, draft = tiny_pair()
    torch.manual_seed(2)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() > 1:
                p.add_(noise * p.std() * torch.randn_like(p))
    return target, draft


def _took_a_later_sibling(tokens, parents, accepted) -> bool:
    """Whether the accepted tokens walk the tree through a node that is not its parent's first child."""
    node = -1
    for t in accepted:
        children = [j for j, p in enumerate(parents) if p == node]
        node = next(j for j in children if tokens[j] == t)
        if node != children[0]:
            return True
    return False


#: one prompt, and a left-padded batch of two
INPUTS = (dict(input_ids=torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7]])),
          dict(input_ids=torch.tensor([[1, 1, 0, 5, 9, 5, 3, 7], [0, 7, 3, 7, 3, 2, 4, 6]]),
               attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])))


def test_tree_greedy_is_the_targets_own_output_single_and_batched():
    target, draft = noisy_pair()
    for inputs in INPUTS:
        ref = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        events = []
        out = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False, custom_generate=hf_spec.generate,
                              return_dict_in_generate=True, drafter=ModelTreeDrafter(draft, 3),
                              event_listeners=[events.append])
        assert out.sequences.tolist() == ref.tolist()
        steps = [e for e in events[1:] if e.parents]
        assert steps and all(len(p) <= 10 for e in steps for p in e.parents)  # 2 + 4 + 4 nodes at k = 3
        # the tree paid where a chain would not: some step accepted a node that is not its parent's first child
        assert any(_took_a_later_sibling(e.drafted[i], e.parents[i], e.emitted[i][:e.num_accepted[i]])
                   for e in steps for i in range(len(e.emitted)))
        # each event names its accepted nodes: a root path whose tokens are the emitted ones
        for e in events[1:]:
            for i, path in enumerate(e.accepted_path):
                parents = e.parents[i] if e.parents else list(range(-1, len(e.drafted[i]) - 1))
                assert [parents[j] for j in path] == ([-1] + path)[:len(path)]
                assert [e.drafted[i][j] for j in path] == e.emitted[i][:len(path)]
                assert len(path) == e.num_accepted[i] + (len(path) == len(e.emitted[i]))
        stats = out.stats
        assert stats.num_accepted_tokens > 0 and len(stats.drafted_per_position) == 3
        assert stats.num_target_forwards < stats.num_emitted_tokens
        # the positions verified per step are the tree's nodes plus one (what a --tree auto bench reports)
        assert stats.positions_per_step == [e.positions for e in events[1:]]
        assert all(p == max(map(len, e.drafted)) + 1 for p, e in zip(stats.positions_per_step, events[1:]))


def test_draft_model_tree_greedy_is_exact():
    """DraftModelDrafter's tree (its chain with siblings): greedy output is the target's own, single and in a
    left-padded batch, at several tree sizes (fewer nodes than k among them), and with a repetition penalty; the
    tree took later siblings and needed fewer target forwards than the chain in the batch."""
    target, draft = noisy_pair()
    for inputs in INPUTS:
        ref = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        runs = {}
        for nodes in (0, 1, 3, 8, 20):
            events = []
            out = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                  custom_generate=hf_spec.generate, return_dict_in_generate=True,
                                  drafter=hf_spec.DraftModelDrafter(draft, 3), num_tree_nodes=nodes,
                                  event_listeners=[events.append])
            assert out.sequences.tolist() == ref.tolist(), nodes
            assert all(len(p) <= max(nodes, 3) for e in events[1:] if e.parents for p in e.parents)
            runs[nodes] = out.stats
        assert any(_took_a_later_sibling(e.drafted[i], e.parents[i], e.emitted[i][:e.num_accepted[i]])
                   for e in events[1:] if e.parents for i in range(len(e.emitted)))
    assert runs[20].num_target_forwards < runs[0].num_target_forwards  # the batch
    # a processor that reads the sequence (repetition penalty): each level's prefix is the chain so far
    for inputs in INPUTS:
        kwargs = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, repetition_penalty=1.5)
        ref = target.generate(**inputs, **kwargs)
        out = target.generate(**inputs, **kwargs, custom_generate=hf_spec.generate,
                              drafter=hf_spec.DraftModelDrafter(draft, 3), num_tree_nodes=8)
        assert out.tolist() == ref.tolist()


class SuffixFirstHybrid(hf_spec.HybridDrafter):
    """The hybrid drafter with its choice fixed, so that a test sees both sources in one batch: the suffix
    proposal wherever there is one, else the model's."""

    def choose_source(self, proposal_length, match_length, k, catch_up_s=0.0, remaining_tokens=None, origin="text"):
        return "suffix" if proposal_length else "model"


class ModelFirstHybrid(hf_spec.HybridDrafter):
    """The hybrid drafter with its choice fixed to the model, so that every row with a suffix match long enough
    drafts the merged tree (the model's with the suffix proposal folded in)."""

    def choose_source(self, proposal_length, match_length, k, catch_up_s=0.0, remaining_tokens=None, origin="text"):
        return "model"


class SampledModelTrees(ModelTreeDrafter):
    """:class:`ModelTreeDrafter` as a tree drafter (``draft_tree``): nodes sampled i.i.d. with their q."""

    drafts_trees = True

    def draft_tree(self, sequences, k, num_nodes):
        return self.draft(sequences, k)


def test_hybrid_tree_greedy_is_exact_with_both_sources_in_a_batch():
    """HybridDrafter with num_tree_nodes: each row drafts its source's tree (the suffix drafter's speculation tree
    or the draft model's), rows of both sources in one batch; greedy output is the target's own, single and
    batched, and the hybrid's acceptance statistics count a tree's depth, not its nodes."""
    target, draft = noisy_pair()
    for inputs in INPUTS:
        ref = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        for nodes in (4, 8):
            events = []
            drafter = SuffixFirstHybrid(hf_spec.DraftModelDrafter(draft, 3))
            out = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                  custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter,
                                  num_tree_nodes=nodes, event_listeners=[events.append])
            assert out.sequences.tolist() == ref.tolist(), nodes
            steps = [e for e in events[1:] if e.parents]
            sources = {s for e in steps for s in e.sources}
            assert {"suffix", "draft"} <= sources, sources
            # a model row's tree branches (siblings beside its chain) at some step
            assert any(len(set(p[:n])) < n for e in steps for p, n, s in zip(e.parents, map(len, e.drafted),
                                                                             e.sources) if s == "draft" and n > 1)
            assert all(len(p) <= nodes for e in steps for p in e.parents)
            assert out.stats.per_source["suffix"]["drafts"] and out.stats.per_source["draft"]["drafts"]
    # a model drafter whose draft() returns a tree (the Drafter interface allows it) in a chain call: every row
    # drafts a tree, suffix rows as chains in it (it crashed unpacking three values)
    for inputs in INPUTS:
        ref = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        events = []
        out = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                              custom_generate=hf_spec.generate, event_listeners=[events.append],
                              drafter=SuffixFirstHybrid(ModelTreeDrafter(draft, 3)))
        assert out.tolist() == ref.tolist()
        assert {"suffix", "model-tree"} <= {s for e in events[1:] for s in e.sources or ()}
        assert any(e.parents for e in events[1:] if "model-tree" in (e.sources or ()))
    # a plain HybridDrafter (its own choice) drafts trees too, and a batch's rows leave it exact
    ref = target.generate(**INPUTS[1], max_new_tokens=24, min_new_tokens=24, do_sample=False)
    out = target.generate(**INPUTS[1], max_new_tokens=24, min_new_tokens=24, do_sample=False,
                          custom_generate=hf_spec.generate, num_tree_nodes=6,
                          drafter=hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 3)))
    assert out.tolist() == ref.tolist()


def test_merge_into_tree_shares_the_common_prefix_and_appends_the_rest():
    """merge_into_tree against its definition: the chain's longest prefix that is a root path of the tree is
    shared, the rest hangs below it in order; the tree's own nodes stay first and unchanged; every root path of
    either input is one of the result; a chain already in the tree adds nothing."""
    from hf_spec.drafters.hybrid import merge_into_tree

    tokens, parents = [5, 6, 7, 8], [-1, -1, 0, 2]  # 5 -> 7 -> 8 and 6
    assert merge_into_tree(tokens, parents, [5, 7, 9, 4]) == ([5, 6, 7, 8, 9, 4], [-1, -1, 0, 2, 2, 4])
    assert merge_into_tree(tokens, parents, [6, 6]) == ([5, 6, 7, 8, 6], [-1, -1, 0, 2, 1])
    assert merge_into_tree(tokens, parents, [3]) == ([5, 6, 7, 8, 3], [-1, -1, 0, 2, -1])
    assert merge_into_tree(tokens, parents, [5, 7, 8]) == (tokens, parents)
    assert merge_into_tree([], [], [1, 1]) == ([1, 1], [-1, 0])

    def paths(t, p):
        out = set()
        for j in range(len(t)):
            path, node = [], j
            while node >= 0:
                path.append(t[node])
                node = p[node]
            out.add(tuple(path[::-1]))
        return out

    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(0, 8, (1,), generator=gen))
        t = torch.randint(0, 3, (n,), generator=gen).tolist()
        p = [int(torch.randint(-1, j, (1,), generator=gen)) for j in range(n)]  # a parent before its child
        chain = torch.randint(0, 3, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
        mt, mp = merge_into_tree(t, p, chain)
        assert mt[:n] == t and mp[:n] == p and all(mp[j] < j for j in range(len(mp)))
        assert paths(mt, mp) == paths(t, p) | {tuple(chain[:i]) for i in range(1, len(chain) + 1)}
        added = list(zip(mp[n:], mt[n:]))
        assert len(added) == len(set(added)) and not set(added) & set(zip(p, t))


def test_hybrid_merged_tree_is_exact_and_its_suffix_branch_is_taken(monkeypatch):
    """A model row with a suffix match drafts the model's tree with the suffix proposal folded in: greedy output
    stays the target's own (single and a left-padded batch), no tree passes num_tree_nodes, the rows read
    "draft+suffix", and with a corpus holding the target's own answer the suffix branch is taken: more tokens
    accepted than the same hybrid without the merge."""
    import hf_spec.drafters.hybrid as hybrid

    target, draft = noisy_pair()
    for inputs in INPUTS:
        ref = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        corpus = [row.tolist() for row in ref]  # the answers themselves: every suffix proposal is right

        def run():
            events = []
            drafter = ModelFirstHybrid(hf_spec.DraftModelDrafter(draft, 3),
                                       hf_spec.SuffixDrafter(corpus=corpus, min_match=2))
            out = target.generate(**inputs, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                                  custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter,
                                  num_tree_nodes=8, event_listeners=[events.append])
            assert out.sequences.tolist() == ref.tolist()
            assert all(len(p) <= 8 for e in events[1:] if e.parents for p in e.parents)
            return out.stats, {s for e in events[1:] if e.sources for s in e.sources}

        merged, sources = run()
        assert "draft+suffix" in sources, sources
        monkeypatch.setattr(hybrid, "MERGE_MIN_MATCH", 10**9)
        alone, sources = run()
        monkeypatch.undo()
        assert "draft+suffix" not in sources
        assert merged.num_accepted_tokens > alone.num_accepted_tokens, (merged.num_accepted_tokens,
                                                                        alone.num_accepted_tokens)
    # a batch whose rows take different sources in one step: merged model rows beside suffix-only rows
    events = []
    ref = target.generate(**INPUTS[1], max_new_tokens=24, min_new_tokens=24, do_sample=False)
    drafter = RowParityHybrid(hf_spec.DraftModelDrafter(draft, 3),
                              hf_spec.SuffixDrafter(corpus=[row.tolist() for row in ref]))
    out = target.generate(**INPUTS[1], max_new_tokens=24, min_new_tokens=24, do_sample=False,
                          custom_generate=hf_spec.generate, drafter=drafter, num_tree_nodes=8,
                          event_listeners=[events.append])
    assert out.tolist() == ref.tolist()
    assert any({"draft+suffix", "suffix"} <= set(e.sources) for e in events[1:] if e.sources), \
        [e.sources for e in events[1:]]


class RowParityHybrid(hf_spec.HybridDrafter):
    """The hybrid drafter with its choice fixed by the row (it is asked row by row): the model in even rows (with
    the suffix chain folded in where the match is long enough), the suffix proposal alone in odd rows."""

    calls = 0

    def choose_source(self, proposal_length, match_length, k, catch_up_s=0.0, remaining_tokens=None, origin="text"):
        self.calls += 1
        return "suffix" if proposal_length and self.calls % 2 == 0 else "model"


def test_hybrid_holds_back_no_nodes_for_a_model_whose_tree_nodes_are_sampled():
    """A model drafter whose tree comes with scores (sampled nodes) gets nothing folded in; after its first such
    tree the hybrid asks it for the whole num_tree_nodes again."""
    target, draft = noisy_pair()
    asked = []

    class Recording(SampledModelTrees):
        def draft_tree(self, sequences, k, num_nodes):
            asked.append(num_nodes)
            return super().draft_tree(sequences, k, num_nodes)

    vocab = target.config.vocab_size  # after the prompt's last token (7) any first token starts a 2-token match
    drafter = ModelFirstHybrid(Recording(draft, 2), hf_spec.SuffixDrafter(corpus=[[7, t, t, t] for t in range(vocab)]))
    torch.manual_seed(0)
    out = target.generate(**INPUTS[0], max_new_tokens=16, min_new_tokens=16, do_sample=True,
                          custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter,
                          num_tree_nodes=6)
    assert "draft+suffix" not in out.stats.per_source
    assert len(asked) > 2 and asked[0] < 6 and set(asked[1:]) == {6}, asked


@pytest.mark.parametrize("nodes", [6, 0], ids=["tree", "chain"])
def test_sampled_drafts_process_positions_lazily_on_a_cpu_with_the_same_output(monkeypatch, nodes):
    """On a CPU the loop processes a sampled tree's or chain's positions as the rejection walk reads them
    (hf_spec.acceptance.LAZY_DEVICES); seeded, every sample equals the one of processing all positions at once
    (the form on other devices), with a processor that reads the sequence (repetition penalty) and top-p, single
    and in a left-padded batch."""
    target, draft = noisy_pair()
    settings = dict(max_new_tokens=20, min_new_tokens=20, do_sample=True, temperature=0.8, top_k=6, top_p=0.9,
                    repetition_penalty=1.2, custom_generate=hf_spec.generate, num_tree_nodes=nodes)
    for inputs in INPUTS:
        outs = []
        for lazy in (("cpu",), ()):
            monkeypatch.setattr(hf_spec.loop, "LAZY_DEVICES", lazy)
            for seed in range(3):
                torch.manual_seed(seed)
                outs.append(target.generate(**inputs, drafter=hf_spec.DraftModelDrafter(draft, 3), **settings).tolist())
        assert outs[:3] == outs[3:]
        assert len({str(o) for o in outs[:3]}) > 1  # the seeds sample different texts


class WrongForRowZero(ModelTreeDrafter):
    """The model's tree, with every token of batch row 0 (left-padded) replaced by another: row 1 (unpadded, its
    positions as long as its length) advances k + 1 tokens a step, row 0 one, so near max_length their budgets
    differ by more than one."""

    def draft(self, sequences, k):
        tokens, num_drafted, scores, parents = super().draft(sequences, k)
        for b, seq in enumerate(sequences):
            if seq[:2].tolist() == [0, 5]:  # row 0's prompt (INPUTS[1]), wherever it sits after row 1 finished
                tokens[b] = (tokens[b] + 1) % self.model.config.vocab_size
        return tokens, num_drafted, scores, parents


def test_no_row_of_a_batchs_tree_reaches_past_max_length():
    """Rows of a batch that reach max_length at different steps: no row's tree node may sit past it (a chain's
    tokens past a row's budget are masked filler; a tree's nodes, not a prefix, are dropped). A GPT-2 target has
    no position embedding there (n_positions = max_length), and plain decoding never goes there; the output
    stays the target's own."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    common = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=32, initializer_range=0.3, bos_token_id=0,
                  eos_token_id=None, pad_token_id=1)  # wide weights: a tiny GPT-2 that does not repeat one token
    inputs, new = INPUTS[1], 14
    target = GPT2LMHeadModel(GPT2Config(n_positions=inputs["input_ids"].shape[1] + new, **common)).eval()
    draft = GPT2LMHeadModel(GPT2Config(n_positions=64, **common)).eval()  # the target, looking further ahead
    weights = target.state_dict()
    weights["transformer.wpe.weight"] = torch.cat([weights["transformer.wpe.weight"], torch.zeros(64 - 22, 32)])
    draft.load_state_dict(weights)
    highest = []
    target.transformer.wpe.register_forward_pre_hook(lambda m, args: highest.append(int(args[0].max())))
    ref = target.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    highest.clear()
    events = []
    drafter = ToldDepths(draft, 4)
    out = target.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                          custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=drafter, event_listeners=[events.append])
    assert out.sequences.tolist() == ref.tolist()
    assert max(highest) < 22
    assert [len(row) for row in events[2].emitted] == [1, 5]  # the rows drift apart as meant
    # the drafter is told each row's depth as verified: its tree's, cut at the row's budget
    assert drafter.told == drafter.expected
    assert any(told != drafted for told, drafted in zip(drafter.told, drafter.drafted))  # some tree was cut


class ToldDepths(WrongForRowZero):
    """Records, per step, its trees' depths and the depths the loop tells it were verified
    (:attr:`VerifyOutput.depths`), beside the depths expected: each tree's, cut at the row's budget (max_length
    - 1 - the row's padded length; row 0 of INPUTS[1] has 2 pads)."""

    def start(self, target, input_ids, generation_config, *args, **kwargs):
        self.told, self.drafted, self.expected, self._pending = [], [], [], None
        return super().start(target, input_ids, generation_config, *args, **kwargs)

    def draft(self, sequences, k):
        from hf_spec.acceptance import tree_depths

        tokens, num_drafted, scores, parents = super().draft(sequences, k)
        depths = tree_depths(parents, num_drafted).amax(dim=1).tolist()
        max_length = self.generation_config.max_length
        budgets = [max_length - 1 - len(s) - (2 if s[:2].tolist() == [0, 5] else 0) for s in sequences]
        self._pending = (depths, [min(d, b) for d, b in zip(depths, budgets)])
        return tokens, num_drafted, scores, parents

    def update(self, verified):
        super().update(verified)
        if verified.step and self._pending is not None:
            self.drafted.append(self._pending[0])
            self.expected.append(self._pending[1])
            self.told.append(verified.depths.tolist())
            self._pending = None


class WrongDraftForRowZero(hf_spec.DraftModelDrafter):
    """A draft model whose row-0 proposals are all wrong (the row lags), chain or tree."""

    def _wrong(self, sequences, tokens):
        for b, seq in enumerate(sequences):
            if seq[:2].tolist() == [0, 5]:  # row 0's prompt (INPUTS[1])
                tokens[b] = (tokens[b] + 1) % self.draft_model.config.vocab_size
        return tokens

    def draft(self, sequences, k):
        tokens, num_drafted, scores = super().draft(sequences, k)
        return self._wrong(sequences, tokens), num_drafted, scores

    def draft_tree(self, sequences, k, num_nodes):
        tokens, num_drafted, scores, parents = super().draft_tree(sequences, k, num_nodes)
        return self._wrong(sequences, tokens), num_drafted, scores, parents


@pytest.mark.parametrize("nodes", [0, 5], ids=["chain", "tree"])
@pytest.mark.parametrize("threshold", [0.0, 0.01], ids=["k-tokens", "confidence-stop"])
def test_a_draft_model_sees_no_position_past_max_length_in_a_batch(nodes, threshold):
    """A batch whose rows are at different distances from max_length: the draft model drafts the longest row's k
    in lockstep, but feeds a row only the tokens it may still draft, so a draft with learned positions up to
    max_length only (GPT-2, n_positions = max_length) never indexes past them, at a second draft too (its cache,
    holes included, caught up). Fed every drafted token as before, the row one token from its cap was fed
    positions up to max_length + 3. A row at max_length - 1 drafts nothing: no token counted before the
    confidence stop, no tree node (the loop dropped them; the drafter claimed them)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    max_length, k = 24, 6
    draft = GPT2LMHeadModel(GPT2Config(n_positions=max_length, n_embd=32, n_layer=2, n_head=4, vocab_size=32,
                                       initializer_range=0.3, bos_token_id=0, eos_token_id=None,
                                       pad_token_id=1)).eval()
    highest = []
    draft.transformer.wpe.register_forward_pre_hook(lambda m, args: highest.append(int(args[0].max())))
    rows = [torch.randint(2, 32, (max_length - 2,)), torch.randint(2, 32, (8,)), torch.randint(2, 32, (max_length - 1,))]
    session = hf_spec.DraftModelDrafter(draft, k, confidence_threshold=threshold).start(
        draft, torch.stack([r[:8] for r in rows]), GenerationConfig(max_length=max_length))
    for _ in range(2):
        out = session.draft_tree(rows, k, nodes) if nodes else session.draft(rows, k)
        tokens, num_drafted = out[0], out[1]
        assert int(num_drafted[1]) > 1  # the short row drafted on
        assert int(num_drafted[2]) == 0  # the row at its cap drafted nothing
        assert highest and max(highest) < max_length
        rows = [rows[0], torch.cat([rows[1], tokens[1, :1]]), rows[2]]  # the short row accepted its first token
    # a stop at the first token (a draft that doubts everything) does not count one for the row at its cap either
    doubter = hf_spec.DraftModelDrafter(draft, k, confidence_threshold=0.99).start(
        draft, torch.stack([r[:8] for r in rows]), GenerationConfig(max_length=max_length))
    out = doubter.draft_tree(rows, k, nodes) if nodes else doubter.draft(rows, k)
    assert out[1].tolist()[2] == 0


def _gpt2_and_its_short_draft(positions: int):
    """A tiny GPT-2 target (64 learned positions) and a draft with its weights but only the first ``positions``
    position rows, so it drafts well; and the list the draft's position embedding records its highest index in."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    common = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=32, initializer_range=0.3, bos_token_id=0,
                  eos_token_id=None, pad_token_id=1)
    target = GPT2LMHeadModel(GPT2Config(n_positions=64, **common)).eval()
    draft = GPT2LMHeadModel(GPT2Config(n_positions=positions, **common)).eval()
    weights = target.state_dict()
    weights["transformer.wpe.weight"] = weights["transformer.wpe.weight"][:positions]
    draft.load_state_dict(weights)
    highest = []
    draft.transformer.wpe.register_forward_pre_hook(lambda m, args: highest.append(int(args[0].max())))
    return target, draft, highest


@pytest.mark.parametrize("nodes", [None, 5], ids=["chain", "tree"])
def test_no_row_of_a_batch_feeds_its_draft_model_past_max_length(nodes):
    """The same end to end: rows that reach max_length at different steps (row 0's drafts all wrong), a draft
    with the target's weights and learned positions up to max_length only; every position the draft sees stays
    below max_length, the rows drift apart as meant, and the output is the target's own (the draft fed every
    drafted token in every row raised IndexError here)."""
    inputs, new = INPUTS[1], 14
    max_length = inputs["input_ids"].shape[1] + new
    target, draft, highest = _gpt2_and_its_short_draft(max_length)
    ref = target.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    events = []
    out = target.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                          custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=WrongDraftForRowZero(draft, 6, confidence_threshold=0.2),
                          event_listeners=[events.append], **({} if nodes is None else {"num_tree_nodes": nodes}))
    assert out.sequences.tolist() == ref.tolist()
    assert highest and max(highest) < max_length
    assert any(len(set(map(len, e.emitted))) > 1 for e in events[1:])  # the rows drift apart


@pytest.mark.parametrize("hybrid", [False, True], ids=["draft-model", "hybrid"])
@pytest.mark.parametrize("nodes", [None, 5], ids=["chain", "tree"])
def test_a_sequence_that_outgrows_a_short_draft_is_decoded_on_exactly(nodes, hybrid, caplog):
    """A draft that reads fewer positions than the call needs (GPT-2, n_positions = 12 < max_length; its weights the
    target's, so it drafts well): it drafts while a row fits, a row that outgrows it is decoded on without its
    drafts (the rows of a batch at different steps: one is 2 tokens longer), a prompt already longer gets none from
    the start, the draft never indexes a position it does not have, and the output is the target's own; alone and
    as the hybrid drafter's model source (whose suffix source may still draft past it). Before, the draft's
    position embedding raised IndexError mid-call."""
    context, new = 12, 14
    target, draft, highest = _gpt2_and_its_short_draft(context)
    long_prompt = dict(input_ids=torch.arange(2, 2 + context + 1)[None] % 30 + 2)
    for inputs in (*INPUTS, long_prompt):
        highest.clear()
        ref = target.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        events = []
        out = target.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                              custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=hf_spec.HybridDrafter(hf_spec.DraftModelDrafter(draft, 4)) if hybrid
                              else hf_spec.DraftModelDrafter(draft, 4), event_listeners=[events.append],
                              **({} if nodes is None else {"num_tree_nodes": nodes}))
        assert out.sequences.tolist() == ref.tolist()
        assert not highest or max(highest) < context
        lengths = (inputs["attention_mask"].sum(dim=1) if "attention_mask" in inputs
                   else torch.tensor([inputs["input_ids"].shape[1]])).tolist()
        drafted_at = []  # the length before the step of each row the draft model alone drafted for
        for e in events[1:]:  # (a hybrid's "draft+suffix" rows may hold suffix nodes only: `highest` covers them)
            rows = e.rows or range(len(e.drafted))
            sources = e.sources or ["draft"] * len(e.drafted)
            drafted_at += [lengths[r] for r, d, src in zip(rows, e.drafted, sources) if d and src == "draft"]
            for r, emitted in zip(e.rows or range(len(e.emitted)), e.emitted):
                lengths[r] += len(emitted)
        if inputs is long_prompt:
            assert not drafted_at  # past the context from the start
        else:  # only for rows that fit; alone it drafted (the hybrid may have taken its suffix source throughout)
            assert max(drafted_at, default=0) <= context and (drafted_at or hybrid)
    assert "reads at most 12 positions" in caplog.text


def _medusa_tree(target, draft):
    from .test_medusa import random_heads

    heads = random_heads(n=2, vocab=target.config.vocab_size, hidden=target.config.hidden_size, seed=3, scale=1.0)
    return hf_spec.MedusaDrafter(heads.bind(target), 2)


@pytest.mark.parametrize("make,nodes", [(lambda target, draft: ModelTreeDrafter(draft, 2), None), (_medusa_tree, 6),
                                        (lambda target, draft: hf_spec.DraftModelDrafter(draft, 2), 5),
                                        (lambda target, draft: SuffixFirstHybrid(SampledModelTrees(draft, 2)), 6),
                                        (lambda target, draft: ModelFirstHybrid(
                                            hf_spec.DraftModelDrafter(draft, 2),
                                            hf_spec.SuffixDrafter(
                                                corpus=[[7, t, (t + 1) % 10, (t + 3) % 10] for t in range(10)])), 6)],
                         ids=["sampled-model-tree", "medusa-top-k-tree", "draft-model-tree",
                              "hybrid-suffix-and-sampled-model-trees", "hybrid-merged-trees"])
def test_tree_sampling_is_distribution_exact_and_a_wrong_rule_fails(pair, monkeypatch, make, nodes):  # noqa: F811
    target, draft = pair
    procs = processors(1.0)
    exact = exact_distribution(target, procs)
    cfg = GenerationConfig(do_sample=True, max_length=PROMPT.shape[1] + NEW + 1)
    stop = StoppingCriteriaList([MaxLengthCriteria(cfg.max_length)])

    def counts(seed):
        """N_RUNS independent samples, as the rows of a few batches (each row samples on its own)."""
        drafter = make(target, draft)  # before seeding: building random heads seeds the global generator
        torch.manual_seed(seed)
        found, accepted, sources = {}, 0, set()
        for _ in range(N_RUNS // 300):
            out = hf_spec.speculative_decode(target, PROMPT.expand(300, -1), drafter,
                                             logits_processor=procs, stopping_criteria=stop, generation_config=cfg,
                                             num_tree_nodes=nodes)
            for row in out.sequences[:, PROMPT.shape[1]:PROMPT.shape[1] + NEW].tolist():
                found[tuple(row)] = found.get(tuple(row), 0) + 1
            accepted += out.stats.num_accepted_tokens
            sources |= set(out.stats.per_source)
        return found, accepted, sources

    found, accepted, sources = counts(7)
    assert pvalue(found, exact) > ALPHA
    assert accepted > N_RUNS // 4
    if isinstance(make(target, draft), ModelFirstHybrid):  # the suffix corpus's chains joined the model's trees
        assert "draft+suffix" in sources, sources
    monkeypatch.setattr(hf_spec.loop, "speculative_sample_tree", wrong_sibling_rule)
    assert pvalue(counts(8)[0], exact) < ALPHA


def test_a_bad_tree_is_refused_with_the_drafters_name():
    target, draft = tiny_pair()

    class Bad(ModelTreeDrafter):
        def draft(self, sequences, k):
            tokens, n, scores, parents = super().draft(sequences, k)
            parents[:, 1] = 1  # its own parent
            return tokens, n, scores, parents

    with pytest.raises(ValueError, match="Bad.draft.*earlier node"):
        target.generate(torch.tensor([[0, 5, 9]]), max_new_tokens=6, do_sample=False,
                        custom_generate=hf_spec.generate, drafter=Bad(draft, 2))


@pytest.mark.slow
def test_tree_greedy_on_real_smollm2_is_exact(smol, smol_drafts, specbench_prompts):
    """The real SmolLM2-135M with the draft-model tree (DraftModelDrafter: its chain with siblings) of its weak
    layer-skip draft, and with the suffix drafter's speculation trees: every output is plain greedy's (or first
    differs at a float32 near-tie), and the draft model's trees took later siblings. (Run alone: ~1 min; never
    beside another torch process on 2 cores, where oversubscribed threads made it 14 min.)"""
    from .conftest import TIE_BOUND, encode, first_divergence, top2_gap

    model, tok = smol
    later = 0
    for q in specbench_prompts[::8]:
        enc = encode(tok, q.text)
        base = model.generate(**enc, max_new_tokens=16, do_sample=False)
        for drafter, nodes in ((hf_spec.DraftModelDrafter(smol_drafts["skip"], 3), 10), (hf_spec.SuffixDrafter(4), 8)):
            events = []
            out = model.generate(**enc, max_new_tokens=16, do_sample=False, custom_generate=hf_spec.generate,
                                 return_dict_in_generate=True, drafter=drafter, num_tree_nodes=nodes,
                                 event_listeners=[events.append])
            j = first_divergence(out.sequences, base, enc["input_ids"].shape[1])
            assert j is None or top2_gap(model, base[:, :j]) < TIE_BOUND, (q.question_id, drafter.method)
            if drafter.method == "draft":
                later += sum(_took_a_later_sibling(e.drafted[0], e.parents[0], e.emitted[0][:e.num_accepted[0]])
                             for e in events[1:] if e.parents)
    assert later > 0


def test_sparse_tree_takes_the_likeliest_paths_and_their_parents():
    from hf_spec.drafters.medusa import sparse_tree

    assert sparse_tree([[0.9, 0.05], [0.8, 0.1]], 3) == [(0,), (0, 0), (0, 1)]
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        acc = torch.rand(4, 5, generator=g).sort(dim=1, descending=True).values.tolist()
        tree = sparse_tree(acc, 12)
        assert len(tree) == 12 and all(len(p) == 1 or p[:-1] in tree for p in tree)
        score = lambda p: torch.tensor([acc[d][r] for d, r in enumerate(p)]).prod()  # noqa: E731
        worst_in = min(score(p) for p in tree)
        # no path left out (whose parent is in) beats a chosen one
        for p in tree:
            for r in range(5):
                child = p + (r,)
                if len(child) <= 4 and child not in tree:
                    assert score(child) <= worst_in + 1e-6
    with pytest.raises(ValueError, match="num_nodes"):
        sparse_tree([[0.5]], 0)


def test_medusa_tree_greedy_is_exact_and_bad_trees_are_refused():
    from .conftest import tiny_llama
    from .test_medusa import random_heads

    target = tiny_llama()
    heads = random_heads(n=3, seed=1).bind(target)
    prompt = torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7]])
    ref = target.generate(prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False)
    stats = []
    for nodes in (1, 10, 40):
        out = target.generate(prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                              custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=hf_spec.MedusaDrafter(heads, 3), num_tree_nodes=nodes)
        assert out.sequences.tolist() == ref.tolist(), nodes
        stats.append(out.stats)
    assert stats[0].num_draft_tokens < stats[1].num_draft_tokens < stats[2].num_draft_tokens
    assert stats[2].num_accepted_tokens > 0
    kw = dict(max_new_tokens=4, do_sample=False, custom_generate=hf_spec.generate)
    with pytest.raises(ValueError, match="drafts chains only"):
        target.generate(prompt, drafter=hf_spec.NgramDrafter(3), num_tree_nodes=8, **kw)

    class ChainOnly(hf_spec.MedusaDrafter):
        method = "chain-only"
        drafts_trees = False

    with pytest.raises(ValueError, match=r"model source \(chain-only\) drafts chains only.*MedusaDrafter"):
        target.generate(prompt, drafter=hf_spec.HybridDrafter(ChainOnly(heads, 3)), num_tree_nodes=8, **kw)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="num_tree_nodes must be an integer"):
            target.generate(prompt, drafter=hf_spec.MedusaDrafter(heads, 3), num_tree_nodes=bad, **kw)
    import numpy as np  # numpy integers are integers, as for num_speculative_tokens

    assert torch.equal(target.generate(prompt, drafter=hf_spec.MedusaDrafter(heads, 3), num_tree_nodes=np.int64(4),
                                       **kw), target.generate(prompt, max_new_tokens=4, do_sample=False))


def test_medusa_measures_each_heads_rank_accuracy_from_what_the_target_emitted():
    from hf_spec.drafters.medusa import PRIOR_WEIGHT, prior_accuracy

    from .conftest import tiny_llama
    from .test_medusa import random_heads

    target = tiny_llama()
    d = hf_spec.MedusaDrafter(random_heads(n=3, seed=1).bind(target), 3).start(
        target, torch.tensor([[0, 5]]), GenerationConfig(do_sample=False))
    d._top = torch.tensor([[[4, 5, 6, 7, 8, 9, 10, 11], [1, 2, 3, 12, 13, 14, 15, 16], [0] * 8]])  # [B=1, k=3, R]
    d._lengths = [2]
    d._count([torch.tensor([0, 5, 5, 3])])  # the target emitted 5 (head 0's rank 1), then 3 (head 1's rank 2)
    assert d._trials == [1.0, 1.0, 0.0]
    assert d._hits[0][1] == 1 and d._hits[1][2] == 1 and sum(map(sum, d._hits)) == 2
    acc = d.accuracy(3)
    assert acc[0][1] == pytest.approx((1 + PRIOR_WEIGHT * prior_accuracy(0, 1)) / (1 + PRIOR_WEIGHT))
    assert acc[0][0] == pytest.approx(PRIOR_WEIGHT * prior_accuracy(0, 0) / (1 + PRIOR_WEIGHT))
    assert acc[2][0] == pytest.approx(prior_accuracy(2, 0))


def test_a_trees_system_efficiency_counts_its_depth_not_its_nodes():
    """vLLM's system efficiency is emitted tokens over the most the drafts allowed: for a tree, one path of it (its
    depth) plus the target's token. A fully accepted 5-node tree of depth 2 allowed 3 tokens and emitted 3."""
    from hf_spec.events import StepEvent

    stats = hf_spec.SpecStats()
    stats(StepEvent(0, 0, [[]], [0], [[7]], 0.0, 0.0, 0.1, [False]))
    # root children 0, 1, 2; node 3 under 0, node 4 under 1: depth 2; path 0 -> 3 accepted, then the target's token
    stats(StepEvent(1, 2, [[4, 5, 6, 8, 9]], [2], [[4, 8, 3]], 0.0, 0.0, 0.2, [False], parents=[[-1, -1, -1, 0, 1]]))
    assert stats.system_efficiency == 1.0
    assert stats.num_draft_tokens == 5 and stats.acceptance_rate == 2 / 5  # every node verified counts as drafted
    # a chain keeps its meaning: 3 drafted, 1 accepted, 2 emitted of the 4 it allowed
    stats(StepEvent(2, 3, [[1, 2, 3]], [1], [[1, 5]], 0.0, 0.0, 0.3, [False]))
    assert stats.system_efficiency == (3 + 2) / (3 + 4)


def _likeliest_nodes(draft, sequence, chain, num_nodes) -> set[tuple[int, int]]:
    """``(depth, token)`` of the ``num_nodes`` likeliest candidates of a draft tree, recomputed from unpadded
    forwards: at each depth d, the draft's min(num_nodes, TREE_WIDTH) likeliest tokens after the sequence and
    chain[:d], scored by the cumulative log-probability of chain[:d] and the token (d = depth - 1)."""
    from hf_spec.drafters.draft_model import TREE_WIDTH

    candidates, before = [], 0.0
    with torch.no_grad():
        for d in range(len(chain)):
            logp = draft(input_ids=torch.cat([sequence, chain[:d]])[None]).logits[0, -1].float().log_softmax(-1)
            top = logp.topk(min(num_nodes, TREE_WIDTH))
            candidates += [(before + float(v), d, int(t)) for v, t in zip(top.values, top.indices)]
            before += float(logp[chain[d]])
    return {(d, t) for _, d, t in sorted(candidates, reverse=True)[:num_nodes]}


def test_draft_model_tree_is_its_chain_with_siblings_and_stops_where_the_chain_stops():
    """DraftModelDrafter.draft_tree: the nodes with children form one root path, the chain draft() drafts (the same
    tokens, cut where the chain's confidence stop cuts each row); every other node is a leaf beside a chain node;
    no node lies below the row's stop; without a stop, the nodes are the likeliest candidates (EAGLE-2's rerank,
    each chain node offering up to TREE_WIDTH). Thresholds: none (the whole chain), and the mean of the draft's
    first-token probabilities, so that rows of one batch stop at different depths."""
    from transformers import LogitsProcessorList

    from hf_spec.acceptance import tree_depths

    target, draft = noisy_pair()
    inputs = INPUTS[1]
    ids = inputs["input_ids"]
    sequences = [ids[0, 2:], ids[1]]
    config = GenerationConfig(do_sample=False, max_length=40)
    with torch.no_grad():
        first = draft(input_ids=ids, attention_mask=inputs["attention_mask"]).logits[:, -1].softmax(-1).max(-1).values
    k, nodes = 4, 10
    for threshold in (0.0, float(first.mean())):
        drafter = hf_spec.DraftModelDrafter(draft, k, confidence_threshold=threshold)
        chain, chain_len, _ = drafter.start(target, ids, config, LogitsProcessorList()).draft(sequences, k)
        session = drafter.start(target, ids, config, LogitsProcessorList())
        tokens, num_drafted, _, parents = session.draft_tree(sequences, k, nodes)
        assert tokens.shape[1] <= nodes
        # the draft's cache holds what the drafter says it holds (the chain fed), and the next step reuses it: a
        # draft after one more token is a fresh drafter's
        assert [len(c) for c in session._cached] == session._ragged.lengths.tolist()
        longer = [torch.cat([s, chain[b, :1]]) for b, s in enumerate(sequences)]
        assert torch.equal(session.draft(longer, k)[0],
                           drafter.start(target, ids, config, LogitsProcessorList()).draft(longer, k)[0])
        for b in range(2):
            n = int(num_drafted[b])
            tok, par = tokens[b, :n].tolist(), parents[b, :n].tolist()
            inner = {p for p in par if p >= 0}
            path, node = [], -1  # the chain: from the root, each time the first child made (the likeliest)
            while kids := [j for j in range(n) if par[j] == node]:
                path.append(kids[0])
                node = kids[0]
            assert set(inner) <= set(path)  # only chain nodes have children
            assert [tok[j] for j in path] == chain[b, :len(path)].tolist()
            assert len(path) <= int(chain_len[b])  # nothing below the chain's stop
            assert n > len(path)  # siblings beside the chain
            if threshold == 0:  # EAGLE-2's rerank: the `nodes` likeliest of the chain nodes' top-W candidates
                depth = tree_depths(parents[b:b + 1, :n])[0].tolist()
                assert _likeliest_nodes(draft, sequences[b], chain[b], nodes) == {
                    (depth[j] - 1, tok[j]) for j in range(n)}
        if threshold > 0:
            assert len(set(chain_len.tolist())) > 1 or int(chain_len.max()) < k  # the stop cut some row


# ---- models whose positions are not position_ids: ALiBi (Bloom, MPT, Falcon with alibi=True) -------------------
def _alibi_archs():
    import transformers as tf

    from . import conformance as C
    return [
        C.Arch("Bloom", lambda: tf.BloomConfig(hidden_size=32, n_layer=2, n_head=4, **C._COMMON), tf.BloomForCausalLM),
        C.Arch("MPT", lambda: tf.MptConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=256, **C._COMMON),
               tf.MptForCausalLM),
        C.Arch("Falcon (alibi)", lambda: tf.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                         alibi=True, **C._COMMON), tf.FalconForCausalLM),
    ]


class OneRightOfThree(Drafter):
    """A test drafter that knows each row's greedy output (``outputs``: rows without padding) and drafts its next
    3 tokens with the second one wrong: one accepted and two rejected per step (holes in a batch's cache)."""

    method = "one-right-of-three"

    def __init__(self, outputs):
        super().__init__(3)
        self.outputs = outputs

    def draft(self, sequences, k):
        tokens = torch.zeros(len(sequences), k, dtype=torch.long)
        for b, seq in enumerate(sequences):
            full = next(o for o in self.outputs if o[:len(seq)] == seq.tolist())
            nxt = full[len(seq):len(seq) + k] + [0] * k
            tokens[b] = torch.tensor(nxt[:k])
            if k > 1:
                tokens[b, 1] = (tokens[b, 1] + 1) % 64
        return tokens, torch.full((len(sequences),), k), None


@pytest.mark.parametrize("arch", _alibi_archs(), ids=lambda a: a.name)
def test_alibi_models_refuse_trees_before_any_work_and_decode_chains_exactly(arch, monkeypatch):
    """A tree's siblings share a position; an ALiBi model takes its biases from the 2D mask (Bloom, Falcon: a 4D
    mask crashed there) or from each key's cache slot (MPT: silently other logits), so trees are refused before
    any forward. Chains stay exact, also where the measured CPU choices pass 4D masks (forced here: packed
    attention, the one-query mask, which crashed Falcon's chains); MPT, which places keys by slot, refuses a
    batch (a rejected draft's empty slot would move the row's later keys: other tokens)."""
    from . import conformance as C
    monkeypatch.setattr(hf_spec.ragged, "packed_attention_pays", lambda *a, **k: True)
    monkeypatch.setattr(hf_spec.ragged, "one_query_mask_pays", lambda *a, **k: True)
    monkeypatch.setattr(hf_spec.ragged, "measure_attention_choices", lambda *a, **k: None)
    target = C.build(arch)
    calls = []
    target.register_forward_pre_hook(lambda *a: calls.append(1))
    for inputs in (dict(input_ids=torch.tensor([C.PROMPT])), C.batch_inputs()):
        for nodes in (6, "auto"):
            calls.clear()
            with pytest.raises(ValueError, match="sibling nodes at the same position"):
                target.generate(**inputs, max_new_tokens=16, do_sample=False, custom_generate=hf_spec.generate,
                                drafter=hf_spec.SuffixDrafter(3), num_tree_nodes=nodes)
            assert not calls  # before any work
        ref = target.generate(**inputs, max_new_tokens=16, do_sample=False)
        mask = inputs.get("attention_mask", torch.ones_like(inputs["input_ids"]))
        drafter = OneRightOfThree([r[m.bool()].tolist() for r, m in zip(ref, torch.cat([mask, torch.ones_like(
            ref[:, mask.shape[1]:])], dim=1))])
        chain = dict(max_new_tokens=16, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                     drafter=drafter)
        if arch.name == "MPT" and inputs["input_ids"].shape[0] > 1:
            with pytest.raises(ValueError, match="cache slot"):
                target.generate(**inputs, **chain)
            continue
        out = target.generate(**inputs, **chain)
        assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens  # accepted and rejected: holes
        assert out.sequences.tolist() == ref.tolist()


def test_doge_is_exact_within_its_keep_window_and_refused_past_it():
    """Doge's dynamic mask keeps the top keep_window_size keys of each query once more are visible, and which keys
    depends on the forward: a break-it tester found greedy output differing from plain generate's at the first new
    token (keep_window_size=8, an 11-token prompt, one sequence, a chain). Within the window it selects nothing:
    chains, a left-padded batch and trees are token-identical; a call that can pass it is refused before any
    forward, saying what fits."""
    import transformers as tf

    from . import conformance as C

    arch = C.Arch("Doge", lambda: tf.DogeConfig(keep_window_size=40, **C._LLAMA_LIKE), tf.DogeForCausalLM)
    target, draft = C.build(arch), C.build(arch, noise=C.DRAFT_NOISE)
    calls = []
    target.register_forward_pre_hook(lambda *a: calls.append(1))
    for inputs in (dict(input_ids=torch.tensor([C.PROMPT])), C.batch_inputs()):
        ref = target.generate(**inputs, max_new_tokens=20, do_sample=False)  # 11 + 20 tokens: within 40
        for nodes in (None, 6):
            out = target.generate(**inputs, max_new_tokens=20, do_sample=False, custom_generate=hf_spec.generate,
                                  return_dict_in_generate=True, drafter=hf_spec.DraftModelDrafter(draft, 3),
                                  num_tree_nodes=nodes)
            assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens
            assert out.sequences.tolist() == ref.tolist(), (inputs["input_ids"].shape, nodes)
    calls.clear()
    with pytest.raises(ValueError, match=r"keep_window_size=40 keys.*reaches 41 tokens.*within 40"):
        target.generate(input_ids=torch.tensor([C.PROMPT]), max_new_tokens=30, do_sample=False,
                        custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(3))
    assert not calls  # before any work
