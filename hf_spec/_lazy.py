"""Lazy public names for a package's ``__init__`` (PEP 562's module ``__getattr__``).

``import hf_spec`` then costs milliseconds instead of the seconds torch and transformers take, so the command line
parses its arguments, prints ``--help`` and reports a usage error before either is imported; the first use of a
name (``hf_spec.generate``, ``from hf_spec import DraftModelDrafter``) imports its submodule. transformers' own
``__init__`` works the same way (``_LazyModule``).
"""

from __future__ import annotations

import importlib
import importlib.util

__all__ = ["lazy_exports"]


def lazy_exports(package: str, names: dict[str, str]):
    """``__getattr__`` and ``__dir__`` for the package ``package`` whose public names live in submodules.

    Args:
        package: the package's ``__name__``.
        names: public name -> the submodule (relative, e.g. ``".loop"``) that defines it; a submodule's own name
            (``"prompts": ".prompts"``) gives the submodule.

    Returns:
        ``(__getattr__, __dir__)`` to assign at the package's top level. ``__getattr__`` imports the submodule on
        first use and caches the value in the package's namespace; a submodule's name gives the submodule, as
        after an eager ``__init__`` (``import hf_spec; hf_spec.device.machine_info()``); other names raise
        ``AttributeError``.
    """
    import sys

    def __getattr__(name: str):
        if name in names:
            module = importlib.import_module(names[name], package)
            value = module if module.__name__.rpartition(".")[2] == name else getattr(module, name)
        elif not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            value = importlib.import_module(f"{package}.{name}")  # a submodule: hf_spec.device.machine_info()
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
