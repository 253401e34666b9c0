import time, torch, hf_spec, statistics
from hf_spec.ragged import RaggedCache
from hf_spec.kernels import verify_linear
torch.manual_seed(0)
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
prompt = torch.randint(100, 20000, (1, 300))
rc = RaggedCache(target.config, 1, "cpu")
with torch.no_grad():
    rc.forward(target, prompt)
def chain_parents(n): return torch.arange(-1, n - 1)[None]
def tree_parents(n):  # chain of 4 with siblings under each
    p = [-1, 0, 1, 2] + [-1] * 4 + [0] * 3 + [1] * 2 + [2] * 2 + [3]
    return torch.tensor(p[: n])[None]
cases = {"chain17": (17, None), "tree17c": (17, chain_parents), "tree17": (17, tree_parents), "chain8": (8, None), "tree8": (8, tree_parents)}
res = {c: [] for c in cases}
post = {c: [] for c in cases}
with torch.no_grad():
    for rep in range(15):
        for c, (n, pf) in cases.items():
            block = torch.randint(100, 20000, (1, n))
            before = rc.lengths.clone()
            t0 = time.perf_counter()
            with verify_linear(n > 1):
                out = rc.forward(target, block, None, logits_to_keep=n, parents=None if pf is None else pf(n - 1))
            t1 = time.perf_counter()
            lg = out.logits[:, -n:].float(); am = lg.argmax(-1)
            if pf is None:
                rc.truncate(before)
            else:
                rc.keep_path(torch.tensor([0]), torch.zeros(1, 0, dtype=torch.long))
                rc.truncate(before)
            t2 = time.perf_counter()
            if rep: res[c].append(t1 - t0); post[c].append(t2 - t1)
for c in cases:
    print(c, f"fwd {1e3*statistics.median(res[c]):.1f} ms  post {1e3*statistics.median(post[c]):.2f} ms")
