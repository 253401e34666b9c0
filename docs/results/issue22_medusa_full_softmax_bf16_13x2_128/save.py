import torch, hf_spec
from hf_spec.medusa.heads import MedusaConfig, MedusaHeads
target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="bfloat16")
cfg = MedusaConfig(4, 1, 1536, target.get_output_embeddings().weight.shape[0], "shared-lm-head", "qwen2.5-coder-1.5b")
heads = MedusaHeads(cfg).float()
heads.heads.load_state_dict(torch.load("/work/runs/medusa_loss/heads_full.pt"))
heads.bind(target)
heads.save_pretrained("/work/runs/medusa_loss/heads_full_1epoch")
print("saved")
