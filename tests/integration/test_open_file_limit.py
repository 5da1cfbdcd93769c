"""A broker with more partitions than its open-file limit: idle ones cost no descriptor.

The broker process runs with RLIMIT_NOFILE set to LIMIT (soft and hard, in the child before
it starts). A partition holds a descriptor (its active segment's ``.log``) only once it is
written; a new partition, or one not written since a clean start, holds none. So a first
topic of FITS partitions, every one written, and a second of MORE partitions, more than the
limit, are both created and served; the broker restarts cleanly and after a SIGKILL at the
same limit with all of them (no crash loop) and nothing acknowledged is lost. Running out of
descriptors while creating or writing one log fails that request alone, answered
KAFKA_STORAGE_ERROR with the dir online (tests/unit/test_log_handles.py makes the disk say
EMFILE there).
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.broker import BrokerProcess
from tests.support.clients import confluent_consume, unique_topic, watermarks

LIMIT = 256
FITS = 100
MORE = 300
OVERRIDES = {
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
    "log.flush.interval.messages": "1",
    "auto.create.topics.enable": "false",
}


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    """CreateTopics with room for a slow disk (a partition is a directory and three files)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions)],
                                  operation_timeout=60, request_timeout=90)
    futures[topic].result(timeout=120)


def _limit_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _produce(bootstrap: str, topic: str, partitions: list[int], tag: str) -> None:
    """One acknowledged record per partition (acks=all: fsynced)."""
    errors: list = []
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "error_cb": errors.append,
                  "broker.address.family": "v4", "message.timeout.ms": 20000})
    failed: list = []

    def report(err, _msg) -> None:
        if err is not None:
            failed.append(err)

    for part in partitions:
        p.produce(topic, value=f"{tag}-{part}".encode(), partition=part, on_delivery=report)
    assert p.flush(30) == 0
    assert not failed, failed


def _values(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    """Every record of the partition, up to its high watermark."""
    _start, high = watermarks(bootstrap, topic, partition)
    got = confluent_consume(bootstrap, topic, high, partition=partition, timeout=20)
    return [g.rec.value for g in got]


def _open_fds(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    return len(list(Path(f"/proc/{broker.proc.pid}/fd").iterdir()))


@pytest.mark.timeout(600)
def test_more_partitions_than_descriptors_are_created_and_served(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, OVERRIDES)
    broker.preexec_fn = _limit_open_files
    broker.start()
    try:
        baseline = _open_fds(broker)
        fits = unique_topic("fits")
        _create(broker.bootstrap, fits, FITS)
        assert _open_fds(broker) - baseline <= 10  # created, not written: none held
        _produce(broker.bootstrap, fits, list(range(FITS)), "before")
        assert _open_fds(broker) - baseline <= FITS + 10  # one per written partition

        more = unique_topic("more")
        _create(broker.bootstrap, more, MORE)  # FITS + MORE partitions > LIMIT descriptors
        assert _open_fds(broker) - baseline <= FITS + 10
        _produce(broker.bootstrap, more, [0, MORE - 1], "more")
        lines = broker.new_log_lines()
        assert not any("log dir offline" in line.get("event", "") for line in lines)

        _produce(broker.bootstrap, fits, [0, FITS // 2, FITS - 1], "after")
        for part in (0, FITS // 2, FITS - 1):
            assert _values(broker.bootstrap, fits, part) == [
                f"before-{part}".encode(), f"after-{part}".encode()]

        broker.restart(clean=True)  # same limit: the child's preexec_fn runs again
        assert _open_fds(broker) <= baseline + 10  # a clean start opens no log
        last = FITS - 1
        assert _values(broker.bootstrap, fits, last) == [b"before-%d" % last, b"after-%d" % last]
        _produce(broker.bootstrap, more, [1], "again")

        broker.restart(clean=False)  # SIGKILL: every log recovered, at the same limit
        assert _values(broker.bootstrap, fits, 0) == [b"before-0", b"after-0"]
        assert _values(broker.bootstrap, more, MORE - 1) == [b"more-%d" % (MORE - 1)]
        assert _values(broker.bootstrap, more, 1) == [b"again-1"]
        assert _open_fds(broker) <= baseline + FITS + 10
    finally:
        broker.stop()
