"""The drafter interface (tiny random models): the loop owns k and never writes it onto a drafter; after every
target forward, speculative or plain, the drafter is told what happened (accepted counts, and the target's
hidden states when it asks: the input of its lm_head, read per call and thread), so a Medusa drafter survives
plain steps and two threads on one target never see each other's hidden states."""

import copy
import threading

import pytest
import torch

import hf_spec
from hf_spec.adaptive import AdaptiveK
from hf_spec.drafters.medusa import MedusaDrafter

from .conftest import tiny_llama, tiny_pair
from .test_medusa import random_heads

PROMPT = torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]])


class Schedule(AdaptiveK):
    """A controller that plays a fixed k schedule (0 = a plain step), round and round."""

    def __init__(self, ks):
        super().__init__()
        self.ks = ks

    def reset(self, drafter_k=None, drafter_k_max=None):
        super().reset(drafter_k, drafter_k_max)
        self.i = 0

    def decide(self):
        k = self.ks[self.i % len(self.ks)]
        self.i += 1
        return k, None


def in_threads(fn, jobs: list[tuple]) -> list:
    """``fn(*job)`` for every job, each in its own thread, all at once; the results in order (errors raised)."""
    results, errors = [None] * len(jobs), []

    def worker(i):
        try:
            results[i] = fn(*jobs[i])
        except Exception as e:  # noqa: BLE001  (raised below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def _target(seed=3):
    target = tiny_llama(seed=seed)
    target.generation_config.eos_token_id = None  # run to max_new_tokens
    return target


@pytest.mark.parametrize("schedule", [[0, 2, 0, 0, 3, 1], [3, 0], [0, 0, 0, 2]])
def test_medusa_survives_plain_steps_between_drafts(schedule):
    """Before, a Medusa draft after a plain step (speculation off, a refresh step) crashed: "lost track of the
    target's hidden states"; the drafts must still come from the hidden state of the last accepted position."""
    target = _target()
    heads = random_heads(n=3, seed=1).bind(target)
    ref = target.generate(PROMPT, max_new_tokens=30, do_sample=False)
    seen = []
    out = target.generate(PROMPT, max_new_tokens=30, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=MedusaDrafter(heads, 3), num_speculative_tokens=Schedule(schedule),
                          event_listeners=[seen.append])
    assert torch.equal(out.sequences, ref)
    drafted = [e for e in seen if e.drafted[0]]
    assert len(drafted) >= 5 and any(e.step > 1 and e.num_speculative_tokens == 0 for e in seen)
    # each draft equals the heads on a full forward's hidden state at position len - 2 (the one that predicted
    # the row's last token)
    seq = ref[0]
    length = PROMPT.shape[1] + 1  # after the prefill
    for e in seen[1:]:
        if e.drafted[0]:
            with torch.no_grad():
                hidden = target(input_ids=seq[None, :length - 1], output_hidden_states=True).hidden_states[-1][0, -1]
                want = heads(hidden, num_heads=len(e.drafted[0])).argmax(-1).tolist()
            assert e.drafted[0] == want, (e.step, e.drafted[0], want)
        length += len(e.emitted[0])


def test_medusa_with_auto_k_is_greedy_identical():
    """The demo's default: random heads lose, so the controller switches speculation off and probes later."""
    target = _target()
    heads = random_heads(n=3, seed=1).bind(target)
    ref = target.generate(PROMPT, max_new_tokens=80, do_sample=False)
    out = target.generate(PROMPT, max_new_tokens=80, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=MedusaDrafter(heads), num_speculative_tokens=AdaptiveK(off_steps=2))
    assert torch.equal(out.sequences, ref)
    assert 0 in out.stats.k_per_step[4:] and any(k > 0 for k in out.stats.k_per_step)


def test_two_threads_on_one_target_never_share_hidden_states():
    """Two threads, one target, each with its own Medusa drafter and prompt: every thread's drafts equal what
    the same call drafts alone (before, one crashed and the other drafted from the other request)."""
    target = _target()
    jobs = [(MedusaDrafter(random_heads(n=3, seed=1).bind(target), 3), torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7]])),
            (MedusaDrafter(random_heads(n=2, seed=2).bind(target), 2), torch.tensor([[0, 4, 4, 8, 2, 6, 11, 3, 2, 7]]))]

    def run(drafter, prompt):
        seen = []
        target.generate(prompt, max_new_tokens=40, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                        drafter=drafter, event_listeners=[seen.append])
        return [e.drafted[0] for e in seen]

    alone = [run(d, p) for d, p in jobs]
    for _ in range(3):
        assert in_threads(run, jobs) == alone


def test_one_draft_model_drafter_serves_two_threads_at_once():
    """One drafter object, two concurrent calls (a batch of two and a single prompt): each call works on its own
    copy, so each gets what it gets alone, drafts included."""
    target, draft = tiny_pair()
    drafter = hf_spec.DraftModelDrafter(draft, 3)
    batch = dict(input_ids=torch.tensor([[1, 1, 0, 5, 9, 5], [0, 4, 4, 8, 2, 6]]),
                 attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]))
    jobs = [batch, dict(input_ids=PROMPT)]

    def run(inputs):
        seen = []
        out = target.generate(**inputs, max_new_tokens=30, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=drafter, event_listeners=[seen.append])
        return out.sequences.tolist(), [e.drafted for e in seen]

    alone = [run(j) for j in jobs]
    for _ in range(3):
        assert in_threads(run, [(j,) for j in jobs]) == alone


def test_one_adaptive_k_configures_concurrent_calls():
    """An AdaptiveK instance passed to calls in two threads: each call runs its own copy, so the bounds of one
    call's drafter (2 Medusa heads) never leak into the other's (4 heads)."""
    target = _target()
    controller = AdaptiveK(k_max=8, dwell_steps=1, margin=0.0, off_below=0.0)
    jobs = [MedusaDrafter(random_heads(n=2, seed=1).bind(target)), MedusaDrafter(random_heads(n=4, seed=2).bind(target))]
    def run(drafter):
        out = target.generate(PROMPT, max_new_tokens=40, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=drafter, num_speculative_tokens=controller)
        return max(out.stats.k_per_step)

    for _ in range(3):
        most = in_threads(run, [(d,) for d in jobs])
        assert most[0] <= 2 and most[1] <= 4
    assert controller.mode == "start"  # the instance itself was only copied


def test_medusa_heads_shared_by_two_targets_draft_from_each_calls_target():
    """One drafter, two targets of the same shape: each call projects with its own target's lm_head, and the
    heads stay as they were (no rebinding of shared heads)."""
    a, b = _target(seed=3), _target(seed=4)
    heads = random_heads(n=3, seed=1).bind(a)
    drafter = MedusaDrafter(heads)

    def drafts(target):
        seen = []
        target.generate(PROMPT, max_new_tokens=20, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter,
                        event_listeners=[seen.append])
        return [e.drafted[0] for e in seen]

    alone_a = drafts(a)
    drafts(b)
    assert drafts(a) == alone_a
    assert heads.projection(0) is a.get_output_embeddings().weight


def test_statistics_record_the_k_the_drafter_was_asked_for():
    """A fixed k far above max_new_tokens: each step's k is what draft() got (capped by the budget), so the
    per-position statistics stay as long as what could be drafted."""
    target = _target()
    seen = []

    class Asked(hf_spec.NgramDrafter):
        def draft(self, sequences, k):
            seen.append(k)
            return super().draft(sequences, k)

    out = target.generate(PROMPT, max_new_tokens=8, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=Asked(), num_speculative_tokens=10**6)
    assert max(out.stats.k_per_step) <= 7 and len(out.stats.acceptance_by_position) <= 7
    assert [k for k in out.stats.k_per_step if k] == seen


def test_no_hook_is_left_on_the_target():
    target = _target()
    drafter = MedusaDrafter(random_heads(n=2, seed=1).bind(target))
    target.generate(PROMPT, max_new_tokens=10, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter)
    lm_head = target.get_output_embeddings()
    assert not lm_head._forward_pre_hooks and not lm_head._forward_hooks


@pytest.mark.parametrize("make", [lambda draft: hf_spec.NgramDrafter(5), lambda draft: hf_spec.DraftModelDrafter(draft, 5)])
def test_a_call_never_changes_the_drafters_k(make):
    """A drafter passed with num_speculative_tokens=2 (or "auto") keeps its own k for the next call."""
    target, draft = tiny_pair()
    drafter = make(draft)
    for k in (2, "auto", 1):
        target.generate(PROMPT, max_new_tokens=12, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                        drafter=drafter, num_speculative_tokens=k)
        assert drafter.num_speculative_tokens == 5
    seen = []
    target.generate(PROMPT, max_new_tokens=12, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter,
                    event_listeners=[seen.append])
    ks = [e.num_speculative_tokens for e in seen[1:]]
    assert ks[0] == 5 and max(ks) == 5  # the drafter's own k (smaller only where max_new_tokens leaves less)


# ---- what the drafter is told after each forward ------------------------------------------------------------
def _tiny(arch: str):
    """A tiny random target of a few architectures whose last hidden state is computed differently (Llama;
    GPT-2's learned positions and final LayerNorm; Gemma 2's logit soft-capping after lm_head)."""
    from transformers import AutoModelForCausalLM, Gemma2Config, GPT2Config, LlamaConfig

    torch.manual_seed(0)
    common = dict(vocab_size=32, bos_token_id=0, eos_token_id=None, pad_token_id=1)
    cfg = {"llama": lambda: LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, **common),
           "gpt2": lambda: GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, **common),
           "gemma2": lambda: Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=8, final_logit_softcapping=5.0, **common),
           }[arch]()
    return AutoModelForCausalLM.from_config(cfg).eval()


class Recording(hf_spec.NgramDrafter):
    """An n-gram drafter that asks for hidden states and keeps everything it is told."""

    needs_hidden_states = True

    def prepare(self, target, input_ids):
        super().prepare(target, input_ids)
        self.told = []

    def update(self, verified):
        self.told.append(verified)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
def test_the_drafter_is_told_every_forward_with_the_targets_hidden_states(arch, monkeypatch):
    """After the prefill and every step (plain ones too): the accepted and drafted counts of the events, and
    hidden states equal to a full forward's last hidden states at the verified positions."""
    target = _tiny(arch)
    prompt = torch.tensor([[0, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9, 5, 9]])
    drafter = Recording(3)
    sessions = []
    original = Recording.start

    def start(self, *args, **kwargs):
        sessions.append(original(self, *args, **kwargs))
        return sessions[-1]

    monkeypatch.setattr(Recording, "start", start)
    events = []
    out = target.generate(prompt, max_new_tokens=24, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=drafter, num_speculative_tokens=Schedule([3, 0, 2]), event_listeners=[events.append])
    assert not hasattr(drafter, "told")  # the caller's object is untouched; the call's copy was told
    told = sessions[0].told
    assert len(told) == len(events) and [v.step for v in told] == [e.step for e in events]
    assert any(e.drafted[0] for e in events) and any(e.step and not e.drafted[0] for e in events)
    seq = out.sequences[0]
    with torch.no_grad():
        full = target(input_ids=seq[None], output_hidden_states=True).hidden_states[-1][0]
    length = prompt.shape[1]  # the row's length before the forward
    for verified, event in zip(told, events):
        assert verified.num_drafted.tolist() == [len(event.drafted[0])]
        assert verified.num_accepted.tolist() == [event.num_accepted[0]]
        width = verified.hidden_states.shape[1]
        assert width == (1 if event.step == 0 else len(event.drafted[0]) + 1)
        first = length - 1  # column 0 is the position of the row's last token before the forward
        for j in range(event.num_accepted[0] + 1):  # columns whose inputs are all in the final sequence
            torch.testing.assert_close(verified.hidden_states[0, j], full[first + j], atol=1e-4, rtol=1e-4)
        length += len(event.emitted[0])
        torch.testing.assert_close(verified.last_hidden_state()[0], full[length - 2], atol=1e-4, rtol=1e-4)


def test_hidden_states_only_for_drafters_that_ask(monkeypatch):
    target = _tiny("llama")
    seen = []
    monkeypatch.setattr(hf_spec.NgramDrafter, "update", lambda self, verified: seen.append(verified.hidden_states))
    target.generate(PROMPT, max_new_tokens=8, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                    drafter=hf_spec.NgramDrafter(2))
    assert seen and all(h is None for h in seen)


# ---- the registry --------------------------------------------------------------------------------------------
def test_registry_builds_every_spec_with_one_default_k():
    from hf_spec.drafters.base import DEFAULT_NUM_SPECULATIVE_TOKENS
    from hf_spec.drafters.registry import make_drafter, parse_drafter

    assert make_drafter("none") is None
    ngram = make_drafter("ngram")
    assert isinstance(ngram, hf_spec.NgramDrafter) and ngram.num_speculative_tokens == DEFAULT_NUM_SPECULATIVE_TOKENS
    assert make_drafter("ngram", num_speculative_tokens=5).num_speculative_tokens == 5
    assert str(parse_drafter("draft:some/model")) == "draft:some/model"
    for bad, msg in [("warp", "unknown drafter 'warp'; use none | ngram | draft:MODEL | medusa:DIR"),
                     ("draft:", "needs MODEL"), ("ngram:5", "takes no argument"), ("medusa:/no/such", "no Medusa heads")]:
        with pytest.raises(ValueError, match=msg):
            parse_drafter(bad)
    with pytest.raises(ValueError, match="integer >= 1"):
        make_drafter("ngram", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="chosen per call"):
        make_drafter("ngram", num_speculative_tokens="auto")
    import numpy as np

    assert make_drafter("ngram", num_speculative_tokens=np.int64(4)).num_speculative_tokens == 4
    # a drafter's own k is a number: its message said '"auto"' was allowed while refusing it
    with pytest.raises(ValueError, match="SuffixDrafter's own k is a number: \"auto\" is chosen per call"):
        hf_spec.SuffixDrafter("auto")


def test_a_drafters_default_k_fits_what_it_can_propose():
    class Two(hf_spec.NgramDrafter):
        max_num_speculative_tokens = 2

    assert Two().num_speculative_tokens == 2  # the default 3, capped
    with pytest.raises(ValueError, match="at most 2 tokens"):
        Two(3)


def test_register_drafter_refuses_bad_names():
    from hf_spec.drafters.registry import register_drafter

    for name in ("", "a:b", "none", "ngram", " mine", "mine\n", "a,b", 5):
        with pytest.raises(ValueError, match="cannot register"):
            register_drafter(name, hf_spec.NgramDrafter)
    with pytest.raises(TypeError):
        register_drafter("x", dict)


def test_a_fixed_k_above_what_the_drafter_proposes_is_refused_before_any_work():
    target = _target()
    drafter = MedusaDrafter(random_heads(n=2, seed=1).bind(target))
    with pytest.raises(ValueError, match="at most 2 tokens per step"):
        target.generate(PROMPT, max_new_tokens=4, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter,
                        num_speculative_tokens=3)
    for bad in (0, -1, 2.5, "fast", True):
        with pytest.raises(ValueError, match="integer >= 1"):
            target.generate(PROMPT, max_new_tokens=4, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter,
                            num_speculative_tokens=bad)


# ---- a new drafter: one file and one registry line -----------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_target_dir(tmp_path_factory):
    """A tiny random Llama with SmolLM2's real tokenizer, saved as a folder the command line loads."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(hf_spec.provision("smollm2-135m"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                         pad_token_id=tok.pad_token_id))
    path = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_the_docs_toy_drafter_is_one_file_and_one_registry_line(tiny_target_dir, tmp_path, monkeypatch, capsys):
    """docs/architecture.md's RepeatDrafter, written to its own file and given its registry entry, works through
    the command line's drafter spec: exact output, k from the one default, its drafts verified."""
    import importlib.util
    import json
    import re
    from pathlib import Path

    from hf_spec import cli
    from hf_spec.drafters.base import DEFAULT_NUM_SPECULATIVE_TOKENS
    from hf_spec.drafters.registry import DRAFTERS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    source = re.search(r"```python\n(# hf_spec/drafters/repeat\.py\n.*?)```", doc, re.S).group(1)
    assert '"repeat": RepeatDrafter,' in doc
    (tmp_path / "repeat.py").write_text(source)
    spec = importlib.util.spec_from_file_location("repeat", tmp_path / "repeat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(DRAFTERS, "repeat", module.RepeatDrafter)  # the registry line
    assert cli.main(["generate", "--target", str(tiny_target_dir), "--drafter", "repeat", "--max-new-tokens", "24",
                     "--prompt", "def f():", "--compare", "--json", "--dtype", "float32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["identical_to_baseline"] is True and out["new_tokens"] == 24
    assert out["config"]["drafter"] == "repeat" and out["config"]["num_speculative_tokens"] == DEFAULT_NUM_SPECULATIVE_TOKENS
    assert len(out["acceptance_by_position"]) == DEFAULT_NUM_SPECULATIVE_TOKENS  # it drafted k tokens per step
    assert out["acceptance_rate"] > 0  # a random tiny model repeats itself: the drafts are really verified
    assert out["target_forwards"] < out["new_tokens"] + 1


def test_bad_drafter_specs_fail_before_any_model_loads(capsys):
    from pathlib import Path

    from hf_spec import cli

    for spec, k, msg in [("no-such-drafter", [], "unknown drafter 'no-such-drafter'"),
                         ("medusa:/no/such/heads", [], "no Medusa heads"), ("draft:", [], "needs MODEL"),
                         ("draft:no-such-draft", [], "unknown model 'no-such-draft'"),
                         ("medusa:smollm2-135m", ["-k", "9"], "has 4 heads"),
                         ("medusa:" + str(Path(__file__).parent), [], "not a folder of Medusa heads")]:
        assert cli.main(["generate", "--target", "no-such-model", "--drafter", spec, "--prompt", "hi", *k]) == 2
        err = capsys.readouterr().err
        assert msg in err and "no-such-model" not in err, err  # the drafter's error, before the target's


class Malformed(hf_spec.NgramDrafter):
    """Returns whatever ``make(rows, k)`` returns (set by the test)."""

    make = None

    def draft(self, sequences, k):
        return type(self).make(sequences, k)


@pytest.mark.parametrize("make, msg", [
    (lambda s, k: (torch.zeros(len(s), k + 1, dtype=torch.long), torch.full((len(s),), k), None), "tokens of shape"),
    (lambda s, k: (torch.zeros(len(s), k), torch.full((len(s),), k), None), "dtype torch.float32"),
    (lambda s, k: (torch.zeros(k, dtype=torch.long), torch.full((len(s),), k), None), "tokens of shape"),
    (lambda s, k: (torch.zeros(len(s), k, dtype=torch.long), torch.full((len(s),), k + 1), None), "num_drafted"),
    (lambda s, k: (torch.full((len(s), k), 32), torch.full((len(s),), k), None), "outside the target's vocabulary"),
    (lambda s, k: (torch.zeros(len(s), k, dtype=torch.long), torch.full((len(s),), k), torch.zeros(len(s), k)), "scores"),
    (lambda s, k: [torch.zeros(len(s), k, dtype=torch.long)], "instead of a 3-tuple"),
])
def test_malformed_drafts_are_clear_errors(make, msg, monkeypatch):
    """A drafter of one's own that returns the wrong thing gets a message naming it and the contract, not a
    cryptic error inside the target or a silently wrong result."""
    target = _target()
    monkeypatch.setattr(Malformed, "make", staticmethod(make))
    with pytest.raises(ValueError, match=msg) as info:
        target.generate(PROMPT, max_new_tokens=6, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                        drafter=Malformed(3))
    assert "Malformed.draft" in str(info.value) and "Writing a drafter" in str(info.value)


def test_a_sampling_drafter_without_scores_is_refused(monkeypatch):
    """Without q the rule would treat sampled tokens as certain: the distribution would no longer be exact."""
    target, draft = tiny_pair()
    drafter = hf_spec.DraftModelDrafter(draft, 2)
    original = hf_spec.DraftModelDrafter.draft
    monkeypatch.setattr(hf_spec.DraftModelDrafter, "draft", lambda self, s, k: original(self, s, k)[:2] + (None,))
    with pytest.raises(ValueError, match="no scores under sampling"):
        target.generate(PROMPT, max_new_tokens=6, min_new_tokens=6, do_sample=True, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter)
    target.generate(PROMPT, max_new_tokens=6, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter)


def _q_logits(s, k, fill=0.0):
    return torch.full((len(s), k, 32), fill)


def _last(s, k):
    return torch.stack([x[-1:].repeat(k) for x in s])


@pytest.mark.parametrize("make, msg", [
    (lambda s, k: (_last(s, k), torch.full((len(s),), k), torch.zeros(len(s), k, 33)), "scores over 33 tokens"),
    (lambda s, k: (_last(s, k), torch.full((len(s),), k), _q_logits(s, k, float("nan"))), "NaN"),
    (lambda s, k: (_last(s, k), torch.full((len(s),), k), _q_logits(s, k, float("-inf"))), "every token -inf"),
    (lambda s, k: (_last(s, k), torch.full((len(s),), k), _q_logits(s, k).softmax(-1)), "look like probabilities"),
    (lambda s, k: (_last(s, k), torch.full((len(s),), k),
                   _q_logits(s, k).scatter(2, _last(s, k)[..., None], float("-inf"))), "probability 0"),
    (lambda s, k: (_last(s, k), torch.ones(len(s), dtype=torch.bool), None), "num_drafted"),
    (lambda s, k: (_last(s, k).to("meta"), torch.full((len(s),), k), None), "cannot be moved"),
])
def test_malformed_sampling_scores_are_clear_errors(make, msg, monkeypatch):
    """Under sampling q decides the output distribution: scores over another vocabulary, NaN or all -inf, probabilities
    where logits belong (softmaxed twice: on 304a40c P(token) went from 0.03 to 0.41 without a word), or a token its own
    q gives 0 (always accepted) are refused before the acceptance rule, naming the drafter."""
    target = _target()
    monkeypatch.setattr(Malformed, "make", staticmethod(make))
    with pytest.raises(ValueError, match=msg) as info:
        target.generate(PROMPT, max_new_tokens=6, do_sample=True, custom_generate=hf_spec.generate, drafter=Malformed(3))
    assert "Malformed.draft(rows, k=3)" in str(info.value) and "Writing a drafter" in str(info.value)


def test_own_drafters_get_clear_errors_before_any_work(monkeypatch):
    """The mistakes of a first drafter of one's own are named where they happen, with the fix: a class or a spec string
    for drafter=, an __init__ without super().__init__, a drafts_trees flag without draft_tree (or the reverse), a
    tree from draft_tree named as such, an exception from draft noted with the drafter and step; and the events and
    statistics carry the drafter's method."""
    from hf_spec.drafters.base import Drafter

    target = _target()

    class Repeat(Drafter):
        method = "repeat"

        def draft(self, s, k):
            return _last(s, k), torch.full((len(s),), k), None

    run = lambda d, **kw: target.generate(PROMPT, max_new_tokens=6, do_sample=False,  # noqa: E731
                                          custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=d, **kw)
    with pytest.raises(TypeError, match=r"got the class Repeat: pass Repeat\(...\)"):
        run(Repeat)
    with pytest.raises(TypeError, match=r"hf_spec.make_drafter\('repeat'"):
        run("repeat")
    with pytest.raises(TypeError, match=r"got the model LlamaForCausalLM: wrap a draft model in hf_spec.DraftModelDrafter"):
        run(target)
    # the same values as assistant_model= after enable_drafters, where transformers crashed on them (AttributeError:
    # 'str' object has no attribute 'config'); a model stays accepted there
    enabled = hf_spec.enable_drafters(copy.deepcopy(target))
    for value, said in ((Repeat, r" instance, got the class Repeat: pass Repeat\(...\)"),
                        ("ngram", r", got the string 'ngram': .*hf_spec.make_drafter\('ngram'"), (3, ", got int$")):
        with pytest.raises(TypeError, match=r"^assistant_model must be a draft model \(a transformers model\) or an "
                                            "hf_spec Drafter" + said):
            enabled.generate(PROMPT, max_new_tokens=4, do_sample=False, assistant_model=value)
    # a model without its language-model head (the base model, model.model) is no draft: said, not an AttributeError
    # on .logits inside the loop, by either way in
    with pytest.raises(TypeError, match=r"the draft \w+Model has no language-model head"):
        enabled.generate(PROMPT, max_new_tokens=4, do_sample=False, assistant_model=enabled.model)
    with pytest.raises(TypeError, match=r"the draft \w+Model has no language-model head"):
        hf_spec.DraftModelDrafter(target.model)

    class NoSuper(Repeat):
        def __init__(self, token):
            self.token = token
    with pytest.raises(TypeError, match=r"NoSuper.__init__ did not call super\(\).__init__"):
        run(NoSuper(5))

    class FlagOnly(Repeat):
        drafts_trees = True
    with pytest.raises(ValueError, match="sets drafts_trees = True but does not define draft_tree"):
        run(FlagOnly(), num_tree_nodes=4)

    class TreeOnly(Repeat):
        def draft_tree(self, s, k, n):
            return _last(s, k + 1), torch.full((len(s),), k + 1), None, torch.arange(-1, k)[None].repeat(len(s), 1)
    with pytest.raises(ValueError, match="set drafts_trees = True on the class"):
        run(TreeOnly(), num_tree_nodes=4)
    TreeOnly.drafts_trees = True
    with pytest.raises(ValueError, match=r"TreeOnly.draft_tree\(rows, k=3, num_nodes=8\) .* tokens deep .* at most k deep"):
        run(TreeOnly(), num_tree_nodes=8)

    class Raises(Repeat):
        def draft(self, s, k):
            raise RuntimeError("mine")
    with pytest.raises(RuntimeError, match="mine") as info:
        run(Raises())
    assert any("Raises.draft at step 1" in note for note in getattr(info.value, "__notes__", ["Raises.draft at step 1"]))

    events = []
    out = run(Repeat(), event_listeners=[events.append])
    assert {e.method for e in events} == {"repeat"} and out.stats.method == "repeat"
    assert out.stats.to_dict()["method"] == "repeat"
    plain = hf_spec.SpecStats()
    assert plain.merge(out.stats).merge(out.stats).method == "repeat"
    # one listener kept over calls of two drafters counts both, as merging their statistics does
    listener = hf_spec.SpecStats()
    other = run(hf_spec.NgramDrafter(2), event_listeners=[listener])
    run(Repeat(), event_listeners=[listener])
    assert listener.method == "ngram, repeat" == hf_spec.SpecStats().merge(other.stats).merge(out.stats).method


def test_register_drafter_twice_and_from_spec_keeps_k(monkeypatch):
    """Registering the same class again (a re-run cell) is harmless; another class under a taken name says whose it
    is and offers replace=True; the default from_spec passes k by keyword, and a built k other than the one asked is
    an error, not a silently different drafter (on 304a40c, __init__(self, token=5, num_speculative_tokens=None) got
    the k as its token)."""
    from hf_spec.drafters.base import Drafter
    from hf_spec.drafters.registry import DRAFTERS, make_drafter, register_drafter

    monkeypatch.setattr("hf_spec.drafters.registry.DRAFTERS", dict(DRAFTERS))

    class Fixed(Drafter):
        method = "fixed"

        def __init__(self, token=5, num_speculative_tokens=None):
            super().__init__(num_speculative_tokens)
            self.token = token

    class Positional(Drafter):
        def __init__(self, k=None):
            super().__init__()  # drops k
    register_drafter("fixed", Fixed)
    register_drafter("fixed", Fixed)  # again: nothing happens
    with pytest.raises(ValueError, match=r"registered to .*Fixed; choose another name, or pass replace=True"):
        register_drafter("fixed", Positional)
    with pytest.raises(TypeError, match="pass its class, Fixed"):
        register_drafter("other", Fixed())
    built = make_drafter("fixed", num_speculative_tokens=2)
    assert (built.token, built.num_speculative_tokens) == (5, 2)
    register_drafter("fixed", Positional, replace=True)
    with pytest.raises(ValueError, match=r"asked for k=2, Positional.from_spec built one with k=3"):
        make_drafter("fixed", num_speculative_tokens=2)
