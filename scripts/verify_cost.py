"""Verify cost by positions on this machine: one target forward over n new positions after a cache of
``--context`` tokens, relative to a one-position forward (a plain decode step), as a chain (causal) and as a tree
(the last accepted token and a binary tree of n - 1 nodes under it, the loop's tree attention mask). Medians of
``--repeats`` after a warm-up, through the loop's own forward (:func:`hf_spec.tuning.measure_forward_times`).
What it prints decides what a draft tree may cost: where a verify of 24 positions costs about one plain step
(CPUs with AMX in bfloat16, GPUs), trees of 12-24 nodes are nearly free; where it costs 1.5 (AVX512-BF16
without AMX), trees beyond ~6 nodes are not.

    python scripts/verify_cost.py --target qwen2.5-coder-1.5b --dtype bfloat16 float32

With ``--head-rows R`` it also prints what joining R rows per position (Medusa heads that share the target's
``lm_head``) to a verify forward's vocabulary projection costs: one product over n + n x R rows against two, over
n rows and over R (:func:`hf_spec.kernels.measure_extra_rows`, the measurement the loop decides by), and the two
products' time over a plain step's.
"""

import argparse

import torch

import hf_spec
from hf_spec.device import machine_info
from hf_spec.kernels import measure_extra_rows
from hf_spec.tuning import measure_forward_times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--context", type=int, default=200, help="tokens in the cache before the measured forward")
    ap.add_argument("--positions", default="1,2,4,7,11,16,24,32", help="comma-separated n (1 = a plain step)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--head-rows", type=int, default=0, help="also time the lm_head with this many extra rows per "
                    "position (Medusa's heads), joined against apart")
    args = ap.parse_args()
    positions = sorted({1, *(int(x) for x in args.positions.split(","))})
    torch.manual_seed(0)
    ids = torch.randint(100, 20000, (1, args.context))
    info = machine_info()
    print(f"{args.target}, {args.context}-token cache, median of {args.repeats}; {info['date']}, commit {info['commit']}, "
          f"{info['machine']} ({', '.join(info['cpu_flags'])}), {info['threads']} threads, torch {info['torch']}")
    print("| dtype | shape | T_1 (ms) | " + " | ".join(f"n={n}" for n in positions[1:]) + " |")
    print("|---|---|---|" + "---|" * (len(positions) - 1))
    for dtype in args.dtype:
        model, _ = hf_spec.load(args.target, dtype=dtype)
        for tree in (False, True):
            t = measure_forward_times(model, ids, positions, repeats=args.repeats, tree=tree)
            print(f"| {dtype} | {'tree' if tree else 'chain'} | {t[1] * 1000:.0f} | "
                  + " | ".join(f"{t[n] / t[1]:.2f}" for n in positions[1:]) + " |", flush=True)
        if args.head_rows:
            weight, R = model.get_output_embeddings().weight, args.head_rows
            cells = []
            for n in positions[1:]:
                one, two = measure_extra_rows(weight, n, n * R, R)
                cells.append(f"{one / two:.2f} ({two / t[1]:.2f})")
            print(f"| {dtype} | lm_head + {R} rows per position: one product / two (two / T_1) | | "
                  + " | ".join(cells) + " |", flush=True)
        del model


if __name__ == "__main__":
    main()
