"""The consumer group assignors on a large group: how long two assignments take (a fresh one,
then the rebalance after one member leaves, the sticky path) and how many calls they make.

The unit tests bound the calls (tests/unit/test_assignors.py), which do not depend on the
machine; the time is a figure for docs/benchmarks.md, never a pass/fail bound.

    python -m bench.assignors --json
    python -m bench.assignors --topics 200 --members 200 --repeat 5 --json

One JSON object per line: assignor, subscriptions (homogeneous or mixed), topics, partitions,
members, calls (Python and C function calls of the two assignments), best_ms and median_ms
over --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from broker.group.assignors import ASSIGNORS, Assignment, MemberSubscription

T = TypeVar("T")


def member(member_id: str, topics: list[str],
           owned: Mapping[str, frozenset[int]] | None = None) -> MemberSubscription:
    return MemberSubscription(member_id, None, None, frozenset(topics), dict(owned or {}))


def groups(topics: int, partitions_per_topic: int, members: int
           ) -> tuple[dict[str, int], dict[str, dict[str, MemberSubscription]]]:
    """The partition counts and two groups: everyone on every topic, and members on
    overlapping thirds of the topics."""
    counts = {f"topic-{i}": partitions_per_topic for i in range(topics)}
    names = list(counts)
    homogeneous = {f"member-{i}": member(f"member-{i}", names) for i in range(members)}
    mixed = {f"member-{i}": member(f"member-{i}", names[i % 3::2]) for i in range(members)}
    return counts, {"homogeneous": homogeneous, "mixed": mixed}


def assign_twice(name: str, members: Mapping[str, MemberSubscription],
                 counts: Mapping[str, int]) -> dict[str, Assignment]:
    """A fresh assignment, then the one after the first member leaves, keeping what each
    remaining member was given."""
    assignor = ASSIGNORS[name]
    result = assignor.assign(members, counts)
    rest = {m: member(m, list(sub.topics), result[m]) for m, sub in list(members.items())[1:]}
    return assignor.assign(rest, counts)


def count_calls(fn: Callable[[], T]) -> tuple[int, T]:
    """How many Python and C function calls ``fn`` makes: the same on every machine."""
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(previous)
    return calls - 1, result  # less the call of sys.setprofile that ends the count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions-per-topic", type=int, default=10)
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    counts, by_kind = groups(args.topics, args.partitions_per_topic, args.members)
    for name in sorted(ASSIGNORS):
        for kind, members in by_kind.items():
            calls, _ = count_calls(lambda: assign_twice(name, members, counts))  # noqa: B023
            times = []
            for _ in range(max(1, args.repeat)):
                started = time.perf_counter()
                assign_twice(name, members, counts)
                times.append((time.perf_counter() - started) * 1000)
            row = {"assignor": name, "subscriptions": kind, "topics": args.topics,
                   "partitions": sum(counts.values()), "members": args.members, "calls": calls,
                   "best_ms": round(min(times), 2), "median_ms": round(statistics.median(times), 2)}
            print(json.dumps(row) if args.json else
                  f"{name:8} {kind:12} {row['calls']:>8} calls  best {row['best_ms']:7.2f} ms"
                  f"  median {row['median_ms']:7.2f} ms")


if __name__ == "__main__":
    main()
