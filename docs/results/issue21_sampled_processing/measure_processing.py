"""A sampled verify step's logits processing with Qwen2.5-Instruct's shipped settings (repetition penalty 1.05,
temperature 0.7, top-k 20, top-p 0.8) over n positions of a 151,936-token vocabulary: every position through the
whole list by itself (hf-spec before 2026-12-02 evening) against hf_spec.processors.process_scores (the repetition
penalty per position, the warpers once on all positions). Interleaved, medians of 21; the outputs are checked equal.
Run from the repository root:

    .venv/bin/python docs/results/issue21_sampled_processing/measure_processing.py
"""
import statistics
import time

import torch
from transformers import LogitsProcessorList
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

from hf_spec.processors import process_scores

V = 151936
procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.05), TemperatureLogitsWarper(0.7),
                             TopKLogitsWarper(20), TopPLogitsWarper(0.8)])
torch.manual_seed(0)
print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads; ms per verify step's processing")
for n in (2, 5, 9, 17):
    seqs = [torch.randint(0, V, (400 + j,)) for j in range(n)]
    scores = torch.randn(n, V) * 4
    forms = {"each position alone": lambda: torch.cat([procs(s[None], scores[j:j + 1]) for j, s in enumerate(seqs)]),
             "process_scores": lambda: process_scores(procs, seqs, scores)}
    assert torch.equal(forms["each position alone"](), forms["process_scores"]())
    times = {f: [] for f in forms}
    for _ in range(22):
        for f, fn in forms.items():
            t = time.perf_counter()
            fn()
            times[f].append(time.perf_counter() - t)
    print(f"n={n:2d} " + "  ".join(f"{f} {statistics.median(ts[1:]) * 1e3:6.1f}" for f, ts in times.items()), flush=True)
