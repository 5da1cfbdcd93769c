"""The source and sink options, named and interpreted as Spark's Kafka connector does.

Keeping the names identical is the point: a pipeline written for `format("kafka")` ports by
changing the format name. Everything is parsed once, on the driver, into plain picklable values
so executors never see a half-valid option.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

# Kafka's sentinels in offset JSON, as in Spark: -2 is earliest, -1 is latest.
EARLIEST = -2
LATEST = -1

# Settings that the connector owns: a user value would break its guarantees, so it is rejected
# (Spark rejects the same ones for the same reason).
_FORBIDDEN_CONSUMER = {"auto.offset.reset", "enable.auto.commit", "key.deserializer",
                       "value.deserializer", "group.instance.id"}
_FORBIDDEN_PRODUCER = {"key.serializer", "value.serializer"}


class OptionError(ValueError):
    """An option is missing, unknown in value, or contradicts another one."""


@dataclass(frozen=True)
class Subscription:
    """Which topic-partitions to read: exactly one of the three strategies is set."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None

    def matches(self, topic: str) -> bool:
        if self.assign is not None:
            return topic in self.assign
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    def describe(self) -> str:
        if self.assign is not None:
            return f"assign={json.dumps({t: list(p) for t, p in self.assign.items()})}"
        if self.pattern is not None:
            return f"subscribePattern={self.pattern}"
        return f"subscribe={','.join(self.topics)}"


@dataclass(frozen=True)
class OffsetSpec:
    """`earliest`, `latest`, or explicit offsets per topic-partition (sentinels allowed)."""

    kind: str  # "earliest" | "latest" | "json"
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    fallback: int = EARLIEST  # for a partition the JSON does not name

    def for_partition(self, topic: str, partition: int) -> int:
        """An offset or a sentinel: what this spec asks for on one partition."""
        if self.kind == "earliest":
            return EARLIEST
        if self.kind == "latest":
            return LATEST
        return self.offsets.get((topic, partition), self.fallback)


def parse_offset_spec(raw: str | None, name: str, default: str) -> OffsetSpec:
    text = (raw or default).strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(text.lower())
    try:
        parsed = json.loads(text)
        offsets = {(str(t), int(p)): int(o) for t, parts in parsed.items()
                   for p, o in parts.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise OptionError(
            f'{name} must be "earliest", "latest" or JSON like {{"topic":{{"0":23,"1":-2}}}}, '
            f"got {text!r}") from exc
    # Partitions the JSON does not name get the option's default (Spark insists on all of them;
    # being lenient costs nothing and survives partitions added after the job was written).
    return OffsetSpec("json", offsets, EARLIEST if default == "earliest" else LATEST)


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    low = str(raw).strip().lower()
    if low not in ("true", "false"):
        raise OptionError(f"{key} must be true or false, got {raw!r}")
    return low == "true"


def _positive_int(opts: Mapping[str, str], key: str) -> int | None:
    raw = opts.get(key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError as exc:
        raise OptionError(f"{key} must be a positive integer, got {raw!r}") from exc
    if value <= 0:
        raise OptionError(f"{key} must be a positive integer, got {raw!r}")
    return value


def client_settings(opts: Mapping[str, str]) -> dict[str, str]:
    """Every `kafka.`-prefixed option with the prefix stripped, for the librdkafka client."""
    out = {k[len("kafka."):]: str(v) for k, v in opts.items() if k.lower().startswith("kafka.")}
    if not out.get("bootstrap.servers"):
        raise OptionError("option kafka.bootstrap.servers is required")
    return out


@dataclass(frozen=True)
class SourceOptions:
    """Read options, validated: what Spark's Kafka source accepts, under the same names."""

    client: dict[str, str]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    include_headers: bool
    poll_timeout_ms: int
    group_id: str

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> SourceOptions:
        opts = {k.lower(): v for k, v in options.items()}  # Spark's option names ignore case
        client = client_settings(opts)
        bad = _FORBIDDEN_CONSUMER & set(client)
        if bad:
            raise OptionError(f"kafka.{sorted(bad)[0]} is managed by the source and not allowed")
        strategies = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
        if len(strategies) != 1:
            raise OptionError("exactly one of subscribe, subscribePattern, assign is required, "
                              f"got {strategies or 'none'}")
        strategy = strategies[0]
        raw = str(opts[strategy])
        if strategy == "subscribe":
            topics = tuple(t.strip() for t in raw.split(",") if t.strip())
            if not topics:
                raise OptionError("subscribe names no topic")
            sub = Subscription(topics=topics)
        elif strategy == "subscribepattern":
            try:
                re.compile(raw)
            except re.error as exc:
                raise OptionError(f"subscribePattern is not a valid regex: {exc}") from exc
            sub = Subscription(pattern=raw)
        else:
            try:
                parsed = json.loads(raw)
                assign = {str(t): tuple(sorted(int(p) for p in ps)) for t, ps in parsed.items()}
            except (ValueError, AttributeError, TypeError) as exc:
                raise OptionError(f'assign must be JSON like {{"topicA":[0,1]}}, got {raw!r}'
                                  ) from exc
            sub = Subscription(assign=assign)

        starting = parse_offset_spec(opts.get("startingoffsets"), "startingOffsets",
                                     "latest" if streaming else "earliest")
        ending = parse_offset_spec(opts.get("endingoffsets"), "endingOffsets", "latest")
        if streaming and opts.get("endingoffsets"):
            raise OptionError("endingOffsets is for batch queries only")
        if not streaming:
            if starting.kind == "latest" or LATEST in starting.offsets.values():
                raise OptionError("startingOffsets latest is meaningless for a batch query")
            if ending.kind == "earliest" or EARLIEST in ending.offsets.values():
                raise OptionError("endingOffsets earliest is meaningless for a batch query")
        max_per_trigger = _positive_int(opts, "maxoffsetspertrigger")
        if max_per_trigger is not None and not streaming:
            max_per_trigger = None  # Spark ignores it for batch queries too
        prefix = opts.get("groupidprefix") or "spark-mini-broker-source"
        return cls(
            client=client,
            subscription=sub,
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=max_per_trigger,
            fail_on_data_loss=_bool(opts, "failondataloss", True),
            include_headers=_bool(opts, "includeheaders", False),
            poll_timeout_ms=_positive_int(opts, "kafkaconsumer.polltimeoutms") or 60_000,
            group_id=client.get("group.id") or f"{prefix}-{uuid.uuid4().hex}",
        )


@dataclass(frozen=True)
class SinkOptions:
    """Write options: the producer settings and the default topic."""

    client: dict[str, str]
    topic: str | None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = {k.lower(): v for k, v in options.items()}
        client = client_settings(opts)
        bad = _FORBIDDEN_PRODUCER & set(client)
        if bad:
            raise OptionError(f"kafka.{sorted(bad)[0]} is managed by the sink and not allowed")
        for key, want in (("acks", {"all", "-1"}), ("enable.idempotence", {"true"})):
            if key in client and client[key].lower() not in want:
                raise OptionError(f"kafka.{key}={client[key]} would weaken the sink's delivery "
                                  "guarantee (acks=all and idempotence are always on)")
        return cls(client=client, topic=opts.get("topic") or None)
