"""One module per API, dispatched by API key; each reads top to bottom: validate, act, answer.

Each API module declares what it serves at its top: ``API_KEY``, ``VERSIONS`` (the range of
request versions it handles) and, where ApiVersions advertises a wider range than is handled,
``ADVERTISED_VERSIONS``. The package finds them itself, so adding an API is its module here and
its codec in protocol/registry.py. The codec registry keeps the same ranges for the layers below
this one (the connection and SASL refuse a version before any handler runs); the two are checked
to agree when this package is imported.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from protocol.registry import APIS


@dataclass(frozen=True, slots=True)
class ServedApi:
    """What one API module declares: its key, the versions handled and those advertised."""

    key: int
    versions: range
    advertised: range
    module: ModuleType


def _declared() -> dict[int, ServedApi]:
    """Every module of this package that declares an ``API_KEY``, by key."""
    served: dict[int, ServedApi] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        key = getattr(module, "API_KEY", None)
        if key is None:
            continue  # a helper module (context, authorize, deferred)
        if key in served:
            raise ImportError(f"API key {key} declared by both {served[key].module.__name__} "
                              f"and {module.__name__}")
        versions: range = module.VERSIONS
        served[key] = ServedApi(key, versions, getattr(module, "ADVERTISED_VERSIONS", versions),
                                module)
    return dict(sorted(served.items()))


def disagreements(served: dict[int, ServedApi]) -> list[str]:
    """Where the API modules' declarations and the codec registry differ (empty when they
    agree): a key on one side only, or a different handled or advertised range."""
    out = [f"API key {k} has a codec but no API module" for k in sorted(set(APIS) - set(served))]
    out += [f"API key {k} has an API module but no codec" for k in sorted(set(served) - set(APIS))]
    for key in sorted(set(served) & set(APIS)):
        api, spec = served[key], APIS[key]
        codec = (range(spec.min_version, spec.max_version + 1),
                 range(spec.advertised_min, spec.max_version + 1))
        if (api.versions, api.advertised) != codec:
            out.append(f"{api.module.__name__} serves {api.versions} advertising {api.advertised}"
                       f", the codec registry {codec[0]} advertising {codec[1]}")
    return out


SERVED: dict[int, ServedApi] = _declared()
HANDLERS: dict[int, Callable[..., Any]] = {k: api.module.handle for k, api in SERVED.items()}

if _problems := disagreements(SERVED):
    raise ImportError("broker.apis and protocol/registry.py disagree: " + "; ".join(_problems))
