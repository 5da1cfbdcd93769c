"""The GC policy belongs to the broker process started by the command line; a broker built
in someone else's process (an embedded one, in a user's tests) leaves their collector alone."""

from __future__ import annotations

import gc

from broker.testing import EmbeddedBroker
from tests.support.broker import BrokerProcess


def _events(broker: BrokerProcess, name: str) -> list[dict]:
    return [line for line in broker.new_log_lines() if line.get("event") == name]


def test_cli_applies_the_policy_and_logs_the_pauses(tmp_path):
    broker = BrokerProcess(tmp_path, {"minibroker.gc.policy": "tuned",
                                      "minibroker.gc.gen0.threshold": "40000",
                                      "log.level": "DEBUG"}).start()  # the policy line
    assert broker.stop() == 0
    [applied] = _events(broker, "gc policy")
    assert applied["policy"] == "tuned"
    assert applied["thresholds"][0] == 40000
    assert applied["frozen"] > 0
    [pauses] = _events(broker, "gc pauses")
    assert len(pauses["collections"]) == len(pauses["pause_ms"]) == 3


def test_cli_default_policy_leaves_cpython_as_is(tmp_path):
    broker = BrokerProcess(tmp_path, {"minibroker.gc.policy": "default",
                                      "log.level": "DEBUG"}).start()
    assert broker.stop() == 0
    [applied] = _events(broker, "gc policy")
    assert applied["thresholds"] == list(gc.get_threshold())  # pytest's: CPython's own
    assert applied["frozen"] == 0


def test_a_broker_in_this_process_does_not_touch_its_collector(tmp_path):
    before = (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled())
    with EmbeddedBroker(tmp_path, **{"minibroker.gc.policy": "tuned"}) as broker:
        assert broker.running
        assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == before
    assert (gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()) == before
