"""``hf-spec generate``: speculative generation on one prompt (or a file of prompts, in batches), optionally
compared side by side with plain ``model.generate`` in the same process (speedup, identity, and where a
greedy output differs, the target's logits there)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

__all__ = ["run", "first_difference", "near_tie_verdict"]

from ..divergence import first_difference, near_tie_verdict  # noqa: E402  (re-exported: they lived here)


def run(args) -> int:
    """The command body (arguments from :func:`hf_spec.cli.build_parser`).

    Raises:
        ValueError: bad input (an empty prompt, a bad drafter spec, a port out of range, ...), before any
            model loads where it can be told then.
    """
    from ..device import check_draft_dtype, resolve_device_map, resolve_dtype
    from ..drafters.registry import make_drafter, parse_drafter
    from ..models import load
    from ..kernels import draft_kind

    _check_args(args)
    device_map = resolve_device_map(args.device_map)  # a device this machine lacks fails before any model loads
    spec = parse_drafter(args.drafter, None if args.k == "auto" else args.k)  # a bad spec fails before any model loads
    args.draft_dtype = draft_dtype_flag(args, uses_a_draft_model(spec), args.drafter)
    check_draft_dtype(args.draft_dtype, device_map)
    if args.corpus and (spec is None or not spec.cls.takes_corpus):
        raise ValueError(f"--corpus needs a drafter that drafts from one: --drafter suffix, hybrid:draft:MODEL or "
                         f"hybrid:medusa:DIR, not "
                         f"{args.drafter!r}")
    speculative_only = [flag for flag, given in (("-k", args.k is not None), ("--tree", bool(args.tree)),
                                                 ("--prometheus-port", args.prometheus_port is not None)) if given]
    if spec is None and speculative_only:
        raise ValueError(f"{speculative_only[0]} is about speculative decoding, and "
                         "--drafter none decodes without it: drop the option, or choose a drafter (e.g. ngram, suffix, "
                         "draft:MODEL)")
    if args.tree and (spec is None or not spec.cls.drafts_trees):
        raise ValueError(f"--tree {args.tree}: drafter {args.drafter!r} drafts chains only; use --tree none, or a "
                         "drafter that drafts trees: draft:MODEL, medusa:DIR, suffix or hybrid:SPEC")
    corpus = read_corpus(args.corpus)
    prompts = _read_prompts(args)
    dtype = resolve_dtype(args.dtype, device_map)
    metrics = _serve_metrics(args)  # a port in use fails before any model loads
    model, tokenizer = load(args.target, dtype=dtype, device_map=device_map, quantization=args.quantization)
    drafter = make_drafter(spec, num_speculative_tokens=None if args.k == "auto" else args.k, target=model,
                           tokenizer=tokenizer, draft_dtype=args.draft_dtype, corpus=corpus)
    listeners = [] if metrics is None else [metrics.listener(drafter.method)]
    rows, totals = _generate_all(args, model, tokenizer, drafter, prompts, listeners, dtype)
    # a draft model drafter's model, or a hybrid drafter's model source's
    draft_model = getattr(drafter, "draft_model", None) or getattr(getattr(drafter, "model_drafter", None),
                                                                    "draft_model", None)
    config = {"target": args.target, "drafter": args.drafter,
              "num_speculative_tokens": args.k if args.k is not None or drafter is None else drafter.num_speculative_tokens,
              "num_tree_nodes": args.tree,
              "dtype": str(dtype).replace("torch.", ""), "device_map": device_map, "device": str(model.device),
              "quantization": args.quantization,
              "draft_dtype": draft_kind(draft_model) if draft_model is not None else None,
              "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
              "batch_size": min(args.batch_size, len(prompts))}
    if args.json:
        result = (dict(rows[0], config=config, **{k: totals[k] for k in ("other_cpu_cores", "warnings") if k in totals})
                  if len(rows) == 1 else {"config": config, "rows": rows, **totals})
        print(json.dumps(result, indent=2), flush=True)
    else:
        _print_text(args, rows, totals, config, streamed=_streams(args, prompts))
    for warning in totals.get("warnings", []):
        print(f"hf-spec: warning: {warning}", file=sys.stderr)
    if args.prometheus_port is not None and args.prometheus_hold > 0:
        print(f"hf-spec: serving the metrics {args.prometheus_hold:g} s more", file=sys.stderr)
        time.sleep(args.prometheus_hold)
    return 0


def _check_args(args) -> None:
    if args.k is not None and args.k != "auto" and args.k < 1:
        raise ValueError("-k must be >= 1 or auto (use --drafter none to decode without speculation)")
    if args.prometheus_port is not None and not 0 < args.prometheus_port < 65536:
        raise ValueError("--prometheus-port must be a TCP port (1-65535)")
    if not 0 <= args.prometheus_hold <= 86400:  # NaN and inf too (time.sleep(inf) overflows)
        raise ValueError("--prometheus-hold must be 0 to 86400 seconds")
    if args.prometheus_hold > 0 and args.prometheus_port is None:
        raise ValueError("--prometheus-hold keeps the metrics server up after generation, and there is none without "
                         "--prometheus-port: add --prometheus-port PORT, or drop --prometheus-hold")
    if args.max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be >= 1")
    if args.batch_size < 1:
        raise ValueError("--batch-size must be >= 1")
    check_sampling(args)


def draft_dtype_flag(args, runs_a_draft_model: bool, drafter: str) -> str:
    """``--draft-dtype`` as the loaders take it: ``"auto"`` when not given; refused when given to a run without a
    draft model, where it would do nothing without a word.

    Args:
        runs_a_draft_model: whether the drafter (or a bench method) drafts with a draft model.
        drafter: the drafter spec or methods, for the message.

    Raises:
        ValueError: ``--draft-dtype`` given and no draft model to apply it to.
    """
    if args.draft_dtype is not None and not runs_a_draft_model:
        raise ValueError(f"--draft-dtype {args.draft_dtype} sets a draft model's dtype, and {drafter!r} runs none: drop "
                         "the flag, or draft with a model (draft:MODEL, hybrid:draft:MODEL; bench: hf-assisted too)")
    return args.draft_dtype or "auto"


def uses_a_draft_model(spec) -> bool:
    """Whether a drafter spec (text or parsed; ``None``: none) drafts with a draft model: ``draft:MODEL`` or
    ``hybrid:draft:MODEL``."""
    return spec is not None and str(spec).startswith(("draft:", "hybrid:draft:"))


def check_sampling(args) -> None:
    """The sampling flags of ``generate`` and ``bench``: ``--temperature`` (finite, >= 0; NaN decoded greedily, inf
    uniformly), ``--top-p`` in (0, 1] and ``--top-k`` >= 1, neither without a temperature > 0 (greedy decoding would
    ignore them without a word), ``--repetition-penalty`` > 0 (greedy or sampled: it changes the logits, as
    transformers applies it in both), and ``--seed`` as torch takes it (``torch.manual_seed`` overflows past 64
    bits, after the model loaded).

    Raises:
        ValueError: naming the flag and its range.
    """
    if not (args.temperature >= 0 and math.isfinite(args.temperature)):
        raise ValueError("--temperature must be a finite number >= 0 (0 decodes greedily)")
    for flag, value, ok, bound in (("--top-p", args.top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
                                   ("--top-k", args.top_k, lambda v: v >= 1, ">= 1")):
        if value is not None and not ok(value):
            raise ValueError(f"{flag} must be {bound}")
        if value is not None and args.temperature == 0:
            raise ValueError(f"{flag} is a sampling setting: give --temperature > 0 too")
    if args.repetition_penalty is not None and not 0 < args.repetition_penalty < math.inf:
        raise ValueError("--repetition-penalty must be a finite number > 0")
    if not -2**63 <= args.seed < 2**64:
        raise ValueError(f"--seed must fit in 64 bits (e.g. 0 to {2**63 - 1}), got {args.seed}")


def check_out_folder(out: str) -> Path:
    """``--out`` of ``bench``, ``train-medusa`` and ``quantize``: a folder (made if missing), checked before any model
    loads (else an existing file, a file where a parent folder should be or a read-only place is found once the work
    has begun, and an empty one is the current folder). Nothing is created here.

    Raises:
        ValueError: ``out`` is empty or an existing file, or the nearest existing folder above it is a file or not
            writable.
    """
    path = Path(out)
    if not out.strip() or (path.exists() and not path.is_dir()):
        raise ValueError(f"--out {out!r}: {'an existing file' if out.strip() else 'empty'}; give a folder (made if "
                         "missing)")
    existing = next(p for p in (path.absolute(), *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out!r}: {existing} is a file, so no folder can be made under it; give another --out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out!r}: {existing} is not writable here; give a folder you can write to")
    return path


def _check_text(text: str, where: str) -> str:
    """``text`` if it is Unicode a tokenizer takes; a lone surrogate (a byte that is not UTF-8 on the command line
    or standard input, or half a pair escaped in JSON) is a usage error, not a traceback after the model loaded."""
    from ..drafters.suffix import lone_surrogate

    bad = lone_surrogate(text)
    if bad:
        raise ValueError(f"{where} is not UTF-8 text: it holds {bad}; fix the encoding (e.g. iconv -t UTF-8)")
    return text


def read_corpus(paths) -> list[str] | None:
    """The documents of ``--corpus FILE...`` (``None`` without the option): a text file is one document; a
    ``.jsonl`` file holds one document a line, a JSON object with a ``"text"`` string (past answers as a server
    logs them, for example), so the drafter never matches across two of them.

    Raises:
        OSError: a file that cannot be read (permissions, a device), named.
        ValueError: a file that does not exist or is a folder, an empty one, one that is not UTF-8 text, or a ``.jsonl`` line
            that is not an object with a ``"text"`` string or whose text is not Unicode (a lone surrogate escape);
            the message names the file and line.
    """
    if not paths:
        return None
    from ..drafters.suffix import lone_surrogate
    from ..prompts import read_text_file

    texts = []
    for name in paths:
        path = Path(name)
        jsonl = path.suffix.lower() == ".jsonl"
        content = read_text_file(path, f"--corpus {path}", "text files or .jsonl files of {\"text\": ...} lines")
        if not content.strip():
            raise ValueError(f"--corpus {path} is empty: give files with text to draft from, or drop it")
        if not jsonl:
            texts.append(content)
            continue
        # lines end at "\n" only: JSON strings may hold U+2028 and other breaks that str.splitlines() splits at
        for lineno, line in enumerate(content.split("\n"), 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line).get("text")
            except (json.JSONDecodeError, AttributeError):
                text = None
            if not isinstance(text, str):
                raise ValueError(f"--corpus {path}:{lineno}: each line of a .jsonl corpus must be a JSON object with a "
                                 "\"text\" string, e.g. {\"text\": \"an earlier answer\"}")
            bad = lone_surrogate(text)  # JSON may escape half of a surrogate pair: no text to tokenize
            if bad:
                raise ValueError(f"--corpus {path}:{lineno}: the \"text\" holds {bad}, half of a character cut in "
                                 "two; fix or drop that line")
            texts.append(text)
    return texts


def _read_prompts(args) -> list[str]:
    if args.prompt is not None:
        if not args.prompt.strip():
            raise ValueError("empty prompt: give some text with --prompt")
        return [_check_text(args.prompt, "--prompt")]
    if args.prompt_file == "-":  # standard input: one text prompt
        text = sys.stdin.read()
        if not text.strip():
            raise ValueError("empty prompt on standard input (--prompt-file -)")
        return [_check_text(text, "standard input (--prompt-file -)")]
    from ..prompts import read_text_file

    path = Path(args.prompt_file)
    if path.is_dir() or not path.exists():  # a pipe (<(command), /dev/fd/N) or a FIFO exists too: read like a file
        read_text_file(path, f"--prompt-file {path}", "a text or .jsonl file, or - for standard input")  # says why
    if path.suffix.lower() == ".jsonl":  # as --corpus reads it: UP.JSONL is JSON lines too
        from ..prompts import load_questions

        prompts = [q.text for q in load_questions(path)]
        if not prompts:
            raise ValueError(f"no prompts in {path}: expected one JSON object with 'prompt' or 'turns' per line")
        return prompts
    text = read_text_file(path, f"--prompt-file {path}")  # read once: a pipe cannot be read again
    if not text.strip():
        raise ValueError(f"empty prompt file: {path}")
    return [text]


def _serve_metrics(args):
    """``--prometheus-port``: serve vLLM-named metrics on loopback; the :class:`~hf_spec.PrometheusMetrics` (its
    listener feeds them), or ``None`` without the flag."""
    if args.prometheus_port is None:
        return None
    from ..prometheus import PrometheusMetrics

    metrics = PrometheusMetrics(model_name=args.target)  # the model_name label, as vLLM's served name is its --model
    try:
        server, _ = metrics.serve(args.prometheus_port)
    except OSError as e:
        raise ValueError(f"cannot serve metrics on 127.0.0.1:{args.prometheus_port}: {e}") from e
    print(f"hf-spec: Prometheus metrics on http://127.0.0.1:{server.server_port}/metrics", file=sys.stderr)
    return metrics


def _generate_all(args, model, tokenizer, drafter, prompts, listeners, dtype) -> tuple[list[dict], dict]:
    """Every prompt, ``--batch-size`` at a time, speculative then (``--compare``) plain; one row per prompt."""
    import torch
    from transformers import TextStreamer

    from ..device import OtherCpu, clock
    from ..loop import generate as spec_generate
    from ..loop import generated_length
    from ..prompts import chat_inputs, check_context, counted

    gen_kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.temperature > 0, tokenizer=tokenizer)
    if args.repetition_penalty is not None:
        gen_kwargs.update(repetition_penalty=args.repetition_penalty)
    if args.temperature > 0:
        gen_kwargs.update(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    else:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)
    k_call = "auto" if args.k == "auto" and drafter is not None else None
    trees = {"num_tree_nodes": args.tree} if args.tree else {}

    for i, text in enumerate(prompts):  # before any generation: a prompt past the context would write garbage
        what = "the prompt" if len(prompts) == 1 else f"prompt {i + 1} of {len(prompts)}"
        check_context(model, chat_inputs(tokenizer, text, args.chat)["input_ids"].shape[1], args.max_new_tokens,
                      what=what[0].upper() + what[1:])
    # warm-up, so that one-time costs land on neither side of the comparison
    warm = chat_inputs(tokenizer, prompts[0], args.chat)
    model.generate(**warm, max_new_tokens=2, do_sample=False, tokenizer=tokenizer)
    model.generate(**warm, max_new_tokens=2, do_sample=False, custom_generate=spec_generate, return_dict_in_generate=True, drafter=drafter,
                   tokenizer=tokenizer, **trees)

    if args.batch_size > len(prompts):
        print(f"hf-spec: --batch-size {args.batch_size} with {counted(len(prompts), 'prompt')}: batches of "
              f"{len(prompts)} (a text --prompt-file holds one prompt; a .jsonl file one a line)", file=sys.stderr)
    stream = _streams(args, prompts)
    rows, spec_s, base_s = [], 0.0, 0.0
    spec_name = "speculative decoding" if drafter is not None else "decoding"  # --drafter none: plain on both sides
    timed = {spec_name: (0.0, 0.0, 0.0), "plain decoding": (0.0, 0.0, 0.0)}  # what else used the CPU meanwhile
    for first in range(0, len(prompts), args.batch_size):
        texts = prompts[first:first + args.batch_size]
        inputs = chat_inputs(tokenizer, texts, args.chat)
        prompt_len = inputs["input_ids"].shape[1]
        if not args.json and not stream:
            print(f"hf-spec: generating prompts {first + 1}-{first + len(texts)} of {len(prompts)} ...", file=sys.stderr)
        torch.manual_seed(args.seed)
        streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if stream else None
        with OtherCpu() as other:
            out = model.generate(**inputs, custom_generate=spec_generate, return_dict_in_generate=True, drafter=drafter,
                                 event_listeners=listeners, num_speculative_tokens=k_call, streamer=streamer, **trees,
                                 **gen_kwargs)
        spec_s += out.stats.total_s
        timed[spec_name] = _add(timed[spec_name], other)
        if args.compare:
            if not args.json:
                print("hf-spec: plain decoding of the same prompt(s), for --compare ...", file=sys.stderr)
            torch.manual_seed(args.seed)
            with OtherCpu() as other:
                t0 = clock(model.device)
                base = model.generate(**inputs, **gen_kwargs)
                batch_base_s = clock(model.device) - t0
            base_s += batch_base_s
            timed["plain decoding"] = _add(timed["plain decoding"], other)
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
            if stats.per_source:  # the hybrid drafter: drafted and accepted tokens by source
                row["per_source"] = stats.per_source
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
                        diff["verdict"] = near_tie_verdict(diff["logit_gap"], model, dtype)
                if len(texts) == 1:
                    row["baseline_tokens_per_s"] = base_new / batch_base_s
                    row["baseline_total_s"] = batch_base_s
                    row["speedup"] = _speedup(row["tokens_per_s"], row["baseline_tokens_per_s"])
            rows.append(row)
            if stream:  # the answer is out: its figures follow it
                _print_row(args, row, streamed=True)
    total_new = sum(r["new_tokens"] for r in rows)
    totals = {"tokens_per_s": total_new / spec_s if spec_s > 0 else 0.0}
    from ..bench import contention_warning, seconds_to_shares

    if not args.compare:  # tokens/s alone is a timing too: its load is reported all the same
        del timed["plain decoding"]
    shares = seconds_to_shares(timed)
    totals["other_cpu_cores"] = {name: share[0] for name, share in shares.items()}
    totals["warnings"] = [w for w in [contention_warning(shares)] if w]
    if args.compare:
        totals["baseline_tokens_per_s"] = sum(r["baseline_new_tokens"] for r in rows) / base_s
        totals["speedup"] = _speedup(totals["tokens_per_s"], totals["baseline_tokens_per_s"])
        totals["identical_to_baseline"] = all(r["identical_to_baseline"] for r in rows)
        if drafter is not None:  # the bench's check: a speedup that the tokens per target forward cannot explain
            from ..bench import speedup_warning

            tokens_per_forward = sum(r["mean_accepted_length"] * r["new_tokens"] for r in rows) / max(1, total_new)
            warning = speedup_warning("speculative decoding", totals["speedup"], tokens_per_forward,
                                      base_s / max(1, sum(r["baseline_new_tokens"] for r in rows)))
            totals["warnings"] += [warning] if warning else []
    return rows, totals


def _add(timed: tuple[float, float, float], other) -> tuple[float, float, float]:
    """``(other_s, steal_s, wall_s)`` plus one :class:`~hf_spec.device.OtherCpu` block's."""
    return timed[0] + other.other_s, timed[1] + other.steal_s, timed[2] + other.wall_s


def _streams(args, prompts: list[str]) -> bool:
    """Whether the answers are printed as they are generated (transformers' ``TextStreamer``): text output, one
    prompt at a time."""
    return not args.json and min(args.batch_size, len(prompts)) == 1


def _speedup(tokens_per_s: float, baseline_tokens_per_s: float) -> float | None:
    """Tokens/s over plain decoding's; ``None`` where either generated nothing (an answer that ends at once)."""
    return tokens_per_s / baseline_tokens_per_s if tokens_per_s > 0 and baseline_tokens_per_s > 0 else None


def _print_text(args, rows: list[dict], totals: dict, config: dict, streamed: bool = False) -> None:
    """The answers with their figures, then the totals and the settings; ``streamed``: the answers and their figures
    were printed as they were generated (:func:`_print_row`), only the totals are left."""
    if not streamed:
        for row in rows:
            _print_row(args, row)
    _print_totals(args, rows, totals, config)


def _print_row(args, row: dict, streamed: bool = False) -> None:
    """One answer (unless ``streamed``: already printed) and its figures: tokens, acceptance, TTFT, TPOT, and under
    ``--compare`` identity and the first difference."""
    if not streamed:
        print(row["text"])
    print("-" * 60)
    print(f"{row['new_tokens']} tokens | acceptance rate {row['acceptance_rate']:.1%} | mean accepted length "
          f"{row['mean_accepted_length']:.2f} | TTFT {row['ttft_s']:.2f}s | TPOT {row['tpot_s'] * 1000:.0f} ms")
    if args.compare:
        print(f"identical to plain decoding: {row['identical_to_baseline']}"
              + (" (sampling: a speculative and a plain run draw different samples of the same distribution; "
                 "token identity is a greedy check)" if args.temperature > 0 else ""))
        diff = row.get("first_difference")
        if diff:
            print(f"  first difference at new token {diff['new_token']}: plain {diff['plain']!r}, speculative "
                  f"{diff['speculative']!r}; the target's logits there {diff['plain_logit']:.4g} vs "
                  f"{diff['speculative_logit']:.4g} (gap {diff['logit_gap']:.3g}): {diff['verdict']}")


def _print_totals(args, rows: list[dict], totals: dict, config: dict) -> None:
    total_new = sum(r["new_tokens"] for r in rows)
    print(f"total: {total_new} tokens at {totals['tokens_per_s']:.2f} tok/s", end="")
    if args.compare:
        speedup = "n/a (an answer without tokens)" if totals["speedup"] is None else f"{totals['speedup']:.2f}x"
        print(f" | plain decoding {totals['baseline_tokens_per_s']:.2f} tok/s | speedup {speedup}", end="")
    print()
    tree = f" tree={config['num_tree_nodes']}" if config["num_tree_nodes"] else ""
    draft_dtype = f" draft dtype={config['draft_dtype']}" if config.get("draft_dtype") else ""
    k = f" k={config['num_speculative_tokens']}" if config["num_speculative_tokens"] is not None else ""
    print(f"[{config['target']} drafter={config['drafter']}{k}{tree} dtype={config['dtype']}{draft_dtype} "
          f"device {config['device']} batch size {config['batch_size']}]")
