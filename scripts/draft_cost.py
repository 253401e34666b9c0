"""Where a drafting step's time goes: the real loop with a draft model, DraftModelDrafter.draft instrumented.

Runs ``hf_spec.generate`` with the README pair (Qwen2.5-Coder-1.5B target, 0.5B draft) on one prompt at a
fixed k, and splits the time the loop spends drafting (``StepEvent.draft_time_s``, everything between two
verify forwards) into buckets, each timed by wrapping the function that does it:

- ``draft forward``: the draft model's own forward (``model.forward``: embeddings, layers, lm_head);
- ``ragged bookkeeping``: :meth:`RaggedCache.forward` around it (valid mask, position ids, mask argument)
  and :meth:`RaggedCache.truncate` (rolling the draft's cache back);
- ``common prefix``: ``_common_prefix`` (what of the draft's cache is still valid), where the code has it;
- ``choose``: :meth:`Drafter.choose` (logits processors, argmax or a sample);
- ``rest of draft()``: the remainder of ``DraftModelDrafter.draft`` (per-step tensors, ``torch.cat``, the
  float32 copy of the logits, stacking);
- ``loop around draft()``: the loop's own part of ``draft_time_s`` (k's budget, checking the draft).

c (drafting seconds per drafted token / T_1) is reported beside ``c isolated``: one bare one-token forward of the
draft model on a cache of the same length (what ``hf-spec tune``'s old microbenchmark measured). T_1 is the
median plain decode step of the same target in the same process (``hf_spec.generate`` without a drafter).
Speculative and plain calls alternate ``--repeat`` times; every number is a median over the calls (a
drafting step's buckets are summed per call, then divided by the call's drafted tokens).

    python scripts/draft_cost.py --repeat 3                      # the README pair, k = 3, 64 new tokens
    python scripts/draft_cost.py --draft-dtype float32           # a float32 draft instead of bfloat16
    python scripts/draft_cost.py --quantize-draft                # an int8 dynamically quantized draft

Run it from the checkout whose ``hf_spec`` it should measure (cwd's package is imported first).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

import hf_spec
import hf_spec.kernels
from hf_spec.device import cpu_flags
from hf_spec.drafters import draft_model as dm
from hf_spec.drafters.base import Drafter
from hf_spec.ragged import RaggedCache, cache_kwarg

PROMPT = "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."


class Buckets:
    """Seconds per bucket, counted only while DraftModelDrafter.draft runs."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.inside = 0

    def add(self, name: str, seconds: float) -> None:
        if self.inside:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds


def _timed(buckets: Buckets, name: str, fn, *, enter=False, subtract=()):
    """``fn`` wrapped to add its wall time to ``name`` (minus the time its callees put in ``subtract``)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = {s: buckets.seconds.get(s, 0.0) for s in subtract}
        buckets.inside += enter
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - t
            nested = sum(buckets.seconds.get(s, 0.0) - before[s] for s in subtract)
            buckets.add(name, elapsed - nested)
            buckets.inside -= enter

    return wrapper


def instrument(buckets: Buckets, draft_model) -> None:
    """Wrap the functions a drafting step runs (module attributes; restored by nobody: one process, one use)."""
    inner = ("draft forward", "ragged bookkeeping", "common prefix", "choose", "pad or cut")
    draft_model.forward = _timed(buckets, "draft forward", draft_model.forward)
    RaggedCache.forward = _timed(buckets, "ragged bookkeeping", RaggedCache.forward, subtract=("draft forward",))
    RaggedCache.truncate = _timed(buckets, "ragged bookkeeping", RaggedCache.truncate)
    Drafter.choose = _timed(buckets, "choose", Drafter.choose)
    for name in ("_common_prefix", "_pad_or_cut"):
        if hasattr(dm, name):
            setattr(dm, name, _timed(buckets, name.strip("_").replace("_", " "), getattr(dm, name)))
    cls = dm.DraftModelDrafter
    cls.draft = _timed(buckets, "rest of draft()", cls.draft, enter=True, subtract=inner)


def isolated_forward(draft_model, context: torch.LongTensor, repeat: int = 9) -> float:
    """Median seconds of one bare one-token forward of the draft after ``context`` (a DynamicCache)."""
    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache()
        kw = {cache_kwarg(draft_model): cache}
        draft_model(input_ids=context[None, :-1], use_cache=True, logits_to_keep=1, **kw)
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            draft_model(input_ids=context[None, -1:], use_cache=True, logits_to_keep=1, **kw)
            times.append(time.perf_counter() - t)
            cache.crop(-1)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="float32", help="the target's dtype")
    parser.add_argument("--draft-dtype", default="auto",
                        help="auto (hf_spec.device.draft_dtype), bfloat16, float32, int8, int4")
    parser.add_argument("--quantize-draft", action="store_true",
                        help="int8 dynamic quantization of the draft's linear layers (torch.ao quantize_dynamic)")
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prompt", default=PROMPT)
    args = parser.parse_args()

    target, tokenizer = hf_spec.load(args.target, dtype=args.dtype)
    draft = dm.DraftModelDrafter.from_spec(args.draft, num_speculative_tokens=args.k, target=target,
                                           tokenizer=tokenizer, draft_dtype=args.draft_dtype)
    if args.quantize_draft:
        if hf_spec.kernels.draft_kind(draft.draft_model) in ("int8", "int4"):
            parser.error("--quantize-draft quantizes a float32 or bfloat16 draft: pass --draft-dtype float32 or bfloat16")
        draft.draft_model = torch.ao.quantization.quantize_dynamic(
            draft.draft_model, {torch.nn.Linear}, dtype=torch.qint8)
    text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=False,
                                         add_generation_prompt=True)
    inputs = tokenizer(text, return_tensors="pt")
    buckets = Buckets()
    instrument(buckets, draft.draft_model)

    def run(drafter):
        events = []

        def listen(event):
            events.append(event)
            if event.num_speculative_tokens and sum(e.num_speculative_tokens > 0 for e in events) == 1:
                buckets.seconds.clear()  # the first speculative step (the draft's prefill) is reported apart

        out = target.generate(**inputs, custom_generate=hf_spec.generate, drafter=drafter, do_sample=False,
                              num_speculative_tokens=args.k if drafter else None, max_new_tokens=args.max_new_tokens,
                              return_dict_in_generate=True, event_listeners=[listen])
        return out.sequences[0], events

    run(draft)  # warm-up (first-call allocations, oneDNN primitives)
    calls, plain_steps, sequences = [], [], set()
    for _ in range(args.repeat):
        buckets.seconds.clear()
        seq, events = run(draft)
        steps = [e for e in events if e.step > 0 and e.num_speculative_tokens > 0]
        # the first speculative step also prefills the prompt into the draft: a one-off, reported apart
        first, rest = steps[0], steps[1:]
        drafted = sum(len(d) for e in rest for d in e.drafted)
        calls.append({"loop_draft": sum(e.draft_time_s for e in rest) / drafted,
                      "first_step": first.draft_time_s, "buckets": dict(buckets.seconds), "drafted": drafted,
                      "verify": statistics.median(e.verify_time_s for e in rest)})
        sequences.add(tuple(seq.tolist()))
        plain_seq, plain = run(None)
        plain_steps.append(statistics.median(e.verify_time_s for e in plain if e.step > 0))
        sequences.add(tuple(plain_seq.tolist()))
    t1 = statistics.median(plain_steps)
    context = torch.tensor(next(iter(sequences)))[: inputs["input_ids"].shape[1] + args.max_new_tokens // 2]
    iso = isolated_forward(draft.draft_model, context)

    med = lambda xs: statistics.median(xs)  # noqa: E731
    c = med([cl["loop_draft"] for cl in calls]) / t1
    print(f"machine: {hf_spec.device.machine_info()}, cpu flags {', '.join(cpu_flags())}")
    print(f"target {args.target} {target.dtype}, draft {args.draft} {hf_spec.kernels.draft_kind(draft.draft_model)}"
          f"{' int8-dynamic' if args.quantize_draft else ''}, k={args.k}, {args.max_new_tokens} new tokens, "
          f"{args.repeat} calls; outputs identical: {len(sequences) == 1}")
    print(f"T_1 (plain step) {t1 * 1e3:.1f} ms; verify step median {med([cl['verify'] for cl in calls]) * 1e3:.1f} ms")
    print(f"c in the loop (steps after the first) {c:.3f}; c isolated (one bare draft forward) {iso / t1:.3f} "
          f"({iso * 1e3:.1f} ms); first speculative step's drafting (draft prefill) "
          f"{med([cl['first_step'] for cl in calls]) * 1e3:.0f} ms")
    for cl in calls:  # per drafted token; what the loop's clock saw beyond draft() is the loop's own part
        cl["buckets"] = {n: v / cl["drafted"] for n, v in cl["buckets"].items()}
        cl["buckets"]["loop around draft()"] = cl["loop_draft"] - sum(cl["buckets"].values())
    names = sorted({n for cl in calls for n in cl["buckets"]}, key=lambda n: -med(
        [cl["buckets"].get(n, 0.0) for cl in calls]))
    print("| bucket | ms per drafted token | c (share of T_1) |")
    print("|---|---|---|")
    for n in names:
        v = med([cl["buckets"].get(n, 0.0) for cl in calls])
        print(f"| {n} | {v * 1e3:.2f} | {v / t1:.3f} |")
    print(f"| all drafting (loop's draft_time_s) | {c * t1 * 1e3:.2f} | {c:.3f} |")


if __name__ == "__main__":
    main()
