"""Sampled RAG prompt: the draft model alone against the hybrid, per seed (same seed: token-identical where the hybrid
drafts only with its model), then the hybrid's suffix choices logged: python probe_hybrid.py 481 128 4 [SEEDS]."""
import sys, json, torch, time, hf_spec
from hf_spec.drafters.draft_model import DraftModelDrafter, load_draft_model
from hf_spec.drafters.hybrid import HybridDrafter
from hf_spec.drafters.suffix import SuffixDrafter
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.commands.generate import read_corpus
torch.set_num_threads(2)
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
corpus = read_corpus(["/work/main/docs/results/issue21_suffix_corpus/corpus.jsonl"])
q = [x for x in load_questions(per_category=2) if str(x.question_id) == sys.argv[1]][0]
enc = chat_inputs(tok, q.text)
dm = DraftModelDrafter(draft)
hy = HybridDrafter(dm, SuffixDrafter(corpus=corpus, tokenizer=tok))
samp = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
N = int(sys.argv[2]) if len(sys.argv) > 2 else 64
for seed in range(int(sys.argv[3]) if len(sys.argv) > 3 else 4):
    for name, d in (("draft", dm), ("hybrid", hy)):
        torch.manual_seed(seed)
        t = time.perf_counter()
        out = target.generate(**enc, custom_generate=hf_spec.generate, drafter=d, num_speculative_tokens="auto",
                              max_new_tokens=N, return_dict_in_generate=True, **samp)
        s = out.stats
        new = out.sequences[0, enc["input_ids"].shape[1]:].tolist()
        ps = getattr(s, "per_source", {}) or {}
        print(seed, name, "%.1fs" % (time.perf_counter() - t), "drafts", s.num_drafts, "tok", s.num_draft_tokens, "acc", s.num_accepted_tokens,
              "fwd", s.num_target_forwards, "per_source", json.dumps(ps) if isinstance(ps, dict) else ps, "hash", hash(tuple(new)) % 10**6, flush=True)

# ---- log the suffix choices
orig = HybridDrafter._draft
log = []
def patched(self, sequences, k, num_nodes):
    out = orig(self, sequences, k, num_nodes)
    if self._chosen[0][0] == "suffix":
        log.append(dict(len=len(sequences[0]), chosen=self._chosen[0], tokens=out[0][0, :int(out[1][0])].tolist(),
                        scale=self.suffix_prior_scale(), prior=self._suffix_scale_prior))
    return out
HybridDrafter._draft = patched
for seed in [int(x) for x in sys.argv[4].split(",")] if len(sys.argv) > 4 else []:
    log.clear()
    torch.manual_seed(seed)
    out = target.generate(**enc, custom_generate=hf_spec.generate, drafter=hy, num_speculative_tokens="auto",
                          max_new_tokens=N, return_dict_in_generate=True, **samp)
    seq = out.sequences[0].tolist()
    for e in log:
        pos = e["len"]
        print(seed, e["chosen"], "scale %.2f prior %.2f" % (e["scale"], e["prior"]), "proposed:", repr(tok.decode(e["tokens"])), "| target:", repr(tok.decode(seq[pos:pos + len(e["tokens"]) + 1])), "| before:", repr(tok.decode(seq[pos-8:pos])))
