import json, statistics
data = json.load(open("sim_tree.json"))
def walk(r, t, k, accept_lt, cont_lt):
    d = 0
    while d < k and t + d < len(r):
        x = r[t + d]
        if x < accept_lt:
            d += 1
            if x >= cont_lt:
                break
        else:
            break
    return d
def sim(k, accept_lt, cont_lt):
    steps = toks = 0
    for p in data:
        r = p["rank"]; t = 0
        while t < len(r):
            d = walk(r, t, k, accept_lt, cont_lt)
            t += d + 1; steps += 1; toks += d + 1
    return toks / steps
for k in (4, 5, 6, 8):
    print(f"k={k} chain {sim(k,1,1):.2f}  tree W8 (cont rank0) {sim(k,8,1):.2f}  expand m=2 {sim(k,8,2):.2f}  m=3 {sim(k,8,3):.2f}  W2 cont2 {sim(k,2,2):.2f} W3 m3 {sim(k,3,3):.2f}")
import collections
c = collections.Counter(x for p in data for x in p["rank"])
n = sum(c.values()); print({k: round(v / n, 3) for k, v in sorted(c.items())})
import math
def sim2(k, W, m, X, conf=0.5):
    steps = toks = 0
    for p in data:
        r, alp = p["rank"], p["a_lp"]; t = 0
        while t < len(r):
            d = 0; cum = 0.0; extra = False
            while d < k and t + d < len(r):
                x = r[t + d]
                if x >= W: break
                cum += alp[t + d]; d += 1
                if x == 0:
                    if math.exp(alp[t+d-1]) < conf and not extra: break  # chain confidence stop (approx: prob of accepted token)
                    continue
                if x < m and math.exp(cum) >= X: extra = True; continue
                break
            t += d + 1; steps += 1; toks += d + 1
    return toks / steps
for k in (6, 8):
    for m, X in ((1, 1), (2, 0.05), (2, 0.1), (2, 0.2), (3, 0.1)):
        print(k, m, X, f"{sim2(k, 8, m, X):.2f}")
