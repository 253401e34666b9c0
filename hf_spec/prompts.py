"""Evaluation prompts: the Spec-Bench questions (Xia et al. 2024), shipped with the package
(``hf_spec/data/specbench_questions.jsonl``, Apache-2.0; see ``SPECBENCH_SOURCE.md`` beside it), or any
FastChat-style JSONL file (one object a line with ``turns`` or ``prompt``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import BatchEncoding

__all__ = ["Question", "SPECBENCH_PATH", "load_questions", "chat_inputs"]

SPECBENCH_PATH = Path(__file__).parent / "data" / "specbench_questions.jsonl"


@dataclass(frozen=True)
class Question:
    """One prompt: ``text`` is the first turn (or the ``prompt`` field)."""

    question_id: str
    category: str
    text: str


def load_questions(path: str | Path | None = None, categories=None, per_category: int | None = None) -> list[Question]:
    """Read questions from a FastChat-style JSONL file (default: Spec-Bench).

    Args:
        path: JSONL file; each line an object with ``turns`` (list of str; turn 1 is used) or ``prompt``.
        categories: keep only these categories (default: all, in file order).
        per_category: keep the first N of each category.

    Raises:
        ValueError: no such file, a folder or a file that is not UTF-8 text (:func:`read_text_file`); a line that is
            not a JSON object, has neither ``turns`` (a list) nor ``prompt``, or whose
            prompt is not a string, is empty or holds a lone surrogate; a category in ``categories`` that the file does not have.
    """
    from .drafters.suffix import lone_surrogate

    path = Path(path) if path is not None else SPECBENCH_PATH
    wanted = set(categories) if categories else None
    counts: dict[str, int] = {}
    out: list[Question] = []
    # lines end at "\n" only: JSON strings may hold U+2028, at which str.splitlines() splits
    lines = read_text_file(path, str(path), "a .jsonl file (one JSON object with 'prompt' or 'turns' a line)").split("\n")
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not a JSON object ({e.msg}); a .jsonl file has one object "
                             "per line, e.g. {\"prompt\": \"...\"}") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: not a JSON object but {type(obj).__name__}; a .jsonl file has one "
                             "object per line, e.g. {\"prompt\": \"...\"}")
        if "turns" in obj:
            if not isinstance(obj["turns"], list):
                raise ValueError(f"{path}:{lineno}: 'turns' must be a list of strings (turn 1 is used), got "
                                 f"{type(obj['turns']).__name__}; e.g. {{\"turns\": [\"...\"]}}")
            text = obj["turns"][0] if obj["turns"] else ""
        elif "prompt" in obj:
            text = obj["prompt"]
        else:
            raise ValueError(f"{path}:{lineno}: expected a 'turns' or 'prompt' field")
        if not isinstance(text, str):
            raise ValueError(f"{path}:{lineno}: the prompt must be a string, got {type(text).__name__}")
        if not text.strip():
            raise ValueError(f"{path}:{lineno}: empty prompt")
        if bad := lone_surrogate(text):  # JSON may escape half of a surrogate pair: no tokenizer takes it
            raise ValueError(f"{path}:{lineno}: the prompt holds {bad}, half of a character cut in two; fix or "
                             "drop that line")
        cat = str(obj.get("category", "default"))
        if wanted is not None and cat not in wanted:
            continue
        if per_category is not None and counts.get(cat, 0) >= per_category:
            continue
        counts[cat] = counts.get(cat, 0) + 1
        out.append(Question(str(obj.get("question_id", lineno)), cat, text))
    if wanted is not None and wanted - set(counts):
        present = _categories(path)
        raise ValueError(f"no questions of categories {sorted(wanted - set(counts))} in {path}; it has "
                         f"{', '.join(present)}")
    return out


def _categories(path) -> list[str]:
    """Every category of a question file, in file order (for the error naming an unknown one)."""
    with open(path, encoding="utf-8-sig") as f:
        cats = [str(json.loads(line).get("category", "default")) for line in f if line.strip()]
    return list(dict.fromkeys(cats))


def chat_inputs(tokenizer, text: str | list[str], chat: bool = True):
    """Tokenize one prompt, or a batch, through the tokenizer's chat template when ``chat`` (and it has one).

    Args:
        tokenizer: the target's tokenizer.
        text: a prompt, or a list of B prompts (left-padded into one batch, as batched generation needs).
        chat: apply the chat template.

    Returns:
        ``BatchEncoding`` with ``input_ids`` and ``attention_mask`` of shape ``[1, L]``, or ``[B, L_max]``
        with the padding on the left.

    Raises:
        ValueError: a prompt is empty, or the batch is empty.
    """
    if isinstance(text, (list, tuple)):
        if not text:
            raise ValueError("empty batch: give at least one prompt")
        rows = [chat_inputs(tokenizer, t, chat)["input_ids"][0].tolist() for t in text]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        width = max(len(r) for r in rows)
        return BatchEncoding({
            "input_ids": torch.tensor([[pad] * (width - len(r)) + r for r in rows]),
            "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows]),
        })
    if not text or not text.strip():
        raise ValueError("empty prompt: give some text")
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    return tokenizer(text, return_tensors="pt")


def model_context(model) -> int | None:
    """How many positions the model was made to read: ``config.max_position_embeddings`` (GPT-2's ``n_positions``),
    raised where scaled rotary embeddings stretch it (YaRN, linear, Llama 3's: ``original_max_position_embeddings``
    or ``max_position_embeddings`` times ``factor``, Qwen2.5's long-context recipe); ``None`` where nothing bounds
    it: no such field, or dynamic NTK scaling, which grows with the sequence."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None else None
    context = getattr(text, "max_position_embeddings", None)
    if not isinstance(context, int):
        return None
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    if not isinstance(rope, dict):
        return context
    # one set of parameters, or one per layer type (Gemma 3: full_attention, sliding_attention)
    sets = [v for v in rope.values() if isinstance(v, dict)] or [rope]
    for params in sets:
        kind = params.get("rope_type", params.get("type"))
        factor = params.get("factor")
        if kind == "dynamic":
            return None
        if kind not in (None, "default") and isinstance(factor, (int, float)) and factor > 0:
            original = params.get("original_max_position_embeddings")
            context = max(context, int((original if isinstance(original, int) else context) * factor))
    return context


def check_context(model, prompt_tokens: int, max_new_tokens: int, what: str = "Prompt") -> None:
    """Refuse a prompt that, with its new tokens, would run past the positions the model was made to read
    (:func:`model_context`): past them a model writes garbage, slowly (learned positions have no row there,
    rotary ones were never trained on). A model without a bound passes.

    Args:
        model: the target (anything with a ``config``).
        prompt_tokens: the prompt's length in tokens (chat template included).
        max_new_tokens: the most new tokens asked.
        what: how the message names the prompt.

    Raises:
        ValueError: saying by how much, and the most new tokens that would fit.
    """
    context = model_context(model)
    if context is not None and prompt_tokens + max_new_tokens > context:
        if prompt_tokens < context:  # it fits: the new tokens asked are what passes the context
            raise ValueError(f"{what} ({counted(prompt_tokens, 'token')} as the model reads it) and {max_new_tokens} "
                             f"new tokens exceed the context of the model, {context} positions: ask for at most "
                             f"{context - prompt_tokens} new tokens, or shorten the prompt.")
        raise ValueError(f"{what} is too long: {counted(prompt_tokens, 'token')} as the model reads it reach past the "
                         f"context of the model, {context} positions; shorten the prompt.")


def read_text_file(path: str | Path, what: str, give: str = "a text file") -> str:
    """The text of a UTF-8 file a command was given (a byte-order mark dropped), read once (a pipe, ``<(command)``,
    exists and reads like a file), with errors that name it: the one reader of prompt files, question files,
    corpora, training and calibration texts.

    Args:
        path: the file.
        what: how messages name it, e.g. ``"--data notes.txt"``.
        give: what a folder or missing file should have been, for the message.

    Raises:
        ValueError: no such file, a folder, or not UTF-8 text (the byte where it stops being).
        OSError: a file that cannot be read (permissions, a device), named.
    """
    path = Path(path)
    if path.is_dir() or not path.exists():
        raise ValueError(f"{what} is a folder; give {give}" if path.is_dir() else f"{what}: no such file; give {give}")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} is not UTF-8 text (byte {e.start}); convert it, e.g. iconv -t UTF-8") from None
    except OSError as e:  # unreadable: the file named, not a bare errno
        raise OSError(f"{what}: cannot read it ({e.strerror or e})") from e


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` for a message, the noun plural but for one: "1 token", "7 tokens", "2 prompts"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
