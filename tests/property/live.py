"""What fuzzing a live broker needs besides the frames: the broker's log read as it grows, the
internal errors in it, and a calm client whose every error counts.

Shared by tests/integration/test_live_broker.py (a few hundred hypothesis examples) and bench.fuzz
(a million frames).
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

INTERNAL_ERROR = "request failed"  # RequestChannel's line for an exception out of a handler


class LogTail:
    """The JSON lines a broker appends to its log after this object was made."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = path.stat().st_size if path.exists() else 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        data = self._partial + data
        *whole, self._partial = data.split(b"\n")
        out = []
        for raw in whole:
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
        return out


def internal_errors(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [ln for ln in lines if ln.get("event") == INTERNAL_ERROR]


def last_frame(line: dict[str, Any]) -> tuple[str, str]:
    """The innermost traceback frame and the exception of a "request failed" line."""
    text = str(line.get("exception", "")).strip()
    frames = [ln.strip() for ln in text.splitlines() if ln.strip().startswith('File "')]
    return (frames[-1] if frames else "?"), (text.splitlines()[-1] if text else "?")


def signature(line: dict[str, Any]) -> str:
    """One internal error, named so that repeats of the same bug group together: the API, the
    innermost frame and the exception with its numbers blotted out (any version)."""
    frame, exc = last_frame(line)
    return f"{line.get('api')}: {frame} | {re.sub(r'-?[0-9]+', 'N', exc)}"


class CalmProducer:
    """A confluent-kafka producer (acks=all) writing at a steady pace on its own topic, in a
    thread; every error callback and every failed delivery is kept."""

    def __init__(self, bootstrap: str, topic: str, rate: int = 200) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.rate = rate
        self.sent = 0
        self.acked = 0
        self.errors: list[str] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="calm-producer", daemon=True)

    def start(self) -> CalmProducer:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # surfaced by stop()
            self.failure = exc

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(f"delivery: {err}")
        else:
            self.acked += 1

    def _loop(self) -> None:
        producer = Producer({
            "bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 5,
            "enable.idempotence": False, "message.timeout.ms": 60000,
            "error_cb": lambda err: self.errors.append(f"client: {err}"),
        })
        start = time.monotonic()
        while not self._stop.is_set():
            due = start + self.sent / self.rate
            now = time.monotonic()
            if now < due:
                producer.poll(min(due - now, 0.05))
                continue
            producer.produce(self.topic, value=b"calm-%d" % self.sent, key=b"calm",
                             on_delivery=self._on_delivery)
            self.sent += 1
            producer.poll(0)
        left = producer.flush(60)
        if left:
            self.errors.append(f"{left} records never acknowledged")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)
        if self._thread.is_alive():
            self.errors.append("calm producer did not stop")
        if self.failure is not None:
            raise self.failure
