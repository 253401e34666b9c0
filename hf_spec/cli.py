"""The ``hf-spec`` command: the parser and the dispatch; each command's body is in :mod:`hf_spec.commands`.

``hf-spec generate``: speculative generation on one prompt (or a file of prompts, in batches), optionally
compared side by side with plain ``model.generate`` in the same process (``commands/generate.py``).
``hf-spec bench``: methods side by side on Spec-Bench (``commands/bench.py``, ``hf_spec.bench``).
``hf-spec tune``: measure acceptance, draft cost and verify cost; predict the best k and check it.
``hf-spec demo``: the Gradio demo (``hf_spec.demo``).
``hf-spec train-medusa``, ``quantize``, ``provision``: make models (``commands/models.py``).

``generate``, ``bench``, ``tune`` and ``demo`` take ``--device-map`` (default: ``auto`` when CUDA is available, else
``cpu``; :func:`hf_spec.device.resolve_device_map`), and ``--dtype auto`` decides per device; ``train-medusa``
runs on the CPU, ``quantize`` has its own ``--device``.

Bad input exits with status 2 and one line ``hf-spec: error: ...`` on standard error, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "build_parser"]


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate with a drafter (and compare with plain decoding)")
    p.add_argument("--target", required=True, help="target model: short name (smollm2-135m, qwen2.5-coder-1.5b, ...), folder or hub name")
    p.add_argument("--drafter", default="ngram", help=f"{_specs()} (default: ngram)")
    p.add_argument("-k", "--num-speculative-tokens", type=_k_arg, default=None, dest="k",
                   help="tokens drafted per step (default: the drafter's own, 3; a Medusa checkpoint's head "
                        "count), or auto: chosen before each step from running measurements, speculation "
                        "switched off where it does not pay")
    p.add_argument("--prometheus-port", type=int, default=None,
                   help="serve Prometheus metrics (vLLM's names, prefix hf_spec:) on 127.0.0.1:PORT/metrics while running")
    p.add_argument("--prometheus-hold", type=float, default=0.0,
                   help="keep serving the metrics this many seconds after generation ends (for a scrape)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) decodes greedily; > 0 samples")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="compute dtype; auto = the fastest that is sound on the device the model goes to (CUDA: "
                        "bfloat16, float16 before compute capability 8.0; CPU: bfloat16 with native bfloat16, else "
                        "float32)")
    _add_device_map(p)
    p.add_argument("--quantization", choices=["nf4", "fp4"], default=None,
                   help="quantize the target's weights to 4 bits with bitsandbytes while loading (computing in "
                        "--dtype); an AWQ or GPTQ checkpoint needs none: pass its folder as --target")
    p.add_argument("--draft-dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="draft model dtype; auto = bfloat16 (float16 beside a float16 target): a draft's rounding "
                        "cannot change the output, and half the bytes make each drafted token cheaper")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", help="a text file (one prompt), or JSONL with a 'prompt' or 'turns' field per line")
    p.add_argument("--batch-size", type=int, default=1,
                   help="prompts per batch (left-padded; each row accepts and stops on its own); default 1")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    p.add_argument("--compare", action="store_true", help="also run plain model.generate and report speedup and identity")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _specs() -> str:
    from .drafters.registry import drafter_specs

    return drafter_specs()


def _add_device_map(p) -> None:
    """``--device-map`` on a command that loads a model (checked in the command: one line, exit 2)."""
    from .device import DEVICE_MAP_HELP

    p.add_argument("--device-map", default=None, metavar="MAP", help=DEVICE_MAP_HELP)


def _model_names() -> str:
    from .models import MODELS

    return ", ".join(MODELS)


def _k_arg(text: str):
    if text == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or auto, got {text!r}")


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def _k_list(text: str) -> list:
    return [_k_arg(x.strip()) for x in text.split(",") if x.strip()]


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="benchmark methods side by side on Spec-Bench prompts")
    p.add_argument("--target", required=True)
    p.add_argument("--methods", default="baseline,ngram,hf-prompt-lookup",
                   help="comma-separated: baseline, hf-assisted, hf-prompt-lookup and drafter specs "
                        f"({_specs().replace('none | ', '')})")
    ks = p.add_mutually_exclusive_group()
    ks.add_argument("--k", type=_k_arg, default=None, help="num_speculative_tokens for every method (default 3), or "
                    "auto (hf-spec's methods choose k per step; transformers' peers then use their defaults)")
    ks.add_argument("--k-sweep", type=_k_list, default=None,
                    help="e.g. 1,2,3,5,8 or 3,5,auto: every speculative method at each k")
    p.add_argument("--draft", default=None, help="draft model for hf-assisted when --methods has no draft:NAME")
    p.add_argument("--questions", default=None, help="FastChat-style JSONL (default: the shipped Spec-Bench questions)")
    p.add_argument("--categories", default=None, help="comma-separated (default: all in the file)")
    p.add_argument("--per-category", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32",
                   help="compute dtype (default float32); auto = the fastest that is sound on the target's device")
    p.add_argument("--draft-dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="draft model dtype; auto = bfloat16 (float16 beside a float16 target)")
    _add_device_map(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for results.json, results.md and the plots; an "
                   "interrupted run keeps its finished prompts in OUT/.progress.pkl and the same command resumes")


def _add_tune(sub) -> None:
    p = sub.add_parser("tune", help="measure acceptance, draft cost and verify cost; predict and check the best k")
    p.add_argument("--target", required=True)
    p.add_argument("--drafter", required=True, help=f"a drafter spec: {_specs().replace('none | ', '')}")
    p.add_argument("--k-max", type=int, default=12)
    p.add_argument("--categories", default="coding,writing,qa,math_reasoning")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32",
                   help="compute dtype (default float32); auto = the fastest that is sound on the target's device")
    p.add_argument("--draft-dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="draft model dtype; auto = bfloat16 (float16 beside a float16 target)")
    _add_device_map(p)
    p.add_argument("--no-check", action="store_true", help="only predict; skip measuring the speedup at the best k")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _add_train_medusa(sub) -> None:
    from .medusa.train import TrainSettings

    d = TrainSettings()
    p = sub.add_parser("train-medusa", help="train Medusa heads for a target (self-distillation, resumable)")
    p.add_argument("--target", required=True)
    p.add_argument("--heads", type=int, default=d.heads, help=f"number of heads N (default {d.heads})")
    p.add_argument("--layers", type=int, default=d.layers, help=f"residual blocks per head (default {d.layers})")
    p.add_argument("--variant", choices=["full", "shared-lm-head"], default=d.variant,
                   help="full: own vocabulary projection per head (FasterDecoding); shared-lm-head (default): "
                        "reuse the target's lm_head, only the blocks are new")
    p.add_argument("--data", default="specbench",
                   help="specbench (default; the target answers the questions), questions.jsonl, or text.txt")
    p.add_argument("--out", required=True, help="folder for config.json, medusa_lm_head.safetensors, report.json")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="positions per optimiser step")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="the most tokens per text")
    p.add_argument("--response-tokens", type=int, default=d.response_tokens,
                   help="question data: length of the target's answers")
    p.add_argument("--max-texts", type=int, default=d.max_texts, help="use at most this many texts (0: all)")
    p.add_argument("--gen-batch-size", type=int, default=d.gen_batch_size, help="prompts answered per batch")
    p.add_argument("--exclude-per-category", type=int, default=d.exclude_per_category,
                   help="question data: never train on the first M questions of each category (evaluation prompts)")
    p.add_argument("--negatives", type=int, default=d.negatives, help="random tokens added to each batch's softmax")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--holdout-fraction", type=float, default=d.holdout_fraction)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="float32")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-spec", description="Exact speculative decoding for transformers")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_bench(sub)
    _add_tune(sub)
    _add_train_medusa(sub)
    sub.add_parser("demo", help="serve the Gradio demo on 127.0.0.1 (accepted and rejected tokens live); "
                                "hf-spec demo --help", add_help=False)
    p = sub.add_parser("quantize", help="make an AWQ-INT4 checkpoint of a target (needs hf-spec[quantization])")
    p.add_argument("--target", required=True, help="offline short name or model folder")
    p.add_argument("--method", choices=["awq"], default="awq")
    p.add_argument("--out", required=True, help="the folder to create (then: --target OUT)")
    p.add_argument("--group-size", type=int, default=128, help="weights per group; must divide the hidden size "
                                                                "(64 for SmolLM2's 576)")
    p.add_argument("--calibration", default="stdlib",
                   help="stdlib (default: Python standard-library sources), a .txt (blank-line separated) or .jsonl file")
    p.add_argument("--num-texts", type=int, default=128, help="calibration texts (default 128)")
    p.add_argument("--max-chars", type=int, default=2000,
                   help="longest calibration text in characters (default 2000); time grows with texts x length")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    p = sub.add_parser("provision", help="install, assemble, verify and convert offline models into the cache")
    p.add_argument("names", nargs="+", help=f"short names: {_model_names()}")
    return parser


def main(argv=None) -> int:
    from .models import ModelChecksumError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:  # its own options: hf-spec demo --help
        try:
            from .demo import main as demo_main
        except ImportError as e:
            print(f"hf-spec: error: the demo needs gradio: pip install 'hf-spec[demo]' ({e})", file=sys.stderr)
            return 2
        return demo_main(argv[1:])
    args = build_parser().parse_args(argv)
    from .commands import bench, generate, models

    commands = {"generate": generate.run, "bench": bench.run_bench_command, "tune": bench.run_tune,
                "train-medusa": models.run_train_medusa, "quantize": models.run_quantize,
                "provision": models.run_provision}
    try:
        return commands[args.command](args)
    except (ValueError, ModelChecksumError, OSError, ImportError) as e:  # bad input or an unreachable hub: a message, not a traceback
        print(f"hf-spec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
