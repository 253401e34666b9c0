"""Measure T_verify(n) / T_1: one target forward over n new positions (after a 200-token cache) relative
to a one-position forward, with PyTorch's own linear layers and with hf-spec's verify-friendly ones.

    python scripts/verify_cost.py --target qwen2.5-coder-1.5b --dtype float32 --repeats 3
"""

import argparse

import torch

import hf_spec
from hf_spec.tuning import measure_forward_times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--positions", default="1,2,3,4,6,8,12")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    model, _ = hf_spec.load(args.target, dtype=args.dtype)
    ids = torch.randint(100, 1000, (1, args.context))
    positions = [int(x) for x in args.positions.split(",")]
    plain = measure_forward_times(model, ids, positions, args.repeats, use_verify_linear=False)
    fast = measure_forward_times(model, ids, positions, args.repeats, use_verify_linear=True)
    t1 = plain[1] if 1 in plain else min(plain.values())
    print(f"T_1 = {t1 * 1000:.0f} ms ({args.target}, {args.dtype}, {args.context}-token cache, median of {args.repeats})")
    print("| n | torch F.linear | hf-spec verify_linear |")
    print("|---|---|---|")
    for n in positions:
        print(f"| {n} | {plain[n] / t1:.2f}x | {fast[n] / t1:.2f}x |")


if __name__ == "__main__":
    main()
