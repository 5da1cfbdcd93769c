"""Streaming read: the stream offset is the next offset per topic-partition.

Spark checkpoints what latestOffset returns before running the batch, and replays
partitions(start, end) from the checkpoint after a crash; so every method here is a pure
function of its offsets and the broker's logs, and a restart continues exactly where the last
committed batch stopped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pipeline.consumer import read_range
from pipeline.offsets import TP, ClusterView, from_json, rate_limit, report_data_loss, to_json
from pipeline.options import SourceOptions
from pipeline.reader import plan_ranges


class MiniBrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lives in one long-running Python process on the driver, which keeps one metadata
    client open across triggers; the executors get only the ranges."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._view: ClusterView | None = None
        self._target: dict[TP, int] | None = None  # Trigger.AvailableNow's end of the input
        self._latest: dict[TP, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The reader is pickled into the executors' read function; the client stays behind.
        return {**self.__dict__, "_view": None}

    @property
    def view(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(self.opts)
        return self._view

    def initialOffset(self) -> dict:
        tps = self.view.partitions()
        return to_json(self.view.resolve(self.opts.starting, tps))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.view.latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start)
        current = self.view.latest()
        self._latest = current
        for tp, off in sorted(begin.items()):
            if tp not in current:
                report_data_loss(self.opts, f"{tp[0]}-{tp[1]} is gone (topic deleted?)")
            elif current[tp] < off:
                report_data_loss(self.opts, f"{tp[0]}-{tp[1]}: latest offset {current[tp]} is "
                                            f"below the checkpointed {off} (topic recreated?)")
        cap = current
        if self._target is not None:
            # AvailableNow: nothing beyond what existed when the query started.
            cap = {tp: min(off, self._target.get(tp, begin.get(tp, 0)))
                   for tp, off in current.items()}
        # Never move a partition backwards; one that went backwards restarts at its new end.
        latest = {tp: max(off, begin.get(tp, 0)) if current[tp] >= begin.get(tp, 0) else off
                  for tp, off in cap.items()}
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        return to_json(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return plan_ranges(from_json(start), from_json(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.opts, partition)  # type: ignore[arg-type]

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, never in Kafka."""

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
