"""The ``hf-spec`` command.

``hf-spec generate``: speculative generation on one prompt (or a file of prompts), optionally compared
side by side with plain ``model.generate`` in the same process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["main", "build_parser"]


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate with a drafter (and compare with plain decoding)")
    p.add_argument("--target", required=True, help="target model: short name (smollm2-135m, qwen2.5-coder-1.5b, ...), folder or hub name")
    p.add_argument("--drafter", default="ngram", help="none | ngram | draft:MODEL (default: ngram)")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=5, dest="k", help="tokens drafted per step (default 5)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily; > 0 samples")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="compute dtype; auto = the fastest that is sound on this machine")
    p.add_argument("--draft-dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="draft model dtype; auto = bfloat16 (float16 beside a float16 target): a draft's rounding "
                        "cannot change the output, and half the bytes make each drafted token cheaper")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help="a text file (one prompt), or JSONL with a 'prompt' or 'turns' field per line")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    p.add_argument("--compare", action="store_true", help="also run plain model.generate and report speedup and identity")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-spec", description="Exact speculative decoding for transformers")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    p = sub.add_parser("provision", help="install, assemble, verify and convert offline models into the cache")
    p.add_argument("names", nargs="+", help="short names: smollm2-135m, qwen2.5-coder-1.5b, qwen2.5-coder-0.5b")
    return parser


def _read_prompts(args) -> list[str]:
    if args.prompt is not None:
        if not args.prompt.strip():
            raise SystemExit("hf-spec: error: empty prompt: give some text with --prompt")
        return [args.prompt]
    path = Path(args.prompt_file)
    if not path.is_file():
        raise SystemExit(f"hf-spec: error: no such prompt file: {path}")
    if path.suffix == ".jsonl":
        from .prompts import load_questions

        try:
            return [q.text for q in load_questions(path)]
        except ValueError as e:
            raise SystemExit(f"hf-spec: error: {e}")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise SystemExit(f"hf-spec: error: empty prompt file: {path}")
    return [text]


def _make_drafter(spec: str, k: int, dtype, tokenizer):
    from . import DraftModelDrafter, NgramDrafter, load

    if spec == "none":
        return None
    if spec == "ngram":
        return NgramDrafter(k)
    if spec.startswith("draft:"):
        draft_model, draft_tok = load(spec[len("draft:"):], dtype=dtype)
        return DraftModelDrafter(draft_model, k, tokenizer=tokenizer, draft_tokenizer=draft_tok)
    raise SystemExit(f"hf-spec: error: unknown drafter {spec!r}; use none, ngram or draft:MODEL")


def _generate(args) -> int:
    import torch

    from . import generate as spec_generate
    from . import load
    from .models import resolve_dtype
    from .prompts import chat_inputs

    if args.k < 1:
        raise SystemExit("hf-spec: error: -k must be >= 1 (use --drafter none to decode without speculation)")
    if args.max_new_tokens < 1:
        raise SystemExit("hf-spec: error: --max-new-tokens must be >= 1")
    if not (args.drafter in ("none", "ngram") or (args.drafter.startswith("draft:") and len(args.drafter) > 6)):
        raise SystemExit(f"hf-spec: error: unknown drafter {args.drafter!r}; use none, ngram or draft:MODEL")
    prompts = _read_prompts(args)
    dtype = resolve_dtype(args.dtype)
    model, tokenizer = load(args.target, dtype=dtype)
    if args.draft_dtype == "auto":
        draft_dtype = torch.float16 if dtype == torch.float16 else torch.bfloat16
    else:
        draft_dtype = resolve_dtype(args.draft_dtype)
    drafter = _make_drafter(args.drafter, args.k, draft_dtype, tokenizer)
    gen_kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0, tokenizer=tokenizer)
    if args.temperature > 0:
        gen_kwargs.update(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    else:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)

    # warm-up, so that one-time costs land on neither side of the comparison
    warm = chat_inputs(tokenizer, prompts[0], args.chat)
    model.generate(**warm, max_new_tokens=2, do_sample=False, tokenizer=tokenizer)
    model.generate(**warm, max_new_tokens=2, do_sample=False, custom_generate=spec_generate, drafter=drafter,
                   tokenizer=tokenizer)

    rows = []
    for text in prompts:
        inputs = chat_inputs(tokenizer, text, args.chat)
        prompt_len = inputs["input_ids"].shape[1]
        torch.manual_seed(args.seed)
        out = model.generate(**inputs, custom_generate=spec_generate, drafter=drafter, **gen_kwargs)
        stats = out.stats
        new = out.sequences[0, prompt_len:]
        row = {
            "text": tokenizer.decode(new, skip_special_tokens=True),
            "new_tokens": stats.new_tokens,
            "acceptance_rate": stats.acceptance_rate,
            "mean_accepted_length": stats.mean_accepted_length,
            "acceptance_by_position": stats.acceptance_by_position,
            "tokens_per_s": stats.tokens_per_s,
            "ttft_s": stats.ttft_s,
            "tpot_s": stats.tpot_s,
            "total_s": stats.total_s,
            "target_forwards": stats.num_target_forwards,
        }
        if args.compare:
            torch.manual_seed(args.seed)
            t0 = time.perf_counter()
            base = model.generate(**inputs, **gen_kwargs)
            base_s = time.perf_counter() - t0
            base_new = base.shape[1] - prompt_len
            row["baseline_tokens_per_s"] = base_new / base_s
            row["baseline_total_s"] = base_s
            row["speedup"] = row["tokens_per_s"] / row["baseline_tokens_per_s"]
            row["identical_to_baseline"] = bool(torch.equal(base[0], out.sequences[0]))
        rows.append(row)

    config = {"target": args.target, "drafter": args.drafter, "num_speculative_tokens": args.k,
              "dtype": str(dtype).replace("torch.", ""),
              "draft_dtype": str(draft_dtype).replace("torch.", "") if args.drafter.startswith("draft:") else None,
              "temperature": args.temperature,
              "max_new_tokens": args.max_new_tokens}
    if args.json:
        result = dict(rows[0], config=config) if len(rows) == 1 else {"config": config, "rows": rows}
        print(json.dumps(result, indent=2))
        return 0
    for row in rows:
        print(row["text"])
        print("-" * 60)
        print(f"{row['new_tokens']} tokens at {row['tokens_per_s']:.2f} tok/s | acceptance rate "
              f"{row['acceptance_rate']:.1%} | mean accepted length {row['mean_accepted_length']:.2f} | "
              f"TTFT {row['ttft_s']:.2f}s | TPOT {row['tpot_s'] * 1000:.0f} ms")
        if args.compare:
            print(f"plain decoding {row['baseline_tokens_per_s']:.2f} tok/s | speedup {row['speedup']:.2f}x | "
                  f"identical to plain greedy output: {row['identical_to_baseline']}")
    print(f"[{config['target']} drafter={config['drafter']} k={config['num_speculative_tokens']} dtype={config['dtype']}]")
    return 0


def main(argv=None) -> int:
    from .models import ModelChecksumError

    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "provision":
            from .models import provision

            for name in args.names:
                print(provision(name))
            return 0
    except (ValueError, ModelChecksumError, OSError) as e:  # bad input or an unreachable hub: a message, not a traceback
        print(f"hf-spec: error: {e}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
