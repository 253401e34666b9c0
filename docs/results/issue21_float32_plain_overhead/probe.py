"""Float32 plain steps in hf-spec's loop against transformers' generate, in one process, interleaved: does the loop
pay for its steps without a draft? Prompts: Spec-Bench writing (81) and rag (481); N new tokens, greedy.
Kinds: transformers' generate; hf-spec with no drafter; hf-spec with a drafter that never proposes (k = 3: every
step plain through the loop's speculative path); hf-spec's suffix drafter at -k auto (off on most steps of
writing). Prints ms per token (total / N) and TTFT-free ms per step (from the stats where available).
Run: .venv/bin/python docs/results/issue21_float32_plain_overhead/probe.py [N] [ROUNDS]"""
import statistics, sys, time
import torch
import hf_spec
from hf_spec.drafters.base import Drafter
from hf_spec.prompts import chat_inputs, load_questions


class Never(Drafter):
    method = "never"

    def draft(self, sequences, k):
        n = len(sequences)
        return torch.zeros(n, 0, dtype=torch.long), torch.zeros(n, dtype=torch.long), None


N = int(sys.argv[1]) if len(sys.argv) > 1 else 64
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="float32")
qs = {q.question_id: q for q in load_questions()}
prompts = {"writing": chat_inputs(tok, qs["81"].text), "rag": chat_inputs(tok, qs["481"].text)}
kinds = ["transformers", "hf-spec plain", "hf-spec never k=3", "hf-spec suffix auto"]


def run(kind, inputs):
    kw = dict(max_new_tokens=N, min_new_tokens=N, do_sample=False)
    if kind != "transformers":
        kw.update(custom_generate=hf_spec.generate)
    if kind == "hf-spec never k=3":
        kw.update(drafter=Never(3), num_speculative_tokens=3)
    elif kind == "hf-spec suffix auto":
        kw.update(drafter=hf_spec.SuffixDrafter(), num_speculative_tokens="auto")
    t0 = time.perf_counter()
    with torch.inference_mode():
        target.generate(**inputs, **kw)
    return time.perf_counter() - t0


with torch.inference_mode():
    for name, inputs in prompts.items():
        for kind in kinds:
            run(kind, inputs)  # warm: kernels' measurements, T_1 remembered
res = {(n, k): [] for n in prompts for k in kinds}
for r in range(ROUNDS):
    for name, inputs in prompts.items():
        order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
        for kind in order:
            res[(name, kind)].append(run(kind, inputs))
            print(r, name, kind, round(res[(name, kind)][-1], 2), flush=True)
for (name, kind), v in res.items():
    print(f"{name:8s} {kind:22s} ms/token (median of {ROUNDS}): {1000 * statistics.median(v) / N:.0f}  runs {[round(x, 1) for x in v]}")
