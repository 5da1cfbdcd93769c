"""Debian's python3-confluent-kafka over an authenticated listener, run by /usr/bin/python3:

    /usr/bin/python3 secure.py <config.json> <topic> <group> < records.json

<config.json> holds librdkafka's keys for the listener (bootstrap.servers, security.protocol,
sasl.mechanism, sasl.username, sasl.password, ssl.ca.location ...), as the pytest side builds
them for every librdkafka client. The records come on stdin as JSON [[key, value], ...] of
strings. Produces them all (acks=all), then reads them in a group that commits what it
processed, and prints one JSON line: {"got": [[key, value], ...], "errors": [...]}. It judges
nothing; the pytest side does. Standard library and confluent_kafka only.
"""

from __future__ import annotations

import json
import sys
import time

from confluent_kafka import Consumer, Producer

WAIT = 30.0  # seconds, any single wait


def produce(conf: dict, topic: str, records: list, errors: list) -> None:
    producer = Producer({**conf, "acks": "all", "linger.ms": 5,
                         "error_cb": lambda e: errors.append(f"producer: {e}")})

    def report(err, _msg) -> None:
        if err is not None:
            errors.append(f"delivery: {err}")

    for key, value in records:
        producer.produce(topic, value.encode(), key.encode(), on_delivery=report)
    left = producer.flush(WAIT)
    if left:
        errors.append(f"{left} records undelivered after {WAIT}s")


def consume(conf: dict, topic: str, group: str, count: int, errors: list) -> list:
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                         "error_cb": lambda e: errors.append(f"consumer: {e}")})
    got: list = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + WAIT
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                errors.append(f"poll: {msg.error()}")
                continue
            got.append([msg.key().decode(), msg.value().decode()])
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def main() -> None:
    config_path, topic, group = sys.argv[1:4]
    with open(config_path) as f:
        conf = json.load(f)
    records = json.load(sys.stdin)
    errors: list = []
    produce(conf, topic, records, errors)
    got = consume(conf, topic, group, len(records), errors)
    print(json.dumps({"got": got, "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
