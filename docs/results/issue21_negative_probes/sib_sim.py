"""Where a draft tree's sibling is the target's token (draft rank 1-2), is the target's next token the chain's next one
(substitution: free to add as the sibling's child) or the draft's own token (insertion)? Teacher forced over the target's
greedy answers of sim_tree.json; tf_next: the draft's own next token after the true prefix (what a draft forward on
the sibling would give). Run from the repository root."""
import json, torch, time, hf_spec
from hf_spec.prompts import load_questions, chat_inputs
from hf_spec.drafters.draft_model import load_draft_model
torch.set_num_threads(2)
d = json.load(open('docs/results/issue22_eagle2_expansion_bf16_13x2_128/sim_tree.json'))
from transformers import AutoTokenizer
target_dir = hf_spec.models.provision("qwen2.5-coder-1.5b")
tok = AutoTokenizer.from_pretrained(target_dir)
draft, _ = load_draft_model("qwen2.5-coder-0.5b", draft_dtype="bfloat16")
qs = load_questions(per_category=2)
stats = dict(hits=0, sub1=0, ins1=0, sub12=0, tf_next=0, n_pos=0)
rows=[]
t0=time.time()
for q, x in zip(qs, d):
    assert q.category == x['cat']
    enc = chat_inputs(tok, q.text)["input_ids"][0]
    new = torch.tensor(x['new']); L = len(enc)
    seq = torch.cat([enc, new])
    with torch.no_grad():
        dl = draft(seq[None]).logits[0, L-1:-1].float()
    own = dl.argmax(-1)  # draft's top-1 at each new position, teacher forced
    top = dl.topk(3, -1).indices
    for i in range(len(new) - 2):
        if x['rank'][i] not in (1, 2) or x['new'][i] != x['argmax'][i]:
            continue
        stats['hits'] += 1
        stats['tf_next'] += int(own[i+1] == new[i+1])
        stats['ins1'] += int(own[i] == new[i+1])
        pre = torch.cat([seq[:L+i], own[i:i+1]])
        with torch.no_grad():
            out = draft(pre[None], use_cache=True)
            c1 = out.logits[0, -1].argmax()
            out2 = draft(c1.view(1,1), past_key_values=out.past_key_values, use_cache=True)
            c2 = out2.logits[0, -1].argmax()
        s1 = int(c1 == new[i+1]); stats['sub1'] += s1
        stats['sub12'] += int(s1 and c2 == new[i+2])
        rows.append(dict(cat=q.category, i=i, rank=x['rank'][i], own=int(own[i]), tgt=[int(t) for t in new[i:i+3]], c=[int(c1), int(c2)]))
    print(q.category, stats, f"{time.time()-t0:.0f}s", flush=True)
json.dump(dict(stats=stats, rows=rows), open('docs/results/issue21_negative_probes/sib_sim.json','w'))
