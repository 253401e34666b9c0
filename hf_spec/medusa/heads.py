"""Medusa heads and their checkpoint format (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration
Framework with Multiple Decoding Heads"; layout of FasterDecoding/Medusa ``medusa/model/medusa_model.py``).

Head i (0-based) reads the target's last hidden state at position t (the input of its ``lm_head``, after
the final norm) and predicts the token at t + i + 2: the target's own ``lm_head`` gives t + 1. A head is
``L`` residual blocks ``x + SiLU(W x + b)`` followed by a vocabulary projection.

Two variants:

- ``full``: each head has its own ``Linear(hidden, vocab, bias=False)``, the FasterDecoding layout; files
  from FasterDecoding (and TGI, which reads the same format) load as they are.
- ``shared-lm-head``: the heads reuse the target's ``lm_head``; only the residual blocks are new (files
  ~1/50 of the size for a 150k vocabulary, and the one projection is read once for all heads per step).

On disk (a folder)::

    config.json                      {"medusa_num_heads": N, "medusa_num_layers": L, "hidden_size": H,
                                      "vocab_size": V, "hf_spec_variant": "full" | "shared-lm-head", ...}
    medusa_lm_head.safetensors       keys "{i}.{j}.linear.weight" [H, H], "{i}.{j}.linear.bias" [H],
                                     and for "full" "{i}.{L}.weight" [V, H]
    (or medusa_lm_head.pt, a torch state dict with the same keys, as FasterDecoding saves)

A FasterDecoding ``config.json`` has no ``hf_spec_variant``: the variant is then read from the weights
(a ``{i}.{L}.weight`` key means ``full``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

__all__ = ["MedusaConfig", "MedusaHeads", "MedusaCheckpointError", "ResBlock", "VARIANTS", "heads_path",
           "SHIPPED_DIR"]

VARIANTS = ("full", "shared-lm-head")
WEIGHTS_SAFETENSORS = "medusa_lm_head.safetensors"
WEIGHTS_PT = "medusa_lm_head.pt"
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


class MedusaCheckpointError(ValueError):
    """A Medusa checkpoint is missing, corrupt, or does not fit the target."""


@dataclass
class MedusaConfig:
    """What ``config.json`` of a heads folder holds.

    Attributes:
        medusa_num_heads: N, the number of heads (the most tokens drafted per step).
        medusa_num_layers: L, residual blocks per head.
        hidden_size: H, the target's hidden size.
        vocab_size: V, the target's vocabulary size (rows of its ``lm_head``).
        variant: ``"full"`` (own projection per head) or ``"shared-lm-head"`` (the target's ``lm_head``).
        base_model_name_or_path: the target the heads were trained for (informational).
    """

    medusa_num_heads: int
    medusa_num_layers: int
    hidden_size: int
    vocab_size: int
    variant: str = "full"
    base_model_name_or_path: str | None = None

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise MedusaCheckpointError(f"unknown Medusa variant {self.variant!r}; use one of {VARIANTS}")
        for name in ("medusa_num_heads", "medusa_num_layers", "hidden_size", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise MedusaCheckpointError(f"Medusa config: {name} must be a positive integer, got {value!r}")

    def to_json(self) -> dict:
        d = asdict(self)
        d["hf_spec_variant"] = d.pop("variant")
        return d


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)``; W starts at zero so that a new block is the identity (as in FasterDecoding)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """N Medusa heads on a target's last hidden state.

    Args:
        config: sizes and variant (:class:`MedusaConfig`).

    ``self.heads`` is an ``nn.ModuleList`` whose state dict has exactly FasterDecoding's keys. The
    ``shared-lm-head`` variant needs the target's projection: :meth:`bind` it (the drafter and the trainer
    do); it is not part of this module's parameters or of the saved file.
    """

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        H, V, L = config.hidden_size, config.vocab_size, config.medusa_num_layers
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(H) for _ in range(L)], *([nn.Linear(H, V, bias=False)] if config.variant == "full" else []))
            for _ in range(config.medusa_num_heads)
        )
        self._lm_head: list[nn.Module] = []  # a list, so that the target's lm_head is not registered here

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
                lm_head: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of the heads.

        Args:
            hidden_states: ``[..., H]``, the target's last hidden states (after its final norm).
            num_heads: use only the first n heads (default all).
            lm_head: ``[V, H]``, the target's ``lm_head`` weight for ``shared-lm-head`` heads, given per call
                (the drafter does, so heads shared by several targets never depend on which was bound last);
                default: the bound target's.

        Returns:
            ``[..., n, V]``: head i's logits for the token i + 2 positions after each hidden state's.
        """
        x = self.hidden(hidden_states, num_heads)
        if self.shares_lm_head:
            W = lm_head if lm_head is not None else self.projection(0)
            return _project(x.to(W.dtype), W)
        return torch.stack([_project(x[..., i, :], self.projection(i)) for i in range(x.shape[-2])], dim=-2)

    def _dtype(self) -> torch.dtype:
        return next(self.heads.parameters()).dtype

    # ---- checkpoint I/O -----------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``medusa_lm_head.safetensors`` (FasterDecoding keys) to ``directory``.

        Written to a temporary folder first and moved into place, so a failure leaves no half-written file.
        Returns the folder.
        """
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".medusa-", dir=out))
        try:
            state = {k: v.detach().contiguous().cpu() for k, v in self.heads.state_dict().items()}
            save_file(state, str(tmp / WEIGHTS_SAFETENSORS), metadata={"format": "pt"})
            (tmp / "config.json").write_text(json.dumps(self.config.to_json(), indent=2) + "\n")
            for name in ("config.json", WEIGHTS_SAFETENSORS):
                os.replace(tmp / name, out / name)
            stale = out / WEIGHTS_PT  # an older .pt beside the new file would be ambiguous
            if stale.exists():
                stale.unlink()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return out

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, target=None, dtype: torch.dtype | None = None) -> "MedusaHeads":
        """Load heads from a folder in FasterDecoding's format (or hf-spec's, which is the same plus a variant).

        Args:
            directory: the folder with ``config.json`` and ``medusa_lm_head.safetensors`` (or ``.pt``), or
                the short name of shipped or cached heads (see :func:`heads_path`).
            target: when given, checked (hidden size, vocabulary) and bound (see :meth:`bind`).
            dtype: the heads' dtype (default: as stored).

        Raises:
            MedusaCheckpointError: folder, config or weights missing or unreadable; keys or shapes that do
                not form N heads of L blocks; sizes that do not match ``target``.
        """
        path = heads_path(directory)  # a folder, or the short name of shipped or cached heads
        state = _read_weights(path)
        raw = _read_config(path)
        n, L = raw.get("medusa_num_heads"), raw.get("medusa_num_layers", 1)
        if n is None:
            raise MedusaCheckpointError(f"{path / 'config.json'} has no medusa_num_heads")
        full_key = f"0.{L}.weight"
        variant = raw.get("hf_spec_variant") or ("full" if full_key in state else "shared-lm-head")
        first = state.get("0.0.linear.weight")
        proj = state.get(full_key)
        hidden = raw.get("hidden_size") or (first.shape[1] if first is not None else proj.shape[1] if proj is not None else None)
        vocab = raw.get("vocab_size") or (proj.shape[0] if proj is not None else None)
        if vocab is None and target is not None:
            vocab = target.get_output_embeddings().weight.shape[0]
        if hidden is None or vocab is None:
            raise MedusaCheckpointError(f"{path}: cannot tell hidden_size / vocab_size; add them to config.json")
        config = MedusaConfig(int(n), int(L), int(hidden), int(vocab), variant, raw.get("base_model_name_or_path"))
        heads = cls(config)
        expected = heads.heads.state_dict()
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise MedusaCheckpointError(
                f"{path}: the weights do not form {n} heads of {L} blocks ({variant}): "
                f"missing {missing[:4]}{'...' if len(missing) > 4 else ''}, "
                f"unexpected {unexpected[:4]}{'...' if len(unexpected) > 4 else ''}; "
                "check medusa_num_heads / medusa_num_layers in config.json")
        for key, tensor in state.items():
            if tuple(tensor.shape) != tuple(expected[key].shape):
                raise MedusaCheckpointError(
                    f"{path}: {key} has shape {tuple(tensor.shape)}, expected {tuple(expected[key].shape)} "
                    f"for hidden_size {hidden}, vocab_size {vocab}")
        heads.heads.load_state_dict(state)
        if dtype is not None:
            heads.to(dtype)
        else:
            heads.to(next(iter(state.values())).dtype)
        heads.eval()
        if target is not None:
            heads.bind(target)
        return heads


def _in_features(linear) -> int:
    return getattr(linear, "in_features", None) or linear.weight.shape[1]


def _project(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` for ``x [..., H]``; a few float32 CPU rows as ``(W @ x.T).T``, which reads W once
    (see :mod:`hf_spec.kernels`)."""
    rows = x.numel() // x.shape[-1]
    if x.device.type == "cpu" and x.dtype == torch.float32 and 2 <= rows <= 128 and not x.requires_grad:
        return torch.mm(W, x.reshape(rows, -1).t()).t().reshape(*x.shape[:-1], W.shape[0])
    return torch.nn.functional.linear(x, W)


def _read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.exists():
        raise MedusaCheckpointError(f"{path} has no config.json (medusa_num_heads, medusa_num_layers)")
    try:
        raw = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MedusaCheckpointError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise MedusaCheckpointError(f"{file} must hold a JSON object")
    return raw


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
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
