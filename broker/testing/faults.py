"""Fault injection for an embedded broker, in the spirit of franz-go's kfake control functions.

A ``Faults`` wraps the broker's dispatch (``Broker.dispatch_filter``): each request is checked
against the armed faults, oldest first, and the first that matches acts on it:

- an error fault answers at once, in the API's own response layout, without acting on the
  request: every error code of the response carries the error (Kafka's getErrorResponse) and
  the entries mirror the request's (the topics and partitions asked about). With a topic (and
  partition) the fault matches only requests naming it, and only its entries get the error;
  the rest of the request is served as usual. An entry that names its topic by id (Fetch v13
  and later) is matched by the name the broker's metadata gives that id;
- a delay fault serves the request at once and holds its answer back (the connection's later
  answers wait behind it, as on a slow broker); processing order is never changed, so an
  idempotent producer's sequence stays intact;
- a drop fault lets ``after`` requests through, then resets every open connection (the request
  that tripped it gets no answer), as a network cut would.

Every fault that fires is logged (warning ``fault injected``) and counted by kind and API;
``counts`` holds them and the broker's /metrics serves them as
``minibroker_faults_injected_total``. Faults are armed from any thread.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kafka.errors
import structlog
from kafka.protocol.api_message import ApiMessage
from prometheus_client.core import CounterMetricFamily

from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode
from protocol.registry import APIS, ApiSpec

if TYPE_CHECKING:
    from broker.network.request import Request
    from broker.network.request_channel import HandlerResult

logger = structlog.get_logger("broker.testing")

Dispatch = Callable[["Request"], "HandlerResult"]
#: A topic id's name, or None for an id the broker does not know.
TopicNames = Callable[[uuid.UUID], "str | None"]

# Field names that identify an entry, by what they name (a topic is "name" in one API and
# "topic" in the next). Only these are copied from a request entry into its error entry.
_CANONICAL = {"name": "topic", "topic": "topic", "topic_name": "topic",
              "index": "partition", "partition": "partition", "partition_index": "partition",
              "partition_id": "partition"}
_IDENTIFIERS = {"topic", "partition", "topic_id", "group_id", "key", "transactional_id",
                "resource_name", "resource_type", "producer_id"}


def api_spec(api: str | int) -> ApiSpec:
    """An API by key or by Kafka's name, in any case, with or without underscores."""
    if isinstance(api, int):
        if api not in APIS:
            raise ValueError(f"API key {api} is not served")
        return APIS[api]
    wanted = api.replace("_", "").lower()
    for spec in APIS.values():
        if spec.name.lower() == wanted:
            return spec
    raise ValueError(f"unknown API {api!r}")


def error_code(error: str | int) -> int:
    """A Kafka error by name (NOT_LEADER_OR_FOLLOWER, not_leader_or_follower) or code."""
    if isinstance(error, int):
        return error
    name = error.upper()
    if name in ErrorCode.__members__:
        return int(ErrorCode[name])
    for cls in kafka.errors.kafka_errors.values():
        if cls.message == name or cls.__name__.upper() in (name, name.replace("_", "")):
            return int(cls.errno)
    raise ValueError(f"unknown Kafka error {error!r}")


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        cls = kafka.errors.kafka_errors.get(code)
        return cls.message if cls is not None else str(code)


@dataclass
class Fault:
    kind: str  # "error", "delay" or "drop"
    api: ApiSpec | None  # None: any API
    remaining: int | None  # requests it still acts on; None: until cleared
    error: int = 0
    topic: str | None = None
    partition: int | None = None
    ms: float = 0.0
    after: int = 0  # drop: requests still let through first

    def matches(self, request: Request, names: TopicNames | None = None) -> bool:
        if self.api is not None and request.spec.key != self.api.key:
            return False
        if self.topic is None or request.body is None:
            return True
        return any(_entry_matches(self, t, p)
                   for t, p in _topic_partitions(request.body, request.version, names))


class Faults:
    """The armed faults of one broker and the count of those that fired."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self.counts: dict[tuple[str, str], int] = {}  # (kind, API) -> fired
        self._held: set[asyncio.Future[None]] = set()  # answers held back by delay faults

    # -- arming (any thread) ----------------------------------------------------------------
    def inject_errors(self, api: str | int, error: str | int, count: int | None = 1,
                      topic: str | None = None, partition: int | None = None) -> Fault:
        """The next ``count`` requests of ``api`` (None: every one until cleared) are answered
        with ``error``; with ``topic``/``partition`` only their entries are."""
        if partition is not None and topic is None:
            raise ValueError("a partition needs its topic")
        return self._arm(Fault("error", api_spec(api), count, error=error_code(error),
                               topic=topic, partition=partition))

    def delay(self, api: str | int, ms: float, count: int | None = 1) -> Fault:
        """The answers of the next ``count`` requests of ``api`` leave ``ms`` late."""
        return self._arm(Fault("delay", api_spec(api), count, ms=ms))

    def drop_connections(self, after: int = 0) -> Fault:
        """Let ``after`` requests through, then reset every open connection."""
        return self._arm(Fault("drop", None, 1, after=after))

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def armed(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def _arm(self, fault: Fault) -> Fault:
        if fault.remaining is not None and fault.remaining < 1:
            raise ValueError("count must be at least 1 (or None: until cleared)")
        with self._lock:
            self._faults.append(fault)
        return fault

    def _take(self, request: Request, names: TopicNames | None) -> Fault | None:
        """The first armed fault for this request, its count moved on (gone at zero)."""
        with self._lock:
            for fault in self._faults:
                if not fault.matches(request, names):
                    continue
                if fault.kind == "drop" and fault.after > 0:
                    fault.after -= 1
                    continue
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._faults.remove(fault)
                return fault
        return None

    # -- the dispatch filter (the broker's loop) --------------------------------------------
    def __call__(self, request: Request, dispatch: Dispatch) -> HandlerResult:
        if not self._faults:
            return dispatch(request)
        names = _topic_names(dispatch)
        fault = self._take(request, names)
        if fault is None:
            return dispatch(request)
        self._fired(fault, request)
        if fault.kind == "error":
            return self._error(fault, request, dispatch, names)
        if fault.kind == "delay":
            return self._delayed(dispatch(request), fault.ms / 1000)
        return self._drop(request)

    def _fired(self, fault: Fault, request: Request) -> None:
        key = (fault.kind, request.spec.name)
        self.counts[key] = self.counts.get(key, 0) + 1
        fields: dict[str, Any] = {"kind": fault.kind, "api": request.spec.name,
                                  "version": request.version,
                                  "correlation_id": request.header.correlation_id}
        if fault.kind == "error":
            fields.update(error=error_name(fault.error), topic=fault.topic,
                          partition=fault.partition)
        elif fault.kind == "delay":
            fields["ms"] = fault.ms
        logger.warning("fault injected", **fields)

    def _error(self, fault: Fault, request: Request, dispatch: Dispatch,
               names: TopicNames | None) -> HandlerResult:
        body = request.body
        if fault.topic is None or body is None or not request.expects_response:
            return None if not request.expects_response else error_response(
                request.spec, request.version, body, fault.error)
        failed = error_response(request.spec, request.version, body, fault.error,
                                keep=lambda t, p: _entry_matches(fault, t, p), top_level=False,
                                names=names)
        rest = _without(body, request.version, lambda t, p: _entry_matches(fault, t, p), names)
        if rest is None:
            return failed
        served = dispatch(request)  # the request now names only the entries left to serve
        if isinstance(served, Completion):
            return served.then(lambda r: _merged(r, failed))
        return _merged(served, failed) if served is not None else failed

    def _delayed(self, result: HandlerResult, seconds: float) -> Completion[Any]:
        """``result`` once ``seconds`` passed, or at once when the delays are released."""
        loop = asyncio.get_running_loop()
        answer: Completion[Any] = Completion()
        held: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, lambda: held.done() or held.set_result(None))
        self._held.add(held)

        def release(_held: asyncio.Future[None]) -> None:
            timer.cancel()
            self._held.discard(held)
            if isinstance(result, Completion):
                result.on_done(lambda done: _pass_on(done, answer))
            else:
                answer.set_result(result)

        held.add_done_callback(release)
        return answer

    def release_delays(self) -> None:
        """Send every held answer now (on the broker's loop: clear_faults, stop, kill)."""
        for held in list(self._held):
            if not held.done():
                held.set_result(None)

    def _drop(self, request: Request) -> HandlerResult:
        channel = request.connection.channel
        for conn in list(channel.connections):
            conn.close_quietly()
            if conn.transport is not None:
                conn.transport.abort()
        # No answer, and none expected: a cancelled result is how the channel hears that a
        # request's connection went away (a None would be logged as a handler bug).
        gone: Completion[Any] = Completion()
        gone.cancel()
        return gone

    # -- metrics ----------------------------------------------------------------------------
    def collect(self) -> Iterator[CounterMetricFamily]:
        """A prometheus collector: faults fired, by kind and API."""
        family = CounterMetricFamily("minibroker_faults_injected",
                                     "Faults injected by a test (broker.testing), by kind and API.",
                                     labels=["kind", "api"])
        for (kind, api), n in sorted(self.counts.items()):
            family.add_metric([kind, api], n)
        yield family


# -- answers -------------------------------------------------------------------------------------



def _pass_on(done: Completion[Any], answer: Completion[Any]) -> None:
    """``answer`` ends as ``done`` did."""
    if done.cancelled():
        answer.cancel()
    elif (exc := done.exception()) is not None:
        answer.set_exception(exc)
    else:
        answer.set_result(done.result())


def error_response(spec: ApiSpec, version: int, body: Any, code: int, *,
                   keep: Callable[[str | None, int | None], bool] | None = None,
                   top_level: bool = True, names: TopicNames | None = None) -> Any:
    """``spec``'s response for ``version`` answering ``body`` with ``code``: every error code
    set, every entry of the request mirrored (only those ``keep(topic, partition)`` accepts,
    and no top-level error when ``top_level`` is false). ``names`` names the topic of an entry
    that gives only its id, for ``keep``; the answer mirrors the id as the request gave it."""
    response_cls = spec.response
    fields = _fill(response_cls, version, body, code, _Keep(keep, names), top_level, {})
    return response_cls(version=version, **fields)


@dataclass(frozen=True, slots=True)
class _Keep:
    """Which entries an error answer keeps: ``accepts(topic, partition)`` (None: all), the
    topic of an entry naming only its id resolved by ``names``."""

    accepts: Callable[[str | None, int | None], bool] | None
    names: TopicNames | None


def _fill(cls: Any, version: int, source: Any, code: int, keep: _Keep, errors: bool,
          ids: dict[str, Any]) -> dict[str, Any]:
    """The fields of one ``cls`` (the response, or one of its entry classes)."""
    out: dict[str, Any] = {}
    for f in cls._struct._fields:
        if not f.for_version_q(version):
            continue
        name = f.name
        canonical = _CANONICAL.get(name, name)
        if name == "error_code":
            out[name] = code if errors else 0
        elif name == "throttle_time_ms":
            out[name] = 0
        elif f.is_struct_array():
            out[name] = _entries(getattr(cls, f.type_str), version, source, code, keep, ids)
        elif canonical in _IDENTIFIERS and not f.is_array() and canonical in ids:
            out[name] = ids[canonical]
    return out


def _entries(cls: Any, version: int, source: Any, code: int, keep: _Keep,
             ids: dict[str, Any]) -> list[Any]:
    """One ``cls`` entry per entry of the request array that best matches it."""
    field = cls._struct
    match = _matching_array(field, version, source)
    if match is None:
        return []
    values = getattr(source, match.name, None) or []
    out = []
    for value in values:
        entry_ids = dict(ids)
        if match.is_struct_array():
            entry_ids.update(_ids_of(value))
            if _names_topic(value, version):
                entry_ids[_NAMED] = _topic_of(value, version, keep.names)
        else:
            ident = _scalar_identifier(field, match)
            if ident is None:
                continue
            entry_ids[ident] = value
        fields = _fill(cls, version, value if match.is_struct_array() else None, code, keep,
                       True, entry_ids)
        if keep.accepts is not None and not _kept(field, version, fields, entry_ids,
                                                  keep.accepts):
            continue
        out.append(cls(**fields))
    return out


def _kept(field: Any, version: int, fields: dict[str, Any], ids: dict[str, Any],
          keep: Callable[[str | None, int | None], bool]) -> bool:
    """A partition entry is kept when ``keep`` says so; a topic entry when any of its
    partitions was, or (without partitions) when ``keep(topic, None)`` says so."""
    topic = ids[_NAMED] if _NAMED in ids else ids.get("topic")
    if "partition" in ids:
        return keep(topic, ids["partition"])
    nested = [fields[f.name] for f in field._fields
              if f.for_version_q(version) and f.is_struct_array() and f.name in fields]
    if any(nested):
        return True
    return keep(topic, None)


def _matching_array(field: Any, version: int, source: Any) -> Any:
    """The request array (at ``source``'s level) whose entries the response array mirrors:
    the one sharing most identifier names (a scalar array counts when its values can fill an
    identifier), the first on a tie."""
    if source is None or getattr(source, "_struct", None) is None:
        return None
    wanted = _identifier_names(field, version)
    best, best_score = None, 0.0
    for candidate in source._struct._fields:
        if not candidate.is_array() or not candidate.for_version_q(version):
            continue
        if candidate.is_struct_array():
            score = float(len(wanted & _identifier_names(candidate, version)))
        else:
            score = 0.5 if _scalar_identifier(field, candidate) is not None else 0.0
        if score > best_score:
            best, best_score = candidate, score
    return best


def _identifier_names(field: Any, version: int) -> set[str]:
    return {_CANONICAL.get(f.name, f.name) for f in field._fields
            if f.for_version_q(version) and not f.is_array()} & _IDENTIFIERS


def _scalar_identifier(field: Any, scalar_array: Any) -> str | None:
    """Which identifier of ``field``'s entries a request's scalar array fills: partition
    numbers fill the partition, strings the first string identifier (a topic, group or key)."""
    item = scalar_array.type_str.removeprefix("[]")
    for f in field._fields:
        canonical = _CANONICAL.get(f.name, f.name)
        if canonical not in _IDENTIFIERS or f.is_array():
            continue
        if item == "int32" and canonical == "partition":
            return canonical
        if item == "string" and f.type_str == "string":
            return canonical
    return None


def _ids_of(entry: Any) -> dict[str, Any]:
    out = {}
    for f in entry._struct._fields:
        canonical = _CANONICAL.get(f.name, f.name)
        if canonical in _IDENTIFIERS and not f.is_array():
            value = getattr(entry, f.name, None)
            if value is not None and canonical not in out:
                out[canonical] = value
    return out


# -- the entries a request names -----------------------------------------------------------------

def _topic_partitions(body: Any, version: int, names: TopicNames | None
                      ) -> Iterable[tuple[str | None, int | None]]:
    """(topic, partition) of every entry of the request, (topic, None) for a topic without
    partitions."""
    for topics in _topic_arrays(body):
        for t in topics:
            topic = _topic_of(t, version, names)
            partitions = list(_partitions_of(t))
            if not partitions:
                yield topic, None
            for p in partitions:
                yield topic, p


def _topic_arrays(body: Any) -> Iterable[list[Any]]:
    struct = getattr(body, "_struct", None)
    if struct is None:
        return
    for f in struct._fields:
        if f.is_struct_array() and "topic" in {_CANONICAL.get(g.name) for g in f._fields}:
            yield getattr(body, f.name, None) or []


def _partitions_of(topic_entry: Any) -> Iterable[int]:
    for f in topic_entry._struct._fields:
        values = getattr(topic_entry, f.name, None) if f.is_array() else None
        if not values:
            continue
        if f.is_struct_array():
            for v in values:
                p = _ids_of(v).get("partition")
                if p is not None:
                    yield p
        elif f.type_str == "[]int32" and "partition" in f.name:
            yield from values


# The key under which an entry's ids carry the topic's name as resolved (not an identifier
# field: never copied into an answer).
_NAMED = " named"


def _names_topic(entry: Any, version: int) -> bool:
    return any(_CANONICAL.get(f.name) == "topic" or f.name == "topic_id"
               for f in entry._struct._fields if f.for_version_q(version) and not f.is_array())


def _topic_of(entry: Any, version: int, names: TopicNames | None) -> str | None:
    """The topic a request entry names: its name at ``version``, or, for an entry that gives
    only an id (Fetch v13 and later, a Metadata or DeleteTopics entry by id), the id's name."""
    name = topic_id = None
    for f in entry._struct._fields:
        if f.is_array() or not f.for_version_q(version):
            continue
        if f.name == "topic_id":
            topic_id = getattr(entry, f.name, None)
        elif _CANONICAL.get(f.name) == "topic" and name is None:
            name = getattr(entry, f.name, None)
    if name is None and topic_id is not None and names is not None:
        return names(topic_id)
    return name


def _topic_names(dispatch: Dispatch) -> TopicNames | None:
    """Topic ids named from the metadata of the broker whose dispatch the filter is handed
    (Broker._handle, bound to its broker); None for a dispatch with no broker behind it."""
    metadata = getattr(getattr(dispatch, "__self__", None), "metadata", None)
    by_id = getattr(metadata, "by_id", None)
    if by_id is None:
        return None

    def name(topic_id: uuid.UUID) -> str | None:
        info = by_id.get(topic_id)
        return info.name if info is not None else None
    return name


def _entry_matches(fault: Fault, topic: str | None, partition: int | None) -> bool:
    if topic != fault.topic:
        return False
    return fault.partition is None or partition is None or partition == fault.partition


def _without(body: Any, version: int, drop: Callable[[str | None, int | None], bool],
             names: TopicNames | None) -> Any:
    """Takes the entries ``drop`` names out of the request, in place; returns the request, or
    None when nothing is left to serve."""
    left = 0
    for f in body._struct._fields:
        if not (f.is_struct_array() and "topic" in {_CANONICAL.get(g.name) for g in f._fields}):
            continue
        kept_topics = []
        for t in getattr(body, f.name, None) or []:
            topic = _topic_of(t, version, names)
            for g in t._struct._fields:
                values = getattr(t, g.name, None) if g.is_array() else None
                if not values:
                    continue
                if g.is_struct_array():
                    setattr(t, g.name, [v for v in values
                                        if not drop(topic, _ids_of(v).get("partition"))])
                elif g.type_str == "[]int32" and "partition" in g.name:
                    setattr(t, g.name, [p for p in values if not drop(topic, p)])
            partitions = list(_partitions_of(t))
            if partitions or not drop(topic, None):
                kept_topics.append(t)
                left += max(len(partitions), 1)
        setattr(body, f.name, kept_topics)
    return body if left else None


def _merged(response: Any, failed: Any) -> Any:
    """``failed``'s entries added to ``response``'s (topics merged by their identifiers). An
    answer packed from a template (protocol/templates.py) is turned into kafka-python's message
    first: its entries are read-only views."""
    if not isinstance(response, ApiMessage):
        response = response.to_message()
    _merge_into(response, failed)
    return response


def _merge_into(target: Any, extra: Any) -> None:
    for f in extra._struct._fields:
        if not f.is_struct_array():
            continue
        mine = getattr(target, f.name, None)
        if mine is None:
            mine = []
            setattr(target, f.name, mine)
        for entry in getattr(extra, f.name, None) or []:
            ids = _ids_of(entry)
            same = next((m for m in mine if ids and _ids_of(m) == ids), None)
            if same is None:
                mine.append(entry)
            else:
                _merge_into(same, entry)
