"""Side-by-side measurement of hf-spec against plain decoding and transformers' own assisted generation
on a few Spec-Bench prompts (greedy). A small precursor of the benchmark harness; methods are
interleaved prompt by prompt after a warm-up, and every output is compared with plain greedy.

    python scripts/measure_core.py --target qwen2.5-coder-1.5b --draft qwen2.5-coder-0.5b \
        --categories coding,qa,summarization,math_reasoning --per-category 1 --max-new-tokens 64 -k 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import hf_spec
from hf_spec.prompts import chat_inputs, load_questions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--categories", default="coding,qa,summarization,math_reasoning")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()

    target, tok = hf_spec.load(args.target, dtype=args.dtype)
    draft32, _ = hf_spec.load(args.draft, dtype=args.dtype)
    draft16, _ = hf_spec.load(args.draft, dtype="bfloat16")
    k = args.k
    methods = {
        "plain": dict(),
        f"hf-spec draft(bf16) k={k}": dict(custom_generate=hf_spec.generate, drafter=hf_spec.DraftModelDrafter(draft16, k)),
        f"hf-spec draft(fp32) k={k}": dict(custom_generate=hf_spec.generate, drafter=hf_spec.DraftModelDrafter(draft32, k)),
        f"hf-spec ngram k={k}": dict(custom_generate=hf_spec.generate, drafter=hf_spec.NgramDrafter(k)),
        f"hf-assisted(fp32) k={k}": dict(assistant_model=draft32, num_assistant_tokens=k,
                                         num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0),
        f"hf-prompt-lookup k={k}": dict(prompt_lookup_num_tokens=k),
    }
    questions = load_questions(categories=args.categories.split(","), per_category=args.per_category)
    warm = chat_inputs(tok, "Hello")
    for kw in methods.values():
        target.generate(**warm, max_new_tokens=4, do_sample=False, **kw)

    rows = []
    for q in questions:
        enc = chat_inputs(tok, q.text)
        L = enc["input_ids"].shape[1]
        base = None
        for name, kw in methods.items():
            t0 = time.perf_counter()
            out = target.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False, **kw)
            dt = time.perf_counter() - t0
            seq = out if torch.is_tensor(out) else out.sequences
            stats = getattr(out, "stats", None)
            if name == "plain":
                base = seq
            row = dict(category=q.category, question_id=q.question_id, method=name, prompt_tokens=L,
                       new_tokens=seq.shape[1] - L, seconds=dt, tokens_per_s=(seq.shape[1] - L) / dt,
                       identical=bool(torch.equal(seq, base)),
                       acceptance_rate=stats.acceptance_rate if stats else None,
                       mean_accepted_length=stats.mean_accepted_length if stats else None)
            rows.append(row)
            print(json.dumps(row), flush=True)

    print(f"\n| method | median speedup | tokens/s (all) | acceptance | mean accepted | identical |")
    print("|---|---|---|---|---|---|")
    for name in methods:
        mine = [r for r in rows if r["method"] == name]
        base = {r["question_id"]: r for r in rows if r["method"] == "plain"}
        ratios = [r["tokens_per_s"] / base[r["question_id"]]["tokens_per_s"] for r in mine]
        tps = sum(r["new_tokens"] for r in mine) / sum(r["seconds"] for r in mine)
        acc = [r["acceptance_rate"] for r in mine if r["acceptance_rate"] is not None]
        mal = [r["mean_accepted_length"] for r in mine if r["mean_accepted_length"] is not None]
        print(f"| {name} | {statistics.median(ratios):.2f}x | {tps:.2f} | "
              f"{(statistics.mean(acc) if acc else float('nan')):.1%} | "
              f"{(statistics.mean(mal) if mal else float('nan')):.2f} | "
              f"{sum(r['identical'] for r in mine)}/{len(mine)} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"config": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
