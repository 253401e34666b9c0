"""Medusa heads: the module and its checkpoint format (:mod:`.heads`) and self-distillation training
(:mod:`.train`). The drafter that uses them is :class:`hf_spec.drafters.medusa.MedusaDrafter`."""

from .heads import MedusaCheckpointError, MedusaConfig, MedusaHeads

__all__ = ["MedusaConfig", "MedusaHeads", "MedusaCheckpointError"]
