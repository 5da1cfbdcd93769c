"""The follower's log operations: the leader's batches appended as they are, truncation.

Kafka's UnifiedLog.appendAsFollower (origin REPLICATION), truncateTo and
truncateFullyAndStartAt: a follower's log must hold the leader's batches byte for byte at
the same offsets, with producer state, transaction index and leader epochs rebuilt from them.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from broker.log.config import LogConfig
from broker.log.log import Log, UnexpectedAppendOffsetError
from broker.log.producer_state import snapshot_file_name
from protocol.record_batch import CorruptRecordError, iter_batches
from tests.support.log_batches import T0, plain, producer_batch

CFG = LogConfig(segment_bytes=1024, index_interval_bytes=256)


def open_log(path: Path, name: str, cfg: LogConfig = CFG) -> Log:
    return Log(path / name / "topic-0", cfg, "topic", 0)


def fetch_from(leader: Log, offset: int, max_bytes: int = 1 << 20) -> bytes:
    """What a replica fetch at ``offset`` returns (whole batches of one segment)."""
    return bytes(leader.read(offset, max_bytes, None, True))


def replicate(leader: Log, follower: Log, max_bytes: int = 1 << 20) -> int:
    """Fetch and append until the follower reaches the leader's end; returns round trips."""
    rounds = 0
    while follower.log_end_offset < leader.log_end_offset:
        rounds += 1
        assert rounds < 1000
        follower.append_as_follower(fetch_from(leader, follower.log_end_offset, max_bytes), T0)
    return rounds


def all_batches(log: Log) -> list[bytes]:
    out: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = fetch_from(log, offset)
        for pos, h in iter_batches(data):
            if h.last_offset >= offset:
                out.append(data[pos:pos + h.size_in_bytes])
                offset = h.last_offset + 1
    return out


def leader_with_history(tmp_path: Path) -> Log:
    """Plain, idempotent and transactional batches over several segments and two epochs,
    with an aborted and a committed transaction."""
    leader = open_log(tmp_path, "leader")
    for _i in range(6):
        leader.append(plain(3), T0, leader_epoch=1)
    leader.append(producer_batch(7, 0, 0, 2, transactional=True), T0, leader_epoch=1)
    leader.append(producer_batch(8, 0, 0, 3), T0, leader_epoch=2)
    leader.append_end_txn_marker(7, 0, 5, False, T0, leader_epoch=2)
    leader.append(producer_batch(9, 1, 0, 2, transactional=True), T0, leader_epoch=2)
    leader.append_end_txn_marker(9, 1, 5, True, T0, leader_epoch=2)
    for _i in range(6):
        leader.append(plain(4), T0, leader_epoch=3)
    assert leader.num_segments > 2
    return leader


def test_follower_holds_the_leaders_batches_byte_for_byte(tmp_path: Path) -> None:
    leader = leader_with_history(tmp_path)
    follower = open_log(tmp_path, "follower")
    replicate(leader, follower)
    assert follower.log_end_offset == leader.log_end_offset
    assert all_batches(follower) == all_batches(leader)
    assert follower.leader_epoch_cache.entries() == leader.leader_epoch_cache.entries()
    assert follower.collect_aborted_transactions(0, follower.log_end_offset) == \
        leader.collect_aborted_transactions(0, leader.log_end_offset)
    assert follower.producer_state.last_entry(8).last_seq == 2  # type: ignore[union-attr]
    assert follower.first_undecided_offset is None
    assert follower.num_segments > 1


def test_small_fetches_and_reopen_keep_the_same_state(tmp_path: Path) -> None:
    leader = leader_with_history(tmp_path)
    follower = open_log(tmp_path, "follower")
    assert replicate(leader, follower, max_bytes=1) > 5  # one batch per fetch (KIP-74)
    follower.close()
    again = open_log(tmp_path, "follower")
    assert all_batches(again) == all_batches(leader)
    assert again.leader_epoch_cache.entries() == leader.leader_epoch_cache.entries()
    assert again.collect_aborted_transactions(0, again.log_end_offset) == \
        leader.collect_aborted_transactions(0, leader.log_end_offset)


def test_open_transaction_is_replicated_and_marker_closes_it(tmp_path: Path) -> None:
    leader = open_log(tmp_path, "leader")
    follower = open_log(tmp_path, "follower")
    first = leader.append(producer_batch(4, 0, 0, 2, transactional=True), T0).first_offset
    replicate(leader, follower)
    assert follower.first_undecided_offset == first
    leader.append_end_txn_marker(4, 0, 1, False, T0)
    replicate(leader, follower)
    assert follower.first_undecided_offset is None
    [txn] = follower.collect_aborted_transactions(0, follower.log_end_offset)
    assert (txn.producer_id, txn.first_offset, txn.last_offset) == (4, first, first + 2)


def test_no_sequence_checks_for_replicated_batches(tmp_path: Path) -> None:
    # A leader's log may hold sequences a client append would refuse here (a gap after the
    # producer's earlier batches were deleted): the follower keeps them as they are.
    follower = open_log(tmp_path, "follower")
    src = open_log(tmp_path, "src")
    src.append(producer_batch(3, 0, 0, 2), T0)
    follower.append_as_follower(fetch_from(src, 0), T0)
    gap = open_log(tmp_path, "gap")
    gap.append(plain(2), T0)
    gap.append(producer_batch(3, 0, 40, 2), T0)  # sequence 40: out of order for pid 3
    data = fetch_from(gap, 2)
    info = follower.append_as_follower(data, T0)
    assert info is not None and info.first_offset == 2
    assert follower.producer_state.last_entry(3).last_seq == 41  # type: ignore[union-attr]


def test_gaps_in_offsets_are_kept(tmp_path: Path) -> None:
    leader = open_log(tmp_path, "leader")
    leader.append(plain(2), T0)
    data = bytearray(fetch_from(leader, 0))
    struct.pack_into(">q", data, 0, 10)  # base offset 10: CRC does not cover it
    follower = open_log(tmp_path, "follower")
    info = follower.append_as_follower(bytes(data), T0)
    assert info is not None and (info.first_offset, info.last_offset) == (10, 11)
    assert follower.log_end_offset == 12
    assert [h.base_offset for _p, h in iter_batches(fetch_from(follower, 10))] == [10]


def test_bad_batches_are_refused_and_change_nothing(tmp_path: Path) -> None:
    leader = open_log(tmp_path, "leader")
    leader.append(plain(2), T0)
    leader.append(plain(2), T0)
    follower = open_log(tmp_path, "follower")
    follower.append_as_follower(fetch_from(leader, 0, 1), T0)
    assert follower.log_end_offset == 2
    with pytest.raises(UnexpectedAppendOffsetError):
        follower.append_as_follower(fetch_from(leader, 0), T0)  # offset 0 again
    corrupt = bytearray(fetch_from(leader, 2))
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        follower.append_as_follower(bytes(corrupt), T0)
    assert follower.log_end_offset == 2
    whole = fetch_from(leader, 2)
    assert follower.append_as_follower(whole[:-5], T0) is None  # a partial batch only
    assert follower.append_as_follower(whole, T0) is not None
    assert all_batches(follower) == all_batches(leader)


def test_truncate_to_removes_everything_at_and_after(tmp_path: Path) -> None:
    leader = leader_with_history(tmp_path)
    follower = open_log(tmp_path, "follower")
    replicate(leader, follower)
    epoch2_start = dict((e.epoch, e.start_offset) for e in leader.leader_epoch_cache.entries())[2]
    segments_before = follower.num_segments
    assert follower.truncate_to(epoch2_start)
    assert follower.log_end_offset == epoch2_start
    assert follower.num_segments < segments_before
    assert follower.latest_epoch == 1
    # the open transaction of producer 7 (its marker was cut) is open again
    assert follower.first_undecided_offset is not None
    assert follower.collect_aborted_transactions(0, epoch2_start) == []
    assert follower.producer_state.last_entry(8) is None
    assert all(s <= epoch2_start for s in follower.producer_state.snapshots)
    assert all_batches(follower) == [
        b for b in all_batches(leader) if struct.unpack_from(">q", b)[0] < epoch2_start]
    assert not follower.truncate_to(epoch2_start)  # nothing at or past the end
    # fetching again rebuilds the same log
    replicate(leader, follower)
    assert all_batches(follower) == all_batches(leader)
    assert follower.leader_epoch_cache.entries() == leader.leader_epoch_cache.entries()
    follower.close()
    again = open_log(tmp_path, "follower")
    assert all_batches(again) == all_batches(leader)


def test_truncate_inside_a_batch_removes_the_whole_batch(tmp_path: Path) -> None:
    follower = open_log(tmp_path, "follower")
    leader = open_log(tmp_path, "leader")
    leader.append(plain(3), T0)
    leader.append(plain(3), T0)
    replicate(leader, follower)
    follower.truncate_to(4)
    assert follower.log_end_offset == 3
    assert [h.base_offset for _p, h in iter_batches(fetch_from(follower, 0))] == [0]


def test_truncate_fully_and_start_at(tmp_path: Path) -> None:
    leader = leader_with_history(tmp_path)
    follower = open_log(tmp_path, "follower")
    replicate(leader, follower)
    follower.truncate_fully_and_start_at(1000)
    assert (follower.log_start_offset, follower.log_end_offset) == (1000, 1000)
    assert follower.num_segments == 1
    assert len(follower.leader_epoch_cache) == 0
    assert follower.producer_state.producer_id_count == 0
    assert not (follower.dir / snapshot_file_name(0)).exists()
    assert sorted(p.name for p in follower.dir.glob("*.log")) == [f"{1000:020d}.log"]
    follower.close()
    again = open_log(tmp_path, "follower")
    assert (again.log_start_offset, again.log_end_offset) == (1000, 1000)


def test_truncate_to_at_or_below_the_start_empties_the_log(tmp_path: Path) -> None:
    leader = leader_with_history(tmp_path)
    follower = open_log(tmp_path, "follower")
    replicate(leader, follower)
    assert follower.truncate_to(0)
    assert (follower.log_start_offset, follower.log_end_offset) == (0, 0)
    replicate(leader, follower)
    assert all_batches(follower) == all_batches(leader)


def test_truncate_to_the_end_drops_an_epoch_that_wrote_nothing(tmp_path: Path) -> None:
    """A replica that became leader in an epoch and appended nothing before another was
    elected: truncating to its end (the leader's answer for its previous epoch) removes that
    epoch's entry, on disk too, so its next fetch no longer names an epoch the leader lacks."""
    log = open_log(tmp_path, "replica")
    log.append(plain(3), T0, leader_epoch=1)
    log.maybe_assign_epoch_start_offset(2, log.log_end_offset)
    assert log.latest_epoch == 2
    assert not log.truncate_to(log.log_end_offset)
    assert log.latest_epoch == 1
    assert log.log_end_offset == 3
    log.close()
    assert open_log(tmp_path, "replica").latest_epoch == 1
