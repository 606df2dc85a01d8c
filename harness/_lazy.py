"""The lazy faces (PEP 562) of `harness`, `harness.run`, `harness.stages`, `harness.monitor` and
`harness.report`: a public name is imported from the
module that defines it on first use, so that a command loads only what it calls.

(`experts` and `probes` keep their own ten lines: neither may import `harness`.)"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` of `package`, whose public names are the keys of
    `exports`, each mapped to the (relative) module that defines it."""

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
