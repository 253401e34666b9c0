"""Teacher-forced sim: chain vs chain-with-siblings tree under confidence thresholds. Cost model from AMX measurements."""
import json, math, statistics, sys
from pathlib import Path
data = json.load(open(Path(__file__).parent.parent / "issue22_eagle2_expansion_bf16_13x2_128" / "sim_tree.json"))
D1, D2 = 32.5, 38.0   # ms: draft forward, 1 and 2 tokens
def V_linear(n): return 195.0 + 0.8 * (n - 1)  # ms: target verify of n positions
def run(p, tau, tree, k=6, nodes=16, W=8, V=V_linear):
    r, tlp = p["rank"], p["top_lp"]
    t = 0; steps = 0; ms = 0.0; catch = 1
    while t < len(r):
        # levels drafted: chain token at level i has confidence exp(tlp[t+i][0]) (true context; approx after divergence)
        levels = 0; cum = 0.0; cands = []  # (cumprob, level, rank)
        while levels < k and t + levels < len(r):
            lp = tlp[t + levels]
            for j in range(1, W):
                cands.append((cum + lp[j], levels, j))
            levels += 1
            cum_chain = cum + lp[0]
            if math.exp(lp[0]) < tau: break
            cum = cum_chain
        # acceptance along the chain
        acc = 0
        while acc < levels and r[t + acc] == 0: acc += 1
        npos = 1 + levels
        extra = 0
        if tree:
            cands.sort(reverse=True)
            keep = set((l, j) for _, l, j in cands[: max(0, nodes - levels)])
            npos = 1 + min(nodes, levels + len(cands))
            if acc < levels and (acc, r[t + acc]) in keep: extra = 1
        emitted = acc + extra + 1
        ms += (D1 if catch == 1 else D2) + (levels - 1) * D1 + V(npos)
        catch = 2 if (acc == levels or extra) else 1
        t += emitted; steps += 1
    return t / (ms / 1000), t / steps
if __name__ == "__main__":
    for tau in (0.3, 0.4, 0.5, 0.6, 0.7):
        res = []
        for p in data:
            c = run(p, 0.5, False); tr = run(p, tau, True); c2 = run(p, tau, False)
            res.append((tr[0] / c[0], c2[0] / c[0], tr[1], c[1]))
        print(f"tau={tau}: tree/chain(0.5) median {statistics.median(x[0] for x in res):.3f}  chain(tau)/chain(0.5) {statistics.median(x[1] for x in res):.3f}  tok/step tree {statistics.mean(x[2] for x in res):.2f} chain {statistics.mean(x[3] for x in res):.2f}")
