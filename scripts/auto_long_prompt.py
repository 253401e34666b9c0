"""-k auto on a long prompt with a short answer: plain decoding, auto, and auto without the catch-up check.

A draft model prefills the whole prompt at its first draft. ``AdaptiveK.catch_up_pays`` keeps speculation off
where the tokens left before ``max_length`` cannot repay that; "auto, no check" replaces it with one that
always says yes (the controller before issue 21). The three run interleaved, ``--repeat`` rounds, for each
``--max-new-tokens``, in one process (models loaded once, one warm-up call each); reported: median wall time
of the whole call (prefill included), speedup over plain, new tokens, and whether the outputs are identical.

    python scripts/auto_long_prompt.py --question 481 --max-new-tokens 16,128 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import hf_spec
from hf_spec.adaptive import AdaptiveK
from hf_spec.prompts import SPECBENCH_PATH


class NoCheck(AdaptiveK):
    """AdaptiveK as it was before the catch-up check."""

    def catch_up_pays(self, k, catch_up_s, remaining_tokens):
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--questions", default=str(SPECBENCH_PATH))
    parser.add_argument("--question", type=int, default=481, help="question_id (481: the first Spec-Bench rag one)")
    parser.add_argument("--max-new-tokens", default="16,128")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    question = next(q for q in map(json.loads, Path(args.questions).read_text().splitlines())
                    if q["question_id"] == args.question)
    target, tokenizer = hf_spec.load(args.target, dtype=args.dtype)
    drafter = hf_spec.DraftModelDrafter.from_spec(args.draft, target=target, tokenizer=tokenizer)
    text = tokenizer.apply_chat_template([{"role": "user", "content": question["turns"][0]}], tokenize=False,
                                         add_generation_prompt=True)
    inputs = tokenizer(text, return_tensors="pt")
    methods = {"plain": None, "auto": "auto", "auto, no check": NoCheck()}

    def run(method, n):
        kw = {} if methods[method] is None else {"drafter": drafter, "num_speculative_tokens": methods[method]}
        t = time.perf_counter()
        out = target.generate(**inputs, custom_generate=hf_spec.generate, do_sample=False, max_new_tokens=n,
                              return_dict_in_generate=True, **kw)
        return time.perf_counter() - t, out

    print(f"{hf_spec.device.machine_info()}; question {args.question} ({question['category']}), "
          f"{inputs['input_ids'].shape[1]} prompt tokens; {args.target} {args.dtype}, draft {args.draft} "
          f"{drafter.draft_model.dtype}")
    for m in methods:
        run(m, 4)  # warm-up
    for n in map(int, args.max_new_tokens.split(",")):
        times, outputs, policy = {m: [] for m in methods}, {m: set() for m in methods}, {}
        for _ in range(args.repeat):
            for m in methods:
                seconds, out = run(m, n)
                times[m].append(seconds)
                outputs[m].add(tuple(out.sequences[0].tolist()))
                if out.stats is not None:
                    policy[m] = (out.stats.k_per_step, [e["reason"] for e in out.stats.policy_events])
        plain = statistics.median(times["plain"])
        new = len(next(iter(outputs["plain"]))) - inputs["input_ids"].shape[1]
        print(f"\nmax_new_tokens {n} ({new} new tokens)")
        print("| method | median s (runs) | speedup | identical |")
        print("|---|---|---|---|")
        for m in methods:
            t = statistics.median(times[m])
            print(f"| {m} | {t:.1f} ({', '.join(f'{x:.1f}' for x in times[m])}) | {plain / t:.2f}x | "
                  f"{outputs[m] == outputs['plain']} |")
        for m, (ks, reasons) in policy.items():
            print(f"{m}: k per step {ks}; policy {reasons}")


if __name__ == "__main__":
    main()
