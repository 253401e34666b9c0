"""Medusa heads and their checkpoint formats (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration
Framework with Multiple Decoding Heads"; module layout of FasterDecoding/Medusa
``medusa/model/medusa_model.py``; files in the layout of vLLM's Medusa draft,
``vllm/model_executor/models/medusa.py`` and ``vllm/transformers_utils/configs/medusa.py``).

Head i (0-based) reads the target's last hidden state at position t (the input of its ``lm_head``, after
the final norm) and predicts the token at t + i + 2: the target's own ``lm_head`` gives t + 1. A head is
``L`` residual blocks ``x + SiLU(W x + b)`` followed by a vocabulary projection without bias. That is the
computation of vLLM's ``ResidualBlock`` with ``medusa_fc_bias`` true, followed by its ``ParallelLMHead``
with ``logit_scale`` 1; vLLM's default is ``medusa_fc_bias`` false, so the config hf-spec writes says true.

Two variants:

- ``full``: each head has its own ``Linear(hidden, vocab, bias=False)``, the FasterDecoding layout.
- ``shared-lm-head``: the heads reuse the target's ``lm_head``; only the residual blocks are trained, and
  hf-spec projects with the target's own ``lm_head`` (read once for all heads per step).

Written (:meth:`MedusaHeads.save_pretrained`), a folder that vLLM's Medusa loader reads as it is
(``speculative_config={"method": "medusa", "model": DIR, "num_speculative_tokens": k}``; docs/vllm.md)::

    config.json         {"model_type": "medusa", "architectures": ["MedusaModel"], "num_heads": N,
                         "num_hidden_layers": L, "hidden_size": H, "vocab_size": V,
                         "truncated_vocab_size": V, "medusa_fc_bias": true,
                         "original_lm_head": <variant is shared-lm-head>,
                         "hf_spec_variant": "full" | "shared-lm-head", "base_model_name_or_path": ...}
    model.safetensors   "blocks.{i}.layers.{j}.weight" [H, H], "blocks.{i}.layers.{j}.bias" [H];
                        full: "lm_heads.{i}.weight" [V, H] for every head;
                        shared-lm-head: one "lm_heads.0.weight" [V, H], a copy of the target's lm_head

vLLM's Medusa draft does not read the target's ``lm_head``: with ``original_lm_head`` it builds one
projection that all heads share and its ``load_weights`` fills it from ``lm_heads.0.weight``, so a
``shared-lm-head`` folder carries that one copy (stored in bfloat16 when that loses nothing, as for a
target whose checkpoint is bfloat16). hf-spec itself still projects with the target's ``lm_head`` and does
not load the copy; it only compares a few of its rows with the target's when loading for a target.

Read as well, the layout hf-spec wrote before (the heads shipped in ``hf_spec/data/medusa``) and
FasterDecoding's (TGI reads the same)::

    config.json                  {"medusa_num_heads": N, "medusa_num_layers": L, "hidden_size": H,
                                  "vocab_size": V, "hf_spec_variant": ..., ...}
    medusa_lm_head.safetensors   "{i}.{j}.linear.weight" [H, H], "{i}.{j}.linear.bias" [H],
                                 and for "full" "{i}.{L}.weight" [V, H]
    (or medusa_lm_head.pt, a torch state dict with the same keys, as FasterDecoding saves)

A truncated vocabulary (vLLM's ``truncated_vocab_size`` with a ``token_map``; FR-Spec, Zhao et al. 2025, calls it a
frequency-ranked draft vocabulary): the heads score only the ``truncated_vocab_size`` token ids listed in the
int64 tensor ``"token_map"`` [V'] of ``model.safetensors`` (the projections keep all V rows; vLLM gathers the
mapped ones when it loads, hf-spec when it first projects). Drafting costs less (4 heads x V' rows instead of
4 x V) and the heads can never propose a token outside the map; the target verifies as always, so the output
is unchanged. :meth:`MedusaHeads.set_token_map` sets one; ``hf-spec train-medusa --truncated-vocab-size``
builds it from the target's most frequent answer tokens.

A config without ``hf_spec_variant`` (FasterDecoding's, or vLLM-layout files from other tools) gets its
variant from the files: ``original_lm_head`` true means ``shared-lm-head``; in FasterDecoding's layout a
``{i}.{L}.weight`` key means ``full``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from ..kernels import mm_is_faster

__all__ = ["MedusaConfig", "MedusaHeads", "MedusaCheckpointError", "ResBlock", "VARIANTS", "heads_path",
           "SHIPPED_DIR"]

logger = logging.getLogger("hf_spec")

VARIANTS = ("full", "shared-lm-head")
#: vLLM's layout, written
WEIGHTS_VLLM = "model.safetensors"
#: FasterDecoding's layout (hf-spec's own before it wrote vLLM's), read
WEIGHTS_SAFETENSORS = "medusa_lm_head.safetensors"
WEIGHTS_PT = "medusa_lm_head.pt"
#: a prefix vLLM's ``Medusa.load_weights`` strips from every name
VLLM_PREFIX = "medusa_heads."
#: heads shipped inside the package (small ones: SmolLM2-135M)
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "medusa"


def cached_dir() -> Path:
    """Where ``hf-spec train-medusa --target NAME`` puts heads too big for the package: beside the models
    (``$HF_SPEC_CACHE/medusa``, by default ``~/.cache/hf_spec/medusa``)."""
    from ..models import cache_dir

    return cache_dir() / "medusa"


def heads_path(name_or_dir: str | os.PathLike) -> Path:
    """The folder of a set of heads: a path as given, else heads shipped with hf-spec or trained into the
    cache under that target's short name (``smollm2-135m``, ``qwen2.5-coder-1.5b``).

    Raises:
        MedusaCheckpointError: none of those exists; the message says how to make them.
    """
    path = Path(name_or_dir)
    if path.is_dir():
        return path
    for base in (SHIPPED_DIR, cached_dir()):
        if (base / str(name_or_dir)).is_dir():
            return base / str(name_or_dir)
    raise MedusaCheckpointError(
        f"no Medusa heads {str(name_or_dir)!r}: not a folder, not shipped ({SHIPPED_DIR}) and not in the cache "
        f"({cached_dir()}); train them: hf-spec train-medusa --target NAME --out {cached_dir() / str(name_or_dir)}")


def default_heads(target: str) -> Path | None:
    """The heads shipped with hf-spec or trained into the cache for ``target``'s short name (``smollm2-135m``), or
    ``None``: for a target given as a folder or a hub id (anything with a path separator, or an existing folder)
    there are none by default, since the folder is the model's, not its heads' (the demo took a target folder for
    a heads folder and failed on its config)."""
    if not target or Path(target).name != target or Path(target).is_dir():
        return None
    for base in (SHIPPED_DIR, cached_dir()):
        if (base / target).is_dir():
            return base / target
    return None


class MedusaCheckpointError(ValueError):
    """A Medusa checkpoint is missing, corrupt, or does not fit the target."""


@dataclass
class MedusaConfig:
    """The sizes and variant of a set of heads (what ``config.json`` of a heads folder says, under vLLM's
    key names or FasterDecoding's).

    Attributes:
        medusa_num_heads: N, the number of heads (the most tokens drafted per step).
        medusa_num_layers: L, residual blocks per head.
        hidden_size: H, the target's hidden size.
        vocab_size: V, the target's vocabulary size (rows of its ``lm_head``).
        variant: ``"full"`` (own projection per head) or ``"shared-lm-head"`` (the target's ``lm_head``).
        base_model_name_or_path: the target the heads were trained for (informational).
        truncated_vocab_size: V', the number of token ids the heads score (their ``token_map``), or ``None``:
            the whole vocabulary. Set through :meth:`MedusaHeads.set_token_map` (on the heads' own copy of the
            config); :class:`MedusaHeads` refuses a config that has it, since the map is not part of a config.
    """

    medusa_num_heads: int
    medusa_num_layers: int
    hidden_size: int
    vocab_size: int
    variant: str = "full"
    base_model_name_or_path: str | None = None
    truncated_vocab_size: int | None = None

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise MedusaCheckpointError(f"unknown Medusa variant {self.variant!r}; use one of {VARIANTS}")
        for name in ("medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MedusaCheckpointError(f"Medusa config: {name} must be a positive integer, got {value!r}")
        t = self.truncated_vocab_size
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= self.vocab_size):
            raise MedusaCheckpointError(
                f"Medusa config: truncated_vocab_size must be an integer in 1..vocab_size ({self.vocab_size}), got {t!r}")

    def to_json(self) -> dict:
        """FasterDecoding's keys plus ``hf_spec_variant`` (the config hf-spec wrote before it wrote vLLM's;
        still the identity of a training run in :mod:`hf_spec.medusa.train`'s checkpoints)."""
        d = asdict(self)
        d["hf_spec_variant"] = d.pop("variant")
        return d

    def to_vllm_json(self) -> dict:
        """``config.json`` as vLLM's ``MedusaConfig`` reads it (``vllm/transformers_utils/configs/medusa.py``):
        ``model_type`` ``"medusa"`` (so vLLM detects the method from the folder), ``num_heads``,
        ``num_hidden_layers``, sizes, ``truncated_vocab_size`` (``vocab_size`` when there is no token map),
        ``medusa_fc_bias`` true (hf-spec's blocks have biases; vLLM's default is none) and
        ``original_lm_head`` for the shared projection; plus hf-spec's ``hf_spec_variant`` and
        ``base_model_name_or_path``. No other key holds both "num" and "heads" (or "layers"): vLLM renames
        every such key to ``num_heads`` (``num_hidden_layers``) when it reads the file."""
        return {
            "model_type": "medusa",
            "architectures": ["MedusaModel"],
            "num_heads": self.medusa_num_heads,
            "num_hidden_layers": self.medusa_num_layers,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "truncated_vocab_size": self.truncated_vocab_size or self.vocab_size,
            "medusa_fc_bias": True,
            "original_lm_head": self.variant == "shared-lm-head",
            "hf_spec_variant": self.variant,
            "base_model_name_or_path": self.base_model_name_or_path,
        }


def check_heads_folder(directory: str | os.PathLike) -> None:
    """Refuse to write Medusa heads (``config.json``, ``model.safetensors``) into a folder that holds another
    model: its ``config.json`` is not a Medusa one (``model_type`` ``"medusa"``, or FasterDecoding's
    ``medusa_num_heads``), or it has weights without such a config. Heads would replace that model's files (a
    break-it run trained heads into the target's own folder: the target no longer loaded). A missing or empty
    folder, or one of heads (being trained: ``train-medusa`` resumes there), passes.

    Raises:
        ValueError: the folder holds another model, naming what was found.
    """
    path = Path(directory)
    if not path.is_dir():
        return
    if (path / "config.json").is_file():
        try:
            raw = _read_config(path)
        except MedusaCheckpointError:  # not JSON, or not an object: no Medusa config either
            raw = None
        if not isinstance(raw, dict) or not (raw.get("model_type") == "medusa" or "medusa_num_heads" in raw):
            kind = raw.get("model_type") if isinstance(raw, dict) else None
            raise ValueError(f"{path} holds another model ({'model_type ' + repr(kind) if kind else 'a config.json'} "
                             "that is not Medusa heads'): heads written there would replace its config.json and "
                             "weights; give the heads a folder of their own (new or empty)")
    elif any(p.name not in (WEIGHTS_SAFETENSORS, WEIGHTS_PT) for p in (*path.glob("*.safetensors"), *path.glob("*.bin"))):
        raise ValueError(f"{path} holds weights without a Medusa config.json: heads written there would mix with them; "
                         "give the heads a folder of their own (new or empty)")


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)``; W starts at zero so that a new block is the identity (as in FasterDecoding)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class _MappedRows:
    """:meth:`MedusaHeads.mapped_projection`'s cache: ``entries`` maps a projection weight, held weakly by identity
    (torch's ``WeakIdKeyDictionary``: an entry goes with its weight, and a new weight is a new key even at a freed
    one's address), to (its version and address, its map rows). Copies and pickles of the heads start empty."""

    def __init__(self):
        self.entries = WeakIdKeyDictionary()

    def __deepcopy__(self, memo) -> "_MappedRows":
        return _MappedRows()

    def __reduce__(self):
        return (_MappedRows, ())


class MedusaHeads(nn.Module):
    """N Medusa heads on a target's last hidden state.

    Args:
        config: sizes and variant (:class:`MedusaConfig`), copied; without ``truncated_vocab_size`` (a token map is
            set with :meth:`set_token_map`).

    Raises:
        MedusaCheckpointError: a config with ``truncated_vocab_size``.

    ``self.heads`` is an ``nn.ModuleList`` whose state dict has exactly FasterDecoding's keys
    (:meth:`vllm_state_dict` gives vLLM's names). The ``shared-lm-head`` variant needs the target's
    projection: :meth:`bind` it (the drafter and the trainer do); it is not part of this module's
    parameters, and :meth:`save_pretrained` writes a copy of it only because vLLM needs one.
    """

    def __init__(self, config: MedusaConfig):
        super().__init__()
        if config.truncated_vocab_size is not None:
            raise MedusaCheckpointError(
                f"MedusaConfig.truncated_vocab_size {config.truncated_vocab_size} comes with a token map, which a config "
                "does not hold: build the heads from a config without it and call heads.set_token_map(ids)")
        # the heads' own copy: set_token_map writes truncated_vocab_size into it, which must not reach other heads
        # built from the same config (they would save a truncated size without a token map)
        self.config = config = replace(config)
        H, V, L = config.hidden_size, config.vocab_size, config.medusa_num_layers
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(H) for _ in range(L)], *([nn.Linear(H, V, bias=False)] if config.variant == "full" else []))
            for _ in range(config.medusa_num_heads)
        )
        self._lm_head: list[nn.Module] = []  # a list, so that the target's lm_head is not registered here
        self.register_buffer("token_map", None, persistent=False)  # LongTensor[V'] or None: see set_token_map
        self._mapped = _MappedRows()  # the token map's rows of each projection weight: see mapped_projection

    def set_token_map(self, token_ids) -> "MedusaHeads":
        """Score only these token ids from now on (vLLM's ``token_map``; see the module docstring), or the whole
        vocabulary again with ``None``. Returns self.

        Args:
            token_ids: a sequence or 1-D integer tensor of V' distinct ids in ``0..vocab_size - 1`` (kept sorted),
                or ``None``.

        Raises:
            MedusaCheckpointError: not 1-D integers, empty, repeated ids, or ids outside the vocabulary.
        """
        self._mapped = _MappedRows()
        if token_ids is None:
            self.token_map = None
            self.config.truncated_vocab_size = None
            return self
        ids = torch.as_tensor(token_ids)
        V = self.config.vocab_size
        if ids.dim() != 1 or ids.numel() == 0 or ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
            raise MedusaCheckpointError(f"a token map must be a non-empty 1-D list of integer token ids, got "
                                        f"{ids.dtype} of shape {list(ids.shape)}")
        ids = ids.to(torch.long).sort().values
        if int(ids[0]) < 0 or int(ids[-1]) >= V:
            raise MedusaCheckpointError(f"a token map's ids must lie in 0..{V - 1} (the vocabulary), got "
                                        f"{int(ids[0])}..{int(ids[-1])}")
        if bool((ids[1:] == ids[:-1]).any()):
            raise MedusaCheckpointError("a token map lists each token id once; it repeats some")
        device = next(self.parameters()).device
        self.token_map = ids.to(device)
        self.config.truncated_vocab_size = len(ids)
        return self

    @property
    def num_heads(self) -> int:
        return self.config.medusa_num_heads

    @property
    def shares_lm_head(self) -> bool:
        return self.config.variant == "shared-lm-head"

    # ---- the target ---------------------------------------------------------------------------------
    def check_target(self, target) -> None:
        """Raise :class:`MedusaCheckpointError` unless hidden size and vocabulary match ``target``."""
        lm_head = target.get_output_embeddings()
        if lm_head is None or not hasattr(lm_head, "weight"):
            raise MedusaCheckpointError(f"{type(target).__name__} has no output embedding (lm_head); Medusa heads need one")
        V, H = lm_head.weight.shape[0], _in_features(lm_head)
        name = getattr(target, "name_or_path", "") or type(target).__name__
        if H != self.config.hidden_size:
            raise MedusaCheckpointError(
                f"Medusa heads were made for hidden size {self.config.hidden_size}, target {name} has {H}; "
                "load the heads trained for this target (hf-spec train-medusa --target ...)")
        if V != self.config.vocab_size:
            raise MedusaCheckpointError(
                f"Medusa heads predict {self.config.vocab_size} tokens, target {name}'s lm_head has {V}; "
                "load the heads trained for this target (hf-spec train-medusa --target ...)")

    def bind(self, target) -> "MedusaHeads":
        """Check ``target`` (:meth:`check_target`) and, for ``shared-lm-head``, use its ``lm_head``. Returns self."""
        self.check_target(target)
        self._lm_head = [target.get_output_embeddings()]
        return self

    def projection(self, i: int) -> torch.Tensor:
        """The vocabulary projection weight ``[V, H]`` of head i (the target's for ``shared-lm-head``)."""
        if self.shares_lm_head:
            if not self._lm_head:
                raise RuntimeError("shared-lm-head Medusa heads need the target's lm_head: call heads.bind(target)")
            return self._lm_head[0].weight
        return self.heads[i][-1].weight

    def mapped_projection(self, i: int, lm_head: torch.Tensor | None = None) -> torch.Tensor:
        """Head i's projection rows for the token map, ``[V', H]`` (``[V, H]`` without a map): gathered once per
        projection weight (the rows of a 151,936 x 1,536 ``lm_head`` for 32,768 ids are 100 MB in bfloat16) and
        reused while that weight lives unchanged (the same tensor, version and address: in-place changes and
        ``.data`` replaced are seen, not writes through ``.data`` or to inference tensors, which torch does not
        count). One copy per live weight: targets sharing the heads, each call passing its own ``lm_head``, do not
        gather again at every turn. With autograd recording and a weight that requires grad, a differentiable
        gather (not cached).

        Args:
            lm_head: ``shared-lm-head``: the target's ``lm_head`` weight (default: the bound target's).
        """
        W = lm_head if lm_head is not None and self.shares_lm_head else self.projection(i)
        token_map = self.token_map
        if token_map is None:
            return W
        if torch.is_grad_enabled() and W.requires_grad:  # training through forward: the projection gets its gradient
            return W[token_map.to(W.device)]
        try:
            stamp = (None if W.is_inference() else W._version, W.data_ptr())  # inference tensors have no version
        except RuntimeError:  # a tensor subclass without storage: gathered every time
            return W.detach()[token_map.to(W.device)]
        entry = self._mapped.entries.get(W)
        if entry is None or entry[0] != stamp:
            entry = (stamp, W.detach()[token_map.to(W.device)])
            self._mapped.entries[W] = entry
        return entry[1]

    # ---- forward ------------------------------------------------------------------------------------
    def hidden(self, hidden_states: torch.Tensor, num_heads: int | None = None) -> torch.Tensor:
        """The heads' inputs to their vocabulary projection.

        Args:
            hidden_states: ``[..., H]``, the target's last hidden states (after its final norm).
            num_heads: use only the first n heads (default all).

        Returns:
            ``[..., n, H]``.
        """
        n = self.num_heads if num_heads is None else num_heads
        L = self.config.medusa_num_layers
        x = hidden_states.to(self._dtype())
        outs = []
        for i in range(n):
            h = x
            for j in range(L):
                h = self.heads[i][j](h)
            outs.append(h)
        return torch.stack(outs, dim=-2)

    def forward(self, hidden_states: torch.Tensor, num_heads: int | None = None,
                lm_head: torch.Tensor | None = None, truncated: bool = False,
                outside: float = float("-inf")) -> torch.Tensor:
        """Logits of the heads.

        Args:
            hidden_states: ``[..., H]``, the target's last hidden states (after its final norm).
            num_heads: use only the first n heads (default all).
            lm_head: ``[V, H]``, the target's ``lm_head`` weight for ``shared-lm-head`` heads, given per call
                (the drafter does, so heads shared by several targets never depend on which was bound last);
                default: the bound target's.
            truncated: with a token map, return the logits of the mapped ids only (column j scores
                ``token_map[j]``); ignored without one.
            outside: with a token map and not ``truncated``, the logit of every id outside it (default ``-inf``,
                as vLLM's Medusa returns them).

        Returns:
            ``[..., n, V]``: head i's logits for the token i + 2 positions after each hidden state's (``outside``
            where a token map leaves ids out), or ``[..., n, V']`` when ``truncated``.
        """
        x = self.hidden(hidden_states, num_heads)
        if self.shares_lm_head:
            W = self.mapped_projection(0, lm_head)
            logits = _project(x.to(W.dtype), W)
        else:
            logits = torch.stack([_project(x[..., i, :], self.mapped_projection(i)) for i in range(x.shape[-2])], dim=-2)
        if self.token_map is None or truncated:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), outside)
        full[..., self.token_map.to(full.device)] = logits
        return full

    def _dtype(self) -> torch.dtype:
        return next(self.heads.parameters()).dtype

    # ---- checkpoint I/O -----------------------------------------------------------------------------
    def vllm_state_dict(self, lm_head: torch.Tensor | nn.Module | None = None) -> dict[str, torch.Tensor]:
        """The heads' tensors under the names vLLM's ``Medusa.load_weights`` consumes
        (``vllm/model_executor/models/medusa.py``), on the CPU (the blocks' tensors share memory with the
        parameters of heads that are on the CPU).

        Head i's block j is ``blocks.{i}.layers.{j}`` (``.weight`` [H, H], ``.bias`` [H]); the projection is
        ``lm_heads.{i}.weight`` [V, H] per head (``full``) or, for ``shared-lm-head``, one
        ``lm_heads.0.weight``, which vLLM's loader puts into the projection all heads share when the config
        has ``original_lm_head``; with a token map, ``token_map`` (int64 ``[V']``; the projections keep all V
        rows, vLLM gathers the mapped ones).

        Args:
            lm_head: for ``shared-lm-head``, the target's projection (its weight ``[V, H]`` or the module);
                default: the bound target's (:meth:`bind`). Ignored for ``full``.

        Raises:
            MedusaCheckpointError: ``shared-lm-head`` with no projection given or bound, or one whose shape
                is not ``[vocab_size, hidden_size]`` or that is not floating point.
        """
        L = self.config.medusa_num_layers
        state: dict[str, torch.Tensor] = {}
        for i, head in enumerate(self.heads):
            for j in range(L):
                state[f"blocks.{i}.layers.{j}.weight"] = head[j].linear.weight
                state[f"blocks.{i}.layers.{j}.bias"] = head[j].linear.bias
            if not self.shares_lm_head:
                state[f"lm_heads.{i}.weight"] = head[L].weight
        state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
        if self.token_map is not None:
            state["token_map"] = self.token_map.detach().cpu().contiguous()
        if self.shares_lm_head:
            state["lm_heads.0.weight"] = self._lm_head_copy(lm_head)
        return state

    def _lm_head_copy(self, lm_head) -> torch.Tensor:
        """The shared projection to store: bfloat16 when a float32 weight holds only bfloat16 values (a
        target loaded in float32 from a bfloat16 checkpoint), which loses nothing and halves the file."""
        if lm_head is None and self._lm_head:
            lm_head = self._lm_head[0]
        W = getattr(lm_head, "weight", lm_head)
        if not isinstance(W, torch.Tensor):
            raise MedusaCheckpointError(
                "shared-lm-head heads are saved with a copy of the target's lm_head, because vLLM's Medusa draft "
                "does not read the target's: bind the heads to their target first (heads.bind(target)) or pass "
                "lm_head=target.get_output_embeddings()")
        want = (self.config.vocab_size, self.config.hidden_size)
        if tuple(W.shape) != want or not W.is_floating_point() or W.is_meta:
            raise MedusaCheckpointError(
                f"the lm_head to save with the heads must be a floating-point [vocab_size, hidden_size] = {list(want)} "
                f"weight held in memory, got {W.dtype} {list(W.shape)}{' on the meta device' if W.is_meta else ''}")
        W = W.detach().cpu().contiguous()
        if W.dtype == torch.float32:
            compact = W.to(torch.bfloat16)
            if torch.equal(compact.float(), W):
                return compact
        return W

    def save_pretrained(self, directory: str | os.PathLike, lm_head: torch.Tensor | nn.Module | None = None) -> Path:
        """Write ``config.json`` and ``model.safetensors`` in vLLM's Medusa layout (see the module docstring;
        :meth:`vllm_state_dict`, :meth:`MedusaConfig.to_vllm_json`) to ``directory``; hf-spec and vLLM both
        load the folder as it is.

        Args:
            directory: the folder (created if missing). Files of the older layout
                (``medusa_lm_head.safetensors`` / ``.pt``) in it are removed: vLLM would read every
                ``*.safetensors`` in the folder.
            lm_head: ``shared-lm-head`` only: the target's projection to store (default: the bound target's).

        Written to a temporary folder first and moved into place, so a failure leaves no half-written file.
        Returns the folder.

        Raises:
            MedusaCheckpointError: ``shared-lm-head`` heads with no target bound and no ``lm_head`` (raised
                before anything is written).
            ValueError: ``directory`` holds another model (:func:`check_heads_folder`), before anything is written.
        """
        from safetensors.torch import save_file

        check_heads_folder(directory)
        state = self.vllm_state_dict(lm_head)
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".medusa-", dir=out))
        try:
            save_file(state, str(tmp / WEIGHTS_VLLM), metadata={"format": "pt"})
            (tmp / "config.json").write_text(json.dumps(self.config.to_vllm_json(), indent=2) + "\n")
            from ..models import open_to_umask

            open_to_umask(tmp)  # safetensors writes private files (0o600): others sharing the heads could not read them
            for name in ("config.json", WEIGHTS_VLLM):
                os.replace(tmp / name, out / name)
            for stale in (WEIGHTS_SAFETENSORS, WEIGHTS_PT):  # the older layout beside the new one is ambiguous
                if (out / stale).exists():
                    (out / stale).unlink()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, target=None, dtype: torch.dtype | None = None) -> "MedusaHeads":
        """Load heads from a folder in vLLM's layout (``model.safetensors``, what :meth:`save_pretrained`
        writes and vLLM's Medusa loader reads) or in FasterDecoding's (``medusa_lm_head.safetensors`` or
        ``.pt``: the shipped heads, older hf-spec folders, FasterDecoding's).

        Args:
            directory: the folder, or the short name of shipped or cached heads (see :func:`heads_path`).
            target: when given, checked (hidden size, vocabulary) and bound (see :meth:`bind`); for
                ``shared-lm-head`` heads in vLLM's layout, a warning if the stored ``lm_head`` copy differs
                from the target's (hf-spec uses the target's, vLLM the copy).
            dtype: the heads' dtype (default: as the blocks are stored).

        Raises:
            MedusaCheckpointError: folder, config or weights missing or unreadable; names or shapes that do
                not form N heads of L blocks; a config vLLM reads differently from what hf-spec computes (a
                ``truncated_vocab_size`` without a matching ``token_map`` or with projections of fewer rows than
                the vocabulary, ``logit_scale`` other than 1, ``hf_spec_variant``
                against ``original_lm_head``); sizes that do not match ``target``.
        """
        path = heads_path(directory)  # a folder, or the short name of shipped or cached heads
        raw = _read_config(path)
        weights = _weights_file(path)
        if weights.name == WEIGHTS_VLLM:
            config, state, stored_lm_head, token_map = _read_vllm(path, raw, target)
        else:
            state, stored_lm_head, token_map = _read_weights(path), None, None
            config = _fasterdecoding_config(path, raw, state, target)
        heads = cls(config)
        expected = heads.heads.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:  # names given in the file's own layout
            if weights.name == WEIGHTS_VLLM:
                missing, unexpected = _vllm_names(missing, config), _vllm_names(unexpected, config)
            raise MedusaCheckpointError(
                f"{path}: the weights do not form {config.medusa_num_heads} heads of {config.medusa_num_layers} "
                f"blocks ({config.variant}): missing {missing[:4]}{'...' if len(missing) > 4 else ''}, "
                f"unexpected {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}; "
                "check the number of heads and layers in config.json")
        for key, tensor in state.items():
            if tuple(tensor.shape) != tuple(expected[key].shape):
                name = _vllm_names([key], config)[0] if weights.name == WEIGHTS_VLLM else key
                raise MedusaCheckpointError(
                    f"{path}: {name} has shape {tuple(tensor.shape)}, expected {tuple(expected[key].shape)} "
                    f"for hidden_size {config.hidden_size}, vocab_size {config.vocab_size}")
        heads.heads.load_state_dict(state)
        heads.to(dtype if dtype is not None else state["0.0.linear.weight"].dtype)
        if token_map is not None:
            try:
                heads.set_token_map(token_map)
            except MedusaCheckpointError as e:
                raise MedusaCheckpointError(f"{path}: token_map: {e}") from e
        heads.eval()
        if target is not None:
            heads.bind(target)
            if stored_lm_head is not None:
                _compare_lm_head(path, stored_lm_head, target.get_output_embeddings().weight)
        return heads


def _in_features(linear) -> int:
    return getattr(linear, "in_features", None) or linear.weight.shape[1]


def _project(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` for ``x [..., H]``; a few float32 CPU rows as ``(W @ x.T).T`` where that was measured
    faster on this machine (:func:`hf_spec.kernels.mm_is_faster`)."""
    rows = x.numel() // x.shape[-1]
    if (x.device.type == "cpu" and x.dtype == torch.float32 and 2 <= rows <= 128 and not x.requires_grad
            and mm_is_faster(W, rows)):
        return torch.mm(W, x.reshape(rows, -1).t()).t().reshape(*x.shape[:-1], W.shape[0])
    return torch.nn.functional.linear(x, W)


def _read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.exists():
        raise MedusaCheckpointError(f"{path} has no config.json (num_heads, num_hidden_layers)")
    try:
        raw = json.loads(file.read_text(encoding="utf-8-sig"))  # -sig: a byte-order mark an editor may write
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MedusaCheckpointError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise MedusaCheckpointError(f"{file} must hold a JSON object")
    return raw


def _weights_file(path: Path) -> Path:
    """The weights of a heads folder: vLLM's layout first, then FasterDecoding's."""
    for name in (WEIGHTS_VLLM, WEIGHTS_SAFETENSORS, WEIGHTS_PT):
        if (path / name).is_file():
            return path / name
    raise MedusaCheckpointError(
        f"{path} has no {WEIGHTS_VLLM}, {WEIGHTS_SAFETENSORS} or {WEIGHTS_PT}: not a folder of Medusa heads")


def _count(raw: dict, path: Path, names: tuple[str, ...], default: int | None = None):
    """The value config.json gives under any of ``names`` (vLLM's and FasterDecoding's names for one
    count); two that disagree are an error (vLLM would keep whichever its renaming meets last)."""
    found = {name: raw[name] for name in names if name in raw}
    if len({json.dumps(v) for v in found.values()}) > 1:
        raise MedusaCheckpointError(f"{path / 'config.json'}: {found} disagree")
    if not found:
        if default is None:
            raise MedusaCheckpointError(f"{path / 'config.json'} has no {' or '.join(names)}")
        return default
    return next(iter(found.values()))


def checkpoint_num_heads(name_or_dir: str | os.PathLike) -> int:
    """The number of heads a folder (or shipped / cached name) holds, from its config, checking that it has
    weights; nothing is loaded.

    Raises:
        MedusaCheckpointError: no such heads, no weights file, no config or no head count in it.
    """
    path = heads_path(name_or_dir)
    _weights_file(path)
    return _count(_read_config(path), path, ("num_heads", "medusa_num_heads"))


def _fasterdecoding_config(path: Path, raw: dict, state: dict[str, torch.Tensor], target) -> MedusaConfig:
    """The config of a folder in FasterDecoding's layout; sizes the config leaves out come from the
    weights (or the target's vocabulary, for shared heads)."""
    n = _count(raw, path, ("medusa_num_heads", "num_heads"))
    L = _count(raw, path, ("medusa_num_layers", "num_hidden_layers"), default=1)
    full_key = f"0.{L}.weight"
    variant = raw.get("hf_spec_variant") or ("full" if full_key in state else "shared-lm-head")
    first, proj = state.get("0.0.linear.weight"), state.get(full_key)
    hidden = raw.get("hidden_size") or (first.shape[1] if first is not None else proj.shape[1] if proj is not None else None)
    vocab = raw.get("vocab_size") or (proj.shape[0] if proj is not None else None)
    if vocab is None and target is not None:
        vocab = target.get_output_embeddings().weight.shape[0]
    if hidden is None or vocab is None:
        raise MedusaCheckpointError(f"{path}: cannot tell hidden_size / vocab_size; add them to config.json")
    return MedusaConfig(n, L, hidden, vocab, variant, raw.get("base_model_name_or_path"))


_VLLM_BLOCK = re.compile(r"blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)")
_VLLM_PROJECTION = re.compile(r"lm_heads\.(\d+)\.weight")
_FD_BLOCK = re.compile(r"(\d+)\.(\d+)\.linear\.(weight|bias)")
_FD_PROJECTION = re.compile(r"(\d+)\.(\d+)\.weight")


def _fasterdecoding_name(name: str, L: int) -> str:
    """vLLM's name of a tensor -> the key of :attr:`MedusaHeads.heads`' state dict (others unchanged)."""
    if m := _VLLM_BLOCK.fullmatch(name):
        return f"{m[1]}.{m[2]}.linear.{m[3]}"
    if m := _VLLM_PROJECTION.fullmatch(name):
        return f"{m[1]}.{L}.weight"
    return name


def _vllm_names(keys: list[str], config: MedusaConfig) -> list[str]:
    """Keys of :attr:`MedusaHeads.heads`' state dict -> vLLM's names (for messages)."""
    out = []
    for key in keys:
        if m := _FD_BLOCK.fullmatch(key):
            out.append(f"blocks.{m[1]}.layers.{m[2]}.{m[3]}")
        elif (m := _FD_PROJECTION.fullmatch(key)) and int(m[2]) == config.medusa_num_layers:
            out.append(f"lm_heads.{m[1]}.weight")
        else:
            out.append(key)
    return out


def _read_vllm(path: Path, raw: dict, target) -> tuple[MedusaConfig, dict[str, torch.Tensor], str | None]:
    """A folder in vLLM's layout, read as vLLM's ``MedusaConfig`` and ``Medusa.load_weights`` read it.

    Returns the config, the blocks (and ``full`` projections) under :attr:`MedusaHeads.heads`' keys, with
    zero biases when ``medusa_fc_bias`` is false (the same computation as vLLM's bias-free blocks), and for
    ``shared-lm-head`` the file's name of the stored projection, which is not loaded.
    """
    cfg, file = path / "config.json", path / WEIGHTS_VLLM
    n = _count(raw, path, ("num_heads", "medusa_num_heads"))
    L = _count(raw, path, ("num_hidden_layers", "medusa_num_layers"), default=1)
    vocab, truncated = raw.get("vocab_size"), raw.get("truncated_vocab_size")
    if truncated is not None and (isinstance(truncated, bool) or not isinstance(truncated, int)):
        raise MedusaCheckpointError(f"{cfg}: truncated_vocab_size must be an integer, got {truncated!r}")
    if raw.get("logit_scale", 1.0) != 1.0:
        raise MedusaCheckpointError(
            f"{cfg}: logit_scale {raw['logit_scale']}: vLLM multiplies these heads' logits by it and hf-spec does "
            "not; remove it (or fold it into the projections) to load them")
    flags = {key: raw.get(key, False) for key in ("original_lm_head", "medusa_fc_bias")}  # vLLM's defaults
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise MedusaCheckpointError(f"{cfg}: {key} must be true or false, got {value!r}")
    variant = "shared-lm-head" if flags["original_lm_head"] else "full"
    if raw.get("hf_spec_variant", variant) != variant:
        raise MedusaCheckpointError(
            f"{cfg}: hf_spec_variant {raw['hf_spec_variant']!r} but original_lm_head {flags['original_lm_head']}, "
            f"which vLLM reads as {variant!r}; make them agree")
    try:
        from safetensors import safe_open

        with safe_open(str(file), framework="pt") as f:
            names = {name.replace(VLLM_PREFIX, ""): name for name in f.keys()}  # as vLLM's load_weights
            shapes = {short: tuple(f.get_slice(name).get_shape()) for short, name in names.items()}
            lm_name = None
            if variant == "shared-lm-head":  # vLLM: lm_heads.0.weight is mapped to lm_head.weight
                found = [short for short in ("lm_heads.0.weight", "lm_head.weight") if short in names]
                if len(found) != 1:
                    raise MedusaCheckpointError(
                        f"{file}: original_lm_head needs the one shared projection, lm_heads.0.weight (or "
                        f"lm_head.weight); found {found or 'neither'}")
                lm_name = found[0]
            state = {_fasterdecoding_name(short, L): f.get_tensor(name) for short, name in names.items()
                     if short not in (lm_name, "token_map")}
            token_map = f.get_tensor(names["token_map"]) if "token_map" in names else None
    except MedusaCheckpointError:
        raise
    except Exception as e:  # truncated or corrupt file: safetensors errors of many kinds
        raise MedusaCheckpointError(f"cannot read Medusa weights in {path}: {type(e).__name__}: {e}") from e
    biases = sorted(short for short in names if _VLLM_BLOCK.fullmatch(short) and short.endswith(".bias"))
    if biases and not flags["medusa_fc_bias"]:
        raise MedusaCheckpointError(
            f"{file} holds block biases ({biases[0]}, ...) but {cfg} does not set medusa_fc_bias: vLLM would "
            "drop them; set \"medusa_fc_bias\": true")
    if not flags["medusa_fc_bias"]:  # x + SiLU(W x) is x + SiLU(W x + 0)
        for key in [k for k in state if _FD_BLOCK.fullmatch(k)]:
            state[key[: -len("weight")] + "bias"] = torch.zeros(state[key].shape[0], dtype=state[key].dtype)
    first = shapes.get("blocks.0.layers.0.weight")
    proj = shapes.get(lm_name or "lm_heads.0.weight")
    hidden = raw.get("hidden_size") or (first[1] if first else proj[1] if proj else None)
    vocab = vocab or (proj[0] if proj else None)
    if vocab is None and target is not None:
        vocab = target.get_output_embeddings().weight.shape[0]
    if hidden is None or vocab is None:
        raise MedusaCheckpointError(f"{path}: cannot tell hidden_size / vocab_size; add them to config.json")
    config = MedusaConfig(n, L, hidden, vocab, variant, raw.get("base_model_name_or_path"))
    if truncated is not None and not 1 <= truncated <= vocab:  # vLLM builds projections of this many rows
        raise MedusaCheckpointError(
            f"{cfg}: truncated_vocab_size {truncated} must lie in 1..vocab_size ({vocab}): the number of token ids in "
            f"the token_map, or vocab_size for none")
    if truncated is not None and truncated != vocab:  # as vLLM: the map counts only with a truncated size
        if token_map is None or tuple(token_map.shape) != (truncated,):
            raise MedusaCheckpointError(
                f"{path}: truncated_vocab_size {truncated} (of {vocab}) needs a token_map of {truncated} token ids in "
                f"{WEIGHTS_VLLM}; found {'none' if token_map is None else list(token_map.shape)}")
        short = [(_vllm_names([key], config)[0], state[key].shape[0]) for key in state
                 if _FD_PROJECTION.fullmatch(key) and state[key].shape[0] != vocab]
        if lm_name is not None and shapes[lm_name][0] != vocab:  # the shared projection's copy, likewise
            short.insert(0, (lm_name, shapes[lm_name][0]))
        if short:
            raise MedusaCheckpointError(
                f"{path}: {short[0][0]} holds {short[0][1]} rows (only the token map's?); "
                f"hf-spec needs all {vocab} rows of each projection (vLLM gathers the mapped ones when it loads)")
    else:
        token_map = None  # vLLM ignores a token_map without truncation
    if lm_name is not None and shapes[lm_name] != (vocab, hidden):
        raise MedusaCheckpointError(
            f"{path}: {lm_name} has shape {shapes[lm_name]}, expected {(vocab, hidden)} "
            f"for hidden_size {hidden}, vocab_size {vocab}")
    return config, state, None if lm_name is None else names[lm_name], token_map


def _compare_lm_head(path: Path, name: str, target_weight: torch.Tensor) -> None:
    """Warn when the ``lm_head`` copy stored with shared heads differs from the target's, on 24 rows (the
    first, middle and last 8), compared in the coarser of the two dtypes."""
    if not target_weight.is_floating_point() or target_weight.is_meta:
        return
    V = target_weight.shape[0]
    spans = [(a, min(a + 8, V)) for a in sorted({0, V // 2, max(V - 8, 0)})]
    from safetensors import safe_open

    with safe_open(str(path / WEIGHTS_VLLM), framework="pt") as f:
        rows = f.get_slice(name)
        stored = torch.cat([rows[a:b] for a, b in spans])
    mine = torch.cat([target_weight[a:b].detach().cpu() for a, b in spans])
    coarse = max(stored.dtype, mine.dtype, key=lambda d: torch.finfo(d).eps)
    if not torch.equal(stored.to(coarse), mine.to(coarse)):
        logger.warning(
            "%s: the lm_head stored with these shared-lm-head heads (%s, which vLLM uses) differs from the "
            "target's (which hf-spec uses), so hf-spec and vLLM would draft differently; were the heads made "
            "for another model of the same size? Re-save them bound to this target to update the copy.",
            path, name)


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """FasterDecoding's layout: ``medusa_lm_head.safetensors``, else ``medusa_lm_head.pt``."""
    st, pt = path / WEIGHTS_SAFETENSORS, path / WEIGHTS_PT
    try:
        if st.exists():
            from safetensors.torch import load_file

            return load_file(str(st))
        if pt.exists():
            state = torch.load(str(pt), map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
                raise MedusaCheckpointError(f"{pt} is not a state dict of tensors")
            return state
    except MedusaCheckpointError:
        raise
    except Exception as e:  # truncated or corrupt file: safetensors / pickle errors of many kinds
        raise MedusaCheckpointError(f"cannot read Medusa weights in {path}: {type(e).__name__}: {e}") from e
    raise MedusaCheckpointError(f"{path} has no {WEIGHTS_SAFETENSORS} or {WEIGHTS_PT}")
