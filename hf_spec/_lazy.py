"""Lazy public names for a package's ``__init__`` (PEP 562's module ``__getattr__``).

``import hf_spec`` then costs milliseconds instead of the seconds torch and transformers take, so the command line
parses its arguments, prints ``--help`` and reports a usage error before either is imported; the first use of a
name (``hf_spec.generate``, ``from hf_spec import DraftModelDrafter``) imports its submodule. transformers' own
``__init__`` works the same way (``_LazyModule``).
"""

from __future__ import annotations

import importlib
import sys
import threading

__all__ = ["lazy_exports"]

#: one lock for every first use: transformers' lazy module is not safe when two threads import through it at once
#: (``ImportError: cannot import name 'DynamicCache'``), so two threads' first uses of hf-spec's names import one
#: after the other, as an eager ``import hf_spec`` did under the package's import lock
_IMPORT_LOCK = threading.RLock()


def lazy_exports(package: str, names: dict[str, str], submodules: frozenset[str] = frozenset()):
    """``__getattr__`` and ``__dir__`` for the package ``package`` whose public names live in submodules.

    Args:
        package: the package's ``__name__``.
        names: public name -> the submodule (relative, e.g. ``".loop"``) that defines it; a submodule's own name
            (``"prompts": ".prompts"``) gives the submodule.
        submodules: submodules reachable as attributes right after ``import package``, as they were when the
            package imported them eagerly (``import hf_spec; hf_spec.device.machine_info()``).

    Returns:
        ``(__getattr__, __dir__)`` to assign at the package's top level. ``__getattr__`` imports what a name needs on
        its first use (one thread at a time) and caches the value in the package's namespace; other names raise
        ``AttributeError``. ``__dir__`` lists the public names beside what is already there.
    """

    def __getattr__(name: str):
        if name in names:
            target = names[name]
        elif name in submodules:
            target = "." + name
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        with _IMPORT_LOCK:
            module = importlib.import_module(target, package)
            value = module if module.__name__.rpartition(".")[2] == name else getattr(module, name)
            setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names) | set(submodules))

    return __getattr__, __dir__
