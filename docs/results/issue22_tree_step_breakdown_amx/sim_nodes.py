"""sim_tau.py's simulation at the chain's stop (0.5) for several tree sizes, with the verify times tn.py measured."""
import statistics
from sim_tau import data, run
T = {1: 195.6, 8: 197.1, 12: 199.5, 15: 201.4, 16: 202.8, 17: 210.5, 18: 212.9, 24: 216.8, 32: 226.2, 33: 273.2}  # tn.txt
def V(n):  # ms: target verify of n positions, interpolated between tn.py's measurements
    lo = max(m for m in T if m <= n); hi = min((m for m in T if m >= n), default=lo)
    return T[lo] if hi == lo else T[lo] + (T[hi] - T[lo]) * (n - lo) / (hi - lo)
for nodes in (6, 8, 10, 12, 14, 15, 16, 24):
    res = []
    for p in data:
        c = run(p, 0.5, False, V=V); tr = run(p, 0.5, True, nodes=nodes, V=V)
        res.append((tr[0] / c[0], tr[1], c[1]))
    print(f"nodes={nodes}: tree/chain median {statistics.median(x[0] for x in res):.3f}  tok/step tree {statistics.mean(x[1] for x in res):.2f} chain {statistics.mean(x[2] for x in res):.2f}")
