"""Batch read: the driver turns starting/ending offsets into one Spark task per partition."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pipeline.consumer import OffsetRange, read_range
from pipeline.offsets import ClusterView
from pipeline.options import OptionError, SourceOptions


def plan_ranges(start: dict[tuple[str, int], int],
                end: dict[tuple[str, int], int]) -> list[OffsetRange]:
    """Non-empty ranges in partition order; a partition missing from `start` is new since the
    start was taken, so it is read from its first offset (0), as Spark does."""
    return [OffsetRange(topic, part, start.get((topic, part), 0), stop)
            for (topic, part), stop in sorted(end.items())
            if stop > start.get((topic, part), 0)]


class MiniBrokerReader(DataSourceReader):
    """Offsets are resolved once at planning, so every task of the query sees the same snapshot
    (and a retried task re-reads exactly its range)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        view = ClusterView(self.opts)
        try:
            tps = view.partitions()
            start = view.resolve(self.opts.starting, tps)
            end = view.resolve(self.opts.ending, tps)
        finally:
            view.close()
        for tp in tps:
            if start[tp] > end[tp]:
                raise OptionError(f"{tp[0]}-{tp[1]}: startingOffsets {start[tp]} is after "
                                  f"endingOffsets {end[tp]}")
        return plan_ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return iter(())  # Spark's placeholder partition when there is nothing to read
        return read_range(self.opts, partition)
