"""Jepsen's anomalies for Kafka, found in a recorded history (a pure function: no I/O).

Each record carries a value no other record has, so a value names one record and an offset
must name one value. The analysis builds, per partition, what every source says sits at each
offset (the acknowledgements and every poll) and then looks for:

- ``lost``: acknowledged, never read by anyone, although some consumer read a later offset
  of its partition (what was read past it should have included it);
- ``unseen``: acknowledged and never read, at an offset no read reached (or no offset known).
  An anomaly when the final read reached every partition's end (``History.drained``); when
  the run ended before that, it is only counted;
- ``duplicate``: one value at two positions (partition, offset);
- ``inconsistent_offsets``: one position, two values;
- ``nonmonotonic_poll``: a consumer reading an offset at or before one it had read in that
  partition, with no assignment or seek in between;
- ``nonmonotonic_send``: a producer's acknowledged offsets in one partition not increasing in
  the order it produced them;
- ``aborted_read``: a read_committed consumer reading a record of an aborted transaction.

Offsets are compared as Kafka gives them: transaction markers take offsets no record has, so
gaps are not anomalies.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from bench.consistency.history import Assign, History, Outcome, Poll, Send

KINDS = ("lost", "unseen", "duplicate", "inconsistent_offsets", "nonmonotonic_poll",
         "nonmonotonic_send", "aborted_read")


@dataclass
class Analysis:
    """What ``analyse`` found: every case of each kind (``anomalies``) and the totals."""

    anomalies: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {kind: [] for kind in KINDS})
    sent: int = 0
    acknowledged: int = 0
    read: int = 0  # distinct values read
    drained: bool = False

    def counts(self) -> dict[str, int]:
        return {kind: len(cases) for kind, cases in self.anomalies.items()}

    def failures(self) -> dict[str, int]:
        """The kinds that fail the run: every kind found, but ``unseen`` only when drained."""
        return {kind: n for kind, n in self.counts().items()
                if n and (kind != "unseen" or self.drained)}

    @property
    def ok(self) -> bool:
        return not self.failures()

    def to_dict(self, examples: int = 5) -> dict[str, Any]:
        """A JSON-ready summary with the first ``examples`` cases of each kind."""
        return {"ok": self.ok, "drained": self.drained, "sent": self.sent,
                "acknowledged": self.acknowledged, "read": self.read,
                "anomalies": self.counts(), "failures": self.failures(),
                "examples": {kind: cases[:examples]
                             for kind, cases in self.anomalies.items() if cases}}


def analyse(history: History) -> Analysis:
    """Every anomaly of ``history`` (see the module docstring)."""
    out = Analysis(sent=len(history.sends), drained=history.drained)
    polls = history.polls()
    read_values = {r.value for poll in polls for r in poll.records}
    out.read = len(read_values)
    out.acknowledged = sum(1 for s in history.sends if history.acknowledged(s))
    positions = _positions(history.sends, polls)
    out.anomalies["inconsistent_offsets"] = _inconsistent(positions)
    out.anomalies["duplicate"] = _duplicates(positions)
    lost, unseen = _unread(history, polls, read_values)
    out.anomalies["lost"], out.anomalies["unseen"] = lost, unseen
    out.anomalies["nonmonotonic_poll"] = _nonmonotonic_polls(history.reads)
    out.anomalies["nonmonotonic_send"] = _nonmonotonic_sends(history.sends)
    out.anomalies["aborted_read"] = _aborted_reads(history, polls)
    return out


def _positions(sends: list[Send], polls: list[Poll]) -> dict[tuple[int, int], set[str]]:
    """(partition, offset) -> every value an acknowledgement or a poll put there."""
    at: dict[tuple[int, int], set[str]] = defaultdict(set)
    for s in sends:
        if s.offset is not None:
            at[(s.partition, s.offset)].add(s.value)
    for poll in polls:
        for r in poll.records:
            at[(r.partition, r.offset)].add(r.value)
    return at


def _inconsistent(positions: dict[tuple[int, int], set[str]]) -> list[dict[str, Any]]:
    return [{"partition": p, "offset": o, "values": sorted(values)}
            for (p, o), values in sorted(positions.items()) if len(values) > 1]


def _duplicates(positions: dict[tuple[int, int], set[str]]) -> list[dict[str, Any]]:
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for position, values in sorted(positions.items()):
        for value in values:
            where[value].append(position)
    return [{"value": value, "positions": [list(p) for p in found]}
            for value, found in sorted(where.items()) if len(found) > 1]


def _unread(history: History, polls: list[Poll],
            read_values: set[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Acknowledged records no poll returned: lost when a later offset of their partition was
    read, unseen otherwise."""
    highest: dict[int, int] = {}
    for poll in polls:
        for r in poll.records:
            highest[r.partition] = max(highest.get(r.partition, -1), r.offset)
    lost: list[dict[str, Any]] = []
    unseen: list[dict[str, Any]] = []
    for s in history.sends:
        if s.value in read_values or not history.acknowledged(s):
            continue
        case = {"value": s.value, "partition": s.partition, "offset": s.offset,
                "producer": s.producer, "acked_s": s.acked_s}
        read_past = s.offset is not None and s.offset <= highest.get(s.partition, -1)
        if read_past:
            lost.append({**case, "highest_read": highest[s.partition]})
        else:
            unseen.append(case)
    return lost, unseen


def _nonmonotonic_polls(reads: list[Poll | Assign]) -> list[dict[str, Any]]:
    last: dict[tuple[str, int], int] = {}
    found: list[dict[str, Any]] = []
    for event in reads:
        if isinstance(event, Assign):
            for p in event.partitions:
                last.pop((event.consumer, p), None)
            continue
        for r in event.records:
            key = (event.consumer, r.partition)
            before = last.get(key)
            if before is not None and r.offset <= before:
                found.append({"consumer": event.consumer, "partition": r.partition,
                              "offsets": [before, r.offset], "at_s": event.at_s})
            last[key] = r.offset
    return found


def _nonmonotonic_sends(sends: list[Send]) -> list[dict[str, Any]]:
    last: dict[tuple[str, int], Send] = {}
    found: list[dict[str, Any]] = []
    for s in sends:
        if s.offset is None:
            continue
        key = (s.producer, s.partition)
        before = last.get(key)
        if before is not None and before.offset is not None and s.offset <= before.offset:
            found.append({"producer": s.producer, "partition": s.partition,
                          "values": [before.value, s.value],
                          "offsets": [before.offset, s.offset]})
        last[key] = s
    return found


def _aborted_reads(history: History, polls: list[Poll]) -> list[dict[str, Any]]:
    aborted = {s.value: s for s in history.sends if history.outcome(s) is Outcome.ABORTED}
    return [{"consumer": poll.consumer, "value": r.value, "partition": r.partition,
             "offset": r.offset, "producer": aborted[r.value].producer,
             "txn": aborted[r.value].txn, "at_s": poll.at_s}
            for poll in polls if poll.read_committed
            for r in poll.records if r.value in aborted]
