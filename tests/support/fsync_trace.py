"""fsyncs of a broker process, observed from outside it (and slowed down on request).

`trace_fsyncs` puts a `sitecustomize` on the PYTHONPATH of brokers started afterwards in the
test. It wraps `os.fsync` to log, for each call, when it started and finished (CLOCK_MONOTONIC,
shared by every process on the machine) and how long the file was when it started (what the
call covers). It can also make each fsync of a segment slower, to widen the window in which a
broker that answered early would be caught, or to make the broker's disk slow. No broker code is
changed; the wrapper is active only where MINI_BROKER_TEST_FSYNC_TRACE is set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

TRACE_ENV = "MINI_BROKER_TEST_FSYNC_TRACE"  # the file every fsync is logged to
DELAY_ENV = "MINI_BROKER_TEST_FSYNC_DELAY_MS"  # added to each fsync of a segment (*.log)

_SITECUSTOMIZE = f'''
import os
import time

_trace = os.environ.get({TRACE_ENV!r})
if _trace:
    _delay = float(os.environ.get({DELAY_ENV!r}, "0")) / 1000
    _real_fsync = os.fsync
    _out = os.open(_trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def fsync(fd):
        try:
            path = os.readlink("/proc/self/fd/%d" % fd)
            size = os.fstat(fd).st_size
        except OSError:
            path, size = "?", -1
        start = time.monotonic()
        _real_fsync(fd)
        if _delay and path.endswith(".log"):
            time.sleep(_delay)
        done = time.monotonic()
        os.write(_out, ("%.6f %.6f %d %s\\n" % (start, done, size, path)).encode())

    os.fsync = fsync
'''


@dataclass(frozen=True)
class Fsync:
    start: float
    done: float
    size: int  # file length when the call began: the bytes it certainly made durable
    path: str


def trace_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delay_ms: int) -> Path:
    """Make brokers started from now on in this test log every fsync to the returned file."""
    site = tmp_path / "fsync-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    trace = tmp_path / "fsync.trace"
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{old}" if old else str(site))
    monkeypatch.setenv(TRACE_ENV, str(trace))
    monkeypatch.setenv(DELAY_ENV, str(delay_ms))
    return trace


def segment_fsyncs(trace: Path, topic: str, partition: int = 0) -> list[Fsync]:
    """The traced fsyncs of the segment files of one partition, in the order they finished."""
    out = []
    for line in trace.read_text().splitlines():
        start, done, size, path = line.split(" ", 3)
        if Path(path).parent.name == f"{topic}-{partition}" and path.endswith(".log"):
            out.append(Fsync(float(start), float(done), int(size), path))
    return out


def first_durable(fsyncs: list[Fsync], end_position: int) -> float:
    """When the first fsync that certainly covered bytes [0, end_position) finished."""
    covering = [f.done for f in fsyncs if f.size >= end_position]
    return min(covering) if covering else float("inf")
