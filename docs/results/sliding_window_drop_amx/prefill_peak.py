"""The largest KV cache hf-spec's own cache stores at any layer's update (the prompt's forward included) for
Gemma-3-270M on a 4,096-token prompt: window layers that drop slots out of their window (WINDOW_SLACK = 64) against
keeping every slot (10**9). Output (2026-12-06, AMX Xeon): 41.0 MiB and 144.1 MiB.

    python docs/results/sliding_window_drop_amx/prefill_peak.py
"""
import torch, hf_spec, hf_spec.ragged as R
from transformers.cache_utils import DynamicLayer
from hf_spec.prompts import load_questions
model, tok = hf_spec.load("gemma-3-270m", dtype=torch.float32)
texts = [q.text for q in load_questions(categories=["summarization", "rag"])]
ids = tok("\n\n".join(texts), return_tensors="pt")["input_ids"][:, :4096]
caches = []
orig_init = R.RaggedCache.__init__
def init(self, *a, **k):
    orig_init(self, *a, **k); caches.append(self)
R.RaggedCache.__init__ = init
peak = {"v": 0}
orig = DynamicLayer.update
def upd(self, *a, **k):
    out = orig(self, *a, **k)
    for c in caches:
        size = sum(t.numel() * t.element_size() for l in c.cache.layers if getattr(l, "keys", None) is not None for t in (l.keys, l.values))
        peak["v"] = max(peak["v"], size)
    return out
DynamicLayer.update = upd
for slack in (64, 10**9):
    R.WINDOW_SLACK = slack; caches.clear(); peak["v"] = 0
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, custom_generate=hf_spec.generate, drafter=hf_spec.SuffixDrafter())
    print(slack, "largest stored cache inside any forward MiB", round(peak["v"] / 2**20, 1))
