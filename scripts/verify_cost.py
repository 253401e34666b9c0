"""Measure T_verify(n) / T_1: one target forward over n new positions (after a 200-token cache) relative
to a one-position forward, with PyTorch's own linear layers and with hf-spec's verify-friendly ones.

    python scripts/verify_cost.py --target qwen2.5-coder-1.5b --dtype float32 --repeats 3
"""

import argparse
import statistics
import time

import torch
from transformers import DynamicCache

import hf_spec
from hf_spec.ragged import crop_cache_to
from hf_spec.kernels import install_verify_linear, verify_linear


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--positions", default="1,2,3,4,6,8,12")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model, _ = hf_spec.load(args.target, dtype=args.dtype)
    install_verify_linear(model)
    ids = torch.randint(100, 1000, (1, args.context + 16))
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, : args.context], cache=cache, logits_to_keep=1)
        times = {}
        for n in [int(x) for x in args.positions.split(",")]:
            for fast in (False, True):
                ts = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    with verify_linear(fast):
                        model(input_ids=ids[:, args.context: args.context + n], cache=cache, logits_to_keep=n)
                    ts.append(time.perf_counter() - t)
                    crop_cache_to(cache, args.context)
                times[(n, fast)] = statistics.median(ts)
    t1 = times[(1, False)]
    print(f"T_1 = {t1 * 1000:.0f} ms ({args.target}, {args.dtype}, {args.context}-token cache, median of {args.repeats})")
    print("| n | torch F.linear | hf-spec verify_linear |")
    print("|---|---|---|")
    for n in sorted({n for n, _ in times}):
        print(f"| {n} | {times[(n, False)] / t1:.2f}x | {times[(n, True)] / t1:.2f}x |")


if __name__ == "__main__":
    main()
