"""A sampled tree verify's logits processing, all 17 positions at once against the positions a rejection walk reads.

Qwen2.5-Instruct's sampling settings (repetition penalty 1.05, temperature 0.7, top-k 20, top-p 0.8) on random
bfloat16-rounded logits over Qwen2.5's 151,936 rows; the loop's own processing (hf_spec.processors.process_scores,
row by row for the penalty, then the warpers at once) and softmax. Medians of 21 interleaved rounds, milliseconds.
Usage: python probe.py"""
import statistics
import time

import torch
from transformers import LogitsProcessorList
from transformers.generation import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper,
                                     TopPLogitsWarper)

from hf_spec.processors import process_scores

V, P = 151_936, 17
procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.05), TemperatureLogitsWarper(0.7),
                             TopKLogitsWarper(20), TopPLogitsWarper(0.8)])
torch.manual_seed(0)
logits = (torch.randn(P, V) * 3).bfloat16().float()
seq = torch.randint(V, (300,))
seqs = [torch.cat([seq, torch.randint(V, (j,))]) for j in range(P)]


def all_at_once():
    return process_scores([procs] * P, seqs, logits).softmax(dim=-1)


def walk(n):
    return [process_scores([procs], [seqs[j]], logits[j:j + 1]).softmax(dim=-1) for j in range(n)]


cases = {"all 17 positions": all_at_once, **{f"{n} positions, one at a time": (lambda n=n: walk(n)) for n in (1, 2, 3, 4, 5)}}
times = {k: [] for k in cases}
for _ in range(21):
    for k, f in cases.items():
        t = time.perf_counter()
        f()
        times[k].append(time.perf_counter() - t)
for k, t in times.items():
    print(f"{k}: {1000 * statistics.median(t):.1f} ms")
