"""The pytest plugin of mini-broker, registered by the package's ``pytest11`` entry point.

Fixtures:

- ``mini_broker``: one embedded broker for the whole session, on an ephemeral port with a fresh
  temporary data dir; ``mini_broker.bootstrap_servers`` is what clients connect to;
- ``mini_broker_factory``: ``mini_broker_factory(**server_properties)`` makes an EmbeddedBroker
  (not started: use it as a context manager, ``with`` or ``async with``); every broker it made
  is closed at the end of the test. ``clock="manual"`` gives one on a manual clock;
- ``mini_broker_cluster``: an EmbeddedCluster of three brokers (and its etcd) for the whole
  session; faults armed on it are healed after each test that used it;
- ``mini_broker_cluster_factory``: ``mini_broker_cluster_factory(nodes=3, **server_properties)``
  makes an EmbeddedCluster (not started: use it as a context manager); every cluster it made
  is closed at the end of the test.

``--kafka-bootstrap HOST:PORT`` points every fixture at an external cluster instead (a real
Kafka in a nightly job, say): they then give an ``ExternalCluster``, whose
``bootstrap_servers`` is that address, and a test that calls what only an embedded broker can
do (fault injection, ``advance``, ``kill``, ``leader``, ``pause`` ...) is skipped there rather
than failed.

Faults armed on the session broker are cleared after each test that used it. The broker is
imported only when a fixture is used: the plugin loads in every pytest run of the environment.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from broker.testing.cluster import EmbeddedCluster
    from broker.testing.embedded import EmbeddedBroker

OPTION = "--kafka-bootstrap"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mini-broker")
    group.addoption(OPTION, dest="kafka_bootstrap", default=None, metavar="HOST:PORT",
                    help="run the mini_broker fixtures against this cluster instead of an "
                         "embedded mini-broker")


class ExternalCluster:
    """Stands in for an EmbeddedBroker when the fixtures point at an external cluster."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers

    def __enter__(self) -> ExternalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    async def __aenter__(self) -> ExternalCluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        pytest.skip(f"{name} needs an embedded mini-broker; the tests run against "
                    f"{self.bootstrap_servers} ({OPTION})")

    def __repr__(self) -> str:
        return f"ExternalCluster({self.bootstrap_servers!r})"


def _embedded_broker() -> type[EmbeddedBroker]:
    """The class, imported on first use. kafka-python's codecs load their JSON specs through a
    deprecated importlib.resources call at import: a user's run should not list those."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from broker.testing.embedded import EmbeddedBroker
    return EmbeddedBroker


def _embedded_cluster() -> type[EmbeddedCluster]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from broker.testing.cluster import EmbeddedCluster
    return EmbeddedCluster


def _external(config: pytest.Config) -> str | None:
    value = config.getoption("kafka_bootstrap", default=None)
    return str(value) if value else None


@pytest.fixture(scope="session")
def mini_broker(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One broker for the session (an EmbeddedBroker, or the external cluster)."""
    external = _external(request.config)
    if external is not None:
        yield ExternalCluster(external)
        return
    with _embedded_broker()(tmp_path_factory.mktemp("mini-broker")) as broker:
        yield broker


@pytest.fixture(autouse=True)
def _mini_broker_faults_cleared(request: pytest.FixtureRequest) -> Iterator[None]:
    """The session broker's faults never outlive the test that armed them."""
    yield
    if _external(request.config) is not None:
        return
    if "mini_broker" in request.fixturenames:
        request.getfixturevalue("mini_broker").clear_faults()
    if "mini_broker_cluster" in request.fixturenames:
        request.getfixturevalue("mini_broker_cluster").heal()


@pytest.fixture
def mini_broker_factory(request: pytest.FixtureRequest,
                        tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``make(**server_properties)`` -> an EmbeddedBroker to use as a context manager."""
    external = _external(request.config)
    made: list[EmbeddedBroker] = []

    def make(**server_properties: Any) -> Any:
        if external is not None:
            return ExternalCluster(external)
        broker = _embedded_broker()(tmp_path / f"broker-{len(made)}", **server_properties)
        made.append(broker)
        return broker

    yield make
    for broker in made:
        if broker.running and not broker._async:
            broker.stop()


@pytest.fixture(scope="session")
def mini_broker_cluster(request: pytest.FixtureRequest,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Three brokers and their etcd for the session (an EmbeddedCluster, or the external
    cluster)."""
    external = _external(request.config)
    if external is not None:
        yield ExternalCluster(external)
        return
    with _embedded_cluster()(3, tmp_path_factory.mktemp("mini-broker-cluster")) as cluster:
        yield cluster


@pytest.fixture
def mini_broker_cluster_factory(request: pytest.FixtureRequest,
                                tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``make(nodes=3, **server_properties)`` -> an EmbeddedCluster to use as a context
    manager."""
    external = _external(request.config)
    made: list[EmbeddedCluster] = []

    def make(nodes: int = 3, **server_properties: Any) -> Any:
        if external is not None:
            return ExternalCluster(external)
        cluster = _embedded_cluster()(nodes, tmp_path / f"cluster-{len(made)}",
                                      **server_properties)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
