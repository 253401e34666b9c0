"""Second chat turns from the first turn's cache, with the draft model's cache carried over from the first turn (the
default since the draft cache rides on the target's cache object) and without it (the draft re-prefilled with the
whole conversation, as before), and without any cache; Qwen2.5-Coder-1.5B target, -k auto. Time to the first token
and total time, interleaved (the order turned every round), medians of 3 rounds; each turn's tokens compared with
plain generate continuing from the same cache. Usage: python turn2.py [drafter spec] [dtype] [long]"""
import copy
import json
import statistics
import sys
import time

import torch

import hf_spec
from hf_spec.drafters.registry import make_drafter
from hf_spec.loop import CARRIED

SPEC = sys.argv[1] if len(sys.argv) > 1 else "draft:qwen2.5-coder-0.5b"
DTYPE = sys.argv[2] if len(sys.argv) > 2 else "auto"
CHATS = [("Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
          "Now add type hints and a check that n is not negative."),
         ("Explain what a Python generator is, with a short example.", "How does it differ from a list comprehension?"),
         ("Summarize the rules of tic-tac-toe in five sentences.", "Now write a function that checks for a winner.")]
if len(sys.argv) > 3 and sys.argv[3] == "long":  # a long first turn: Spec-Bench's two RAG prompts (~700 tokens each)
    from hf_spec.prompts import load_questions

    CHATS = [(q.text, "Now answer again in one sentence, and say which passage you used.")
             for q in load_questions(per_category=2) if q.category == "rag"]
NAMES = ("draft cache carried", "draft re-prefilled", "no cache")

target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype=DTYPE)
drafter = make_drafter(SPEC, target=target, tokenizer=tok)
spec = dict(custom_generate=hf_spec.generate, drafter=drafter, num_speculative_tokens="auto",
            return_dict_in_generate=True, do_sample=False)
rows = []
for first, second in CHATS:
    messages = [{"role": "user", "content": first}]
    ids1 = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    out1 = target.generate(ids1, attention_mask=torch.ones_like(ids1), max_new_tokens=128, **spec)
    assert getattr(out1.cache, CARRIED, None) is not None
    reply = tok.decode(out1.sequences[0, ids1.shape[1]:], skip_special_tokens=True)
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": second}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    cached = out1.cache.get_seq_length()
    shared = next((i for i, (a, b) in enumerate(zip(out1.sequences[0, :cached].tolist(), ids[0].tolist())) if a != b),
                  min(cached, ids.shape[1] - 1))
    if shared < cached:
        out1.cache.crop(shared - cached)
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=64)
    plain = target.generate(ids, cache=copy.deepcopy(out1.cache), do_sample=False, **kw)
    times = {name: [] for name in NAMES}
    for r in range(3):
        for name in NAMES[r:] + NAMES[:r]:
            extra = {}
            if name != "no cache":
                extra["cache"] = copy.deepcopy(out1.cache)
                if name == "draft re-prefilled":
                    delattr(extra["cache"], CARRIED)
            t0 = time.perf_counter()
            out = target.generate(ids, **kw, **extra, **spec)
            total = time.perf_counter() - t0
            times[name].append((out.stats.mean_ttft_s, total, out.sequences[0, ids.shape[1]:].tolist()))
    row = {"prompt_tokens": ids.shape[1], "cached_tokens": shared}
    for name, runs in times.items():
        row[name] = {"ttft_s": statistics.median(r[0] for r in runs), "total_s": statistics.median(r[1] for r in runs),
                     "identical_to_plain_continuation": all(r[2] == plain[0, ids.shape[1]:].tolist() for r in runs)}
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump({"drafter": SPEC, "dtype": str(target.dtype), "rows": rows}, open(f"turn2_{SPEC.replace(':', '_')}{'_long' if sys.argv[3:] == ['long'] else ''}.json", "w"),
          indent=1)
