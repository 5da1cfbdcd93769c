"""Debian's librdkafka through Debian's python3-confluent-kafka, run by Debian's /usr/bin/python3
(never the project's venv, whose confluent-kafka wheel bundles a newer librdkafka):

    /usr/bin/python3 conformance.py <bootstrap> <plan.json>

<plan> is a JSON file written by tests/conformance/test_debian_librdkafka.py naming the scenarios:
  roundtrip   per codec: produce the given records to partition 0, read them back (assign)
  idempotent  enable.idempotence over several partitions, then read everything back
  resume      a group member processes the first half of each partition, committing each record;
              a new member of the group resumes exactly after the committed offsets
Bytes travel as tokens: "-" is null, "=" + base64 is bytes (empty included). Prints one JSON
summary line on stdout: what the client saw; it judges nothing, the pytest side does. A scenario
that raised reports {"error": ...}. Standard library and confluent_kafka only.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import traceback

import confluent_kafka
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

WAIT = 30.0  # seconds, any single wait
TIMESTAMP_TYPES = {confluent_kafka.TIMESTAMP_CREATE_TIME: "CreateTime",
                   confluent_kafka.TIMESTAMP_LOG_APPEND_TIME: "LogAppendTime"}


def token(b: bytes | None) -> str:
    return "-" if b is None else "=" + base64.b64encode(b).decode()


def to_bytes(t: str) -> bytes | None:
    return None if t == "-" else base64.b64decode(t[1:])


class Client:
    """Configuration shared by every client of one run, and the errors they report."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.errors: list[str] = []

    def conf(self, **extra) -> dict:
        conf = {"bootstrap.servers": self.bootstrap, "broker.address.family": "v4",
                "socket.timeout.ms": 10000, "client.id": "mini-broker-debian-librdkafka",
                "error_cb": lambda e: self.errors.append(str(e))}
        conf.update({k.replace("_", "."): v for k, v in extra.items()})
        return conf

    def create_topic(self, topic: str, partitions: int) -> None:
        admin = AdminClient(self.conf())
        futures = admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=15)
        futures[topic].result(timeout=WAIT)

    def produce(self, sends: list[dict], **conf) -> list[list]:
        """Produce every send (kwargs of Producer.produce), each reported as [partition,
        offset] or [partition, None, error]."""
        reports: list[list | None] = [None] * len(sends)

        def report(i: int):
            def on_delivery(err, msg) -> None:
                reports[i] = ([msg.partition(), None, str(err)] if err is not None
                              else [msg.partition(), msg.offset()])
            return on_delivery

        producer = Producer(self.conf(**conf))
        for i, send in enumerate(sends):
            producer.produce(on_delivery=report(i), **send)
            producer.poll(0)
        left = producer.flush(WAIT)
        if left:
            raise RuntimeError(f"{left} records undelivered after {WAIT}s")
        return reports  # type: ignore[return-value]

    def consumer(self, group: str, **conf) -> Consumer:
        defaults = {"enable_auto_commit": False, "fetch_wait_max_ms": 100,
                    "auto_offset_reset": "earliest"}
        return Consumer(self.conf(group_id=group, **{**defaults, **conf}))

    def read_assigned(self, toppars: list[TopicPartition], count: int, group: str) -> list:
        """`count` records from the given partitions and offsets, then a pause for extras."""
        consumer = self.consumer(group)
        consumer.assign(toppars)
        rows: list = []
        try:
            poll_until(consumer, lambda m: rows.append(row(m)), lambda: len(rows) >= count,
                       self.errors, f"{count} records read")
            poll_for(consumer, 0.3, lambda m: rows.append(row(m)), self.errors)
        finally:
            consumer.close()
        return rows


def row(m) -> list:
    ts_type, ts = m.timestamp()
    headers = [[k, token(v)] for k, v in (m.headers() or [])]
    return [m.partition(), m.offset(), TIMESTAMP_TYPES.get(ts_type, str(ts_type)), ts,
            token(m.key()), token(m.value()), headers]


def poll_until(consumer: Consumer, handle, done, errors: list, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        poll_for(consumer, 0.1, handle, errors)


def poll_for(consumer: Consumer, seconds: float, handle, errors: list) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        m = consumer.poll(min(left, 0.1))
        if m is None:
            continue
        if m.error():
            errors.append(str(m.error()))
        else:
            handle(m)


# -- scenarios ---------------------------------------------------------------------------------


def roundtrip(client: Client, codec: str, topic: str, records: list) -> dict:
    client.create_topic(topic, 1)
    sends = [{"topic": topic, "partition": 0, "timestamp": ts, "key": to_bytes(key),
              "value": to_bytes(value), "headers": [(k, to_bytes(v)) for k, v in headers]}
             for ts, key, value, headers in records]
    acked = client.produce(sends, compression_type=codec, acks="all", linger_ms=20,
                           enable_idempotence=False)
    rows = client.read_assigned([TopicPartition(topic, 0, 0)], len(records), f"{topic}-reader")
    return {"acked": acked, "records": [r[1:] for r in rows]}


def idempotent(client: Client, topic: str, partitions: int, per_partition: int) -> dict:
    client.create_topic(topic, partitions)
    sends = [{"topic": topic, "partition": p, "value": f"{p}:{i}".encode()}
             for i in range(per_partition) for p in range(partitions)]
    reports = client.produce(sends, enable_idempotence=True, linger_ms=5,
                             max_in_flight_requests_per_connection=5, batch_num_messages=25)
    acked = [[*r, s["value"].decode()] for r, s in zip(reports, sends, strict=True)]
    rows = client.read_assigned([TopicPartition(topic, p, 0) for p in range(partitions)],
                                len(sends), f"{topic}-reader")
    consumed = [[r[0], r[1], to_bytes(r[5]).decode()] for r in rows]
    return {"acked": acked, "consumed": consumed}


def produce_numbered(client: Client, topic: str, partitions: int, per_partition: int) -> None:
    sends = [{"topic": topic, "partition": p, "key": f"k{i}".encode(),
              "value": f"{p}:{i}".encode()}
             for p in range(partitions) for i in range(per_partition)]
    failed = [r for r in client.produce(sends, acks="all", linger_ms=5) if len(r) > 2]
    if failed:
        raise RuntimeError(f"produce failed: {failed[:5]}")


def resume(client: Client, topic: str, group: str, partitions: int,
           per_partition: int) -> dict:
    client.create_topic(topic, partitions)
    produce_numbered(client, topic, partitions, per_partition)
    half = per_partition // 2
    everything = [TopicPartition(topic, p) for p in range(partitions)]
    rows: list = []
    commit_errors: list = []

    def member(name: str, wanted, **conf):
        consumer = client.consumer(group, session_timeout_ms=6000, heartbeat_interval_ms=250,
                                   **conf)

        def handle(m) -> None:
            if not wanted(m):
                return
            rows.append([name, m.partition(), m.offset(), m.value().decode()])
            try:
                consumer.commit(message=m, asynchronous=False)
            except Exception as e:  # reported; the test judges it
                commit_errors.append([name, m.partition(), m.offset(), str(e)])
        return consumer, handle

    def committed(consumer: Consumer) -> dict[str, int]:
        return {str(tp.partition): tp.offset for tp in consumer.committed(everything, WAIT)}

    # The first member processes offsets below `half` of every partition, committing each.
    first, handle = member("first", lambda m: m.offset() < half)
    first.subscribe([topic])
    try:
        poll_until(first, handle, lambda: len(rows) >= half * partitions, client.errors,
                   "the first half processed")
        poll_for(first, 0.3, handle, client.errors)
        committed_by_first = committed(first)
    finally:
        first.close()

    # auto.offset.reset=error: without a committed offset the new member would fail, not rewind.
    second, handle = member("second", lambda m: True, auto_offset_reset="error")
    second.subscribe([topic])
    try:
        poll_until(second, handle, lambda: len(rows) >= per_partition * partitions,
                   client.errors, "every record processed")
        poll_for(second, 0.5, handle, client.errors)  # anything more would be a duplicate
        committed_at_end = committed(second)
    finally:
        second.close()
    return {"rows": rows, "commitErrors": commit_errors, "committedByFirst": committed_by_first,
            "committedAtEnd": committed_at_end}


# -- main --------------------------------------------------------------------------------------


def scenario(results: dict, name: str, bootstrap: str, fn, spec: dict) -> None:
    client = Client(bootstrap)
    started = time.monotonic()
    try:
        results[name] = fn(client, **spec)
    except Exception:  # reported; the test judges it
        results[name] = {"error": traceback.format_exc()}
    results[name]["errors"] = client.errors
    results[name]["ms"] = round((time.monotonic() - started) * 1000)


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: conformance.py <bootstrap> <plan.json>", file=sys.stderr)
        return 64
    bootstrap, plan_path = sys.argv[1:]
    with open(plan_path) as f:
        plan = json.load(f)
    results: dict = {}
    for spec in plan.get("roundtrip", []):
        scenario(results, f"roundtrip:{spec['codec']}", bootstrap, roundtrip, spec)
    if "idempotent" in plan:
        scenario(results, "idempotent", bootstrap, idempotent, plan["idempotent"])
    if "resume" in plan:
        scenario(results, "resume", bootstrap, resume, plan["resume"])
    print(json.dumps({"client": "confluent-kafka", "python": sys.executable,
                      "version": confluent_kafka.version()[0],
                      "librdkafka": confluent_kafka.libversion()[0],
                      "module": confluent_kafka.__file__, "results": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
