import time, torch, hf_spec, statistics, sys
from hf_spec.ragged import RaggedCache
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
rc = RaggedCache(target.config, 1, "cpu")
with torch.no_grad():
    rc.forward(target, torch.randint(100, 20000, (1, 300)))
ns = [int(x) for x in sys.argv[1].split(",")]
res = {n: [] for n in ns}
with torch.no_grad():
    for rep in range(int(sys.argv[2])):
        for n in ns:
            before = rc.lengths.clone()
            t0 = time.perf_counter()
            rc.forward(target, torch.randint(100, 20000, (1, n)), None, logits_to_keep=n)
            if rep: res[n].append(time.perf_counter() - t0)
            rc.truncate(before)
for n in ns: print(n, f"{1e3*statistics.median(res[n]):.1f} ms (min {1e3*min(res[n]):.1f})")
