"""The seed's table on one GPU for an AWQ-INT4 target: TTFT, TPOT and total time for N new tokens with no
speculation, a draft model, Medusa heads and n-gram lookup, batch size 1, greedy; every speculative output
checked token-identical to plain decoding. Sized for about 10 minutes on one H200 with the defaults.

The AWQ checkpoint is made beforehand on a CPU (``hf-spec quantize --target qwen2.5-coder-1.5b --out DIR``)
and carried to the GPU machine with the draft model's and the Medusa heads' folders:

    python scripts/gpu_check.py --target DIR --draft qwen2.5-coder-0.5b --medusa ~/.cache/hf_spec/medusa/qwen2.5-coder-1.5b

Prints the table last (also written to ``--out``/results.json and results.md). Exits 0 with a message when
no CUDA device is present (CI has none).
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="AWQ-INT4 checkpoint folder (or any target)")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model name or folder ('' to leave out)")
    p.add_argument("--medusa", default="", help="Medusa heads folder for the target ('' to leave out)")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--per-category", type=int, default=1, help="Spec-Bench prompts per category (13 categories)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--device", default="cuda", help="cuda (default); cpu to try the script on a small target")
    p.add_argument("--out", default="gpu-check")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to do (run it on a GPU machine)")
        return 0

    import hf_spec
    from hf_spec.bench import Method, markdown_table, run_bench, summarize, write_report
    from hf_spec.device import machine_info
    from hf_spec.prompts import load_questions

    dtype = getattr(torch, args.dtype)
    target, tok = hf_spec.load(args.target, dtype=dtype, device_map=args.device)
    methods = [Method("baseline", "baseline")]
    if args.draft:
        methods.append(Method(f"draft:{args.draft}", "hf-spec", args.k, f"draft:{args.draft}"))
    if args.medusa:
        methods.append(Method(f"medusa:{args.medusa}", "hf-spec", args.k, f"medusa:{args.medusa}"))
    methods.append(Method("ngram", "hf-spec", args.k, "ngram"))
    questions = load_questions(per_category=args.per_category)
    raw = run_bench(target, tok, methods, questions, max_new_tokens=args.max_new_tokens, draft_dtype=dtype)
    summary = summarize(raw, methods, greedy=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    config = dict(machine_info(), target=args.target, device=name, k=args.k, max_new_tokens=args.max_new_tokens,
                  num_prompts=len(questions), dtype=args.dtype, command="python scripts/gpu_check.py " + " ".join(sys.argv[1:]))
    write_report(args.out, config, summary, raw)
    print(f"{args.target} on {name}, {args.dtype}, k={args.k}, {len(questions)} prompts x {args.max_new_tokens} new tokens, batch 1")
    print(markdown_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
