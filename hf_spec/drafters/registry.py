"""One place that turns a drafter spec (``none``, ``ngram``, ``suffix``, ``draft:MODEL``, ``medusa:DIR``,
``hybrid:draft:MODEL``, ``hybrid:medusa:DIR``) into a drafter.

The command line (``generate``, ``bench``, ``tune``), the benchmark and the demo all build their drafters
here, so a spec means the same everywhere, is checked once, before any model loads, and gets one default k
(:data:`~hf_spec.drafters.base.DEFAULT_NUM_SPECULATIVE_TOKENS`, or what the drafter knows better: 6 for a draft
model, whose confidence stop makes k a cap, and for a hybrid built on one; a Medusa checkpoint's head count).
Adding a drafter = one file with a :class:`~hf_spec.drafters.base.Drafter` subclass + one line in
:data:`DRAFTERS` (or :func:`register_drafter` from your own code).
"""

from __future__ import annotations

from dataclasses import dataclass

import re

from .base import Drafter, check_num_speculative_tokens
from .draft_model import DraftModelDrafter
from .hybrid import HybridDrafter
from .medusa import MedusaDrafter
from .ngram import NgramDrafter
from .suffix import SuffixDrafter

__all__ = ["DRAFTERS", "DrafterSpec", "parse_drafter", "make_drafter", "register_drafter", "drafter_specs"]

#: spec name -> drafter class; the spec is ``name`` or ``name:ARGUMENT`` (the class's ``spec_argument``)
DRAFTERS: dict[str, type[Drafter]] = {
    "ngram": NgramDrafter,
    "suffix": SuffixDrafter,
    "hybrid": HybridDrafter,
    "draft": DraftModelDrafter,
    "medusa": MedusaDrafter,
}
#: hf-spec's own spec names, which :func:`register_drafter` never replaces
BUILTIN_DRAFTERS = frozenset(DRAFTERS)


@dataclass(frozen=True)
class DrafterSpec:
    """A parsed drafter spec: ``name`` (a key of :data:`DRAFTERS`) and the ``argument`` after ``:``."""

    name: str
    argument: str | None = None

    def __str__(self) -> str:
        return self.name if self.argument is None else f"{self.name}:{self.argument}"

    @property
    def cls(self) -> type[Drafter]:
        return DRAFTERS[self.name]


def drafter_specs() -> str:
    """The accepted spec forms, for messages and help: ``none``, then every registered drafter's name with its
    argument (``none | ngram | suffix | hybrid:draft:MODEL | hybrid:medusa:DIR | draft:MODEL | medusa:DIR`` with the
    built-in ones)."""
    forms = [name if cls.spec_argument is None else " | ".join(f"{name}:{a}" for a in cls.spec_argument.split(" | "))
             for name, cls in DRAFTERS.items()]
    return " | ".join(["none"] + forms)


def parse_drafter(spec: str, num_speculative_tokens: int | None = None) -> DrafterSpec | None:
    """Parse and check a drafter spec before any model loads; ``"none"`` gives ``None`` (plain decoding).

    Args:
        spec: the spec text.
        num_speculative_tokens: the k the drafter will be built with, when known, for checks such as a
            Medusa checkpoint's head count.

    Raises:
        ValueError: an unknown name, a missing or unexpected argument, or an argument the drafter refuses
            (e.g. ``medusa:DIR`` whose folder does not exist), with the accepted forms.
    """
    text = (spec or "").strip()
    if text == "none":
        return None
    name, sep, argument = text.partition(":")
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {spec!r}; use {drafter_specs()}")
    parsed = DrafterSpec(name, argument if sep else None)
    try:
        parsed.cls.check_spec(parsed.argument, num_speculative_tokens)
    except ValueError as e:
        raise ValueError(f"drafter {spec!r}: {e}") from e
    return parsed


def make_drafter(spec: str | DrafterSpec | None, *, num_speculative_tokens: int | None = None, target=None,
                 tokenizer=None, draft_dtype="auto", corpus=None) -> Drafter | None:
    """Build the drafter a spec names (``None`` for ``"none"``).

    Args:
        spec: ``none``, ``ngram``, ``suffix``, ``draft:MODEL``, ``medusa:DIR``, ``hybrid:draft:MODEL``,
            ``hybrid:medusa:DIR`` or a registered name; or a parsed spec.
        num_speculative_tokens: the drafter's own k (an int >= 1), or ``None`` for its default (3; 6 for
            ``draft:MODEL`` and ``hybrid:draft:MODEL``, whose confidence stop makes k a cap; a Medusa checkpoint's
            head count). ``"auto"`` is a per-call choice: pass it to ``generate``, not here.
        target: the target model (a draft model is put on its device; Medusa heads are checked against it).
        tokenizer: the target's tokenizer (a draft model's must have the same vocabulary).
        draft_dtype: ``"auto"`` (int4 on a CPU with native bfloat16, else int8 with VNNI, else bfloat16; float16
            beside a float16 target:
            :func:`hf_spec.device.draft_dtype`), a dtype name, ``"int8"`` or ``"int4"``, for draft models.
        corpus: texts (or token-id sequences) to draft from, for drafters that take one (``suffix``,
            ``hybrid:...``: :attr:`~hf_spec.drafters.base.Drafter.takes_corpus`); ``None``: none.

    Raises:
        ValueError: a bad spec or k (before any model loads), a corpus for a drafter that takes none, or a
            drafter that cannot serve ``target``.
    """
    if isinstance(num_speculative_tokens, str) and num_speculative_tokens == "auto":
        raise ValueError('num_speculative_tokens="auto" is chosen per call: build the drafter with its own k (or '
                         'none) and pass num_speculative_tokens="auto" to generate')
    if num_speculative_tokens is not None:
        check_num_speculative_tokens(num_speculative_tokens)
    parsed = parse_drafter(spec, num_speculative_tokens) if not isinstance(spec, DrafterSpec) and spec is not None else spec
    if parsed is None:
        if corpus is not None:
            raise ValueError("a corpus needs a drafter that drafts from one: --drafter suffix, hybrid:draft:MODEL or "
                             "hybrid:medusa:DIR")
        return None
    extra = {}
    if corpus is not None:
        if not parsed.cls.takes_corpus:
            raise ValueError(f"drafter {str(parsed)!r} does not draft from a corpus; use suffix, hybrid:draft:MODEL or "
                             "hybrid:medusa:DIR")
        extra["corpus"] = corpus
    drafter = parsed.cls.from_spec(parsed.argument, num_speculative_tokens=num_speculative_tokens, target=target,
                                   tokenizer=tokenizer, draft_dtype=draft_dtype, **extra)
    name = parsed.cls.__name__
    if not isinstance(drafter, Drafter):
        raise TypeError(f"drafter {str(parsed)!r}: {name}.from_spec returned {type(drafter).__name__}, not a Drafter")
    if num_speculative_tokens is not None and getattr(drafter, "num_speculative_tokens", None) != num_speculative_tokens:
        raise ValueError(f"drafter {str(parsed)!r}: asked for k={num_speculative_tokens}, {name}.from_spec built one "
                         f"with k={getattr(drafter, 'num_speculative_tokens', None)}; give {name}.__init__ a "
                         "num_speculative_tokens argument passed on to super().__init__, or override from_spec")
    return drafter


def register_drafter(name: str, cls: type[Drafter], *, replace: bool = False) -> None:
    """Make ``name`` (or ``name:ARGUMENT``) a drafter spec for ``cls`` everywhere specs are read (the CLI, the
    benchmark, the demo), e.g. for a drafter in your own package.

    Only this process sees it: the ``hf-spec`` command reads :data:`DRAFTERS` as the package defines it, so a
    drafter for the command line needs its line there. Registering the same class under the same name again does
    nothing; ``replace=True`` puts another class under a name registered before (a class defined again, as a
    re-run notebook cell does). hf-spec's own names are never registered again.

    Raises:
        ValueError: ``name`` is ``none``, hf-spec's own, registered to another class (without ``replace``), or not
            letters, digits, ``_``, ``.``, ``-`` (a spec is ``name:argument``, and ``--methods`` separates specs with
            commas); TypeError: ``cls`` is no Drafter class.
    """
    if not (isinstance(cls, type) and issubclass(cls, Drafter)):
        hint = f" (an instance: pass its class, {type(cls).__name__})" if isinstance(cls, Drafter) else ""
        raise TypeError(f"{cls!r} is not a subclass of hf_spec.Drafter{hint}")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name == "none":
        raise ValueError(f"cannot register a drafter as {name!r}: use letters, digits, '_', '.', '-', and not 'none'")
    if name in BUILTIN_DRAFTERS:
        raise ValueError(f"cannot register a drafter as {name!r}: hf-spec's own {DRAFTERS[name].__name__} has it; "
                         f"choose another name (taken: {', '.join(DRAFTERS)})")
    if name in DRAFTERS and DRAFTERS[name] is not cls:
        if not replace:
            raise ValueError(f"drafter name {name!r} is registered to {DRAFTERS[name].__module__}."
                             f"{DRAFTERS[name].__qualname__}; choose another name, or pass replace=True to put "
                             f"{cls.__qualname__} there")
    DRAFTERS[name] = cls
