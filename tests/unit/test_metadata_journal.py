"""The topic metadata's journal: a change is recorded whole or not at all, replayed once onto
the snapshot it follows, and compacted into a new snapshot as it grows."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from broker.log import disk
from broker.metadata.file_store import MetadataStore


def _store(path: Path) -> MetadataStore:
    store = MetadataStore(path)
    store.load()
    return store


def _topics(store: MetadataStore) -> dict[str, tuple[str, int, dict[str, str]]]:
    return {name: (str(t.topic_id), t.partitions, t.configs) for name, t in store.topics.items()}


def test_changes_survive_a_reload_without_rewriting_the_snapshot(tmp_path: Path) -> None:
    store = _store(tmp_path)
    snapshot = store.path.read_bytes()
    a = store.add("a", 3, {"retention.ms": "1000"})
    store.add("b", 1, {})
    store.set_partitions("b", 4)
    store.set_configs("a", {"cleanup.policy": "compact"})
    store.add("c", 2, {})
    store.remove("c")
    assert store.path.read_bytes() == snapshot, "topic changes only append to the journal"
    again = _store(tmp_path)
    assert _topics(again) == _topics(store) == {
        "a": (str(a.topic_id), 3, {"cleanup.policy": "compact"}),
        "b": (str(store.topics["b"].topic_id), 4, {}),
    }
    assert set(again.by_id) == {t.topic_id for t in again.topics.values()}
    assert again.cluster_id == store.cluster_id


def test_a_torn_last_line_is_dropped_whole_and_cut_off(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add("kept", 2, {})
    store.add("torn", 5, {})
    data = store.journal_path.read_bytes()
    store.journal_path.write_bytes(data[:-7])  # a crash in the middle of the last append
    again = _store(tmp_path)
    assert set(again.topics) == {"kept"}
    again.add("next", 1, {})  # appended after the last whole line, not after the torn bytes
    assert set(_store(tmp_path).topics) == {"kept", "next"}


def test_a_corrupt_line_ends_the_replay(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add("first", 1, {})
    store.add("second", 1, {})
    lines = store.journal_path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"second", b"secund")  # the checksum no longer matches
    store.journal_path.write_bytes(b"".join(lines))
    assert set(_store(tmp_path).topics) == {"first"}


def test_compaction_writes_a_snapshot_and_starts_the_journal_over(tmp_path: Path) -> None:
    store = _store(tmp_path)
    generation = store.generation
    for i in range(MetadataStore.MIN_COMPACTION_RECORDS):
        store.add(f"t{i}", 1, {})
    assert store.generation == generation + 1
    assert store.journal_records == 0
    assert len(store.journal_path.read_bytes().splitlines()) == 1  # only its generation
    doc = json.loads(store.path.read_text())
    assert len(doc["topics"]) == MetadataStore.MIN_COMPACTION_RECORDS
    store.add("after", 1, {})
    assert _topics(_store(tmp_path)) == _topics(store)


def test_a_journal_older_than_the_snapshot_is_not_replayed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add("gone", 1, {})
    store.save()
    store.remove("gone")
    store.add("gone", 2, {})  # the same name again, a new id
    old_journal = store.journal_path.read_bytes()
    store.save()
    # A crash after the new snapshot but before its fresh journal: the old journal remains.
    store.journal_path.write_bytes(old_journal)
    again = _store(tmp_path)
    assert _topics(again) == _topics(store)
    assert len(again.by_id) == 1


def test_a_snapshot_without_journal_or_generation_loads(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.add("t", 2, {})
    store.save()
    doc = json.loads(store.path.read_text())
    del doc["generation"]  # as an older broker wrote it, with no journal beside it
    store.path.write_text(json.dumps(doc))
    store.journal_path.unlink()
    again = _store(tmp_path)
    assert _topics(again) == _topics(store)
    again.add("u", 1, {})
    assert set(_store(tmp_path).topics) == {"t", "u"}


def test_a_failed_append_records_nothing_and_leaves_the_journal_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _store(tmp_path)
    store.add("before", 1, {})
    real_write = disk.write

    def half_then_full(fd: int, data: memoryview) -> int:
        real_write(fd, data[:5])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk, "write", half_then_full)
    with pytest.raises(OSError):
        store.add("refused", 1, {})
    assert "refused" not in store.topics
    monkeypatch.setattr(disk, "write", real_write)
    store.add("after", 1, {})
    assert set(_store(tmp_path).topics) == {"before", "after"}


def test_every_change_moves_the_epoch(tmp_path: Path) -> None:
    store = _store(tmp_path)
    epochs = [store.epoch]
    store.add("t", 1, {})
    epochs.append(store.epoch)
    store.set_partitions("t", 2)
    epochs.append(store.epoch)
    store.set_configs("t", {"retention.ms": "5"})
    epochs.append(store.epoch)
    store.remove("t")
    epochs.append(store.epoch)
    assert epochs == sorted(set(epochs))
