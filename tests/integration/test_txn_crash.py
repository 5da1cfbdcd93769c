"""Transactions across a SIGKILL of the broker, restarted on the same data dir and port.

With log.flush.interval.messages=1 an acknowledged write is on disk, so a kill may lose only
what nobody was told had happened.

(a) Killed in the middle of a transaction (records sent and acknowledged, no commit): after the
    restart the broker aborts that transaction, either when its transaction.timeout.ms runs
    out or when a new producer initialises the same transactional.id; until then read_committed
    consumers stop at it, afterwards the last stable offset reaches the partition's end, the
    committed records before it are all readable and the open transaction's never are.
(b) Killed right after a commit was acknowledged (EndTxn answered: the coordinator wrote
    PrepareCommit, the markers may not be written yet), several times, each time after an
    aborted transaction too: after each restart, with no client doing anything, the broker
    completes the commit on its own (the last stable offset reaches the end) and read_committed
    consumers read every committed record, in order, and nothing aborted.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.test_transactions import (
    ConfluentTxn,
    Reader,
    has_all,
    high_watermark,
    read_until,
    stable_end,
    vals,
    values,
)
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, unique_topic, wait_until

PARTITIONS = 2
OVERRIDES = {
    "log.flush.interval.messages": "1",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
}
ROUNDS = 3  # kills right after an acknowledged commit in (b)


def _kill_and_restart(b: BrokerProcess) -> None:
    b.kill()
    assert b.proc is not None and b.proc.returncode == -signal.SIGKILL, (
        f"the broker exited by itself with {b.proc.returncode if b.proc else None}")
    b.start()


def _all_stable(b: BrokerProcess, topic: str) -> bool:
    """Every partition's last stable offset is its high watermark: nothing is open."""
    return all(stable_end(b.bootstrap, topic, p) == high_watermark(b.bootstrap, topic, p)
               for p in range(PARTITIONS))


def _send(producer: ConfluentTxn, topic: str, prefix: str, n: int) -> dict[int, list[bytes]]:
    """n records per partition, values prefix-<partition>-<i>."""
    sent = {p: vals(f"{prefix}-{p}", n) for p in range(PARTITIONS)}
    for i in range(n):
        for p in range(PARTITIONS):
            producer.send(topic, p, sent[p][i])
    return sent


def _read_committed(b: BrokerProcess, topic: str, expected: dict[int, list[bytes]]) -> None:
    """A fresh read_committed consumer reads exactly `expected` of each partition, in order."""
    reader = Reader("confluent", b.bootstrap, "read_committed",
                    assign=[(topic, p) for p in range(PARTITIONS)])
    try:
        wanted = [v for vs in expected.values() for v in vs]
        rows = read_until(reader, has_all(wanted), 20, "read_committed after the restart")
    finally:
        reader.close()
    for p in range(PARTITIONS):
        assert values(rows, p) == expected[p], f"partition {p}: {values(rows, p)}"


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("ended_by", ["timeout", "reinit"])
def test_kill_mid_transaction(broker_factory, ended_by: str) -> None:
    b: BrokerProcess = broker_factory(OVERRIDES)
    topic = unique_topic("txn-crash-open")
    create_topic(b.bootstrap, topic, partitions=PARTITIONS)
    txn_id = f"crash-open-{ended_by}-{time.time_ns()}"
    # Long enough that a SIGKILL and restart on a busy machine stay inside the transaction
    # (checked right after the restart), short enough for the timeout case to wait it out.
    producer = ConfluentTxn(b.bootstrap, txn_id, timeout_ms=10000)
    try:
        producer.init()
        producer.begin()
        committed = _send(producer, topic, "committed", 5)
        producer.commit()
        producer.begin()
        _send(producer, topic, "open", 5)
        producer.flush()  # acknowledged, so on disk; never committed
        ends = [high_watermark(b.bootstrap, topic, p) for p in range(PARTITIONS)]
        assert ends == [11, 11] and stable_end(b.bootstrap, topic) == 6

        _kill_and_restart(b)
        assert [high_watermark(b.bootstrap, topic, p) for p in range(PARTITIONS)] == ends
    finally:
        producer.close()

    if ended_by == "reinit":
        fresh = ConfluentTxn(b.bootstrap, txn_id)
        try:
            fresh.init()  # fences the old epoch and aborts its open transaction
            wait_until(lambda: _all_stable(b, topic), 20, "the open transaction's abort")
            fresh.begin()
            later = _send(fresh, topic, "later", 3)
            fresh.commit()
        finally:
            fresh.close()
    else:
        wait_until(lambda: _all_stable(b, topic), 30,
                   "the broker to abort the open transaction on its timeout", interval=0.2)
        other = ConfluentTxn(b.bootstrap, f"{txn_id}-other")
        try:
            other.init()
            other.begin()
            later = _send(other, topic, "later", 3)
            other.commit()
        finally:
            other.close()
    # 5 committed, a marker, 5 open, the abort marker, 3 later and their marker. EndTxn is
    # answered once its PrepareCommit is durable, before the markers are written (as Kafka
    # answers it), so the last marker may land just after commit() returns.
    wait_until(lambda: _all_stable(b, topic), 20, "the last stable offset at the end")
    assert [high_watermark(b.bootstrap, topic, p) for p in range(PARTITIONS)] == [16, 16]
    _read_committed(b, topic, {p: committed[p] + later[p] for p in range(PARTITIONS)})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_right_after_commit(broker_factory) -> None:
    b: BrokerProcess = broker_factory(OVERRIDES)
    topic = unique_topic("txn-crash-commit")
    create_topic(b.bootstrap, topic, partitions=PARTITIONS)
    txn_id = f"crash-commit-{time.time_ns()}"
    expected: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for r in range(ROUNDS):
        producer = ConfluentTxn(b.bootstrap, txn_id)
        try:
            producer.init()
            producer.begin()
            _send(producer, topic, f"aborted{r}", 4)
            producer.flush()
            producer.abort()
            producer.begin()
            sent = _send(producer, topic, f"committed{r}", 4)
            producer.commit()  # EndTxn answered: PrepareCommit is durable
            b.kill()
        finally:
            producer.close()
        for p in range(PARTITIONS):
            expected[p] += sent[p]
        assert b.proc is not None and b.proc.returncode == -signal.SIGKILL
        b.start()
        # Nobody helps: the restarted coordinator must finish the commit by itself.
        wait_until(lambda: _all_stable(b, topic), 30,
                   f"round {r}: the acknowledged commit completed after the restart",
                   interval=0.2)
        _read_committed(b, topic, expected)
    ends = [high_watermark(b.bootstrap, topic, p) for p in range(PARTITIONS)]
    # Per round and partition: 4 aborted, a marker, 4 committed, a marker; and a second commit
    # marker when the kill came before CompleteCommit was written (the restarted coordinator
    # writes the markers of PrepareCommit again, as Kafka's does).
    assert all(10 * ROUNDS <= e <= 11 * ROUNDS for e in ends), ends
