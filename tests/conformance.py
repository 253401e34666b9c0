"""The conformance matrix: tiny random models of the architectures people run with speculative decoding, each
with a tiny draft of the same vocabulary (its own weights, perturbed), decoded by every drafter and checked
against the target's own ``generate``.

``tests/test_conformance.py`` runs it; ``scripts/conformance_table.py`` writes the table in
docs/conformance.md from the same cells, and the test checks that table against what it measured. The
architecture list and the tiny sizes follow transformers' own per-architecture model testers
(``tests/models/*/test_modeling_*.py``) and its ``test_assisted_decoding_matches_greedy_search``.

``HF_SPEC_TEST_DEVICE`` (default ``cpu``) and ``HF_SPEC_TEST_DTYPE`` (default ``float32``) choose where and in
which dtype the models run (``scripts/gpu_check.py`` runs the matrix on CUDA in bfloat16 and float32). A
greedy output that differs from ``generate`` counts as exact only where its first divergence is a float near-tie
(the target's top-2 logit gap there under ``hf_spec.kernels.NEAR_TIE_BOUNDS`` of the dtype).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import transformers as tf

import hf_spec
from hf_spec.kernels import NEAR_TIE_BOUNDS

DEVICE = torch.device(os.environ.get("HF_SPEC_TEST_DEVICE", "cpu"))
DTYPE = getattr(torch, os.environ.get("HF_SPEC_TEST_DTYPE", "float32"))
VOCAB = 64
PAD = 1
#: the sliding window of the sliding-window architectures: prompts + NEW_TOKENS pass it
WINDOW = 8
NEW_TOKENS = 20
#: the processors a shipped instruct generation_config turns on, greedy part (sampling is tested separately)
INSTRUCT_GREEDY = dict(repetition_penalty=1.1)
DRAFTERS = ("ngram", "draft model", "hybrid", "medusa")
#: the tree column: every drafter that drafts trees, at k = 3, each of these tree sizes (num_tree_nodes), single
#: prompt and the batch of 3, greedy, NEW_TOKENS new tokens (a tree's nodes straddle the sliding window's edge)
TREE_DRAFTERS = ("draft model", "medusa", "suffix", "hybrid")
TREE_NODES = (4, 16, "auto")
TREE_COLUMN = "trees"
BATCHES = ("single", "batch of 3")
#: the draft model of each architecture: the target's weights plus this much noise (acceptance 30-70% here)
DRAFT_NOISE = 0.005
#: (k, extra generate kwargs) per greedy run of a cell: k = 1, 3, auto, and k = 3 with a repetition penalty
RUNS = ((1, {}), (3, {}), ("auto", {}), (3, INSTRUCT_GREEDY))
PROMPT = [0, 5, 9, 5, 9, 5, 3, 7, 11, 5, 9]
BATCH = [[5, 9, 5, 3], [0, 7, 3, 7, 3, 7, 3, 7, 3, 7, 3], [0, 4, 4, 9, 12, 4, 4, 9, 12]]  # left-padded to one width

_COMMON = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=None, pad_token_id=PAD)
_LLAMA_LIKE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, **_COMMON)


#: a sliding-window layer, then a full-attention one (Gemma 2/3, GPT-OSS, Ministral, Cohere2)
_HYBRID = ["sliding_attention", "full_attention"]


def _gemma3n(num_hidden_layers: int, num_kv_shared_layers: int):
    """A tiny Gemma 3n text config: AltUp with 2 streams, per-layer inputs, alternating sliding and full layers."""
    llama_like = {k: v for k, v in _LLAMA_LIKE.items() if k not in ("intermediate_size", "num_hidden_layers")}
    return tf.Gemma3nTextConfig(head_dim=8, sliding_window=WINDOW, layer_types=_HYBRID * (num_hidden_layers // 2),
                                num_hidden_layers=num_hidden_layers, num_kv_shared_layers=num_kv_shared_layers,
                                altup_num_inputs=2, laurel_rank=4, hidden_size_per_layer_input=8,
                                vocab_size_per_layer_input=VOCAB, intermediate_size=[64] * num_hidden_layers,
                                activation_sparsity_pattern=[0.0] * num_hidden_layers, **llama_like)


def _gemma4(num_kv_shared_layers: int = 2, **kwargs):
    """A tiny Gemma 4 text config of 4 layers (sliding, full, sliding, full): a heterogeneous config (its full layers
    have a head size of their own), per-layer inputs, the last ``num_kv_shared_layers`` layers reusing keys and
    values."""
    llama_like = {k: v for k, v in _LLAMA_LIKE.items() if k != "num_hidden_layers"}
    return tf.Gemma4TextConfig(head_dim=8, sliding_window=WINDOW, layer_types=_HYBRID * 2, num_hidden_layers=4,
                               num_kv_shared_layers=num_kv_shared_layers, hidden_size_per_layer_input=8,
                               vocab_size_per_layer_input=VOCAB, **llama_like, **kwargs)


def _dory(mode: str):
    """A tiny Dory config: an input layer, 2 recurrent layers looped twice, an output layer; ``mode``: its
    ``recurrent_kv_cache_mode``."""
    llama_like = {k: v for k, v in _LLAMA_LIKE.items() if k != "num_hidden_layers"}
    return tf.DoryConfig(head_dim=8, sliding_window=WINDOW, num_hidden_layers=4, n_input_layers=1, n_output_layers=1,
                         n_recurrent_loops=2, recurrent_kv_cache_mode=mode, **llama_like)


@dataclass(frozen=True)
class Arch:
    """One architecture of the matrix: a name, how to build its tiny config, its model class."""

    name: str
    config: Callable[[], tf.PretrainedConfig]
    model: type
    note: str = ""
    #: logit rows of the target when its vocabulary is padded past the tokenizer's VOCAB tokens
    target_rows: int | None = None
    #: for an architecture hf-spec refuses: what the refusal must say
    refusal: str = ""
    #: for one hf-spec decodes one sequence at a time, as chains only: what its refusal of batches and trees must say
    batch_refusal: str = ""

    def refused(self, batch: str, kind: str) -> str:
        """What the refusal of this cell must say; "" for a cell that must be exact."""
        return self.refusal or (self.batch_refusal if batch != "single" or kind == TREE_COLUMN else "")


ARCHITECTURES = [
    Arch("Llama", lambda: tf.LlamaConfig(**_LLAMA_LIKE), tf.LlamaForCausalLM),
    Arch("Mistral (sliding window)", lambda: tf.MistralConfig(sliding_window=WINDOW, **_LLAMA_LIKE),
         tf.MistralForCausalLM, f"window {WINDOW}, passed"),
    Arch("Qwen2", lambda: tf.Qwen2Config(**_LLAMA_LIKE), tf.Qwen2ForCausalLM),
    Arch("Qwen3", lambda: tf.Qwen3Config(head_dim=8, **_LLAMA_LIKE), tf.Qwen3ForCausalLM),
    Arch("Gemma 2", lambda: tf.Gemma2Config(head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=8,
                                            layer_types=["sliding_attention", "full_attention"], **_LLAMA_LIKE),
         tf.Gemma2ForCausalLM, f"hybrid, window {WINDOW}, softcapping"),
    Arch("Gemma 3", lambda: tf.Gemma3TextConfig(head_dim=8, sliding_window=WINDOW, query_pre_attn_scalar=8,
                                                layer_types=["sliding_attention", "full_attention"], **_LLAMA_LIKE),
         tf.Gemma3ForCausalLM, f"hybrid, window {WINDOW}"),
    Arch("Phi-3", lambda: tf.Phi3Config(**_LLAMA_LIKE), tf.Phi3ForCausalLM),
    Arch("GPT-2", lambda: tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=256, **_COMMON),
         tf.GPT2LMHeadModel, "learned positions"),
    Arch("GPT-NeoX", lambda: tf.GPTNeoXConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, max_position_embeddings=256, **_COMMON),
         tf.GPTNeoXForCausalLM, "partial rotary"),
    Arch("OLMo-2", lambda: tf.Olmo2Config(**_LLAMA_LIKE), tf.Olmo2ForCausalLM),
    Arch("Granite", lambda: tf.GraniteConfig(embedding_multiplier=2.0, logits_scaling=4.0, residual_multiplier=0.5,
                                             attention_multiplier=0.25, **_LLAMA_LIKE), tf.GraniteForCausalLM),
    Arch("Mixtral (MoE)", lambda: tf.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **_LLAMA_LIKE),
         tf.MixtralForCausalLM, "4 experts, top-2"),
    Arch("Llama 4 text (chunked attention)",
         lambda: tf.Llama4TextConfig(head_dim=8, attention_chunk_size=WINDOW, num_local_experts=2,
                                     intermediate_size_mlp=64, **_LLAMA_LIKE),
         tf.Llama4ForCausalLM, f"chunks of {WINDOW}, MoE", refusal="chunked_attention"),
    Arch("Qwen3-Next (linear attention)",
         lambda: tf.Qwen3NextConfig(head_dim=8, linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8,
                                    linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1,
                                    moe_intermediate_size=32, shared_expert_intermediate_size=32,
                                    **{**_LLAMA_LIKE, "num_hidden_layers": 4}),
         tf.Qwen3NextForCausalLM, "3 gated delta-net layers, 1 full", refusal="LinearAttentionLayer"),
    Arch("GPT-Neo (local attention)",
         lambda: tf.GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                                 window_size=WINDOW, max_position_embeddings=256, **_COMMON),
         tf.GPTNeoForCausalLM, f"local window of {WINDOW} cache slots, passed",
         batch_refusal=f"window of {WINDOW} cache slots"),
    Arch("Doge (dynamic mask)", lambda: tf.DogeConfig(keep_window_size=WINDOW, **_LLAMA_LIKE), tf.DogeForCausalLM,
         f"keeps the top {WINDOW} keys, passed", refusal=f"keep_window_size={WINDOW}"),
    Arch("Qwen2, padded vocabulary", lambda: tf.Qwen2Config(**_LLAMA_LIKE), tf.Qwen2ForCausalLM,
         f"target {VOCAB + 8} logit rows, draft {VOCAB}", target_rows=VOCAB + 8),
    Arch("GPT-OSS", lambda: tf.GptOssConfig(head_dim=8, sliding_window=WINDOW, layer_types=_HYBRID, num_local_experts=4,
                                            num_experts_per_tok=2, **_LLAMA_LIKE), tf.GptOssForCausalLM,
         f"attention sinks, hybrid, window {WINDOW}, MoE"),
    Arch("DeepSeek-V3 (MLA)",
         lambda: tf.DeepseekV3Config(kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                     v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                     first_k_dense_replace=1, n_group=1, topk_group=1,
                                     **{**_LLAMA_LIKE, "num_key_value_heads": 4}),
         tf.DeepseekV3ForCausalLM, "latent keys and values cached, MoE"),
    Arch("Ministral", lambda: tf.MinistralConfig(head_dim=8, sliding_window=WINDOW, layer_types=_HYBRID, **_LLAMA_LIKE),
         tf.MinistralForCausalLM, f"hybrid, window {WINDOW}"),
    Arch("Cohere2", lambda: tf.Cohere2Config(sliding_window=WINDOW, layer_types=_HYBRID, **_LLAMA_LIKE),
         tf.Cohere2ForCausalLM, f"hybrid, window {WINDOW}, parallel blocks"),
    Arch("SmolLM3", lambda: tf.SmolLM3Config(no_rope_layers=[1, 0], **_LLAMA_LIKE), tf.SmolLM3ForCausalLM,
         "a layer without rotary positions"),
    Arch("Phi", lambda: tf.PhiConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     partial_rotary_factor=0.5, max_position_embeddings=256, **_COMMON),
         tf.PhiForCausalLM, "partial rotary, biases"),
    Arch("OPT", lambda: tf.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                                     word_embed_proj_dim=32, max_position_embeddings=256, **_COMMON),
         tf.OPTForCausalLM, "learned positions, offset 2"),
    Arch("Gemma 3n (AltUp)", lambda: _gemma3n(num_hidden_layers=2, num_kv_shared_layers=0), tf.Gemma3nForCausalLM,
         f"AltUp streams, per-layer inputs, hybrid, window {WINDOW}"),
    Arch("Gemma 3n (shared keys and values)", lambda: _gemma3n(num_hidden_layers=4, num_kv_shared_layers=2),
         tf.Gemma3nForCausalLM, "the last 2 of 4 layers reuse earlier layers' keys and values, as released"),
    Arch("Gemma 4 (shared keys and values)", lambda: _gemma4(use_double_wide_mlp=True), tf.Gemma4ForCausalLM,
         "head sizes per layer, per-layer inputs, the last 2 of 4 layers reuse keys and values, hybrid, "
         f"window {WINDOW}"),
    Arch("Gemma 4 (MoE, keys as values)", lambda: _gemma4(num_kv_shared_layers=0, attention_k_eq_v=True,
                                                         enable_moe_block=True, num_experts=4, top_k_experts=2,
                                                         moe_intermediate_size=32),
         tf.Gemma4ForCausalLM, f"head sizes per layer, MoE, hybrid, window {WINDOW}"),
    Arch("Dory (looped layers)", lambda: _dory("per_loop"), tf.DoryForCausalLM,
         f"2 recurrent loops, a cache per loop, hybrid, window {WINDOW}"),
    Arch("Dory (last loop's cache only)", lambda: _dory("last_loop"), tf.DoryForCausalLM,
         "earlier loops read the last loop's keys", refusal="recurrent_kv_cache_mode='last_loop'"),
    Arch("LFM2 (short convolutions)", lambda: tf.Lfm2Config(layer_types=["conv", "full_attention"], **_LLAMA_LIKE),
         tf.Lfm2ForCausalLM, "a convolution layer", refusal="recurrent state"),
]


class SameTokenizer:
    """A stand-in for the tokenizer target and draft share (VOCAB tokens): what DraftModelDrafter compares when
    their logit rows differ."""

    name_or_path = "conformance"

    def get_vocab(self):
        return {f"t{i}": i for i in range(VOCAB)}

    def __len__(self):
        return VOCAB


def build(arch: Arch, seed: int = 0, noise: float = 0.0, vocab: int | None = None):
    """A tiny random model of ``arch`` in eval mode on DEVICE/DTYPE; ``noise`` perturbs every weight (a draft
    that mostly agrees); ``vocab`` pads the embedding and logit rows (a padded-vocabulary target)."""
    torch.manual_seed(seed)
    config = arch.config()
    model = arch.model(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0).add_(noise * torch.randn_like(p))  # sharper than the default init: fewer near-ties
    if vocab is not None:  # padded logit rows past the tokenizer's, as one family's larger checkpoints have
        model.resize_token_embeddings(vocab, mean_resizing=False)
    model.generation_config.pad_token_id = PAD
    model.generation_config.eos_token_id = None
    return model.to(device=DEVICE, dtype=DTYPE)


def batch_inputs():
    width = max(map(len, BATCH))
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in BATCH], device=DEVICE)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in BATCH], device=DEVICE)
    return dict(input_ids=ids, attention_mask=mask)


def make_drafter(kind: str, target, draft, k):
    fixed = None if k == "auto" else k
    if kind == "ngram":
        return hf_spec.NgramDrafter(fixed or 3)
    if kind == "suffix":
        return hf_spec.SuffixDrafter(fixed or 3)
    if kind in ("draft model", "hybrid"):
        tok = SameTokenizer() if hf_spec.drafters.base.logit_rows(target) != hf_spec.drafters.base.logit_rows(draft) else None
        model = hf_spec.DraftModelDrafter(draft, fixed or 3, tokenizer=tok, draft_tokenizer=tok)
        # hybrid: suffix matches of the prompts' repeats and the draft model, chosen per row and step
        return model if kind == "draft model" else hf_spec.HybridDrafter(model, num_speculative_tokens=fixed)
    from hf_spec.medusa import MedusaConfig, MedusaHeads
    torch.manual_seed(1)
    hidden = target.config.get_text_config().hidden_size
    heads = MedusaHeads(MedusaConfig(3, 1, hidden, hf_spec.drafters.base.logit_rows(target), "shared-lm-head"))
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.3)
    return hf_spec.MedusaDrafter(heads.eval().to(device=DEVICE, dtype=DTYPE).bind(target), fixed or 3)


def top2_gap(model, prefix: torch.Tensor) -> float:
    """The target's top-1/top-2 logit gap after ``prefix`` (one row, no padding)."""
    with torch.no_grad():
        logits = model(input_ids=prefix).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def compare(model, ref: torch.Tensor, out: torch.Tensor, mask: torch.Tensor | None, start: int) -> str:
    """"exact", "exact (near-tie)" or "DIFFERENT at row r, new token j (gap g)" for two greedy outputs."""
    if out.tolist() == ref.tolist():
        return "exact"
    for r in range(ref.shape[0]):
        if out[r].tolist() == ref[r].tolist():
            continue
        diff = (out[r, start:] != ref[r, start:]).nonzero()
        j = start + int(diff[0]) if diff.numel() else start
        prefix = ref[r:r + 1, :j]
        if mask is not None:
            prefix = prefix[:, mask[r].bool().tolist().index(True):]  # drop the row's left padding
        gap = top2_gap(model, prefix)
        if gap >= NEAR_TIE_BOUNDS[str(DTYPE).removeprefix("torch.")]:
            return f"DIFFERENT at row {r}, new token {j - start} (top-2 gap {gap:.2e})"
    return "exact (near-tie)"


@dataclass
class Cell:
    """One (architecture, drafter, batch) cell: its verdict and the draft tokens proposed/accepted over RUNS."""

    verdict: str
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def _inputs(batched: bool) -> dict:
    return batch_inputs() if batched else dict(input_ids=torch.tensor([PROMPT], device=DEVICE))


def _tally(cell: Cell, target, inputs: dict, ref, out, where: str) -> Cell | None:
    """Count one run's drafted and accepted tokens into ``cell`` and compare its output with ``ref`` (the target's
    own ``generate``): the failed cell where it differs, else ``None`` (``cell`` keeps a near-tie verdict)."""
    cell.drafted += out.stats.num_draft_tokens
    cell.accepted += out.stats.num_accepted_tokens
    verdict = compare(target, ref, out.sequences, inputs.get("attention_mask"), inputs["input_ids"].shape[1])
    if verdict.startswith("DIFFERENT"):
        return Cell(f"{verdict} ({where})")
    if verdict != "exact":
        cell.verdict = verdict
    return None


def run_cell(target, draft, kind: str, batched: bool) -> Cell:
    """Every run of RUNS for one (drafter, batch) cell: "exact", or the first failure or refusal."""
    inputs = _inputs(batched)
    cell = Cell("exact")
    for k, extra in RUNS:
        try:
            out = target.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, **extra,
                                  custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=make_drafter(kind, target, draft, k),
                                  num_speculative_tokens=k)
        except ValueError as e:
            return Cell(f"refused: {e}")
        ref = target.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, **extra)
        failed = _tally(cell, target, inputs, ref, out, f"k={k}, {extra or 'no processors'}")
        if failed:
            return failed
    return cell


def run_tree_cell(target, draft) -> Cell:
    """The tree column: every TREE_DRAFTERS x TREE_NODES x batch run greedy with ``num_tree_nodes``, each compared
    with ``generate``: "exact", or the first failure or refusal."""
    cell = Cell("exact")
    for batched in (False, True):
        inputs = _inputs(batched)
        ref = target.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
        for kind in TREE_DRAFTERS:
            for nodes in TREE_NODES:
                try:
                    out = target.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False,
                                          custom_generate=hf_spec.generate, return_dict_in_generate=True,
                                          drafter=make_drafter(kind, target, draft, 3), num_tree_nodes=nodes)
                except ValueError as e:
                    return Cell(f"refused: {e}")
                failed = _tally(cell, target, inputs, ref, out,
                                f"{kind}, num_tree_nodes={nodes}, {'batch' if batched else 'single'}")
                if failed:
                    return failed
    return cell


def run_architecture(arch: Arch) -> dict[tuple[str, str], Cell]:
    """All cells of one architecture: {(drafter, "single" | "batch of 3"): Cell}, and the tree column's
    {(TREE_COLUMN, "all"): Cell}."""
    target, draft = build(arch, vocab=arch.target_rows), build(arch, noise=DRAFT_NOISE)
    cells = {(kind, batch): run_cell(target, draft, kind, batch == "batch of 3")
             for kind in DRAFTERS for batch in BATCHES}
    cells[(TREE_COLUMN, "all")] = run_tree_cell(target, draft)
    return cells


# ---- sampling ----------------------------------------------------------------------------------------------
#: a shipped instruct generation_config's sampling (Qwen2.5-Instruct's: temperature 0.7, top-p 0.8, top-k 20,
#: repetition penalty 1.05)
INSTRUCT_SAMPLING = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
SAMPLED_TOKENS = 2  # counted; one more is generated so that the first speculative step drafts k=2 of them


def instruct_processors():
    """The processors transformers builds for INSTRUCT_SAMPLING, in its order."""
    from transformers.generation import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                                         TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
    return LogitsProcessorList([RepetitionPenaltyLogitsProcessor(INSTRUCT_SAMPLING["repetition_penalty"]),
                                TemperatureLogitsWarper(INSTRUCT_SAMPLING["temperature"]),
                                TopKLogitsWarper(INSTRUCT_SAMPLING["top_k"]), TopPLogitsWarper(INSTRUCT_SAMPLING["top_p"])])


@torch.no_grad()
def exact_distribution(model) -> dict[tuple[int, ...], float]:
    """P(first SAMPLED_TOKENS new tokens | PROMPT) under the processed target distribution, by enumerating the
    tokens of non-zero probability."""
    procs = instruct_processors()

    def step(prefix):
        logits = model(input_ids=prefix).logits[:, -1].float()
        return procs(prefix, logits).softmax(-1)[0]

    dist = {(): 1.0}
    for _ in range(SAMPLED_TOKENS):
        nxt = {}
        for seq, p in dist.items():
            probs = step(torch.tensor([PROMPT + list(seq)], device=DEVICE))
            for t in probs.nonzero().flatten().tolist():
                nxt[seq + (t,)] = p * float(probs[t])
        dist = nxt
    return dist


def sampled_counts(target, drafter, runs: int, seed: int = 0) -> dict[tuple[int, ...], int]:
    """Counts of the first SAMPLED_TOKENS tokens over ``runs`` rows of one batched ``generate`` call with
    INSTRUCT_SAMPLING (every row is PROMPT: independent samples)."""
    torch.manual_seed(seed)
    ids = torch.tensor([PROMPT] * runs, device=DEVICE)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=SAMPLED_TOKENS + 1,
                          custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=drafter, num_speculative_tokens=2,
                          **INSTRUCT_SAMPLING)
    counts: dict[tuple[int, ...], int] = {}
    for row in out.sequences[:, len(PROMPT):len(PROMPT) + SAMPLED_TOKENS].tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    return counts
