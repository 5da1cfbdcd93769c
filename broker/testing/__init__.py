"""mini-broker as a test fixture: an embedded broker, fault injection and a manual clock.

``from broker.testing import EmbeddedBroker``; the pytest plugin (broker.testing.pytest_plugin,
registered by the package's ``pytest11`` entry point) gives the fixtures ``mini_broker`` and
``mini_broker_factory``. docs/testing.md has the guide.
"""

from broker.testing.clock import ManualClock
from broker.testing.embedded import EmbeddedBroker
from broker.testing.faults import Fault, Faults, error_response

__all__ = ["EmbeddedBroker", "Fault", "Faults", "ManualClock", "error_response"]
