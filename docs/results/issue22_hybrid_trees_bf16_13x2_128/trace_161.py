"""Run: .venv/bin/python docs/results/issue22_hybrid_trees_bf16_13x2_128/trace_161.py. Replays the bench's sequence for translation 161 (bf16 target, int4 draft, -k auto, greedy): the warm-up with 8
tokens for each method, then plain decoding, the draft model and the hybrid on the prompt, printing per step the
hybrid's sources, drafts and acceptance, and the controller's policy events."""
import torch
import hf_spec
from hf_spec.drafters.registry import make_drafter
from hf_spec.drafters.suffix import SuffixDrafter
from hf_spec.prompts import chat_inputs, load_questions

target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="auto")
draft = make_drafter("draft:qwen2.5-coder-0.5b", target=target, tokenizer=tok, draft_dtype="auto")
hybrid = hf_spec.HybridDrafter(draft, SuffixDrafter(tokenizer=tok))
q = {q.question_id: q for q in load_questions()}["161"]
kw = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
with torch.inference_mode():
    warm = chat_inputs(tok, "Write one sentence about the sea.")
    target.generate(**warm, max_new_tokens=8, **kw)
    for d in (draft, hybrid):
        target.generate(**warm, max_new_tokens=8, custom_generate=hf_spec.generate, drafter=d,
                        num_speculative_tokens="auto", **kw)
    inputs = chat_inputs(tok, q.text)
    print(repr(q.text[:300]))
    for name, d in (("draft", draft), ("hybrid", hybrid), ("hybrid", hybrid)):
        events = []
        out = target.generate(**inputs, max_new_tokens=128, custom_generate=hf_spec.generate, drafter=d,
                              num_speculative_tokens="auto", return_dict_in_generate=True,
                              event_listeners=[events.append], **kw)
        s = out.stats
        print(f"== {name}: {out.sequences.shape[1] - inputs['input_ids'].shape[1]} tokens, {s.num_target_forwards} "
              f"forwards, {s.total_s:.2f} s, per source {s.per_source}")
        for p in s.policy_events:
            print("   policy", p)
        for e in events[1:]:
            print(f"  step {e.step} k={e.num_speculative_tokens} src={e.sources} "
                  f"drafted={tok.convert_ids_to_tokens(e.drafted[0])} accepted={e.num_accepted[0]} "
                  f"emitted={tok.convert_ids_to_tokens(e.emitted[0])}")
