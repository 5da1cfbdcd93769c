from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from tests.support.broker import BrokerProcess

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler import LoadFileScheduling

# Hypothesis profiles, chosen by HYPOTHESIS_PROFILE. "full" (the default, `make test`) keeps
# every test's own example count. "check" (`make check`, run before each commit) caps them so
# the unit and property tests take about a minute on two cores; the full suite still runs the
# whole counts.
CHECK_MAX_EXAMPLES = 25
settings.register_profile("full", settings.get_profile("default"))
settings.register_profile("check", max_examples=CHECK_MAX_EXAMPLES)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "full"))


# `make test` runs under pytest-xdist with --dist loadfile: a file is one unit of work, so that
# its module fixtures (a broker, a JVM) start once. Units are handed out in collection order
# (--no-loadscope-reorder; xdist's default, fewest tests last, put the files of one or two
# long tests at the very end, where a 4-minute file finished alone): the Spark tests first,
# as one unit (one session on one worker, beside the brokers of the others), then every file
# with a test marked slow, then the rest as collected, the many short unit and property files
# last, which even out the workers' ends.
PIPELINE = "tests/pipeline"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadFileScheduling | None:
    """loadfile, with every file of tests/pipeline in one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkAsOneUnit(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return PIPELINE if scope.startswith(PIPELINE + "/") else scope

    return SparkAsOneUnit(config, log)


@pytest.hookimpl(trylast=True)  # after pytest's own reordering for shared fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the order its units are handed out
        items[:] = _longest_first(items)
    if os.environ.get("HYPOTHESIS_PROFILE") == "check":
        _cap_examples(items)


def _longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The Spark tests, then files with a slow test, then the rest; each file's tests kept
    together and in order, files of one rank in collection order."""
    first: dict[str, int] = {}
    slow: set[str] = set()
    for i, item in enumerate(items):
        file = item.nodeid.split("::", 1)[0]
        first.setdefault(file, i)
        if item.get_closest_marker("slow") is not None:
            slow.add(file)

    def rank(item: pytest.Item) -> tuple[int, int]:
        file = item.nodeid.split("::", 1)[0]
        return (0 if file.startswith(PIPELINE + "/") else 1 if file in slow else 2, first[file])

    return sorted(items, key=rank)


def _cap_examples(items: list[pytest.Item]) -> None:
    """Under the check profile, cap the examples of tests that set their own count: a test's
    @settings(max_examples=...) overrides any profile, so the profile alone would not shrink
    them. Tests that draw inside their body (@given on an inner function) keep their count."""
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
