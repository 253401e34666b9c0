"""Does the suffix drafter's sampled output copy the prompt more than plain sampling's? (It must not: the output
distribution is the target's.) Summarization's first Spec-Bench prompt, Qwen2.5-Instruct's sampling settings,
R rows per batch, N new tokens: the share of each output's token 4-grams found in the prompt, per method.

Run from the repository root: python docs/results/issue21_hybrid_history/copy_check.py ROWS NEW_TOKENS BATCHES
"""
import json, statistics, sys, torch
import hf_spec
from hf_spec.models import load
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.device import resolve_dtype

rows, new, batches = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
target, tok = load("qwen2.5-coder-1.5b", dtype=resolve_dtype("auto", None))
q = load_questions(categories=["summarization"], per_category=1)[0]
enc = chat_inputs(tok, q.text)
prompt = enc["input_ids"][0].tolist()
grams = {tuple(prompt[i:i + 4]) for i in range(len(prompt) - 3)}
ids = enc["input_ids"].repeat(rows, 1)
mask = torch.ones_like(ids)
corpus = [json.loads(l)["text"] for l in open("docs/results/issue21_suffix_corpus/corpus.jsonl")]
suffix = hf_spec.SuffixDrafter(corpus=corpus, tokenizer=tok)
kw = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, max_new_tokens=new,
          min_new_tokens=new, attention_mask=mask)
shares = {"plain": [], "suffix": []}
for b in range(batches):
    for name in shares:
        torch.manual_seed(1000 * b + (name == "suffix"))
        extra = {} if name == "plain" else dict(custom_generate=hf_spec.generate, drafter=suffix,
                                                num_speculative_tokens="auto")
        out = target.generate(ids, **kw, **extra)
        out = getattr(out, "sequences", out)
        for row in out[:, ids.shape[1]:].tolist():
            g = [tuple(row[i:i + 4]) for i in range(len(row) - 3)]
            shares[name].append(sum(x in grams for x in g) / len(g))
    print(b, {k: round(statistics.mean(v), 3) for k, v in shares.items()}, flush=True)
for k, v in shares.items():
    print(k, "n", len(v), "mean", round(statistics.mean(v), 3), "sd", round(statistics.stdev(v), 3))
print(json.dumps(shares))
