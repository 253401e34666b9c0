"""The benchmark harness: hf-spec's methods, plain decoding and transformers' own speculative decoding,
side by side on Spec-Bench prompts in one process.

Methods (``--methods``):

- ``baseline``: plain ``model.generate``;
- any drafter spec (:mod:`hf_spec.drafters.registry`): ``draft:NAME`` (a draft model, ``--draft-dtype``,
  bfloat16 by default), ``ngram`` (prompt lookup, n <= 3), ``medusa:DIR`` (Medusa heads; k <= heads), ...;
- ``hf-assisted``: transformers' ``assistant_model=`` with the same draft model (a separate copy, same dtype),
  fixed k (``num_assistant_tokens=k``, constant schedule, confidence threshold 0);
- ``hf-assisted-defaults``: the same at transformers' own defaults, whatever k (up to 20 tokens, the draft
  stopping after a token it gives under 0.4: :data:`~hf_spec.bench.runner.HF_ASSISTED_DEFAULTS`);
- ``hf-prompt-lookup``: transformers' ``prompt_lookup_num_tokens=k`` with ``max_matching_ngram_size=3``.

Methods run interleaved prompt by prompt (and repeat by repeat) after a warm-up, so machine drift hits all
alike (:mod:`.runner`); :mod:`.report` aggregates, checks the speedup model and writes the report;
:mod:`.plots` draws it.
"""

from .report import (KEYS, MIN_VERIFY_COST, contention_warning, decode_time_per_token, load_results, markdown_table,
                     model_check, model_table, seconds_to_shares, speedup_vs_k, speedup_warning, summarize,
                     timing_warnings, tune_warnings, write_report)
from .runner import PEERS, Method, parse_methods, run_bench

__all__ = ["Method", "PEERS", "parse_methods", "run_bench", "KEYS", "summarize", "model_check", "speedup_vs_k",
           "markdown_table", "model_table", "write_report", "load_results", "decode_time_per_token", "speedup_warning",
           "contention_warning", "seconds_to_shares", "timing_warnings", "tune_warnings", "MIN_VERIFY_COST"]
