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

from bench.consistency import Outcome
from bench.consistency.__main__ import main
from bench.consistency.faults import EmbeddedTarget, ProcessTarget
from bench.consistency.workload import Workload, run_check
from broker.testing import EmbeddedBroker
from tests.support.broker import BrokerProcess

# Small internal topics: a start takes less; nothing checked depends on them.
OVERRIDES = {"offsets.topic.num.partitions": "1", "transaction.state.log.num.partitions": "1"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path, OVERRIDES).start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.kill()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_kills_report_no_anomaly(broker: BrokerProcess) -> None:
    # the record budget outlasts the faults however slow the restarts are
    workload = Workload(duration_s=8, records=100_000, rate=150, faults=["kill"],
                        fault_interval_s=2, fault_duration_s=0.5, fault_count=2)
    result = run_check(ProcessTarget(broker), workload)
    kills = [f for f in result.faults if f.kind == "kill"]
    assert len(kills) == 2 and all(f.end_s is not None and f.error is None for f in kills)
    assert result.history.drained
    counts = result.analysis.counts()
    assert result.analysis.ok, result.analysis.to_dict()
    assert counts == dict.fromkeys(counts, 0)
    # the run did something: records sent before the first kill, acknowledged after the
    # last restart, all read
    sends = result.history.sends
    acked = [s.acked_s for s in sends if result.history.acknowledged(s) and s.acked_s]
    healed = kills[1].end_s
    assert min(s.sent_s for s in sends) < kills[0].start_s
    assert healed is not None and max(acked) > healed
    assert result.analysis.read == result.analysis.acknowledged > 500


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_power_loss_is_reported_as_lost(broker: BrokerProcess) -> None:
    # the cut comes late enough for acknowledgements to precede it on a loaded machine
    workload = Workload(duration_s=8, records=100_000, rate=150, consumers=0,
                        faults=["power-loss"], fault_interval_s=6, fault_duration_s=0.2,
                        fault_count=1)
    result = run_check(ProcessTarget(broker), workload)
    [cut] = result.faults
    assert cut.error is None and "cut 0 bytes" not in cut.detail, cut.detail
    failures = result.analysis.failures()
    assert failures.get("lost", 0) > 0, result.analysis.to_dict()
    assert not result.analysis.ok
    lost = result.analysis.anomalies["lost"]
    assert all(case["acked_s"] < cut.start_s for case in lost)  # acknowledged before the cut


@pytest.mark.timeout(180)
def test_transactions_on_an_embedded_broker() -> None:
    """Aborted transactions are in the log but never read by the read_committed consumers;
    a kill of the embedded broker (a crash in process) loses nothing."""
    with EmbeddedBroker(**OVERRIDES) as embedded:
        workload = Workload(duration_s=5, records=2000, rate=150, transactional=True,
                            txn_size=5, abort_ratio=0.3, faults=["kill"], fault_interval_s=2,
                            fault_duration_s=0.2, fault_count=1)
        result = run_check(EmbeddedTarget(embedded), workload)
    h = result.history
    outcomes = list(h.txns.values())
    assert outcomes.count(Outcome.COMMITTED) > 0 and outcomes.count(Outcome.ABORTED) > 0
    aborted = {s.value for s in h.sends if h.outcome(s) is Outcome.ABORTED}
    read = {r.value for p in h.polls() for r in p.records}
    assert aborted and not aborted & read
    assert all(p.read_committed for p in h.polls())
    assert h.drained and result.analysis.ok, result.analysis.to_dict()
    assert result.analysis.read == result.analysis.acknowledged > 0


@pytest.mark.timeout(180)
def test_cli_against_a_bootstrap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--bootstrap: no faults, one JSON summary line, the PNG written, exit status 0."""
    import json

    png = tmp_path / "timeline.png"
    with EmbeddedBroker(**OVERRIDES) as embedded:
        status = main(["--json", "--bootstrap", embedded.bootstrap_servers, "--duration", "2",
                       "--records", "300", "--png", str(png)])
    [line] = capsys.readouterr().out.splitlines()
    summary = json.loads(line)
    assert status == 0 and summary["ok"] and summary["drained"]
    assert summary["acknowledged"] == summary["read"] == 300
    assert summary["faults"] == [] and summary["png"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_refuses_faults_on_a_bootstrap() -> None:
    with pytest.raises(ValueError, match="cannot inject"):
        with EmbeddedBroker(**OVERRIDES) as embedded:
            main(["--bootstrap", embedded.bootstrap_servers, "--faults", "kill", "--png", ""])
