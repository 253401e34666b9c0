"""Batched speculative decoding against batched plain ``generate``, for several batch sizes.

For each batch size B the first B prompts (Spec-Bench first turns, chat template, left-padded) run through
plain ``model.generate`` and through hf-spec with each drafter, interleaved repeat by repeat after a
warm-up; tokens/s is the batch's new tokens over its wall time; the speedup is the median over repeats of
the per-repeat ratio. Every speculative row is checked token-identical to the plain batched row.

    python scripts/bench_batch.py --target smollm2-135m --drafters ngram --batch-sizes 1,2,4,8,16 \
        --max-new-tokens 64 --repeats 3 --out docs/results/batch_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from datetime import date
from pathlib import Path

import torch
from tqdm import tqdm

import hf_spec
from hf_spec.loop import generated_length
from hf_spec.prompts import chat_inputs, load_questions

CATEGORIES = ["coding", "writing", "math", "qa", "translation", "extraction", "stem", "roleplay",
              "reasoning", "humanities", "math_reasoning"]


def make_drafter(spec: str, k: int):
    if spec == "ngram":
        return hf_spec.NgramDrafter(k)
    if spec.startswith("draft:"):
        draft, _ = hf_spec.load(spec[len("draft:"):], dtype=torch.bfloat16)
        return hf_spec.DraftModelDrafter(draft, k)
    raise SystemExit(f"unknown drafter {spec!r}: use ngram or draft:NAME")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--drafters", default="ngram", help="comma-separated: ngram, draft:NAME")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--batch-sizes", default="1,2,4,8,16")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", required=True, help="JSON file for the results")
    args = ap.parse_args()

    target, tok = hf_spec.load(args.target, dtype=args.dtype)
    eos = target.generation_config.eos_token_id
    drafters = {spec: make_drafter(spec, args.k) for spec in args.drafters.split(",")}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    questions = [q for q in load_questions(categories=CATEGORIES) if len(q.text) < 1500]
    # round-robin over categories so that every batch mixes kinds of prompts (and prompt lengths)
    by_cat: dict[str, list] = {}
    for q in questions:
        by_cat.setdefault(q.category, []).append(q)
    mixed = [qs[i] for i in range(max(len(v) for v in by_cat.values())) for qs in by_cat.values() if i < len(qs)]
    gen = dict(max_new_tokens=args.max_new_tokens, do_sample=False)

    warm = chat_inputs(tok, [mixed[0].text, mixed[1].text])
    target.generate(**warm, max_new_tokens=4, do_sample=False)
    for d in drafters.values():
        target.generate(**warm, max_new_tokens=4, do_sample=False, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=d)

    results = []
    bar = tqdm(total=len(sizes) * args.repeats * (1 + len(drafters)), desc="bench_batch")
    for bsz in sizes:
        inputs = chat_inputs(tok, [q.text for q in mixed[:bsz]])
        plen = inputs["input_ids"].shape[1]
        runs: dict[str, list] = {"plain": [], **{s: [] for s in drafters}}
        identical = {s: True for s in drafters}
        acceptance = {s: [] for s in drafters}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            base = target.generate(**inputs, **gen)
            dt = time.perf_counter() - t0
            base_len = [generated_length(row, eos) for row in base[:, plen:].tolist()]
            runs["plain"].append(sum(base_len) / dt)
            bar.update()
            for spec, d in drafters.items():
                out = target.generate(**inputs, **gen, custom_generate=hf_spec.generate, return_dict_in_generate=True, drafter=d)
                runs[spec].append(out.stats.num_emitted_tokens / out.stats.total_s)
                acceptance[spec].append(out.stats.acceptance_rate)
                for b, n in enumerate(base_len):
                    if out.sequences[b, plen:plen + n].tolist() != base[b, plen:plen + n].tolist():
                        identical[spec] = False
                bar.update()
        entry = {"batch_size": bsz, "prompt_tokens_max": plen, "plain_tokens_per_s": statistics.median(runs["plain"]),
                 "methods": {}}
        for spec in drafters:
            ratios = [s / p for s, p in zip(runs[spec], runs["plain"])]
            entry["methods"][spec] = {"tokens_per_s": statistics.median(runs[spec]),
                                      "speedup": statistics.median(ratios), "speedups": ratios,
                                      "acceptance_rate": statistics.median(acceptance[spec]),
                                      "identical": identical[spec]}
        results.append(entry)
        tqdm.write(json.dumps({"B": bsz, "plain": round(entry["plain_tokens_per_s"], 2),
                               **{s: (round(m["tokens_per_s"], 2), round(m["speedup"], 2), m["identical"])
                                  for s, m in entry["methods"].items()}}))
    bar.close()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    config = dict(vars(args), date=str(date.today()), commit=commit, machine=platform.processor() or platform.machine(),
                  threads=torch.get_num_threads(), torch=torch.__version__)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": config, "results": results}, indent=2))
    tmp.replace(out)
    print("| B | plain tok/s | " + " | ".join(f"{s} tok/s | speedup | acceptance" for s in drafters) + " |")
    for e in results:
        cells = [f"{e['batch_size']}", f"{e['plain_tokens_per_s']:.2f}"]
        for s in drafters:
            m = e["methods"][s]
            cells += [f"{m['tokens_per_s']:.2f}", f"{m['speedup']:.2f}x" + ("" if m["identical"] else " (differs)"),
                      f"{m['acceptance_rate']:.0%}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
