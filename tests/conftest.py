from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess


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
