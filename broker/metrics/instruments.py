"""The instruments of the request path: plain counters and histograms, no lock, no label.

A ``RequestStats`` per (API key, version) is looked up once per request (one dict get on an
int) and holds plain ints and ``Histogram``s; nothing formats a label or takes a lock on the
request path. Latency is split the way Kafka's RequestMetrics splits it: request queue (parsed
-> a handler picks it up), local (the handler's own work), remote (parked in a purgatory or
waiting for an fsync), response queue (waiting in the connection's sequencer behind earlier
responses), response send (what asyncio lets us observe: the ``transport.write`` call, or, when
the transport's buffer passed its high-water mark, until it drained; see
broker/network/connection.py) and total. This module imports nothing of the broker, so any
layer may count into it; broker/metrics/collector.py reads it at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from protocol.errors import ErrorCode
from protocol.registry import APIS, FETCH_KEY, PRODUCE_KEY
from protocol.templates import (
    PackedFetchResponse,
    PackedMetadataResponse,
    SinglePartitionProduceResponse,
)

if TYPE_CHECKING:
    from broker.network.request import Request

# Seconds; from 100 us (a metadata answer) to a minute (a JoinGroup waiting for a rebalance).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                   0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
UNSUPPORTED = -1  # version label of an ApiVersions request of a version we do not serve


class Histogram:
    """Bucket counts and a sum, observed on the event loop only (so no lock).

    prometheus_client's Histogram takes a lock per observation (about 1 us here, and six are
    needed per request); this is a bisect and two additions.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self, scale: float = 1.0) -> list[tuple[str, float]]:
        """Prometheus buckets: (le, count of observations <= le), ending with +Inf."""
        out = []
        total = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            total += n
            out.append((float_text(bound * scale), total))
        out.append(("+Inf", total + self.counts[-1]))
        return out


def float_text(v: float) -> str:
    return repr(float(v))

class ApiTimings:
    """Kafka's RequestMetrics for one API: one histogram per phase of a request's life."""

    __slots__ = ("request_queue", "local", "remote", "response_queue", "response_send", "total")

    def __init__(self) -> None:
        self.request_queue = Histogram()
        self.local = Histogram()
        self.remote = Histogram()
        self.response_queue = Histogram()
        self.response_send = Histogram()
        self.total = Histogram()


class RequestStats:
    """The pre-bound child of one (API, version): labels resolved once, plain ints after."""

    __slots__ = ("api", "version", "requests", "errors", "timings", "_count_errors")

    def __init__(self, api: str, version: int, timings: ApiTimings,
                 count_errors: Callable[[Any, dict[int, int]], None]) -> None:
        self.api = api
        self.version = version
        self.requests = 0
        self.errors: dict[int, int] = {}
        self.timings = timings
        self._count_errors = count_errors

    # Histogram.observe inlined below (bisect, then two additions): these two run once per
    # request each, and a method call per phase would cost as much again.
    def completed(self, request: Request, response: Any, now: float) -> None:
        """The response is built (or there is none): count it and its error codes, and time
        the request queue, local and remote phases."""
        self.requests += 1
        if response is not None:
            self._count_errors(response, self.errors)
        t = self.timings
        dequeued = request.dequeued
        v = dequeued - request.received
        h = t.request_queue
        h.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
        h.sum += v
        parked = request.local_done
        if parked:
            v = parked - dequeued
            h = t.local
            h.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
            h.sum += v
            v = now - parked
            h = t.remote
            h.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
            h.sum += v
        else:
            v = now - dequeued
            h = t.local
            h.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
            h.sum += v
            t.remote.counts[0] += 1  # never parked: 0 s

    def sent(self, received: float, ready: float, write_start: float, end: float) -> None:
        """The response left (the socket took it all at ``end``)."""
        t = self.timings
        v = write_start - ready
        h = t.response_queue
        h.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
        h.sum += v
        v = end - write_start
        h = t.response_send
        h.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
        h.sum += v
        v = end - received
        h = t.total
        h.counts[bisect_left(LATENCY_BUCKETS, v)] += 1
        h.sum += v

    def failed(self) -> None:
        """The handler raised: the connection is closed, Kafka counts it as an unknown error."""
        self.requests += 1
        code = int(ErrorCode.UNKNOWN_SERVER_ERROR)
        self.errors[code] = self.errors.get(code, 0) + 1

# -- error codes of a response ------------------------------------------------------------------

ErrorTree = tuple[tuple[str, Any], ...]


def _error_tree(fields: Any, version: int) -> ErrorTree:
    """Paths to every ``error_code`` field of a message at ``version``, from its schema."""
    out: list[tuple[str, Any]] = []
    for f in fields:
        lo, hi = getattr(f, "_versions", None) or (0, 32767)
        if not lo <= version <= hi:
            continue
        if f.name == "error_code":
            out.append((f.name, None))
            continue
        sub = getattr(f, "_fields", None)
        if sub:
            tree = _error_tree(sub, version)
            if tree:
                out.append((f.name, tree))
    return tuple(out)


def _walk(obj: Any, tree: ErrorTree, errors: dict[int, int]) -> None:
    for name, sub in tree:
        value = getattr(obj, name, None)
        if value is None:
            continue
        if sub is None:
            if value:
                errors[value] = errors.get(value, 0) + 1
        elif type(value) is list:
            for item in value:
                _walk(item, sub, errors)
        else:
            _walk(value, sub, errors)


def _generic_counter(tree: ErrorTree) -> Callable[[Any, dict[int, int]], None]:
    if not tree:
        return lambda _response, _errors: None
    return lambda response, errors: _walk(response, tree, errors)


def _count_produce_errors(response: Any, errors: dict[int, int]) -> None:
    """Produce, by hand (the hottest API): the error code of every partition."""
    if type(response) is SinglePartitionProduceResponse:
        code = response.error_code
        if code:
            errors[code] = errors.get(code, 0) + 1
        return
    for t in response.responses:
        for p in t.partition_responses:
            code = p.error_code
            if code:
                errors[code] = errors.get(code, 0) + 1


def _fetch_counter(version: int, bytes_out: dict[Any, int]
                   ) -> Callable[[Any, dict[int, int]], None]:
    """Fetch, by hand: its error codes, and the record bytes it returns per topic (bytes out;
    keyed by topic id from v13, resolved to names at scrape time)."""
    topic_attr = "topic_id" if version >= 13 else "topic"

    def count(response: Any, errors: dict[int, int]) -> None:
        code = response.error_code
        if code:
            errors[code] = errors.get(code, 0) + 1
        if type(response) is PackedFetchResponse and not response.materialized:
            count_packed(response, errors)
            return
        for t in response.responses:
            n = 0
            for p in t.partitions:
                code = p.error_code
                if code:
                    errors[code] = errors.get(code, 0) + 1
                records = p.records
                if records:
                    n += len(records)
            if n:
                key = getattr(t, topic_attr)
                bytes_out[key] = bytes_out.get(key, 0) + n

    def count_packed(response: PackedFetchResponse, errors: dict[int, int]) -> None:
        for key, partitions in response.topics:
            n = 0
            for p in partitions:
                code = p[1]
                if code:
                    errors[code] = errors.get(code, 0) + 1
                records = p[6]
                if records:
                    n += len(records)
            if n:
                bytes_out[key] = bytes_out.get(key, 0) + n

    return count


def _metadata_counter(tree: ErrorTree) -> Callable[[Any, dict[int, int]], None]:
    """Metadata: a packed answer counts its own errors (only its error topics have any),
    without building a message per partition."""
    generic = _generic_counter(tree)

    def count(response: Any, errors: dict[int, int]) -> None:
        if type(response) is PackedMetadataResponse:
            response.count_errors(errors)
        else:
            generic(response, errors)

    return count


def request_stats(api_key: int, version: int, timings: ApiTimings,
                  topic_bytes_out: dict[Any, int]) -> RequestStats:
    """The stats of one (API, version), with the error counter its response shape needs."""
    spec = APIS[api_key]
    if version == UNSUPPORTED:
        counter = _generic_counter(_error_tree(spec.response._struct._fields, 0))
    elif api_key == PRODUCE_KEY:
        counter = _count_produce_errors
    elif api_key == FETCH_KEY:
        counter = _fetch_counter(version, topic_bytes_out)
    elif spec.response is PackedMetadataResponse.message_type:
        counter = _metadata_counter(_error_tree(spec.response._struct._fields, version))
    else:
        counter = _generic_counter(_error_tree(spec.response._struct._fields, version))
    return RequestStats(spec.name, version, timings, counter)
