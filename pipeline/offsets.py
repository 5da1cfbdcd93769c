"""Offsets on the driver: which partitions exist, where their logs start and end, and how a
micro-batch's share of `maxOffsetsPerTrigger` is split among them.

Offsets travel as Spark's Kafka source writes them, `{"topic": {"0": 42}}`, so a checkpoint
reads the same to a person who knows that connector. Offsets are "next offset to read":
a range is [start, end).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pipeline.options import EARLIEST, LATEST, OffsetSpec, SourceOptions

logger = logging.getLogger(__name__)

TP = tuple[str, int]
_TIMEOUT_S = 30.0


class DataLossError(RuntimeError):
    """Records the query should have read are gone (retention, topic deleted); Spark's message
    advice applies: set failOnDataLoss=false to skip them instead."""


def to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, part), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(part)] = int(off)
    return out


def from_json(doc: Mapping[str, Mapping[str, int]]) -> dict[TP, int]:
    return {(topic, int(p)): int(o) for topic, parts in doc.items() for p, o in parts.items()}


def consumer_config(opts: SourceOptions) -> dict[str, object]:
    """librdkafka settings for reading: user's `kafka.*`, then what the source must own.

    No group membership and no committed offsets: Spark's checkpoint is the only record of
    progress, so offsets are always given explicitly.
    """
    return {
        **opts.client,
        "group.id": opts.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",  # an out-of-range offset is data loss, never a silent jump
    }


def report_data_loss(opts: SourceOptions, message: str) -> None:
    """Raise or warn, as failOnDataLoss says."""
    if opts.fail_on_data_loss:
        raise DataLossError(message + ". If this is expected, set failOnDataLoss=false.")
    logger.warning("%s; skipping it (failOnDataLoss=false)", message)


@dataclass
class ClusterView:
    """A driver-side consumer that answers metadata and watermark questions, never reads.

    Held for the life of a stream reader so each trigger reuses one connection.
    """

    opts: SourceOptions
    _consumer: Consumer | None = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(consumer_config(self.opts))
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def partitions(self) -> list[TP]:
        """The subscribed topic-partitions that exist now, sorted."""
        sub = self.opts.subscription
        if sub.assign is not None:
            return sorted((t, p) for t, ps in sub.assign.items() for p in ps)
        meta = self._client().list_topics(timeout=_TIMEOUT_S)
        out = []
        for name, topic in meta.topics.items():
            if topic.error is not None or not sub.matches(name):
                continue
            if sub.pattern is not None and name.startswith("__"):
                continue  # internal topics are never matched by a pattern, as in Kafka
            out.extend((name, p) for p in topic.partitions)
        return sorted(out)

    def watermarks(self, tps: Iterable[TP]) -> dict[TP, tuple[int, int]]:
        """(log start offset, high watermark) per partition."""
        client = self._client()
        out = {}
        for topic, part in tps:
            try:
                out[(topic, part)] = client.get_watermark_offsets(
                    TopicPartition(topic, part), timeout=_TIMEOUT_S, cached=False)
            except KafkaException as exc:
                raise RuntimeError(f"cannot list offsets of {topic}-{part}: {exc}") from exc
        return out

    def latest(self, tps: Iterable[TP] | None = None) -> dict[TP, int]:
        tps = self.partitions() if tps is None else tps
        return {tp: high for tp, (_, high) in self.watermarks(tps).items()}

    def resolve(self, spec: OffsetSpec, tps: list[TP]) -> dict[TP, int]:
        """Turn earliest/latest/JSON (with -2/-1 sentinels) into concrete offsets."""
        marks = self.watermarks(tps)
        out = {}
        for tp in tps:
            want = spec.for_partition(*tp)
            low, high = marks[tp]
            if want == EARLIEST:
                out[tp] = low
            elif want == LATEST:
                out[tp] = high
            else:
                out[tp] = want
        return out


def rate_limit(start: Mapping[TP, int], latest: Mapping[TP, int], limit: int) -> dict[TP, int]:
    """End offsets that admit at most `limit` records in total, shared in proportion to each
    partition's backlog (Spark's rule). Shares are rounded down and the leftover goes to the
    largest remainders, so the sum is exactly `limit` when the backlog exceeds it: Spark's
    rounding up can overshoot by one record per partition, which breaks a strict bound.
    """
    lag = {tp: latest[tp] - start.get(tp, 0) for tp in latest}
    lag = {tp: n for tp, n in lag.items() if n > 0}
    total = sum(lag.values())
    if total <= limit:
        return dict(latest)
    shares = {tp: limit * n // total for tp, n in lag.items()}
    leftover = limit - sum(shares.values())
    by_remainder = sorted(lag, key=lambda tp: (-(limit * lag[tp] % total), tp))
    for tp in by_remainder[:leftover]:
        shares[tp] += 1
    return {tp: start.get(tp, 0) + shares[tp] if tp in shares else start.get(tp, latest[tp])
            for tp in latest}
