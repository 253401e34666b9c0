"""Simulate tree shapes by teacher forcing: target greedy outputs (via hf-spec draft tree, near-tie identical),
then target argmax and draft ranks at every position."""
import json, sys, time, torch, hf_spec
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model, DraftModelDrafter
torch.manual_seed(0)
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
draft, _ = load_draft_model("qwen2.5-coder-0.5b", target=target, draft_dtype="int4")
qs = load_questions(per_category=2)
out = []
for q in qs:
    enc = chat_inputs(tok, q.text)
    t0 = time.time()
    res = target.generate(**enc, custom_generate=hf_spec.generate, return_dict_in_generate=True,
                          drafter=DraftModelDrafter(draft), num_speculative_tokens="auto", num_tree_nodes=16,
                          max_new_tokens=128, do_sample=False)
    seq = res.sequences[0]
    with torch.no_grad():
        tl = target(seq[None]).logits[0].float()
        dl = draft(seq[None]).logits[0].float()
    L = enc["input_ids"].shape[1]
    V = tl.shape[-1]
    a = tl[L - 1:-1].argmax(-1)  # target argmax predicting new tokens
    dlp = dl[L - 1:-1, :V].log_softmax(-1)
    top = dlp.topk(8, -1)
    rank = torch.full_like(a, 99)
    for r in range(8):
        rank = torch.where((top.indices[:, r] == a) & (rank == 99), r, rank)
    out.append(dict(cat=q.category, new=seq[L:].tolist(), argmax=a.tolist(), rank=rank.tolist(),
                    top_lp=top.values.tolist(), a_lp=dlp.gather(1, a[:, None])[:, 0].tolist()))
    print(q.category, len(out[-1]["new"]), f"{time.time()-t0:.0f}s", sum(x == y for x, y in zip(out[-1]["new"], out[-1]["argmax"])), flush=True)
json.dump(out, open("sim_tree.json", "w"))
