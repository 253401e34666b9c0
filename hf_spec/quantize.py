"""``hf-spec quantize``: make an AWQ-INT4 checkpoint of a target, on CPU or GPU.

AWQ (Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration")
scales the weight channels that large activations meet before rounding them to 4 bits in groups. The work is
done by the ``gptqmodel`` package (what transformers' own ``AwqQuantizer`` loads AWQ checkpoints with;
``pip install 'hf-spec[quantization]'``, the 7.6 series for torch 2.13). The result is a folder that
``transformers.AutoModelForCausalLM.from_pretrained`` (and :func:`hf_spec.load`) loads as it is, on CPU or GPU.

Calibration texts: by default chunks of Python's own standard-library sources (code, docstrings and
comments; present on every machine, and disjoint from the Spec-Bench prompts the benchmark measures on), or
a ``.txt`` file (blank-line separated texts) or FastChat-style ``.jsonl`` file of your own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["calibration_texts", "quantize_awq"]


def calibration_texts(source: str = "stdlib", num_texts: int = 128, max_chars: int = 2000) -> list[str]:
    """Calibration texts for AWQ.

    Args:
        source: ``"stdlib"`` (chunks of the standard library's ``.py`` files, sorted by name), a ``.txt``
            file (texts separated by blank lines) or a ``.jsonl`` file (``turns`` or ``prompt`` per line).
        num_texts: how many texts (at most).
        max_chars: longest text, in characters (~4 per token): with num_texts, what the quantization's time
            grows with.

    Raises:
        FileNotFoundError: no such file.
        ValueError: fewer than 8 non-empty texts.
    """
    if source == "stdlib":
        root = Path(os.__file__).parent
        texts = []
        for path in sorted(root.glob("*.py")):
            text = path.read_text(encoding="utf-8", errors="ignore").strip()
            if len(text) >= max_chars // 2:
                texts.append(text[:max_chars])
            if len(texts) == num_texts:
                break
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no calibration file {source}; use stdlib, a .txt or a .jsonl file")
        if path.suffix.lower() == ".jsonl":
            from .prompts import load_questions

            texts = [q.text for q in load_questions(path)]
        else:
            from .prompts import read_text_file

            texts = [t.strip() for t in read_text_file(path, f"--calibration {source}").split("\n\n")]
        texts = [t[:max_chars] for t in texts if t.strip()][:num_texts]
    if len(texts) < 8:
        raise ValueError(f"{source} gives {len(texts)} calibration texts; AWQ needs at least 8 (128 is usual)")
    return texts


def _check_sizes(config: dict, group_size: int) -> None:
    """Refuse, before any calibration runs, a model that gptqmodel's AWQ would fail on part-way: a group size that
    does not divide the input widths, or an output width that is not a multiple of 64 (its clipping search takes
    the rows of every linear layer but the query and key projections in batches of 64 or 256, and asserts)."""
    config = config.get("text_config", config)
    sizes = {k: config[k] for k in ("hidden_size", "intermediate_size") if isinstance(config.get(k), int)}
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    head_dim = config.get("head_dim") or (sizes.get("hidden_size", 0) // heads if heads else None)
    widths = dict(sizes)
    if isinstance(head_dim, int) and isinstance(kv_heads or heads, int):
        widths["value width (num_key_value_heads x head_dim)"] = (kv_heads or heads) * head_dim
    narrow = {k: v for k, v in widths.items() if v % 64}
    if narrow:
        text = ", ".join(f"{k} {v}" for k, v in narrow.items())
        raise ValueError(f"AWQ (gptqmodel) needs every layer's output width to be a multiple of 64, and this model's "
                         f"{text} is not; such a model cannot be quantized with --method awq")
    bad = {k: v for k, v in sizes.items() if v % group_size}
    if bad:
        fits = [g for g in (128, 64, 32) if all(v % g == 0 for v in sizes.values())]
        sizes_text = ", ".join(f"{k} {v}" for k, v in bad.items())
        raise ValueError(f"group size {group_size} does not divide the model's {sizes_text}; use --group-size "
                         f"{fits[0] if fits else 32}")


def quantize_awq(target: str, out: str | Path, *, bits: int = 4, group_size: int = 128, calibration: str = "stdlib",
                 num_texts: int = 128, max_chars: int = 2000, device: str | None = None) -> Path:
    """Quantize ``target`` with AWQ and save the checkpoint to ``out``.

    Args:
        target: an offline short name (e.g. ``qwen2.5-coder-1.5b``) or a model folder.
        out: the folder to create (written in a temporary folder beside it and renamed at the end, so a
            failure leaves nothing half-written).
        bits: weight bits (4).
        group_size: weights per quantization group; must divide the hidden and intermediate sizes.
        calibration: see :func:`calibration_texts`.
        num_texts: calibration texts.
        max_chars: longest calibration text, in characters; the time grows with ``num_texts * max_chars``
            (SmolLM2-135M on 2 CPU cores with 32 texts of 2000 characters: ~37 s per layer, 30 layers).
        device: ``"cpu"`` or ``"cuda"`` (default: cuda when available).

    Returns:
        ``out``, holding ``config.json`` (with ``quantization_config``), the weights, the tokenizer, the source's
        own ``generation_config.json`` (so ``generate`` decodes as it does the source's: gptqmodel's copy would
        sample by default) and ``hf_spec_quantize.json`` (settings and seconds taken).

    Raises:
        ImportError: gptqmodel is not installed.
        FileExistsError: ``out`` exists.
        ValueError: bits other than 4, a group size that does not divide the model's sizes, an output width that
            is not a multiple of 64 (see :func:`_check_sizes`), max_chars < 64, too
            few texts (under 8).
    """
    from .models import building, provision, resolve_name
    from .quantization import quantization_method

    if bits != 4:
        raise ValueError(f"bits={bits}: AWQ checkpoints here are 4-bit (AWQ-INT4)")
    if group_size < 1 or max_chars < 64:
        raise ValueError(f"--group-size must be >= 1 and --max-chars >= 64, got {group_size} and {max_chars}")
    if num_texts < 1:  # stdlib would take every file it has (0 never equals a count that grows from 1)
        raise ValueError(f"--num-texts must be >= 1 (128 is usual), got {num_texts}")
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or choose another --out")
    short = resolve_name(target)
    path = provision(short) if short is not None else Path(target)
    if not (path / "config.json").is_file():
        raise ValueError(f"{target} is neither an offline model name nor a model folder (no config.json)")
    already = quantization_method(path)
    if already is not None:
        raise ValueError(f"{target} is already quantized ({already})")
    _check_sizes(json.loads((path / "config.json").read_text()), group_size)
    texts = calibration_texts(calibration, num_texts, max_chars)
    if importlib.util.find_spec("gptqmodel") is None:
        raise ImportError("AWQ quantization needs gptqmodel: pip install 'hf-spec[quantization]' (gptqmodel 7.6)")
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":  # its CPU worker pool fails on small machines unless told how many workers
        os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(1, min(4, os.cpu_count() or 1))))

    with building(out):  # one build of out at a time; a killed build's leftovers go
        if out.exists():  # another process built it while this one waited
            raise FileExistsError(f"{out} exists; remove it or choose another --out")
        _quantize_into(out, path, texts, bits, group_size, device, target, calibration, max_chars)
    return out


def _quantize_into(out: Path, path: Path, texts: list[str], bits: int, group_size: int, device: str, target: str,
                   calibration: str, max_chars: int) -> None:
    """Quantize the model folder ``path`` with gptqmodel into a temporary folder beside ``out``, moved to ``out``
    at the end (under :func:`~hf_spec.models.building`'s lock)."""
    import torch
    from gptqmodel import BACKEND, GPTQModel
    from gptqmodel.quantization import AWQConfig

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        t0 = time.perf_counter()
        model = GPTQModel.load(str(path), AWQConfig(bits=bits, group_size=group_size), device=device)
        # AWQ_TORCH: pure-torch kernels, so quantizing needs no CUDA extension (the others ask for a GPU)
        model.quantize(texts, backend=BACKEND.AWQ_TORCH if device == "cpu" else BACKEND.AUTO)
        model.save(str(tmp))
        seconds = time.perf_counter() - t0
        # the source's generation config, not gptqmodel's: it "auto-fixes" one that has no do_sample into
        # do_sample=True, so that plain generate() on the checkpoint sampled where the source decodes greedily
        source_config = path / "generation_config.json"
        if source_config.is_file():
            shutil.copyfile(source_config, tmp / "generation_config.json")
        else:
            (tmp / "generation_config.json").unlink(missing_ok=True)
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(path)).save_pretrained(str(tmp))
        (tmp / "hf_spec_quantize.json").write_text(json.dumps({
            "method": "awq", "bits": bits, "group_size": group_size, "target": target, "calibration": calibration,
            "num_texts": len(texts), "max_chars": max_chars, "device": device, "seconds": round(seconds, 1),
            "gptqmodel": _version("gptqmodel"), "torch": torch.__version__, "python": sys.version.split()[0],
        }, indent=2) + "\n")
        from .models import open_to_umask

        open_to_umask(tmp)  # mkdtemp made it private; the checkpoint is an ordinary folder
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None
