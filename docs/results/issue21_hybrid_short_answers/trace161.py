"""Why did the int4 draft draft differently for question 161 in the bench's process than in trace.py's?
Runs the draft method on 161 (greedy, -k auto and fixed k=4) in fresh drafters and after warm-ups, printing
forwards and the first drafts."""
import sys, time
import torch
import hf_spec
from hf_spec.drafters.registry import make_drafter
from hf_spec.prompts import chat_inputs, load_questions

target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="auto")
qs = {q.question_id: q for q in load_questions()}
inputs = chat_inputs(tok, qs["161"].text)
warm = chat_inputs(tok, "Write one sentence about the sea.")

def once(d, k, label):
    events = []
    out = target.generate(**inputs, max_new_tokens=128, do_sample=False, custom_generate=hf_spec.generate,
                          drafter=d, num_speculative_tokens=k, return_dict_in_generate=True,
                          event_listeners=[events.append])
    drafts = [tok.convert_ids_to_tokens(e.drafted[0]) for e in events[1:] if e.drafted[0]][:3]
    print(f"{label:40s} k={k}: {out.stats.num_target_forwards} forwards, acc {out.stats.num_accepted_tokens}/"
          f"{out.stats.num_draft_tokens}; first drafts {drafts}", flush=True)
    return out.sequences

with torch.inference_mode():
    d = make_drafter("draft:qwen2.5-coder-0.5b", target=target, tokenizer=tok, draft_dtype="auto")
    a = once(d, 4, "fresh drafter, no warm-up")
    once(d, "auto", "same drafter, second call")
    target.generate(**warm, max_new_tokens=8, custom_generate=hf_spec.generate, drafter=d, num_speculative_tokens="auto")
    once(d, "auto", "after an 8-token warm-up")
    once(d, 4, "after an 8-token warm-up")
    plain = target.generate(**inputs, max_new_tokens=128, do_sample=False)
    print("identical to plain:", torch.equal(plain, a), tok.decode(plain[0, inputs["input_ids"].shape[1]:]))
