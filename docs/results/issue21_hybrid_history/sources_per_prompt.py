"""Per prompt of an `hf-spec bench` results.json: the draft model's, the suffix drafter's and the hybrid's speedup
over plain decoding, and the hybrid's drafts, draft tokens and accepted tokens by source (suffix, model).

    python sources_per_prompt.py RESULTS.json
"""
import ast
import json
import sys

HYBRID, DRAFT = "hybrid:draft:qwen2.5-coder-0.5b", "draft:qwen2.5-coder-0.5b"
results = json.load(open(sys.argv[1]))
print("category      prompt  draft  suffix  hybrid   hybrid's suffix drafts/tokens/accepted   model drafts/tokens/accepted")
for p in results["prompts"]:
    runs = p["runs"]
    plain = runs["baseline"]["tokens_per_s"]
    stats = runs[HYBRID]["stats"]
    stats = ast.literal_eval(stats.replace("nan", "None")) if isinstance(stats, str) else stats
    sources = stats.get("per_source", {})
    s, d = sources.get("suffix", {}), sources.get("draft", {})
    print(f"{p['category'][:13]:13} {p['prompt_tokens']:6} {runs[DRAFT]['tokens_per_s'] / plain:6.2f} "
          f"{runs['suffix']['tokens_per_s'] / plain:7.2f} {runs[HYBRID]['tokens_per_s'] / plain:7.2f}   "
          f"{s.get('drafts', 0):4}/{s.get('draft_tokens', 0):4}/{s.get('accepted_tokens', 0):4}"
          f"{'':25}{d.get('drafts', 0):4}/{d.get('draft_tokens', 0):4}/{d.get('accepted_tokens', 0):4}")
