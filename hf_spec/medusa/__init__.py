"""Medusa heads: the module and its checkpoint format (:mod:`.heads`), self-distillation training
(:mod:`.train`) and its settings (:mod:`.settings`). The drafter that uses them is
:class:`hf_spec.drafters.medusa.MedusaDrafter`. Names are imported on first use (:mod:`hf_spec._lazy`)."""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from .._lazy import lazy_exports as _lazy_exports

if _TYPE_CHECKING:
    from .heads import MedusaCheckpointError, MedusaConfig, MedusaHeads

__all__ = ["MedusaConfig", "MedusaHeads", "MedusaCheckpointError"]
__getattr__, __dir__ = _lazy_exports(__name__, {name: ".heads" for name in __all__}, frozenset({"heads"}))
