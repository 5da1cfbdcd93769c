"""Transactions in the log: markers, open transactions and the first unstable offset, the
transaction index (contents and Kafka's byte format), fencing, snapshots, crash recovery and
retention.

Transactional batches are built by kafka-python as a transactional producer sends them;
markers with ``build_end_txn_marker`` as the transaction coordinator writes them.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from broker.log.config import LogConfig
from broker.log.log import AppendOrigin, Log
from broker.log.producer_state import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    ProducerStateEntry,
    TransactionCoordinatorFencedError,
    read_snapshot,
    snapshot_file_name,
    write_snapshot,
)
from broker.log.txn_index import ABORTED_TXN_SIZE, AbortedTxn, TransactionIndex
from protocol.errors import ErrorCode
from protocol.record_batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    NO_SEQUENCE,
    BatchHeader,
    InvalidRecordError,
    build_end_txn_marker,
    read_end_txn_marker,
)
from tests.support.log_batches import T0, new_log, plain, producer_batch


def tbatch(
    pid: int, epoch: int, seq: int, n: int = 2, *, transactional: bool = True, size: int = 20
) -> bytearray:
    return producer_batch(pid, epoch, seq, n, transactional=transactional, size=size)


def end(log: Log, pid: int, epoch: int, commit: bool, coordinator_epoch: int = 0) -> int:
    return log.append_end_txn_marker(pid, epoch, coordinator_epoch, commit, T0).first_offset


def aborted(log: Log) -> list[AbortedTxn]:
    return log.collect_aborted_transactions(0, log.log_end_offset)


# -- the marker batch -------------------------------------------------------------------------
def test_end_txn_marker_is_kafkas_control_batch() -> None:
    buf = build_end_txn_marker(42, 3, 7, True, T0)
    h = BatchHeader(buf)
    assert h.is_valid() and h.is_control and h.is_transactional
    assert (h.base_offset, h.producer_id, h.producer_epoch, h.base_sequence) == (0, 42, 3, -1)
    assert (h.record_count, h.last_offset_delta, h.max_timestamp) == (1, 0, T0)
    assert len(buf) == 78  # 61-byte header + one 17-byte record, Kafka's marker size
    assert read_end_txn_marker(buf, 0) == (CONTROL_COMMIT, 7)
    assert read_end_txn_marker(build_end_txn_marker(1, 0, 9, False, T0)) == (CONTROL_ABORT, 9)
    # a decoder other than ours reads the same key (version 0, type) and value (version 0, epoch)
    records = list(DefaultRecordBatch(bytes(buf)))
    assert records[0].key == struct.pack(">hh", 0, 1)
    assert records[0].value == struct.pack(">hi", 0, 7)


def test_read_end_txn_marker_refuses_other_batches() -> None:
    with pytest.raises(InvalidRecordError):
        read_end_txn_marker(tbatch(1, 0, 0))


# -- commit, abort and the first unstable offset ------------------------------------------------
def test_commit_opens_and_closes_the_transaction(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(plain(2), T0)  # 0-1
    assert log.first_undecided_offset is None
    log.append(tbatch(7, 0, 0, 3), T0)  # 2-4
    assert log.first_undecided_offset == 2
    log.append(tbatch(7, 0, 3, 2), T0)  # 5-6: the same transaction
    assert log.first_undecided_offset == 2
    entry = log.producer_state.last_entry(7)
    assert entry is not None and entry.current_txn_first_offset == 2
    assert end(log, 7, 0, True, coordinator_epoch=4) == 7
    assert log.first_undecided_offset is None
    assert entry.current_txn_first_offset == -1 and entry.coordinator_epoch == 4
    assert aborted(log) == []  # commits are not indexed
    assert not list(tmp_path.glob("topic-0/*.txnindex"))  # created with its first entry only


def test_abort_is_indexed_with_kafkas_last_stable_offset(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(tbatch(7, 0, 0, 3), T0)  # 0-2
    marker = end(log, 7, 0, False)  # 3
    assert aborted(log) == [AbortedTxn(7, 0, 3, 4)]  # no other open txn: marker + 1
    raw = (tmp_path / "topic-0" / "00000000000000000000.txnindex").read_bytes()
    assert raw == struct.pack(">hqqqq", 0, 7, 0, marker, 4)
    assert len(raw) == ABORTED_TXN_SIZE == 34


def test_interleaved_transactions_of_several_producers(tmp_path: Path) -> None:
    """The LSO after each step follows Kafka: the earliest open transaction's first offset."""
    log = new_log(tmp_path)
    log.append(tbatch(1, 0, 0), T0)  # 0-1   A opens at 0
    assert log.first_undecided_offset == 0
    log.append(tbatch(2, 0, 0), T0)  # 2-3   B opens at 2
    log.append(plain(1), T0)  # 4      non-transactional
    log.append(tbatch(3, 0, 0), T0)  # 5-6   C opens at 5
    log.append(tbatch(1, 0, 2), T0)  # 7-8   A again
    assert log.first_undecided_offset == 0
    assert end(log, 2, 0, False) == 9  # B aborts while A (first 0) is open: LSO 0
    assert log.first_undecided_offset == 0
    assert end(log, 1, 0, True) == 10  # A commits: C (5) is the earliest open one
    assert log.first_undecided_offset == 5
    log.append(tbatch(2, 0, 2), T0)  # 11-12 B opens again
    assert end(log, 3, 0, False) == 13  # C aborts: the next other open txn is B at 11
    assert log.first_undecided_offset == 11
    assert end(log, 2, 0, False) == 14  # B aborts, nothing else open: 14 + 1
    assert log.first_undecided_offset is None
    assert aborted(log) == [
        AbortedTxn(2, 2, 9, 0),
        AbortedTxn(3, 5, 13, 11),
        AbortedTxn(2, 11, 14, 15),
    ]
    # Kafka's collectAbortedTxns: overlap with [start, upper)
    assert log.collect_aborted_transactions(10, 12) == [
        AbortedTxn(3, 5, 13, 11),
        AbortedTxn(2, 11, 14, 15),
    ]
    assert log.collect_aborted_transactions(0, 2) == []
    assert log.collect_aborted_transactions(0, 3) == [AbortedTxn(2, 2, 9, 0)]


def test_marker_without_open_transaction_is_written_and_sets_epochs(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    assert end(log, 9, 2, False, coordinator_epoch=3) == 0
    assert aborted(log) == []
    entry = log.producer_state.last_entry(9)
    assert entry is not None and entry.producer_epoch == 2 and entry.coordinator_epoch == 3
    assert entry.last_seq == -1 and entry.current_txn_first_offset == -1
    # after a marker alone, Kafka wants the producer's next batch at sequence 0
    log.append(tbatch(9, 2, 0), T0)


def test_marker_with_bumped_epoch_drops_the_old_epochs_batches(tmp_path: Path) -> None:
    """The coordinator aborts a timed-out transaction with the epoch bumped (TV1)."""
    log = new_log(tmp_path)
    log.append(tbatch(5, 0, 0), T0)
    end(log, 5, 1, False)
    entry = log.producer_state.last_entry(5)
    assert entry is not None and entry.producer_epoch == 1 and not entry.batches
    with pytest.raises(InvalidProducerEpochError):
        log.append(tbatch(5, 0, 2), T0)  # the zombie's next batch


# -- fencing and refusals -------------------------------------------------------------------
def test_marker_from_an_older_producer_epoch_is_refused(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(tbatch(7, 3, 0), T0)
    end_before = log.log_end_offset
    with pytest.raises(InvalidProducerEpochError) as e:
        end(log, 7, 2, True)
    assert e.value.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert log.log_end_offset == end_before and log.first_undecided_offset == 0


def test_marker_from_an_older_coordinator_epoch_is_fenced(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(tbatch(7, 0, 0), T0)
    end(log, 7, 0, True, coordinator_epoch=5)
    log.append(tbatch(7, 0, 2), T0)
    with pytest.raises(TransactionCoordinatorFencedError) as e:
        end(log, 7, 0, False, coordinator_epoch=4)
    assert e.value.error_code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    end(log, 7, 0, False, coordinator_epoch=5)  # the same epoch is fine
    assert log.first_undecided_offset is None


def test_non_transactional_write_during_open_transaction(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(tbatch(7, 0, 0), T0)
    with pytest.raises(InvalidTxnStateError) as e:
        log.append(tbatch(7, 0, 2, transactional=False), T0)
    assert e.value.error_code == ErrorCode.INVALID_TXN_STATE
    assert log.log_end_offset == 2


def test_clients_may_not_write_control_batches(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    with pytest.raises(InvalidRecordError) as e:
        log.append(build_end_txn_marker(7, 0, 0, True, T0), T0)
    assert e.value.error_code == ErrorCode.INVALID_RECORD
    with pytest.raises(InvalidRecordError):
        log.append(tbatch(7, 0, NO_SEQUENCE), T0)  # a sequence is required from clients
    assert log.log_end_offset == 0


def test_coordinator_batches_without_sequence_keep_the_epoch_check(tmp_path: Path) -> None:
    """The group coordinator's transactional offset commits: sequence -1, epochs checked."""
    log = new_log(tmp_path)
    co = AppendOrigin.COORDINATOR
    log.append(tbatch(8, 2, NO_SEQUENCE), T0, origin=co)
    log.append(tbatch(8, 2, NO_SEQUENCE), T0, origin=co)  # no duplicate or sequence check
    assert log.log_end_offset == 4 and log.first_undecided_offset == 0
    with pytest.raises(InvalidProducerEpochError):
        log.append(tbatch(8, 1, NO_SEQUENCE), T0, origin=co)
    end(log, 8, 2, True)
    assert log.first_undecided_offset is None


def test_duplicate_transactional_batch_is_answered_with_its_offsets(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    first = log.append(tbatch(7, 0, 0), T0)
    again = log.append(tbatch(7, 0, 0), T0)
    assert again.duplicate and again.first_offset == first.first_offset
    assert log.log_end_offset == 2


# -- active producers (DescribeProducers) -----------------------------------------------------
def test_active_producers_expose_what_describe_producers_needs(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(tbatch(1, 0, 0, 3), T0)
    end(log, 2, 4, False, coordinator_epoch=6)
    by_id = {e.producer_id: e for e in log.producer_state.active_producers()}
    one, two = by_id[1], by_id[2]
    assert (one.producer_epoch, one.last_seq, one.last_timestamp) == (0, 2, T0 + 2)
    assert (one.coordinator_epoch, one.current_txn_first_offset) == (-1, 0)
    assert (two.producer_epoch, two.last_seq, two.coordinator_epoch) == (4, -1, 6)
    assert two.current_txn_first_offset == -1 and two.last_timestamp == T0


# -- the transaction index file -----------------------------------------------------------------
def test_txn_index_appends_in_order_truncates_and_drops_a_torn_entry(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000100.txnindex"
    idx = TransactionIndex(path, 100)
    idx.append(AbortedTxn(1, 90, 105, 106))
    idx.append(AbortedTxn(2, 101, 110, 111))
    with pytest.raises(ValueError):
        idx.append(AbortedTxn(3, 102, 110, 111))
    idx.append(AbortedTxn(3, 111, 120, 121))
    assert path.stat().st_size == 3 * 34
    idx.truncate_to(110)
    assert idx.entries == [AbortedTxn(1, 90, 105, 106)] and path.stat().st_size == 34
    idx.append(AbortedTxn(4, 107, 112, 113))
    idx.close()
    with path.open("ab") as f:
        f.write(AbortedTxn(5, 113, 130, 131).to_bytes()[:20])  # a crash mid-write
    again = TransactionIndex(path, 100)
    assert again.entries == [AbortedTxn(1, 90, 105, 106), AbortedTxn(4, 107, 112, 113)]
    assert path.stat().st_size == 2 * 34
    again.sanity_check()
    assert again.collect(106, 200).aborted == [AbortedTxn(4, 107, 112, 113)]
    again.delete()
    assert not path.exists()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(1, 20), st.integers(0, 30)), max_size=12
    ),
    st.integers(0, 400),
    st.integers(0, 400),
)
def test_collect_matches_the_overlap_rule(
    tmp_path_factory: pytest.TempPathFactory,
    spans: list[tuple[int, int, int]],
    start: int,
    upper: int,
) -> None:
    """collect returns a prefix-complete, in-order subset of the overlapping entries."""
    path = tmp_path_factory.mktemp("idx") / "00000000000000000000.txnindex"
    idx = TransactionIndex(path, 0)
    last = 0
    txns: list[AbortedTxn] = []
    for gap, length, lso_back in spans:
        first = last + gap
        last = first + length
        txn = AbortedTxn(1, first, last, max(last + 1 - lso_back, 0))
        idx.append(txn)
        txns.append(txn)
    result = idx.collect(start, upper)
    expected: list[AbortedTxn] = []
    complete = False
    for t in txns:
        if t.last_offset >= start and t.first_offset < upper:
            expected.append(t)
        if t.last_stable_offset >= upper:
            complete = True
            break
    assert (result.aborted, result.complete) == (expected, complete)
    idx.close()
    assert TransactionIndex(path, 0).entries == txns


def test_collect_across_segments(tmp_path: Path) -> None:
    log = new_log(tmp_path, LogConfig(segment_bytes=400))
    for i in range(6):
        log.append(tbatch(10 + i, 0, 0, 2, size=40), T0)
        end(log, 10 + i, 0, i % 2 == 1)  # aborts for even i
    assert len(log.segments) > 2
    want = aborted(log)
    assert [t.producer_id for t in want] == [10, 12, 14]
    files = sorted(p.name for p in (tmp_path / "topic-0").glob("*.txnindex"))
    assert len(files) >= 2  # each abort went to the segment holding its marker
    for seg in log.segments:
        for t in seg.txn_index.entries:
            nxt = log.segments.index(seg) + 1
            upper = log.segments[nxt].base_offset if nxt < len(log.segments) else 10**9
            assert seg.base_offset <= t.last_offset < upper
    # from the middle: entries of earlier segments that end before start are not returned
    mid = want[1].first_offset
    assert log.collect_aborted_transactions(mid, log.log_end_offset) == want[1:]


# -- snapshots --------------------------------------------------------------------------------
def test_snapshot_round_trip_with_an_open_transaction(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(tbatch(1, 0, 0), T0)  # 0-1
    end(log, 1, 0, True, coordinator_epoch=3)  # 2
    log.append(tbatch(2, 5, 0), T0)  # 3-4, open
    log.append(tbatch(1, 0, 2), T0)  # 5-6, open
    log.close()
    entries = {e.producer_id: e for e in read_snapshot(log.dir / snapshot_file_name(7), 7)}
    assert entries[1].coordinator_epoch == 3 and entries[1].current_txn_first_offset == 5
    assert entries[2].current_txn_first_offset == 3 and entries[2].producer_epoch == 5
    again = Log.load(log.dir, LogConfig(), "topic", 0, clean_shutdown=True)
    assert again.producer_state.scanned_batches == 0
    assert again.first_undecided_offset == 3
    assert list(again.producer_state.ongoing_txns) == [3, 5]
    assert end(again, 2, 5, False, coordinator_epoch=3) == 7
    assert aborted(again) == [AbortedTxn(2, 3, 7, 5)]
    with pytest.raises(TransactionCoordinatorFencedError):
        end(again, 1, 0, True, coordinator_epoch=2)


def test_marker_only_entries_survive_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / snapshot_file_name(10)
    e = ProducerStateEntry(4, 2, coordinator_epoch=8)
    e.last_offset, e.last_timestamp = 9, T0
    write_snapshot(path, 10, [e], sync=False)
    (back,) = read_snapshot(path, 10)
    assert (back.producer_id, back.producer_epoch, back.coordinator_epoch) == (4, 2, 8)
    assert (back.last_offset, back.last_timestamp, len(back.batches)) == (9, T0, 0)


def test_version_1_snapshots_are_still_read(tmp_path: Path) -> None:
    """A snapshot written before transactions (version 1) loads: no open txn, epoch -1."""
    from crc32c import crc32c

    body = struct.pack(">qi", 3, 1) + struct.pack(">qhqb", 6, 1, T0, 1)
    body += struct.pack(">iiqqq", 0, 2, 0, 2, T0)
    data = b"MBPS" + struct.pack(">hI", 1, crc32c(body)) + body
    path = tmp_path / snapshot_file_name(3)
    path.write_bytes(data)
    (entry,) = read_snapshot(path, 3)
    assert (entry.producer_id, entry.last_seq, entry.last_offset) == (6, 2, 2)
    assert (entry.coordinator_epoch, entry.current_txn_first_offset) == (-1, -1)


# -- crash recovery ---------------------------------------------------------------------------
def test_restart_after_crash_rebuilds_open_transactions_and_txn_index(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=600)
    log = new_log(tmp_path, cfg)
    log.append(plain(2), T0)  # 0-1
    log.flush()  # the recovery point is 2: everything after is recovered after the crash
    assert log.recovery_point == 2
    log.append(tbatch(1, 0, 0, size=60), T0)
    log.append(tbatch(2, 0, 0, size=60), T0)
    log.append(tbatch(3, 0, 0, size=60), T0)
    end(log, 2, 0, False)
    log.append(tbatch(1, 0, 2, size=60), T0)
    end(log, 3, 0, True)
    log.append(tbatch(4, 0, 0, size=60), T0)
    end(log, 4, 0, False)
    assert len(log.segments) > 1
    before_aborted = aborted(log)
    before_fuo = log.first_undecided_offset
    before_open = dict(log.producer_state.ongoing_txns)
    leo = log.log_end_offset
    # SIGKILL: no close, no snapshot at the end; the transaction indexes are lost too
    for p in (tmp_path / "topic-0").glob("*.txnindex"):
        p.unlink()
    again = Log.load(log.dir, cfg, "topic", 0, clean_shutdown=False, recovery_point=2)
    assert again.log_end_offset == leo
    assert again.producer_state.scanned_batches > 0
    assert dict(again.producer_state.ongoing_txns) == before_open == {2: 1}
    assert again.first_undecided_offset == before_fuo == 2
    assert aborted(again) == before_aborted and len(before_aborted) == 2
    assert sorted(p.name for p in (tmp_path / "topic-0").glob("*.txnindex"))
    # and the open transaction completes as if nothing had happened
    end(again, 1, 0, False)
    assert again.first_undecided_offset is None
    assert aborted(again)[-1].first_offset == 2


def test_recovery_drops_index_entries_of_markers_that_did_not_survive(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(tbatch(1, 0, 0), T0)  # 0-1
    log.flush()
    end(log, 1, 0, False)  # 2, its abort indexed
    assert aborted(log) == [AbortedTxn(1, 0, 2, 3)]
    seg = log.segments[-1]
    size = seg.size
    log_path = seg.log_path
    # the marker's bytes are torn: recovery cuts them, and the txn index entry must go too
    with log_path.open("r+b") as f:
        f.truncate(size - 10)
    again = Log.load(log.dir, LogConfig(), "topic", 0, clean_shutdown=False, recovery_point=2)
    assert again.log_end_offset == 2
    assert aborted(again) == []
    assert again.first_undecided_offset == 0  # the transaction is open again


def test_corrupt_txn_index_is_rebuilt_after_a_clean_shutdown(tmp_path: Path) -> None:
    log = new_log(tmp_path)
    log.append(tbatch(1, 0, 0), T0)
    end(log, 1, 0, False)
    log.close()
    path = tmp_path / "topic-0" / "00000000000000000000.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 9, 1, 0, 2, 3))  # an unknown version
    again = Log.load(log.dir, LogConfig(), "topic", 0, clean_shutdown=True)
    assert aborted(again) == [AbortedTxn(1, 0, 2, 3)]


# -- retention --------------------------------------------------------------------------------
def test_retention_deletes_txn_indexes_with_their_segments(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=300, retention_bytes=0)
    log = new_log(tmp_path, cfg)
    for i in range(4):
        log.append(tbatch(20 + i, 0, 0, size=40), T0)
        end(log, 20 + i, 0, False)
    d = tmp_path / "topic-0"
    before = sorted(p.name for p in d.glob("*.txnindex"))
    assert len(before) >= 2
    deleted = log.delete_old_segments(T0)
    assert deleted > 0
    remaining = {s.base_offset for s in log.segments}
    for name in before:
        assert (d / name).exists() == (int(name[:20]) in remaining)
    assert all(t.last_offset >= log.log_start_offset for t in aborted(log))


def test_retention_keeps_a_producer_with_an_open_transaction(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=300)
    log = new_log(tmp_path, cfg)
    log.append(tbatch(1, 0, 0, size=80), T0)  # opens at 0
    for _ in range(4):
        log.append(plain(2), T0)
    log.update_config(cfg.with_overrides(retention_bytes=0))
    assert log.delete_old_segments(T0) > 0
    assert log.producer_state.last_entry(1) is not None
    assert log.first_undecided_offset == log.log_start_offset
    end(log, 1, 0, True)
    assert log.first_undecided_offset is None


def test_crash_after_a_roll_snapshot_with_an_open_transaction(tmp_path: Path) -> None:
    """The rebuild starts at a snapshot holding the open transaction; an abort written after
    it gets the transaction's first offset from the snapshot, and index entries below the
    snapshot are kept as they are."""
    cfg = LogConfig(segment_bytes=400)
    log = new_log(tmp_path, cfg)
    log.append(tbatch(1, 0, 0, size=60), T0)  # 0-1, producer 1 opens
    end(log, 1, 0, False)  # 2: an abort below the snapshot
    log.append(tbatch(2, 0, 0, size=60), T0)  # producer 2 opens
    while len(log.segments) < 2:
        log.append(plain(2), T0)
    snap = log.segments[-1].base_offset
    log.flush()
    assert log.recovery_point >= snap and snap in log.producer_snapshot_offsets()
    log.append(plain(1), T0)
    marker = end(log, 2, 0, False)
    want = aborted(log)
    assert want == [AbortedTxn(1, 0, 2, 3), AbortedTxn(2, 3, marker, marker + 1)]
    again = Log.load(log.dir, cfg, "topic", 0, clean_shutdown=False,
                     recovery_point=log.recovery_point)
    assert again.producer_state.loaded_from == snap
    assert aborted(again) == want and again.first_undecided_offset is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from("dcap")), max_size=30))
def test_interleavings_match_kafkas_rules_and_survive_a_crash(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[int, str]]
) -> None:
    """A model of Kafka's rules: data opens a transaction, a marker completes it, an abort is
    indexed with lastStableOffset(completedTxn); a crash-restart rebuilds the same state."""
    d = tmp_path_factory.mktemp("log")
    cfg = LogConfig(segment_bytes=500)
    log = Log(d / "topic-0", cfg, "topic", 0)
    seqs = dict.fromkeys(range(4), 0)
    ongoing: dict[int, int] = {}  # first offset -> producer, in offset order
    open_of: dict[int, int] = {}
    expected: list[AbortedTxn] = []
    for pid, op in ops:
        offset = log.log_end_offset
        if op == "d":
            log.append(tbatch(pid, 0, seqs[pid], 2), T0)
            seqs[pid] += 2
            if pid not in open_of:
                open_of[pid] = offset
                ongoing[offset] = pid
        elif op == "p":
            log.append(plain(1), T0)
        else:
            end(log, pid, 0, op == "c")
            if pid in open_of:
                first = open_of.pop(pid)
                others = [f for f, p in ongoing.items() if p != pid]
                lso = others[0] if others else offset + 1
                del ongoing[first]
                if op == "a":
                    expected.append(AbortedTxn(pid, first, offset, lso))
        assert log.first_undecided_offset == (min(ongoing) if ongoing else None)
    assert aborted(log) == expected
    for p in (d / "topic-0").glob("*.txnindex"):
        p.unlink()
    again = Log.load(log.dir, cfg, "topic", 0, clean_shutdown=False, recovery_point=0)
    assert aborted(again) == expected
    assert dict(again.producer_state.ongoing_txns) == ongoing
