"""The replica fetcher's pure rules: Kafka's fetcher id and getOffsetTruncationState."""

from __future__ import annotations

from pathlib import Path

from broker.interbroker.replica_fetcher import (
    EpochEndOffset,
    _java_string_hash,
    fetcher_id,
    truncation_offset,
)
from broker.log.config import LogConfig
from broker.log.log import Log
from broker.replica.partition import Partition
from tests.support.log_batches import T0, plain


def test_fetcher_id_is_kafkas() -> None:
    assert _java_string_hash("hello") == 99162322  # Java's "hello".hashCode()
    assert _java_string_hash("") == 0
    assert _java_string_hash("polygenelubricants") == -2147483648  # Integer.MIN_VALUE
    assert all(fetcher_id(("t", p), 1) == 0 for p in range(5))
    ids = {fetcher_id(("topic", p), 3) for p in range(30)}
    assert ids == {0, 1, 2}


def follower(tmp_path: Path, epochs: list[tuple[int, int]]) -> Partition:
    """A follower whose log holds ``count`` records in each ``(epoch, count)``."""
    log = Log(tmp_path / "t-0", LogConfig(), "t", 0)
    for epoch, count in epochs:
        for _ in range(count):
            log.append(plain(1), T0, leader_epoch=epoch)
    p = Partition("t", 0, log, False)
    p.high_watermark = 2
    return p


def test_truncation_to_the_leaders_end_of_a_shared_epoch(tmp_path: Path) -> None:
    p = follower(tmp_path, [(1, 3), (2, 4)])  # epoch 1: [0, 3), epoch 2: [3, 7)
    assert truncation_offset(p, EpochEndOffset(2, 5)) == (5, True)  # divergent suffix
    assert truncation_offset(p, EpochEndOffset(2, 9)) == (7, True)  # leader is ahead
    assert truncation_offset(p, EpochEndOffset(1, 3)) == (3, True)


def test_an_epoch_the_follower_lacks_asks_again(tmp_path: Path) -> None:
    p = follower(tmp_path, [(1, 3), (3, 4)])  # no epoch 2 here
    # the leader's largest epoch at or below 3 is 2, ending at 5: cut to the end of this
    # replica's largest epoch below 2 (epoch 1 ends at 3) and ask again
    assert truncation_offset(p, EpochEndOffset(2, 5)) == (3, False)


def test_unknown_answers(tmp_path: Path) -> None:
    p = follower(tmp_path, [(4, 6)])
    assert truncation_offset(p, EpochEndOffset(-1, -1)) == (2, True)  # to the HW
    assert truncation_offset(p, EpochEndOffset(-1, 4)) == (4, True)
    # an epoch below every one here: the cache answers it ending where epoch 4 starts
    # (Kafka's endOffsetFor), so everything goes
    assert truncation_offset(p, EpochEndOffset(1, 4)) == (0, True)


def test_an_epoch_led_without_appends_is_dropped_by_the_truncation(tmp_path: Path) -> None:
    """This replica led in epoch 3 and appended nothing; the leader elected after it never
    had epoch 3 and answers epoch 2 ending at this replica's end. The truncation there
    changes no record but drops epoch 3, so the next fetch names epoch 2 as its last fetched
    one and the leader finds no divergence (with epoch 3 kept it would answer a DivergingEpoch
    to every fetch, and the follower would never append again)."""
    p = follower(tmp_path, [(1, 3), (2, 4)])
    p.make_leader(3)
    assert p.log.latest_epoch == 3
    offset, completed = truncation_offset(p, EpochEndOffset(2, 7))
    assert (offset, completed) == (7, True)
    assert not p.truncate_to(offset)
    assert p.log.latest_epoch == 2
    assert p.log_end_offset == 7
