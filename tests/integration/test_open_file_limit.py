"""A broker at its open-file limit: the topic that does not fit is refused, nothing else stops.

The broker process runs with RLIMIT_NOFILE set to LIMIT (soft and hard, in the child before
it starts). A partition costs one descriptor (its active segment's ``.log``), so a first topic
of FITS partitions is created and served; a second of TOO_MANY partitions can not be, and is
answered KAFKA_STORAGE_ERROR (what a Kafka client sees when a broker cannot create a log)
without being recorded or leaving a directory behind. The first topic keeps serving produce
and consume around it, and the broker restarts cleanly (and after a SIGKILL) at the same limit:
no crash loop.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer

from tests.support.broker import BrokerProcess
from tests.support.clients import confluent_consume, unique_topic, watermarks

LIMIT = 256
FITS = 100
TOO_MANY = 300
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


@pytest.mark.timeout(300)
def test_the_topic_that_does_not_fit_is_refused_and_everything_else_serves(
        tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path, OVERRIDES)
    broker.preexec_fn = _limit_open_files
    broker.start()
    try:
        baseline = _open_fds(broker)
        fits = unique_topic("fits")
        _create(broker.bootstrap, fits, FITS)
        assert _open_fds(broker) - baseline <= FITS + 10  # one per partition, + connections
        _produce(broker.bootstrap, fits, [0, FITS // 2, FITS - 1], "before")

        too_many = unique_topic("toomany")
        with pytest.raises(KafkaException) as refused:
            _create(broker.bootstrap, too_many, TOO_MANY)
        assert refused.value.args[0].code() == KafkaError.KAFKA_STORAGE_ERROR
        logs = tmp_path / "logs"
        assert not list(logs.glob(f"{too_many}-*")), "a refused topic left directories"
        lines = broker.new_log_lines()
        assert any(line.get("event", "").startswith("open-file limit reached")
                   and line.get("soft_limit") == LIMIT for line in lines)
        assert not any("log dir offline" in line.get("event", "") for line in lines)

        # Everything else keeps serving, produce and consume around the refusal.
        _produce(broker.bootstrap, fits, [0, FITS // 2, FITS - 1], "after")
        for part in (0, FITS // 2, FITS - 1):
            assert _values(broker.bootstrap, fits, part) == [
                f"before-{part}".encode(), f"after-{part}".encode()]
        # A topic that fits is still created once descriptors are free again.
        small = unique_topic("small")
        _create(broker.bootstrap, small, 2)

        broker.restart(clean=True)  # same limit: the child's preexec_fn runs again
        assert _open_fds(broker) <= baseline + FITS + 2 + 10
        last = FITS - 1
        assert _values(broker.bootstrap, fits, last) == [b"before-%d" % last, b"after-%d" % last]
        _produce(broker.bootstrap, small, [1], "small")

        broker.restart(clean=False)  # SIGKILL, then the same limit again
        assert _values(broker.bootstrap, fits, 0) == [b"before-0", b"after-0"]
        assert _values(broker.bootstrap, small, 1) == [b"small-1"]
        with pytest.raises(KafkaException):  # never recorded: it does not come back
            _produce_one_unknown(broker.bootstrap, too_many)
    finally:
        broker.stop()


def _produce_one_unknown(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                         "allow.auto.create.topics": False})
    md = admin.list_topics(topic, timeout=10)
    error = md.topics[topic].error
    if error is not None:
        raise KafkaException(error)

