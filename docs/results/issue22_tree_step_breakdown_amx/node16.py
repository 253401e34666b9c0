import json, math, statistics
from pathlib import Path
data = json.load(open(Path(__file__).parent.parent / "issue22_eagle2_expansion_bf16_13x2_128" / "sim_tree.json"))
vals = []; hit = {}
for p in data:
    r, tlp = p["rank"], p["top_lp"]; t = 0
    while t < len(r):
        levels = 0; cum = 0.0; cands = []
        while levels < 6 and t + levels < len(r):
            lp = tlp[t + levels]
            cands.append((cum + lp[0], levels, 0))
            for j in range(1, 8): cands.append((cum + lp[j], levels, j))
            levels += 1
            if math.exp(lp[0]) < 0.5: break
            cum += lp[0]
        cands.sort(reverse=True)
        if len(cands) >= 16: vals.append(math.exp(cands[15][0]))
        # which ranked node (by cum prob) got accepted as the deepest sibling
        acc = 0
        while acc < levels and r[t + acc] == 0: acc += 1
        if acc < levels and r[t + acc] < 8:
            idx = [i for i, c in enumerate(cands) if c[1] == acc and c[2] == r[t + acc]][0]
            hit[idx] = hit.get(idx, 0) + 1
        t += acc + 1 + (1 if acc < levels and r[t + acc] < 8 else 0)
print("16th node draft prob: median %.3f, quartiles %s" % (statistics.median(vals), statistics.quantiles(vals, n=4)))
tot = sum(hit.values()); print("sibling accepted at rerank index:", sorted(hit.items())[:30], tot)
