from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from broker.logging import to_standard_logging
from tests.support.broker import BrokerProcess

# Hypothesis profiles, chosen by HYPOTHESIS_PROFILE. "full" (the default, `make test`) keeps
# every test's own example count. "check" (`make check`, run before each commit) caps them so
# the unit and property tests take about a minute on two cores; the full suite still runs the
# whole counts.
CHECK_MAX_EXAMPLES = 25
settings.register_profile("full", settings.get_profile("default"))
settings.register_profile("check", max_examples=CHECK_MAX_EXAMPLES)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "full"))


def pytest_configure(config: pytest.Config) -> None:
    """Set structlog up as an embedded broker would, before any test runs: structlog's
    capture_logs leaves structlog marked configured with its defaults (print to stdout), so a
    broker embedded after such a test would otherwise print its lines into the output a test
    reads."""
    to_standard_logging()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under the check profile, cap the examples of tests that set their own count: a test's
    @settings(max_examples=...) overrides any profile, so the profile alone would not shrink
    them. Tests that draw inside their body (@given on an inner function) keep their count."""
    if os.environ.get("HYPOTHESIS_PROFILE") != "check":
        return
    cap = settings().max_examples
    for item in items:
        obj = getattr(item, "obj", None)
        test = getattr(obj, "__func__", obj)  # a method's settings live on its function
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if test is not None and own is not None and own.max_examples > cap:
            test._hypothesis_internal_use_settings = settings(own, max_examples=cap)
        # A rule-based state machine's settings live on its TestCase class.
        machine = getattr(item, "cls", None)
        own = getattr(machine, "settings", None)
        if isinstance(own, settings) and own.max_examples > cap:
            machine.settings = settings(own, max_examples=cap)  # type: ignore[union-attr]


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator:
    """Make brokers with chosen overrides; every one is stopped at the end of the test."""
    started: list[BrokerProcess] = []

    def make(overrides: dict[str, str] | None = None, name: str = "broker") -> BrokerProcess:
        b = BrokerProcess(tmp_path / name, overrides).start()
        started.append(b)
        return b

    yield make
    for b in started:
        if b.proc is not None and b.proc.poll() is None:
            b.kill()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory()
