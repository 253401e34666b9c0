"""Where the answer's next token ranks among the distinct tokens that follow the longest match of the text (ranked
by their count there), at every position of copy_bound.py's replayed answers, in the text only or with the corpus:
rank 0 is what a frequency-ranked chain proposes; "absent": no match's continuation is the answer's token; "no
match": the text's last token occurs nowhere before.

    python docs/results/issue21_copy_bound/match_ranks.py
"""
import collections
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from copy_bound import ANSWERS, CORPUS, AutoTokenizer, chat_inputs, load_questions, provision  # noqa: E402


def main():
    tokenizer = AutoTokenizer.from_pretrained(provision("qwen2.5-coder-1.5b"))
    answers = json.load(open(ANSWERS))
    corpus_ids = np.concatenate([np.asarray(json.loads(line)["output"] + [-1]) for line in open(CORPUS)])
    for use_corpus in (False, True):
        ranks, distinct, lengths = collections.Counter(), [], collections.Counter()
        for q, rec in zip(load_questions(per_category=2), answers):
            context, answer = chat_inputs(tokenizer, q.text)["input_ids"][0].tolist(), rec["new"]
            full = np.asarray(context + answer)
            text = np.concatenate([corpus_ids, [-1], full]) if use_corpus else full
            offset = len(corpus_ids) + 1 if use_corpus else 0
            for p in range(len(answer)):
                end = offset + len(context) + p
                hay = text[:end]
                ends = np.nonzero(hay[:-1] == hay[-1])[0] + 1  # the slots after an earlier occurrence
                m = 1
                while len(ends):  # keep the occurrences of the longest suffix found
                    keep = ends[ends - m - 1 >= 0]
                    keep = keep[hay[keep - m - 1] == hay[end - m - 1]]
                    if not len(keep):
                        break
                    ends, m = keep, m + 1
                if not len(ends):
                    ranks["no match"] += 1
                    continue
                order = [t for t, _ in collections.Counter(int(text[e]) for e in ends).most_common()]
                distinct.append(len(order))
                lengths[min(m, 5)] += 1
                ranks["absent" if answer[p] not in order else min(order.index(answer[p]), 5)] += 1
        total = sum(ranks.values())
        print("with the corpus" if use_corpus else "text only",
              {k: f"{v / total:.1%}" for k, v in sorted(ranks.items(), key=str)},
              f"distinct next tokens: median {int(np.median(distinct))}, mean {np.mean(distinct):.1f};",
              "match lengths (5: 5 or more):", dict(sorted(lengths.items())))


if __name__ == "__main__":
    main()
