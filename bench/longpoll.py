"""Long-poll latency: how soon a parked fetch is answered after the produce that brings it data,
and how close to its max_wait_ms an idle fetch is answered.

The integration tests (tests/integration/test_longpoll.py) check that each parked fetch is
completed by its event and each idle one by the timer, counts that do not depend on the
machine; these times are the figures, for docs/benchmarks.md, never pass/fail bounds.

    python -m bench.longpoll --json
    python -m bench.longpoll --rounds 200 --json

A broker process on loopback per configuration (hw-on-append; hw-after-fsync, i.e.
log.flush.interval.messages=1); raw FetchRequest v12 and ProduceRequest on two sockets, read
from one thread with select(). One JSON object per line: config, rounds, after_ack_ms and
after_send_ms (median, p99, max: the fetch's answer minus the produce's answer or its send),
then one line of idle fetches (max_wait_ms, answered_after_ms median and max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, unique_topic
from tests.support.requests import fetch_request, produce_request, record_batch
from tests.support.wire import Wire

CONFIGS = {"hw-on-append": {}, "hw-after-fsync": {"log.flush.interval.messages": "1"}}
DEADLINE_S = 10.0  # a response not read by then ends the run


def figures(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"median": round(statistics.median(ms), 3),
            "p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3), "max": round(ms[-1], 3)}


def read_both(fetch: Wire, producer: Wire) -> dict[Wire, float]:
    """When the next frame of each socket arrived."""
    times: dict[Wire, float] = {}
    deadline = time.monotonic() + DEADLINE_S
    while len(times) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError("a response did not arrive")
        for w in (fetch, producer):
            if w not in times and w.readable(0.0005):
                w.read_frame()
                times[w] = time.monotonic()
    return times


def parked(port: int, bootstrap: str, rounds: int) -> tuple[list[float], list[float]]:
    topic = unique_topic("longpoll")
    create_topic(bootstrap, topic)
    fetch, producer = Wire(port), Wire(port)
    after_ack: list[float] = []
    after_send: list[float] = []
    try:
        for i in range(rounds):
            fetch.send(fetch_request([(topic, 0, i)], max_wait_ms=5000, min_bytes=1), 2 * i)
            if fetch.readable(0.3 if i == 0 else 0.05):
                raise RuntimeError(f"round {i}: the fetch was answered before any data")
            sent = time.monotonic()
            producer.send(produce_request(topic, record_batch([b"v%d" % i]), acks=1), 2 * i + 1)
            times = read_both(fetch, producer)
            after_ack.append(times[fetch] - times[producer])
            after_send.append(times[fetch] - sent)
    finally:
        fetch.close()
        producer.close()
    return after_ack, after_send


def idle(port: int, bootstrap: str, max_wait_ms: int, count: int) -> list[float]:
    topic = unique_topic("idle")
    create_topic(bootstrap, topic)
    fetch = Wire(port)
    took = []
    try:
        for i in range(count):
            started = time.monotonic()
            fetch.send(fetch_request([(topic, 0, 0)], max_wait_ms=max_wait_ms), i)
            fetch.read_frame()
            took.append(time.monotonic() - started)
    finally:
        fetch.close()
    return took


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--idle", type=int, default=5, help="idle fetches of 500 ms")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-longpoll-") as tmp:
        for name, overrides in CONFIGS.items():
            broker = BrokerProcess(Path(tmp) / name, overrides).start(timeout=120)
            try:
                after_ack, after_send = parked(broker.port, broker.bootstrap, args.rounds)
                rows.append({"config": name, "rounds": args.rounds,
                             "after_ack_ms": figures(after_ack),
                             "after_send_ms": figures(after_send)})
                if name == "hw-on-append" and args.idle > 0:
                    took = idle(broker.port, broker.bootstrap, 500, args.idle)
                    rows.append({"config": name, "idle_fetches": args.idle, "max_wait_ms": 500,
                                 "answered_after_ms": figures(took)})
            finally:
                broker.stop()
    for row in rows:
        print(json.dumps(row) if args.json else row)


if __name__ == "__main__":
    main()
