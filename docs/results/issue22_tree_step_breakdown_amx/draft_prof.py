import time, torch, hf_spec, statistics, sys, collections
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
from hf_spec.ragged import RaggedCache
import hf_spec.drafters.draft_model as dm
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
log = []
orig = RaggedCache.forward
def fwd(self, model, block, *a, **k):
    t0 = time.perf_counter(); out = orig(self, model, block, *a, **k)
    log.append((model is draft, block.shape[1], time.perf_counter() - t0)); return out
RaggedCache.forward = fwd
tlog = collections.defaultdict(float)
for name in ("draft", "draft_tree", "_catch_up"):
    f = getattr(DraftModelDrafter, name)
    def w(self, *a, _f=f, _n=name, **k):
        t0 = time.perf_counter(); r = _f(self, *a, **k); tlog[_n] += time.perf_counter() - t0; return r
    setattr(DraftModelDrafter, name, w)
qs = [q for q in load_questions(per_category=1) if q.category in sys.argv[1].split(",")]
for q in qs:
    enc = chat_inputs(tok, q.text)
    for nodes in (0, 16):
        log.clear(); tlog.clear(); ev = []
        target.generate(**enc, custom_generate=hf_spec.generate, drafter=DraftModelDrafter(draft), num_speculative_tokens="auto",
                        **({"num_tree_nodes": nodes} if nodes else {}), max_new_tokens=128, do_sample=False, event_listeners=[ev.append])
        steps = len([e for e in ev if e.step > 0])
        dl = [x for x in log[1:] if x[0]]  # skip draft prefill
        by = collections.defaultdict(list)
        for _, n, t in dl: by[min(n, 9)].append(t)
        print(q.category, nodes, "steps", steps, "draft fwds/step %.2f" % (len(dl) / steps),
              {n: (len(v), round(1e3 * statistics.median(v), 1)) for n, v in sorted(by.items())},
              {k: round(1e3 * v / steps, 1) for k, v in tlog.items()}, "fwd total/step %.1f" % (1e3 * sum(t for _, _, t in dl) / steps), flush=True)
