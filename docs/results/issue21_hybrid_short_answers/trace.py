"""Why the hybrid's model drafts were accepted less than the same draft model's alone on short answers (13 x 2 run of
2026-12-03: translation 161, summarization 242). Runs both on one prompt (bf16 target, int4 draft, -k auto, greedy)
after a warm-up call, and prints per step: the source, the drafted tokens, how many were accepted.
Run: .venv/bin/python docs/results/issue21_hybrid_short_answers/trace.py QUESTION_ID [QUESTION_ID ...]"""
import sys
import torch
import hf_spec
from hf_spec.drafters.registry import make_drafter
from hf_spec.prompts import chat_inputs, load_questions

target, tok = hf_spec.load("qwen2.5-coder-1.5b", dtype="auto")
draft = make_drafter("draft:qwen2.5-coder-0.5b", target=target, tokenizer=tok, draft_dtype="auto")
hybrid = hf_spec.HybridDrafter(draft)
qs = {q.question_id: q for q in load_questions()}
with torch.inference_mode():
    warm = chat_inputs(tok, "Write one sentence about the sea.")
    for d in (draft, hybrid):
        target.generate(**warm, max_new_tokens=16, custom_generate=hf_spec.generate, drafter=d, num_speculative_tokens="auto")
    for qid in sys.argv[1:]:
        inputs = chat_inputs(tok, qs[qid].text)
        for name, d in (("draft", draft), ("hybrid", hybrid), ("draft", draft), ("hybrid", hybrid)):
            events = []
            out = target.generate(**inputs, max_new_tokens=128, do_sample=False, custom_generate=hf_spec.generate,
                                  drafter=d, num_speculative_tokens="auto", return_dict_in_generate=True,
                                  event_listeners=[events.append])
            print(f"== {qid} {name}: {out.sequences.shape[1] - inputs['input_ids'].shape[1]} tokens, "
                  f"{out.stats.num_target_forwards} forwards, per source {out.stats.per_source}")
            for e in events[1:]:
                print(f"  step {e.step} k={e.num_speculative_tokens} src={e.sources} drafted={tok.convert_ids_to_tokens(e.drafted[0])} "
                      f"accepted={e.num_accepted[0]} emitted={tok.convert_ids_to_tokens(e.emitted[0])}")
