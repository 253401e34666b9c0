"""Shared fixtures: the real SmolLM2-135M (float32) with real-weight drafts, Spec-Bench prompts, and tiny
random models for unit tests of mechanics."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_spec
from hf_spec.kernels import NEAR_TIE_BOUNDS
from hf_spec.ragged import cache_kwarg
from hf_spec.prompts import chat_inputs, load_questions

torch.set_num_threads(max(1, os.cpu_count() or 1))

#: Largest top-1/top-2 logit gap (float32) that we accept as a numerical near-tie when a speculative
#: output's first divergence from plain greedy is examined (``hf_spec.kernels.NEAR_TIE_BOUNDS``, which
#: ``hf-spec generate --compare`` reports against too). Verifying k+1 positions in one forward uses
#: different matmul shapes than k+1 one-token forwards; observed differences are ~1e-5.
TIE_BOUND = NEAR_TIE_BOUNDS["float32"]
#: The same in bfloat16 compute: bfloat16 keeps 8 significant bits, so logits of magnitude 16-32 are rounded
#: to steps of 0.125-0.25 and two computations of one logit can differ by a few steps.
BF16_TIE_BOUND = NEAR_TIE_BOUNDS["bfloat16"]


@pytest.fixture(autouse=True)
def full_length_drafts(request, monkeypatch):
    """Draft models draft all k tokens in mechanics tests: a tiny random draft is unsure of every token (its top
    probability over 32 tokens is ~0.1-0.3), so under the shipped confidence stop
    (``hf_spec.drafters.draft_model.DEFAULT_CONFIDENCE_THRESHOLD``) it would draft one token a step, and the tests
    of multi-token drafts (ragged batches, caches, acceptance, adaptive k) would test one-token drafts only. The
    real-model tests (``test_real_*``) and ``test_draft_confidence`` run the shipped default."""
    name = request.module.__name__.rpartition(".")[2]
    if not name.startswith(("test_real_", "test_draft_confidence")):
        monkeypatch.setattr("hf_spec.drafters.draft_model.DEFAULT_CONFIDENCE_THRESHOLD", 0.0)


@pytest.fixture(params=["transformers", "hf-spec"])
def attention_path(request, monkeypatch):
    """Runs a test of RaggedCache's forwards once on each attention path: ``"transformers"`` (its own sdpa
    attention: no 4D mask for one query, ``repeat_kv`` for several) and ``"hf-spec"`` (one query with a 4D mask,
    several queries packed where the model can take it: :func:`hf_spec.kernels.packed_attention_pays`). On a real
    machine the choice is measured; here the measurement says which is faster, and the one-query choice is forced
    (float32 never takes it). Both must compute the row's own attention. Returns ``(on, packed)``: whether hf-spec's
    path is on, and a list that gets one entry per layer forward that packed its query heads."""
    from hf_spec import kernels

    on = request.param == "hf-spec"
    monkeypatch.setattr("hf_spec.ragged.one_query_mask_pays", lambda config, dtype, device: on)
    monkeypatch.setattr(kernels, "_packed_times", lambda key: (1.0, 0.1) if on else (0.1, 1.0))
    packed, pack = [], kernels._pack_queries
    monkeypatch.setattr(kernels, "_pack_queries", lambda q, groups: packed.append(q.shape) or pack(q, groups))
    return on, packed


def layer_skip_copy(model, keep: list[int]):
    """A draft built from the target's own weights with only the ``keep`` layers (a real-weight, weak draft)."""
    draft = copy.deepcopy(model)
    draft.model.layers = torch.nn.ModuleList(draft.model.layers[i] for i in keep)
    draft.config.num_hidden_layers = len(keep)
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = [draft.config.layer_types[i] for i in keep]
    for i, layer in enumerate(draft.model.layers):
        layer.self_attn.layer_idx = i
        if hasattr(layer, "layer_idx"):  # Gemma 2/3 and others keep it on the decoder layer too
            layer.layer_idx = i
    return draft


@pytest.fixture(scope="session")
def smol():
    """(model, tokenizer) of the real SmolLM2-135M-Instruct in float32."""
    return hf_spec.load("smollm2-135m", dtype=torch.float32)


@pytest.fixture(scope="session")
def smol_drafts(smol):
    """Real-weight drafts with SmolLM2's tokenizer: a bfloat16 copy (high acceptance) and a 15-layer
    layer-skip copy (low acceptance, exercises rejections)."""
    model, _ = smol
    return {
        "bf16": copy.deepcopy(model).to(torch.bfloat16),
        "skip": layer_skip_copy(model, [i for i in range(30) if not (i % 2 and 5 < i < 25)]),
    }


@pytest.fixture(scope="session")
def gemma3():
    """(model, tokenizer) of the real Gemma-3-270M (base) in float32: a sliding-window target (512-token window
    on 15 of its 18 layers, full attention on the other 3)."""
    return hf_spec.load("gemma-3-270m", dtype=torch.float32)


@pytest.fixture(scope="session")
def specbench_prompts():
    """24 Spec-Bench first turns: 2 from each of 12 categories (long summarization/RAG articles excluded
    to keep CI short; they are covered by the benchmark)."""
    cats = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
            "translation", "qa", "math_reasoning", "summarization"]
    qs = load_questions(categories=cats, per_category=2)
    return [q for q in qs if len(q.text) < 1500]


#: new tokens of the real-model greedy tests on Spec-Bench prompts (:func:`specbench_baselines`)
SPECBENCH_NEW = 24


@pytest.fixture(scope="session")
def specbench_baselines(smol, specbench_prompts):
    """``(question, inputs, plain greedy sequences)`` of SmolLM2 (float32) on each Spec-Bench prompt, SPECBENCH_NEW
    new tokens: the references of every real-model greedy test on these prompts, computed once."""
    model, tok = smol
    out = []
    for q in specbench_prompts:
        enc = encode(tok, q.text)
        out.append((q, enc, model.generate(**enc, max_new_tokens=SPECBENCH_NEW, do_sample=False)))
    return out


def encode(tokenizer, text):
    return chat_inputs(tokenizer, text)


def tiny_llama(vocab_size=32, seed=0, hidden=32, layers=2):
    """A tiny random Llama for mechanics tests (never for claims about real models)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=1, pad_token_id=1, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 1
    return model


def tiny_pair():
    """A tiny random target and a draft that mostly agrees with it: the target's weights, each matrix perturbed by
    1% of its own spread (greedy acceptance ~65% on PROMPT-like inputs, so steps accept some drafts and reject
    others). Noise of a fixed 0.02, the size of the weights themselves, made an unrelated model (0% acceptance)."""
    target = tiny_llama(seed=0)
    draft = tiny_llama(seed=0)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() > 1:
                p.add_(0.01 * p.std() * torch.randn_like(p))
    return target, draft


def first_divergence(a: torch.Tensor, b: torch.Tensor, start: int) -> int | None:
    """Index (absolute) of the first position >= start where the token rows a[0], b[0] differ, or None
    when one is a prefix of the other and they have the same length."""
    n = min(a.shape[1], b.shape[1])
    diff = (a[0, start:n] != b[0, start:n]).nonzero()
    if diff.numel():
        return start + int(diff[0])
    return None if a.shape[1] == b.shape[1] else n


def check_greedy_identical(model, tokenizer, prompts, make_drafter, label, new_tokens, ks, bound=TIE_BOUND, max_ties=1):
    """Greedy speculative output (``make_drafter(k)``) against ``model``'s own greedy ``generate`` on every
    prompt, the ks taking turns over the prompts (prompt i at ``ks[i % len(ks)]``: every k is checked, each
    prompt once, which halved the real-model tests' CI time against every k on every prompt): where they
    differ, the first divergence must be a near-tie (top-2 logit gap under ``bound``), and there may be at most
    ``max_ties`` such. Returns ``(runs, gaps)``."""
    assert len(prompts) >= len(ks), "fewer prompts than ks: some k would never be checked"
    gaps, runs = [], 0
    for i, q in enumerate(prompts):
        enc = encode(tokenizer, q.text)
        base = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False)
        k = ks[i % len(ks)]
        out = model.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=make_drafter(k),
                             max_new_tokens=new_tokens, do_sample=False)
        runs += 1
        j = first_divergence(out.sequences, base, enc["input_ids"].shape[1])
        if j is not None:
            gap = top2_gap(model, base[:, :j])
            assert gap < bound, f"{label} k={k} {q.category}: divergence at new token {j} is no near-tie ({gap:.2e})"
            gaps.append(gap)
    assert len(gaps) <= max_ties, f"{label}: {len(gaps)} near-tie divergences {gaps}"
    return runs, gaps


def verify_vs_decode(model, tokenizer, prompts, n: int = 4) -> tuple[float, int, int]:
    """How differently ``model`` computes n positions in one forward (a verify forward, through hf-spec's
    verify-friendly linear layers where they apply) from n one-position forwards (plain decoding), after
    each prompt and on its own greedy continuation. Returns (largest absolute logit difference, positions
    where the greedy choice differs, positions compared)."""
    from transformers import DynamicCache

    from hf_spec.kernels import install_verify_linear, verify_linear

    if model.dtype == torch.float32:
        install_verify_linear(model)
    worst, flips, count = 0.0, 0, 0
    for q in prompts:
        ids = encode(tokenizer, q.text)["input_ids"]
        with torch.no_grad():
            block = model.generate(input_ids=ids, max_new_tokens=n, do_sample=False)[:, ids.shape[1]:]
            caches = [DynamicCache(config=model.config) for _ in range(2)]
            for cache in caches:
                model(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache})
            with verify_linear(True):
                many = model(input_ids=block, use_cache=True, logits_to_keep=block.shape[1], **{cache_kwarg(model): caches[0]}).logits[0].float()
            one = torch.stack([model(input_ids=block[:, i:i + 1], use_cache=True, **{cache_kwarg(model): caches[1]}).logits[0, -1].float()
                               for i in range(block.shape[1])])
        worst = max(worst, float((many - one).abs().max()))
        flips += int((many.argmax(-1) != one.argmax(-1)).sum())
        count += block.shape[1]
    return worst, flips, count


def top2_gap(model, prefix: torch.Tensor) -> float:
    """float32 gap between the top-1 and top-2 next-token logits after ``prefix`` (one full forward)."""
    with torch.no_grad():
        logits = model(input_ids=prefix).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2-135M's tokenizer (provisioned by scripts/setup.sh), shared by the tests that need a real one."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(hf_spec.provision("smollm2-135m"))
