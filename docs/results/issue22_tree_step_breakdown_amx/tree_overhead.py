import time, torch, hf_spec, statistics
from hf_spec.ragged import RaggedCache, check_tree_model
from hf_spec.acceptance import check_parents
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
rc = RaggedCache(target.config, 1, "cpu")
with torch.no_grad():
    rc.forward(target, torch.randint(100, 20000, (1, 300)))
p = torch.tensor([[-1, 0, 1, 2] + [-1] * 4 + [0] * 3 + [1] * 2 + [2] * 2 + [3]])
bv = torch.ones(1, 17, dtype=torch.bool)
def t(f, n=50):
    f(); ts = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(ts)
print("check_tree_model", t(lambda: check_tree_model(target)))
print("check_parents", t(lambda: check_parents(p, torch.tensor([16]))))
print("_tree", t(lambda: RaggedCache._tree(target, p, bv)))
rc.valid = torch.cat([rc.valid, bv], 1)
pos = torch.arange(300, 317)[None]
d, w = RaggedCache._tree(target, p, bv)
print("_masks tree", t(lambda: rc._masks(target, pos, w)))
print("_masks chain", t(lambda: rc._masks(target, pos, None)))
