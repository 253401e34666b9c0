"""Offline: how often the suffix drafter's proposals are accepted, by match length, on the target's own greedy
outputs (outputs.json from gen_outputs.py). At every output position t the drafter (default settings, k = 8)
proposes from the prompt and output[:t]; greedy verification accepts the proposal's longest prefix equal to
output[t:]. Prints per match-length bucket: proposals, mean length, conditional acceptance at positions 1-4
(P(token i accepted | tokens before it accepted)), and mean accepted tokens. Also the steps a suffix-only loop
takes (jumping by accepted + 1), the positions a real loop visits."""
import json, sys
from collections import defaultdict
from hf_spec.drafters.suffix import SuffixDrafter
from hf_spec.drafters.suffix_index import SuffixTrie

BUCKETS = [(1, 1), (2, 2), (3, 3), (4, 5), (6, 9), (10, 99)]
rows = json.load(open(sys.argv[1]))
d = SuffixDrafter(8)
stats = {mode: defaultdict(lambda: [0, 0, [0] * 8, [0] * 8, 0]) for mode in ("every", "loop")}
for r in rows:
    prompt, out = r["prompt_ids"], r["output_ids"]
    for mode in ("every", "loop"):
        trie = SuffixTrie(d.max_match + 16)
        state = trie.extend(prompt, [])
        t = 0
        while t < len(out):
            n, node = trie.longest_match(state, d.min_match, d.max_match)
            step = 1
            if n:
                p = trie.continuation(node, n, d._limit(n, 8), d.min_token_prob, False)
                acc = 0
                while acc < len(p.tokens) and t + acc < len(out) and p.tokens[acc] == out[t + acc]:
                    acc += 1
                b = next(b for b in BUCKETS if b[0] <= n <= b[1])
                s = stats[mode][b]
                s[0] += 1; s[1] += len(p.tokens); s[4] += acc
                for i in range(min(len(p.tokens), acc + 1)):
                    s[2][i] += 1
                for i in range(acc):
                    s[3][i] += 1
                if mode == "loop":
                    step = acc + 1
            for tok in out[t:t + step]:
                state = trie.append(state, tok)
            t += step
for mode in ("every", "loop"):
    print(f"## proposals at {'every output position' if mode == 'every' else 'the positions a suffix-only loop visits'}")
    print("| match length | proposals | mean length | a_1 | a_2 | a_3 | a_4 | accepted per proposal |")
    print("|---|---|---|---|---|---|---|---|")
    for b in BUCKETS:
        s = stats[mode][b]
        if not s[0]:
            continue
        cond = [f"{s[3][i] / s[2][i]:.2f} ({s[2][i]})" if s[2][i] else "-" for i in range(4)]
        print(f"| {b[0]}-{b[1]} | {s[0]} | {s[1] / s[0]:.1f} | {' | '.join(cond)} | {s[4] / s[0]:.2f} |")
