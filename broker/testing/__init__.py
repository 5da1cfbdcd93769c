"""mini-broker as a test fixture: an embedded broker, fault injection and a manual clock;
an embedded cluster (etcd and N brokers) with faults between its brokers.

``from broker.testing import EmbeddedBroker, EmbeddedCluster``; the pytest plugin
(broker.testing.pytest_plugin, registered by the package's ``pytest11`` entry point) gives the
fixtures ``mini_broker``, ``mini_broker_factory``, ``mini_broker_cluster`` and
``mini_broker_cluster_factory``. docs/testing.md has the guide.

The names are imported on first use: the plugin loads in every pytest run of the environment,
and must not import the whole broker to do so.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.testing.cluster import ClusterBroker, EmbeddedCluster
    from broker.testing.embedded import EmbeddedBroker
    from broker.testing.faults import Fault, Faults, error_response
    from purgatory import ManualClock

__all__ = ["ClusterBroker", "EmbeddedBroker", "EmbeddedCluster", "Fault", "Faults",
           "ManualClock", "error_response"]

#: Where each name lives. The manual clock is the purgatory's (``ManualClock(run_due_soon=True)``
#: is what ``EmbeddedBroker(clock="manual")`` runs on).
_HOMES = {"EmbeddedBroker": "broker.testing.embedded",
          "EmbeddedCluster": "broker.testing.cluster", "ClusterBroker": "broker.testing.cluster",
          "Fault": "broker.testing.faults",
          "Faults": "broker.testing.faults", "ManualClock": "purgatory.clock",
          "error_response": "broker.testing.faults"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home), name)
