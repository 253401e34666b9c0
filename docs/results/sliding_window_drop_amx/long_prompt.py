"""Gemma-3-270M (float32; a 512-token window on 15 of its 18 layers) on long prompts: hf-spec's own cache with window
layers that drop slots out of their window (hf_spec.ragged.WINDOW_SLACK = 64, the default) against the same cache
keeping every slot (WINDOW_SLACK = 10**9: what hf-spec did before), interleaved in one process, with plain
``generate`` beside them. Prompt: Spec-Bench summarization and RAG articles joined up to LENGTH tokens.

    python docs/results/sliding_window_drop_amx/long_prompt.py [LENGTH ...]   # default 2048 4096
"""
import statistics
import sys
import time

import torch
from transformers import DynamicCache

import hf_spec
import hf_spec.ragged
from hf_spec.prompts import load_questions

NEW, ROUNDS = 96, 3
torch.manual_seed(0)
model, tok = hf_spec.load("gemma-3-270m", dtype=torch.float32)
texts = [q.text for q in load_questions(categories=["summarization", "rag"])]
ids_all = tok("\n\n".join(texts), return_tensors="pt")["input_ids"]
held = {}
forward = hf_spec.ragged.RaggedCache.forward


def size(cache) -> int:
    """Bytes of a cache's keys and values, every layer."""
    return sum(t.numel() * t.element_size() for layer in cache.layers if getattr(layer, "keys", None) is not None
               for t in (layer.keys, layer.values))


def spy(self, m, *args, **kwargs):  # the target cache's bytes between forwards (not the prompt forward's transients)
    out = forward(self, m, *args, **kwargs)
    if m is model:
        held["peak"] = max(held.get("peak", 0), size(self.cache))
    return out


hf_spec.ragged.RaggedCache.forward = spy

for length in [int(a) for a in sys.argv[1:]] or [2048, 4096]:
    ids = ids_all[:, :length]
    assert ids.shape[1] == length, ids.shape
    cache = DynamicCache(config=model.config)
    plain = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False, cache=cache)
    peaks = {"plain": size(cache)}  # what plain generate's cache holds at the end
    times = {"plain": [], "drop (64)": [], "keep all": []}
    for r in range(ROUNDS):
        for name in (["plain", "drop (64)", "keep all"] if r % 2 == 0 else ["keep all", "drop (64)", "plain"]):
            t0 = time.perf_counter()
            if name == "plain":
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
            else:
                hf_spec.ragged.WINDOW_SLACK = 64 if name == "drop (64)" else 10 ** 9
                held.clear()
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False,
                                     custom_generate=hf_spec.generate, drafter=hf_spec.SuffixDrafter(), return_dict_in_generate=True)
                peaks[name] = held["peak"]
                stats = out.stats
                out = out.sequences
            times[name].append(time.perf_counter() - t0)
            assert torch.equal(out, plain), name
    print(f"prompt {length} tokens, {NEW} new, suffix drafter, {ROUNDS} rounds (median s): "
          + ", ".join(f"{n} {statistics.median(t):.2f}" for n, t in times.items())
          + "; target cache MiB (hf-spec: the most between forwards; plain: at the end): " + ", ".join(f"{n} {p / 2**20:.1f}" for n, p in peaks.items())
          + f"; identical to plain: yes; tokens per forward {stats.mean_accepted_length:.2f}", flush=True)
