"""Package attributes loaded on first use (PEP 562), so that importing a package
does not import the modules behind every name it offers."""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_exports(package: str, exports: dict[str, str], namespace: dict) -> Callable:
    """A module ``__getattr__`` for ``package``: each name of ``exports`` comes from
    the module it maps to at its first use, and is cached in ``namespace`` (the
    package's globals) so that later uses are plain lookups."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
