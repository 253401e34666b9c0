"""What indexing past outputs costs (SuffixDrafter(remember_outputs=N)): SuffixArrayLevels, the log-structured
index, against one SuffixArray rebuilt over every kept output at each call's end (what the drafter did before).

Outputs: 500-token answers that repeat one answer with 5 tokens changed (an agent's or a template's outputs: the
repetitive case, where sorting suffixes is slowest), one per call, until the bound is full and past it. Prints per
bound: the time of each call's indexing (mean, mean of the last 200, the largest), the levels, one rebuild over the
kept outputs, and a query (the longest match of a 16-token context and an 8-token continuation) on both, interleaved,
medians of 5 rounds of 50 contexts. Usage: python levels_cost.py (about a minute on a 2-core CPU).
"""

import statistics
import time

import numpy as np

from hf_spec.drafters.suffix_index import SuffixArray, SuffixArrayLevels


def main():
    rng = np.random.default_rng(0)
    answer = rng.integers(0, 30000, 500)

    def output():
        out = answer.copy()
        out[rng.integers(0, 500, 5)] = rng.integers(0, 30000, 5)
        return out

    for bound, calls in ((100_000, 400), (1_000_000, 2400)):
        levels, times = SuffixArrayLevels(bound), []
        for _ in range(calls):
            t = time.perf_counter()
            levels.add([output()])
            times.append(time.perf_counter() - t)
        kept = levels.documents
        t = time.perf_counter()
        one = SuffixArray(kept)
        rebuild = time.perf_counter() - t
        print(f"bound {bound:,} tokens, {calls} calls of 500 tokens: indexing a call {statistics.mean(times) * 1000:.1f} ms "
              f"mean, {statistics.mean(times[-200:]) * 1000:.1f} ms mean of the last 200, {max(times) * 1000:.0f} ms at "
              f"most; {len(levels.levels)} levels of {[len(lv.docs) for lv in levels.levels]} outputs; one array "
              f"rebuilt over the {len(kept)} kept outputs: {rebuild:.2f} s")
        contexts = [list(output()[j:j + 16]) for j in rng.integers(0, 480, 50)]
        rounds = {"levels": [], "one array": []}
        for _ in range(5):
            for name, index in (("levels", levels), ("one array", one)):
                t = time.perf_counter()
                for c in contexts:
                    n, *where = index.match_of(c, 1, 16)
                    index.continuation(n, *where, 8)
                rounds[name].append((time.perf_counter() - t) / len(contexts))
        print("  a query (match + 8-token continuation), median of 5 rounds: " + ", ".join(
            f"{name} {statistics.median(v) * 1000:.2f} ms" for name, v in rounds.items()))


if __name__ == "__main__":
    main()
