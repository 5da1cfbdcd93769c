"""The example job end to end: its per-minute page counts, from the Parquet sink and from the
output topic, equal the counts computed in plain Python from the generator's seed."""

from __future__ import annotations

from pathlib import Path

from pipeline.jobs import clickstream
from tests.support.broker import BrokerProcess

SEED = 11


def test_demo_job_matches_counts_from_the_seed(spark, broker: BrokerProcess,
                                               tmp_path: Path) -> None:
    from pipeline.jobs import demo

    start_ms = clickstream.default_start_ms(minutes=5)
    result = demo.run(spark, broker.bootstrap, tmp_path, seed=SEED, events=600, minutes=5,
                      start_ms=start_ms, timeout_s=120)

    expected = clickstream.expected_counts(clickstream.generate(SEED, 600, start_ms, minutes=5))
    assert sum(expected.values()) == 600
    assert len({minute for minute, _ in expected}) == 5
    assert result.expected == expected
    assert result.counts == expected, "Parquet sink"
    assert result.topic_counts == expected, "output topic"
