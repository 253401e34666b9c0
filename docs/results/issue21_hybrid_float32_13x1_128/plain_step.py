"""Plain decode step cost in float32: transformers' generate vs hf-spec's loop (no drafter; a drafter that never
proposes). 64 new tokens, greedy, interleaved rounds; TPOT medians."""
import statistics, sys, time, torch, hf_spec
from hf_spec.drafters.base import Drafter
from hf_spec.prompts import chat_inputs

class Never(Drafter):
    method = "never"
    def draft(self, sequences, k):
        n = len(sequences)
        return torch.zeros(n, 0, dtype=torch.long), torch.zeros(n, dtype=torch.long), None

dtype = sys.argv[1] if len(sys.argv) > 1 else "float32"
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype=dtype)
inputs = chat_inputs(tok, "Explain how a hash map works, with an example in Python.")
N = 48
def run(kind):
    kw = dict(max_new_tokens=N, do_sample=False, min_new_tokens=N)
    if kind == "hf-spec plain":
        kw.update(custom_generate=hf_spec.generate)
    elif kind == "hf-spec never":
        kw.update(custom_generate=hf_spec.generate, drafter=Never(3), num_speculative_tokens=3)
    t0 = time.perf_counter(); target.generate(**inputs, **kw); return (time.perf_counter() - t0) / N
kinds = ["transformers", "hf-spec plain", "hf-spec never"]
for k in kinds: run(k)  # warm
res = {k: [] for k in kinds}
for r in range(3):
    for k in kinds[r % 3:] + kinds[:r % 3]:
        res[k].append(run(k))
for k, v in res.items(): print(dtype, k, "per token ms (median of 3):", round(statistics.median(v) * 1000, 1), [round(x * 1000) for x in v])
