"""Which loss trains better Medusa heads from the cached features: the sampled softmax or the full softmax?"""
import json, sys, time, glob, math
import torch
from hf_spec.medusa import train as T
from hf_spec.medusa.heads import MedusaConfig, MedusaHeads
import hf_spec

mode, epochs = sys.argv[1], float(sys.argv[2])
torch.manual_seed(0)
files = sorted(glob.glob("/root/.cache/hf_spec/medusa/qwen2.5-coder-1.5b/cache/texts/*.pt"))
parts = [torch.load(f, weights_only=False) for f in files]
feats = T.Features.concat(parts, {})
ntext = int(feats.text_index.max()) + 1
train_texts, eval_texts = T._split(ntext, 0.1, 0)
print("texts", ntext, "positions", feats.hidden.shape[0], flush=True)
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
for p in target.parameters(): p.requires_grad_(False)
W_bf16 = target.get_output_embeddings().weight.to(torch.bfloat16)
cfg = MedusaConfig(4, 1, feats.hidden.shape[1], W_bf16.shape[0], "shared-lm-head", "qwen2.5-coder-1.5b")
heads = MedusaHeads(cfg).float().bind(target)

def full_loss(heads, feats, pos, negatives, g):
    N = heads.num_heads
    x = heads.hidden(feats.hidden[pos])  # [b, N, H]
    offsets = torch.arange(1, N + 1)
    label_pos = pos[:, None] + offsets[None, :]
    valid = feats.remaining[pos][:, None] >= offsets[None, :]
    label_pos = torch.where(valid, label_pos, pos[:, None])
    t_ids = feats.top_ids[label_pos]
    t_p = feats.top_logp[label_pos].softmax(dim=-1)
    weights = 0.8 ** torch.arange(N, dtype=torch.float32)
    logits = (x.to(torch.bfloat16) @ W_bf16.T).float()  # [b, N, V]
    logq = logits.log_softmax(dim=-1)
    ce = -(t_p * logq.gather(2, t_ids)).sum(-1)  # [b, N]
    total = x.new_zeros(())
    for i in range(N):
        m = valid[:, i]
        if bool(m.any()):
            total = total + weights[i] * ce[m, i].mean()
    return total

if mode == "full":
    T._batch_loss = full_loss
settings = T.TrainSettings(epochs=max(1, math.ceil(epochs)), negatives=int(sys.argv[3]) if len(sys.argv) > 3 else 1024)
t = time.perf_counter()
log = T.train_heads(heads, feats, train_texts, settings, None, progress=False)
print(mode, "train", time.perf_counter() - t, log, flush=True)
res = T.evaluate_heads(heads, feats, eval_texts)
print(mode, json.dumps(res), flush=True)
torch.save(heads.heads.state_dict(), f"/work/runs/medusa_loss/heads_{mode}.pt")
