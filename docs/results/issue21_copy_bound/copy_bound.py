"""How far can any copy drafter get on Spec-Bench with this target? (issue 21)

Replays the target's own greedy answers (Qwen2.5-Coder-1.5B, bfloat16, 13 categories x 2 prompts x 128 tokens:
the answers saved by docs/results/issue22_eagle2_expansion_bf16_13x2_128/sim_tree.py) offline and counts tokens per
target forward for chain drafters that copy from the text (greedy acceptance is exact given the answer):

- ``prompt lookup``: transformers' PromptLookupCandidateGenerator as the bench runs it (k = 3, n-grams of 3..1,
  the first match from the left), re-implemented from its source (transformers 5.25).
- ``tree oracle``: a drafter that knows the answer and, at every step, takes the best of *all* continuations (at
  most 8 tokens) that follow an occurrence of the text's last token (``any 1-token match``) or of the longest
  suffix of the text found (``longest match``: what suffix and n-gram drafters match on), in the text so far
  (prompt and answer) or also in the corpus of past answers (docs/results/issue21_suffix_corpus/corpus.jsonl): a
  speculation tree of unlimited width over those matches, verified for free. No drafter choosing among those
  matches' continuations takes more tokens per forward.
- ``any run, + corpus``: looser still, the longest run of the answer's next tokens (at most 8) found anywhere in
  the text or corpus, whatever precedes it (not a drafter: 1-token runs of common tokens are nearly always found).
- ``suffix measured``: hf-spec's suffix drafter with the corpus in that bench (RESULTS_JSON, below).

Then, per summarization and RAG prompt, the ceilings on issue 21's "suffix >= 2x" speedup (tokens/s with TTFT,
the bench's measure) from the measured plain run (TTFT and TPOT) and a bench's results.json: decoding free after
the prefill (plain total / TTFT), and the oracle's forwards at the plain TPOT each.

    python docs/results/issue21_copy_bound/copy_bound.py [RESULTS_JSON]
"""
import json
import statistics
import sys
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from hf_spec.models import provision
from hf_spec.prompts import chat_inputs, load_questions

ROOT = Path(__file__).resolve().parents[3]
ANSWERS = ROOT / "docs/results/issue22_eagle2_expansion_bf16_13x2_128/sim_tree.json"
CORPUS = ROOT / "docs/results/issue21_suffix_corpus/corpus.jsonl"
RESULTS = Path(sys.argv[1]) if len(sys.argv) > 1 else \
    ROOT / "docs/results/issue21_hybrid_history/greedy_bf16_13x2_128/results.json"


def prompt_lookup(ids: list[int], k: int = 3, max_ngram: int = 3) -> list[int]:
    """transformers' prompt lookup candidates for ``ids`` (its get_candidates, batch of one, no processors)."""
    n = len(ids)
    for size in range(min(max_ngram, n - 1), 0, -1):
        tail = ids[-size:]
        for start in range(n - size + 1):
            if ids[start:start + size] == tail and start + size < n:
                return ids[start + size:min(start + size + k, n)]
    return []


def occurs(needle: list[int], hay: str) -> bool:
    return (" " + " ".join(map(str, needle)) + " ") in hay


def oracle_run(context: list[int], answer: list[int], pos: int, k: int, corpus: str) -> int:
    """The longest l <= k such that answer[pos:pos + l] occurs in context + answer[:pos] or the corpus."""
    text = " " + " ".join(map(str, context + answer[:pos])) + " "
    best = 0
    for length in range(1, min(k, len(answer) - pos) + 1):
        run = answer[pos:pos + length]
        if occurs(run, text) or (corpus and occurs(run, corpus)):
            best = length
        else:
            break
    return best


def matched_runs(text: np.ndarray, pos_text: int, answer: list[int], pos: int, k: int, longest: bool) -> int:
    """The longest prefix of answer[pos:pos + k] that some continuation in ``text`` proposes, over the slots that
    follow an occurrence of the last token of ``answer``'s context (``longest``: only the occurrences of the
    longest suffix of the context found in ``text``). ``text[:pos_text]`` is the searchable part."""
    hay = text[:pos_text]
    if pos_text < 2:
        return 0
    ends = np.nonzero(hay[:-1] == hay[-1])[0] + 1  # slots after an earlier occurrence of the last token
    if longest:
        m = 1
        while len(ends):
            keep = ends[(ends - m - 1 >= 0)]
            keep = keep[hay[keep - m - 1] == hay[pos_text - m - 1]] if pos_text - m - 1 >= 0 else keep[:0]
            if not len(keep):
                break
            ends, m = keep, m + 1
    want = np.asarray(answer[pos:pos + k])
    best = 0
    for e in ends:
        cont = text[e:e + len(want)]  # may run into the answer itself: what a drafter over the text sees
        n = 0
        while n < len(cont) and n < len(want) and cont[n] == want[n] and e + n < pos_text:
            n += 1
        best = max(best, n)
    return best


def forwards(answer: list[int], propose) -> int:
    pos = steps = 0
    while pos < len(answer):
        draft = propose(pos)
        accepted = 0
        for a, b in zip(draft, answer[pos:]):
            if a != b:
                break
            accepted += 1
        pos += accepted + 1  # the accepted tokens and the target's own (bonus) token
        steps += 1
    return steps


def main():
    tokenizer = AutoTokenizer.from_pretrained(provision("qwen2.5-coder-1.5b"))
    answers = json.load(open(ANSWERS))
    corpus = " " + " | ".join(" ".join(map(str, json.loads(line)["output"])) for line in open(CORPUS)) + " "
    corpus_ids = np.concatenate([np.asarray(json.loads(line)["output"] + [-1]) for line in open(CORPUS)])
    results = {p["question_id"]: p for p in json.load(open(RESULTS))["prompts"]}
    rows = []
    for q, rec in zip(load_questions(per_category=2), answers):
        assert q.category == rec["cat"]
        context = chat_inputs(tokenizer, q.text)["input_ids"][0].tolist()
        answer = rec["new"]
        tpf = {"prompt lookup": len(answer) / forwards(answer, lambda p: prompt_lookup(context + answer[:p]))}
        tpf["any run, + corpus"] = len(answer) / forwards(
            answer, lambda p: answer[p:p + oracle_run(context, answer, p, 8, corpus)])
        full = np.asarray(context + answer)
        with_corpus = np.concatenate([corpus_ids, [-1], full])
        for longest in (False, True):
            name = "tree oracle, " + ("longest match" if longest else "any 1-token match")
            tpf[name] = len(answer) / forwards(answer, lambda p: answer[p:p + matched_runs(
                full, len(context) + p, answer, p, 8, longest)])
            tpf[name + " + corpus"] = len(answer) / forwards(answer, lambda p: answer[p:p + matched_runs(
                with_corpus, len(corpus_ids) + 1 + len(context) + p, answer, p, 8, longest)])
        run = results[str(q.question_id)]["runs"]["suffix"]
        tpf["suffix measured"] = run["stats"]["mean_accepted_length"]
        rows.append((q, tpf))
    names = list(rows[0][1])
    print("tokens per target forward, median over the 26 prompts (and per category: median of its 2):")
    print("| category | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for cat in dict.fromkeys(q.category for q, _ in rows):
        vals = [t for q, t in rows if q.category == cat]
        print(f"| {cat} | " + " | ".join(f"{statistics.median(v[n] for v in vals):.2f}" for n in names) + " |")
    print("| **all (median)** | " + " | ".join(f"**{statistics.median(t[n] for _, t in rows):.2f}**" for n in names) + " |")
    for n in names[1:]:
        ratio = [t[n] / t["prompt lookup"] for _, t in rows]
        print(f"{n} / prompt lookup, median per prompt: {statistics.median(ratio):.3f}")
    print("\nsummarization and RAG: ceilings on the tokens/s speedup over plain decoding (plain run of", RESULTS.name,
          "in", RESULTS.parent.name + ")")
    print("| prompt | prompt tokens | answer tokens | plain TTFT | plain TPOT | decoding free | tree oracle (longest match + corpus) at the plain TPOT a forward | suffix measured |")
    print("|---|---|---|---|---|---|---|---|")
    for q, t in rows:
        if q.category not in ("summarization", "rag"):
            continue
        p = results[str(q.question_id)]
        base, n = p["runs"]["baseline"], p["runs"]["baseline"]["new_tokens"]
        plain = base["total_s"]
        free = plain / base["ttft_s"]
        oracle = plain / (base["ttft_s"] + (n / t["tree oracle, longest match + corpus"] - 1) * base["tpot_s"])
        measured = p["runs"]["suffix"]["tokens_per_s"] / base["tokens_per_s"]
        print(f"| {q.category} {q.question_id} | {p['prompt_tokens']} | {n} | {base['ttft_s']:.2f} s | "
              f"{base['tpot_s'] * 1e3:.0f} ms | {free:.2f}x | {oracle:.2f}x | {measured:.2f}x |")


if __name__ == "__main__":
    main()
