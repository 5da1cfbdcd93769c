"""Option parsing and the maxOffsetsPerTrigger split: pure functions, no Spark, no broker."""

from __future__ import annotations

import random

import pytest

from pipeline.offsets import from_json, rate_limit, to_json
from pipeline.options import EARLIEST, LATEST, OptionError, SinkOptions, SourceOptions

BOOT = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_rate_limit_never_exceeds_and_fills_the_limit() -> None:
    rnd = random.Random(5)
    for _ in range(500):
        tps = [("t", p) for p in range(rnd.randint(1, 6))]
        start = {tp: rnd.randint(0, 50) for tp in tps if rnd.random() < 0.8}
        latest = {tp: start.get(tp, 0) + rnd.randint(0, 40) for tp in tps}
        limit = rnd.randint(1, 60)
        end = rate_limit(start, latest, limit)
        took = [end[tp] - start.get(tp, 0) for tp in tps]
        assert all(0 <= n <= latest[tp] - start.get(tp, 0) for n, tp in zip(took, tps,
                                                                              strict=True))
        backlog = sum(latest[tp] - start.get(tp, 0) for tp in tps)
        assert sum(took) == min(limit, backlog)


def test_rate_limit_shares_in_proportion() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    end = rate_limit(start, {("t", 0): 250, ("t", 1): 100, ("t", 2): 50}, 40)
    assert end == {("t", 0): 25, ("t", 1): 10, ("t", 2): 5}


def test_offsets_json_round_trips() -> None:
    offsets = {("a", 0): 5, ("a", 10): 7, ("b", 1): 0}
    doc = to_json(offsets)
    assert doc == {"a": {"0": 5, "10": 7}, "b": {"1": 0}}
    assert from_json(doc) == offsets


def test_source_options_mirror_spark() -> None:
    opts = SourceOptions.parse({**BOOT, "subscribe": "a, b", "kafka.fetch.max.bytes": "1000",
                                "startingOffsets": '{"a":{"0":3,"1":-2}}',
                                "maxOffsetsPerTrigger": "10", "includeHeaders": "true",
                                "failOnDataLoss": "false"}, streaming=True)
    assert opts.subscription.topics == ("a", "b")
    assert opts.client == {"bootstrap.servers": "127.0.0.1:9092", "fetch.max.bytes": "1000"}
    assert opts.starting.for_partition("a", 0) == 3
    assert opts.starting.for_partition("a", 1) == EARLIEST
    assert opts.starting.for_partition("a", 2) == LATEST  # streaming default for the rest
    assert (opts.max_offsets_per_trigger, opts.include_headers, opts.fail_on_data_loss) == (
        10, True, False)
    batch = SourceOptions.parse({**BOOT, "subscribePattern": "a.*"}, streaming=False)
    assert batch.starting.for_partition("anything", 0) == EARLIEST
    assert batch.subscription.matches("abc") and not batch.subscription.matches("ba")


@pytest.mark.parametrize("bad", [
    {},                                                        # no bootstrap
    {**BOOT},                                                  # no subscription
    {**BOOT, "subscribe": "a", "assign": '{"a":[0]}'},         # two subscriptions
    {**BOOT, "assign": "[0, 1]"},                              # not a topic map
    {**BOOT, "subscribe": "a", "startingOffsets": "latest"},   # batch from latest
    {**BOOT, "subscribe": "a", "endingOffsets": "earliest"},   # batch to earliest
    {**BOOT, "subscribe": "a", "startingOffsets": "{nope"},
    {**BOOT, "subscribe": "a", "failOnDataLoss": "maybe"},
    {**BOOT, "subscribe": "a", "kafka.enable.auto.commit": "true"},
])
def test_bad_source_options_fail_at_planning(bad: dict) -> None:
    with pytest.raises(OptionError):
        SourceOptions.parse(bad, streaming=False)


def test_sink_keeps_its_delivery_guarantee() -> None:
    assert SinkOptions.parse({**BOOT, "topic": "t"}).topic == "t"
    for acks in ("1", "0"):
        with pytest.raises(OptionError):
            SinkOptions.parse({**BOOT, "kafka.acks": acks})
    with pytest.raises(OptionError):
        SinkOptions.parse({**BOOT, "kafka.enable.idempotence": "false"})
