"""A seeded clickstream: the same seed gives the same events, so a job's output can be checked
against counts computed here in plain Python.

Events are JSON, keyed by user (one user's clicks stay in order in one partition), with the
event time also set as the record's CreateTime. They arrive roughly in time order, at most
JITTER_MS out of order, which is less than the job's watermark delay, so no event is ever
too late to count and the expected result does not depend on how Spark batches the input.

    python -m pipeline.jobs.clickstream --bootstrap 127.0.0.1:9092 --topic clicks --seed 7
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

PAGES = ("/", "/products", "/products/42", "/cart", "/checkout", "/search", "/about")
_WEIGHTS = (30, 20, 12, 10, 5, 18, 5)
ACTIONS = ("view", "click", "scroll")
HEARTBEAT = "heartbeat"
JITTER_MS = 15_000
MINUTE_MS = 60_000


@dataclass(frozen=True)
class Click:
    user: str
    page: str
    action: str
    ts: int  # event time, epoch milliseconds

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


def default_start_ms(minutes: int) -> int:
    """A recent whole minute, so the broker's time-based retention never sees old records."""
    return (int(time.time() * 1000) // MINUTE_MS - minutes - 5) * MINUTE_MS


def generate(seed: int, count: int, start_ms: int, minutes: int = 10,
             users: int = 50) -> list[Click]:
    """`count` clicks spread over `minutes` minutes from `start_ms`, in arrival order."""
    rnd = random.Random(seed)
    span = minutes * MINUTE_MS
    out = []
    for i in range(count):
        base = start_ms + i * span // count
        ts = min(start_ms + span - 1, max(start_ms, base + rnd.randint(-JITTER_MS, JITTER_MS)))
        out.append(Click(user=f"u{rnd.randrange(users):03d}",
                         page=rnd.choices(PAGES, _WEIGHTS)[0],
                         action=rnd.choice(ACTIONS), ts=ts))
    return out


def heartbeat(events: Sequence[Click], watermark_ms: int) -> Click:
    """An event far enough past the last click to move the watermark beyond every window, so
    an append-mode job emits its last minutes too; the job drops it after the watermark."""
    last = max(e.ts for e in events)
    return Click(user="-", page="-", action=HEARTBEAT, ts=last + watermark_ms + 2 * MINUTE_MS)


def expected_counts(events: Iterable[Click]) -> Counter[tuple[int, str]]:
    """(minute start in epoch ms, page) -> clicks: the job's answer, in plain Python."""
    return Counter((e.ts // MINUTE_MS * MINUTE_MS, e.page)
                   for e in events if e.action != HEARTBEAT)


def produce(bootstrap: str, topic: str, events: Iterable[Click], timeout_s: float = 60.0,
            extra: dict[str, object] | None = None) -> int:
    """Produce with acks=all and wait for every acknowledgement; returns the count."""
    from confluent_kafka import Producer

    failures: list[object] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5, **(extra or {})})
    n = 0
    for e in events:
        while True:
            try:
                producer.produce(topic, key=e.user.encode(), value=e.to_json(), timestamp=e.ts,
                                 on_delivery=lambda err, _m: err and failures.append(err))
                break
            except BufferError:
                producer.poll(0.1)
        n += 1
    if producer.flush(timeout_s) > 0 or failures:
        raise RuntimeError(f"clickstream produce failed: {failures[:1] or 'flush timed out'}")
    return n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", default="clicks")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--minutes", type=int, default=10)
    ap.add_argument("--watermark-ms", type=int, default=MINUTE_MS)
    args = ap.parse_args(argv)
    events = generate(args.seed, args.events, default_start_ms(args.minutes), args.minutes)
    n = produce(args.bootstrap, args.topic, [*events, heartbeat(events, args.watermark_ms)])
    print(f"produced {n} events to {args.topic}")


if __name__ == "__main__":
    main()
