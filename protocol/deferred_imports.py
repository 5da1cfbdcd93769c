"""Third-party modules registered before anything imports them, run only when first used.

A started broker needs little of what its libraries load up front: importing any
``kafka.protocol`` module runs kafka-python's package ``__init__``, which builds its admin
client, consumer, producer and network stack; ``prometheus_client``'s ``__init__`` imports
its HTTP, WSGI and push-gateway exposition; ``crc32c``'s imports ``importlib.metadata`` and
its command line; and ``kafka.codec`` imports every compression library (python-snappy pulls
in cramjam) though a broker needs one only when a compressed batch arrives. Together several
MB of resident memory per process, for code a broker never runs.

``install`` puts a deferred module in ``sys.modules`` for each: a package's submodules import
as usual (``kafka.protocol.consumer`` without the client), and the first read of any other
name runs the module's own code in that same module object, so ``from kafka import
KafkaProducer`` or ``snappy.compress`` behave as if it had been imported eagerly. A library
that is not installed is left alone, so the import fails (or ``kafka.codec`` reports the codec
missing) as before.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types
from typing import Any

__all__ = ["DEFERRED", "install", "is_deferred"]

# Packages whose __init__ a broker does not need, and the compression libraries kafka.codec
# imports (not lz4.frame: kafka.codec reads its decompress function at import, and it is small).
DEFERRED = ("kafka", "prometheus_client", "crc32c", "snappy", "zstandard")

# Names a package's __init__ binds that the broker reads at start, bound to the same object
# the __init__ would bind so reading them does not run it: crc32c's function (its __init__
# imports importlib.metadata for a version string), read by kafka.record.util.
_PRESET = {"crc32c": {"crc32c": ("crc32c._crc32c", "crc32c")}}

_lock = threading.RLock()
_running: set[str] = set()


class _Deferred(types.ModuleType):
    """A module whose code has not run: submodules import, any other name runs it first."""

    def __getattr__(self, name: str) -> Any:
        if self.__spec__.submodule_search_locations is not None:
            qualified = f"{self.__name__}.{name}"
            if qualified in sys.modules or importlib.util.find_spec(qualified) is not None:
                return importlib.import_module(qualified)
        _run(self)
        return getattr(self, name)


def _run(module: types.ModuleType) -> None:
    """Execute the module's code once, into the module object everyone already holds."""
    with _lock:
        if type(module) is not _Deferred:
            return
        if module.__name__ in _running:
            # Its own code reads a name it has not bound yet: what a partly run import raises.
            raise AttributeError(f"partially initialized module {module.__name__!r}")
        _running.add(module.__name__)
        try:
            module.__spec__.loader.exec_module(module)
        finally:
            _running.discard(module.__name__)
        module.__class__ = types.ModuleType


def _spec(name: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of ``name`` without importing its parent package (find_spec would)."""
    parent, _, _ = name.rpartition(".")
    if not parent:
        return importlib.util.find_spec(name)
    holder = sys.modules.get(parent)
    if holder is None:
        return None
    return importlib.machinery.PathFinder.find_spec(
        name, holder.__spec__.submodule_search_locations)


def is_deferred(name: str) -> bool:
    """Whether ``name`` is registered but its code has not run yet."""
    return type(sys.modules.get(name)) is _Deferred


def install() -> None:
    """Register every deferred module that is neither imported already nor missing."""
    with _lock:
        for name in DEFERRED:
            if name in sys.modules:
                continue
            spec = _spec(name)
            if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
                continue
            module = importlib.util.module_from_spec(spec)
            module.__class__ = _Deferred
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)
            for attr, (source, source_attr) in _PRESET.get(name, {}).items():
                setattr(module, attr, getattr(importlib.import_module(source), source_attr))
