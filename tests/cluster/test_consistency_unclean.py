"""The consistency checker can fail on a cluster: Kafka's unclean failover loses acknowledged
records when the topic allows it, and the same schedule loses nothing under Kafka's safe
settings.

The schedule is the cluster's ``unclean-failover`` fault (bench.consistency.faults): the
followers of a leader crash and its ISR shrinks to the leader alone; it commits records
alone; it crashes, its registration expires, and the followers come back. With
unclean.leader.election.enable and min.insync.replicas 1 the controller elects a follower out
of the ISR, whose log lacks what the lone leader acknowledged: the producers carry on at the
same offsets and the crashed leader, back as a follower, truncates its suffix away. With
unclean election off and min.insync.replicas 2 the lone leader acknowledges nothing and the
partition stays offline until its leader is back. Both run the CLI, as a user would.

No consumer reads while the producers run, only the final drain: a consumer would read the
lone leader's records before the failover, and the checker would report them as
inconsistent offsets (one offset, two values) instead of lost.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from bench.consistency.__main__ import main
from bench.consistency.faults import ClusterTarget

SCHEDULE = ["--json", "--cluster", "3", "--partitions", "1", "--consumers", "0",
            "--faults", "unclean-failover", "--fault-count", "1", "--fault-interval", "1",
            "--fault-duration", "1", "--duration", "3", "--rate", "40",
            "--drain-timeout", "20", "--png", "", "--examples", "100000",
            # a dead follower leaves the ISR after 2 s rather than 30
            "--override", "replica.lag.time.max.ms=2000"]


def run_schedule(capsys: pytest.CaptureFixture[str], min_insync_replicas: int, unclean: bool
                 ) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """The schedule under these settings: the CLI's exit status, its fault line and its
    summary line."""
    status = main([*SCHEDULE, "--min-insync-replicas", str(min_insync_replicas),
                   "--override", f"unclean.leader.election.enable={str(unclean).lower()}"])
    fault, summary = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert fault["kind"] == "unclean-failover" and fault["error"] is None, fault
    assert fault["end_s"] is not None
    return status, fault, summary


@pytest.mark.timeout(150)
def test_unclean_failover_loses_acknowledged_records(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, fault, summary = run_schedule(capsys, min_insync_replicas=1, unclean=True)
    assert "elected out of the ISR" in fault["detail"], fault["detail"]
    alone = re.search(r"committed (\d+) records alone", fault["detail"])
    assert alone and int(alone[1]) >= ClusterTarget.ALONE_RECORDS, fault["detail"]
    assert status == 1 and not summary["ok"] and summary["drained"], summary
    assert summary["failures"].get("lost", 0) > 0, (fault["detail"], summary)
    lost = summary["examples"]["lost"]
    assert len(lost) == summary["anomalies"]["lost"]
    # acknowledged while the followers were down, not before: the fault lost them
    assert all(case["acked_s"] > fault["start_s"] for case in lost), lost


@pytest.mark.timeout(150)
def test_same_schedule_under_safe_settings_loses_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, fault, summary = run_schedule(capsys, min_insync_replicas=2, unclean=False)
    detail = fault["detail"]
    assert "committed 0 records alone" in detail and "offline: no replica" in detail, detail
    assert status == 0 and summary["ok"] and summary["drained"], summary
    assert summary["anomalies"] == dict.fromkeys(summary["anomalies"], 0), summary
    # nothing lost nor unseen after a full drain: every acknowledged record was read
    assert summary["read"] >= summary["acknowledged"] > 100, summary
