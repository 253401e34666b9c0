"""Offline simulation of suffix drafting on the target's own greedy outputs (outputs.jsonl from outputs.py):
chains (the shipped SuffixDrafter proposal) against speculation trees (SuffixTrie.tree) of several sizes.
Greedy verification is simulated exactly: a node is accepted when its path equals the target's next tokens.
Prints per policy: tokens per target forward, positions per forward, and a speedup estimate from forward times
by positions (times.json, measured by times.py on this machine), plain = 1 position per token.
Run: .venv/bin/python docs/results/issue21_suffix_tree_sim/sim.py"""
import json, math, statistics, sys
from pathlib import Path
from hf_spec.drafters.suffix_index import SuffixTrie
from hf_spec.adaptive import forward_time

here = Path(__file__).parent


def accept(tokens, parents, target):
    """Greedy tree acceptance: the longest root path equal to target[:d]."""
    if parents is None:
        a = 0
        while a < len(tokens) and a < len(target) and tokens[a] == target[a]:
            a += 1
        return a
    depth_of, cur, a = {}, -1, 0
    while a < len(target):
        nxt = [i for i, (t, up) in enumerate(zip(tokens, parents)) if up == cur and t == target[a]]
        if not nxt:
            break
        cur, a = nxt[0], a + 1
    return a


def run(policy, prompt, out, memory=None):
    trie = SuffixTrie(16 + 16)
    state = trie.extend(prompt)
    pos = forwards = positions = 0
    seconds = 0.0
    kind, k, size, min_prob = policy
    while pos < len(out):
        n, node = trie.longest_match(state, 1, 16)
        tokens, parents = [], None
        best = None
        if n:
            depth = max(1, min(k, math.ceil(4 * n)))
            if kind == "chain":
                best = trie.continuation(node, n, depth, min_prob)
            else:
                best = trie.tree(node, n, size, depth, min_prob)
        if memory is not None:
            context = (prompt + out[:pos])[-16:]
            m, lo, hi = memory.match_of(context, 1, 16)
            if m and m >= n:
                c = memory.continuation(m, lo, hi, max(1, min(k, math.ceil(4 * m))), min_prob)
                if best is None or (c.expected_accepted, c.match_length) > (best.expected_accepted, best.match_length):
                    best = c
        if best is not None:
            tokens, parents = best.tokens, best.parents
        a = accept(tokens, parents, out[pos:])
        step = min(a + 1, len(out) - pos)
        state = trie.extend(out[pos:pos + step], state)
        pos += step
        forwards += 1
        positions += 1 + len(tokens)
        seconds += forward_time(times, 1 + len(tokens))
    return forwards, positions, seconds


if __name__ == "__main__":  # importable: sim_corpus.py reuses accept()
    rows = [json.loads(l) for l in (here / "outputs.jsonl").open()]
    times = {int(k): v for k, v in json.loads((here / sys.argv[1] if len(sys.argv) > 1 else here / "times.json").read_text()).items()}
    policies = [("chain", 3, 0, 0.1), ("chain", 6, 0, 0.1), ("chain", 8, 0, 0.1), ("chain", 8, 0, 0.0),
                ("tree", 8, 4, 0.1), ("tree", 8, 8, 0.1), ("tree", 8, 16, 0.1), ("tree", 8, 8, 0.05),
                ("tree", 8, 16, 0.02), ("tree", 8, 24, 0.02), ("tree", 12, 16, 0.05)]
    print("times", times)
    from hf_spec.drafters.suffix_index import SuffixArray
    mem_mode = sys.argv[2] if len(sys.argv) > 2 else "none"
    for policy in policies:
        ratios, tpf, ppf = [], [], []
        cats = {}
        for i, r in enumerate(rows):
            others = [x["output"] for j, x in enumerate(rows) if (j < i if mem_mode == "earlier" else j != i)]
            memory = SuffixArray(others) if mem_mode != "none" and others else None
            f, p, s = run(policy, r["prompt"], r["output"], memory)
            plain = len(r["output"]) * times[1]
            ratios.append(plain / s)
            tpf.append(len(r["output"]) / f)
            ppf.append(p / f)
            cats.setdefault(r["category"], []).append(plain / s)
        print(f"{str(policy):28s} speedup median {statistics.median(ratios):.3f} mean {statistics.mean(ratios):.3f} "
              f"tokens/forward {statistics.mean(tpf):.2f} positions/forward {statistics.mean(ppf):.2f}  "
              + " ".join(f"{c[:5]}:{statistics.median(v):.2f}" for c, v in cats.items()))
