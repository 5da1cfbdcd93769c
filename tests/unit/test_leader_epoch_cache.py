"""The leader epoch cache against Kafka's semantics: assignment, end offsets, truncation from
either end, the checkpoint file (round trip, torn and malformed files), and a state machine
checking it against a plain model of Kafka's TreeMap-based cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.log.leader_epoch_cache import (
    LEADER_EPOCH_CHECKPOINT_FILE,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEntry,
    LeaderEpochCheckpointError,
    LeaderEpochFileCache,
    read_leader_epoch_checkpoint,
    write_leader_epoch_checkpoint,
)

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def cache_of(tmp_path: Path, *entries: tuple[int, int]) -> LeaderEpochFileCache:
    cache = LeaderEpochFileCache(tmp_path / LEADER_EPOCH_CHECKPOINT_FILE)
    for epoch, offset in entries:
        cache.assign(epoch, offset)
    return cache


def test_assign_keeps_the_first_offset_of_each_epoch(tmp_path: Path) -> None:
    cache = cache_of(tmp_path)
    assert cache.assign(2, 6)
    assert not cache.assign(2, 7), "the latest epoch from a later offset changes nothing"
    assert cache.assign(3, 10)
    assert cache.entries() == [(2, 6), (3, 10)]
    assert cache.latest_epoch == 3


def test_assign_with_an_earlier_offset_for_the_latest_epoch_replaces_it(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (2, 6), (3, 10))
    assert cache.assign(3, 8)
    assert cache.entries() == [(2, 6), (3, 8)]


def test_a_non_monotonic_entry_truncates_the_entries_it_contradicts(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (2, 6), (3, 8), (4, 11))
    assert cache.assign(3, 9)  # epoch 3 again: 3 and 4 go
    assert cache.entries() == [(2, 6), (3, 9)]
    assert cache.assign(5, 7)  # a later epoch at an earlier offset: 3 goes
    assert cache.entries() == [(2, 6), (5, 7)]


def test_negative_entries_are_refused(tmp_path: Path) -> None:
    cache = cache_of(tmp_path)
    with pytest.raises(ValueError):
        cache.assign(-1, 0)
    with pytest.raises(ValueError):
        cache.assign(0, -1)


def test_end_offset_for_follows_kafka(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (2, 6), (3, 8), (5, 11))
    leo = 20
    assert cache.end_offset_for(UNDEFINED_EPOCH, leo) == UNDEFINED
    assert cache.end_offset_for(5, leo) == (5, leo), "the latest epoch ends at the log end"
    assert cache.end_offset_for(6, leo) == UNDEFINED, "beyond the latest"
    assert cache.end_offset_for(2, leo) == (2, 8)
    assert cache.end_offset_for(3, leo) == (3, 11)
    assert cache.end_offset_for(4, leo) == (3, 11), "a gap answers the epoch below it"
    assert cache.end_offset_for(1, leo) == (1, 6), "below the earliest: its start offset"
    assert cache_of(tmp_path).end_offset_for(0, leo) == UNDEFINED, "an empty cache"


def test_epoch_for_offset(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (2, 6), (3, 8))
    assert [cache.epoch_for_offset(o) for o in (5, 6, 7, 8, 100)] == [None, 2, 2, 3, 3]


def test_truncate_from_end_removes_entries_at_or_after_the_offset(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (2, 6), (3, 8), (4, 11))
    assert not cache.truncate_from_end(12)
    assert not cache.truncate_from_end(-1)
    assert cache.truncate_from_end(8)
    assert cache.entries() == [(2, 6)] and cache.latest_epoch == 2
    assert cache.truncate_from_end(0)
    assert cache.entries() == [] and cache.latest_epoch == UNDEFINED_EPOCH


def test_truncate_from_start_moves_the_first_kept_epoch_to_the_new_start(tmp_path: Path
                                                                       ) -> None:
    cache = cache_of(tmp_path, (2, 6), (3, 8), (4, 11))
    assert not cache.truncate_from_start(5)
    assert cache.truncate_from_start(9)
    assert cache.entries() == [(3, 9), (4, 11)]
    assert not cache.truncate_from_start(9), "already starts there"
    assert cache.truncate_from_start(11)
    assert cache.entries() == [(4, 11)]
    assert cache.truncate_from_start(30), "past every entry: the latest stays, from there"
    assert cache.entries() == [(4, 30)]


# -- the checkpoint file --------------------------------------------------------------------------

def test_checkpoint_round_trip_in_kafkas_format(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (0, 0), (3, 1200), (7, 99_999_999_999))
    assert cache.dirty
    assert cache.write_if_dirty()
    assert not cache.dirty and not cache.write_if_dirty(), "nothing changed since"
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    assert path.read_text() == "0\n3\n0 0\n3 1200\n7 99999999999\n"
    again = LeaderEpochFileCache.load(tmp_path)
    assert again.entries() == cache.entries()
    assert again.latest_epoch == 7 and not again.dirty
    assert not list(tmp_path.glob("*.tmp")), "the temp file was renamed over"


def test_kafka_written_checkpoint_is_read(tmp_path: Path) -> None:
    """Kafka splits entry lines on any whitespace."""
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    path.write_text("0\n2\n0  0\n4\t57\n")
    assert read_leader_epoch_checkpoint(path) == [EpochEntry(0, 0), EpochEntry(4, 57)]


@pytest.mark.parametrize("text", ["", "0\n", "0"])
def test_torn_checkpoint_before_any_entry_reads_as_empty(tmp_path: Path, text: str) -> None:
    """Kafka's CheckpointReadBuffer: a file ending before the count line has no entries."""
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    path.write_text(text)
    assert read_leader_epoch_checkpoint(path) == []


def test_missing_checkpoint_reads_as_empty(tmp_path: Path) -> None:
    assert read_leader_epoch_checkpoint(tmp_path / LEADER_EPOCH_CHECKPOINT_FILE) == []


@pytest.mark.parametrize("text", [
    "1\n1\n0 0\n",  # another version
    "0\n2\n0 0\n",  # fewer entries than announced (a torn file Kafka refuses)
    "0\n1\n0 0\n3 9\n",  # more
    "0\n1\n0 0 7\n",  # three fields
    "0\n1\nzero 0\n",  # not a number
    "x\n",
    "0\ntwo\n",
])
def test_malformed_checkpoint_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    path.write_text(text)
    with pytest.raises(LeaderEpochCheckpointError):
        read_leader_epoch_checkpoint(path)


def test_a_failed_write_leaves_the_cache_dirty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    from broker.log import disk

    cache = cache_of(tmp_path, (0, 0))

    def no_space(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk, "write", no_space)
    with pytest.raises(OSError):
        cache.write_if_dirty()
    assert cache.dirty
    monkeypatch.undo()
    assert cache.write_if_dirty()
    assert read_leader_epoch_checkpoint(cache.path) == [EpochEntry(0, 0)]


def test_a_deleted_partition_dir_is_not_a_write_failure(tmp_path: Path) -> None:
    """A log deleted while a flush writes its checkpoint (Kafka's writeIfDirExists)."""
    d = tmp_path / "t-0"
    d.mkdir()
    cache = LeaderEpochFileCache(d / LEADER_EPOCH_CHECKPOINT_FILE)
    cache.assign(0, 0)
    d.rmdir()
    assert not cache.write_if_dirty()
    assert not d.exists()


def test_write_checkpoint_helper_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / LEADER_EPOCH_CHECKPOINT_FILE
    write_leader_epoch_checkpoint(path, [EpochEntry(1, 5)])
    write_leader_epoch_checkpoint(path, [])
    assert path.read_text() == "0\n0\n"
    assert read_leader_epoch_checkpoint(path) == []


# -- the state machine ----------------------------------------------------------------------------

class _Model:
    """Kafka's cache written plainly: a dict epoch -> start offset, searched linearly."""

    def __init__(self) -> None:
        self.epochs: dict[int, int] = {}

    def sorted(self) -> list[tuple[int, int]]:
        return sorted(self.epochs.items())

    def assign(self, epoch: int, offset: int) -> None:
        entries = self.sorted()
        if entries and entries[-1][0] == epoch and entries[-1][1] <= offset:
            return
        while entries and (entries[-1][0] >= epoch or entries[-1][1] >= offset):
            del self.epochs[entries.pop()[0]]
        self.epochs[epoch] = offset

    def end_offset_for(self, requested: int, leo: int) -> tuple[int, int]:
        entries = self.sorted()
        if requested == UNDEFINED_EPOCH:
            return UNDEFINED
        if entries and entries[-1][0] == requested:
            return requested, leo
        higher = [e for e in entries if e[0] > requested]
        if not higher:
            return UNDEFINED
        floor = [e for e in entries if e[0] <= requested]
        return (floor[-1][0] if floor else requested), higher[0][1]

    def truncate_from_end(self, end: int) -> None:
        entries = self.sorted()
        if end >= 0 and entries and entries[-1][1] >= end:
            for e, o in entries:
                if o >= end:
                    del self.epochs[e]

    def truncate_from_start(self, start: int) -> None:
        removed = [(e, o) for e, o in self.sorted() if o <= start]
        for e, _o in removed:
            del self.epochs[e]
        if removed:
            self.epochs[removed[-1][0]] = start


class EpochCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="epochs-"))
        self.cache = LeaderEpochFileCache(self.dir / LEADER_EPOCH_CHECKPOINT_FILE)
        self.model = _Model()

    @rule(epoch=st.integers(0, 12), offset=st.integers(0, 200))
    def assign(self, epoch: int, offset: int) -> None:
        self.cache.assign(epoch, offset)
        self.model.assign(epoch, offset)

    @rule(end=st.integers(-1, 210))
    def truncate_from_end(self, end: int) -> None:
        self.cache.truncate_from_end(end)
        self.model.truncate_from_end(end)

    @rule(start=st.integers(0, 210))
    def truncate_from_start(self, start: int) -> None:
        self.cache.truncate_from_start(start)
        self.model.truncate_from_start(start)

    @rule(requested=st.integers(-1, 14), leo=st.integers(0, 300))
    def end_offset_for(self, requested: int, leo: int) -> None:
        assert (self.cache.end_offset_for(requested, leo)
                == self.model.end_offset_for(requested, leo))

    @rule()
    def checkpoint_and_reload(self) -> None:
        self.cache.write_if_dirty()
        self.cache = LeaderEpochFileCache.load(self.dir)

    def teardown(self) -> None:
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)

    @invariant()
    def same_entries_strictly_growing(self) -> None:
        entries = self.cache.entries()
        assert [tuple(e) for e in entries] == self.model.sorted()
        for (e1, o1), (e2, o2) in zip(entries, entries[1:], strict=False):
            assert e1 < e2 and o1 < o2
        latest = entries[-1].epoch if entries else UNDEFINED_EPOCH
        assert self.cache.latest_epoch == latest


EpochCacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25,
                                               deadline=None)
test_epoch_cache_matches_kafkas_model = EpochCacheMachine.TestCase
