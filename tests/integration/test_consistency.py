"""The consistency checker against one broker process: clean under SIGKILLs, and able to fail.

A SIGKILL leaves the page cache, so a killed broker keeps everything it acknowledged and the
checker must find nothing. A power cut does not: with log.flush.interval.messages unset
nothing past the recovery point was fsynced, so cutting it off the active segments after the
kill (bench.consistency.faults.cut_unflushed) loses acknowledged records, and the producers,
carrying on after the restart, write new records at their offsets. The checker must call
them lost. No consumer reads during that run (only the final drain), so the lost records
were never read before the cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.consistency.faults import ProcessTarget
from bench.consistency.workload import Workload, run_check
from tests.support.broker import BrokerProcess

# Small internal topics: a start takes less; nothing checked depends on them.
OVERRIDES = {"offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path, OVERRIDES).start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.kill()


@pytest.mark.timeout(300)
def test_two_kills_report_no_anomaly(broker: BrokerProcess) -> None:
    workload = Workload(duration_s=8, records=4000, rate=150, faults=["kill"],
                        fault_interval_s=2, fault_duration_s=0.5, fault_count=2)
    result = run_check(ProcessTarget(broker), workload)
    kills = [f for f in result.faults if f.kind == "kill"]
    assert len(kills) == 2 and all(f.end_s is not None and f.error is None for f in kills)
    assert result.history.drained
    counts = result.analysis.counts()
    assert result.analysis.ok, result.analysis.to_dict()
    assert counts == dict.fromkeys(counts, 0)
    # the run did something: records acknowledged before and after the kills, all read
    acked = [s.acked_s for s in result.history.sends
             if result.history.acknowledged(s) and s.acked_s is not None]
    healed = kills[1].end_s
    assert healed is not None and min(acked) < kills[0].start_s and max(acked) > healed
    assert result.analysis.read == result.analysis.acknowledged > 500


@pytest.mark.timeout(300)
def test_power_loss_is_reported_as_lost(broker: BrokerProcess) -> None:
    workload = Workload(duration_s=6, records=3000, rate=150, consumers=0,
                        faults=["power-loss"], fault_interval_s=2.5, fault_duration_s=0.2,
                        fault_count=1)
    result = run_check(ProcessTarget(broker), workload)
    [cut] = result.faults
    assert cut.error is None and "cut 0 bytes" not in cut.detail, cut.detail
    failures = result.analysis.failures()
    assert failures.get("lost", 0) > 0, result.analysis.to_dict()
    assert not result.analysis.ok
    lost = result.analysis.anomalies["lost"]
    assert all(case["acked_s"] < cut.start_s for case in lost)  # acknowledged before the cut
