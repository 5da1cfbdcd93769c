"""A crash at each step of the cleaner's segment swap, then a load: nothing lost, nothing
duplicated.

The same log is built twice. One copy is cleaned for real (its cleaned segment merges several
old ones); into the other copy the cleaned segment's files are put exactly as a crash at each
step of ``Log.replace_segments`` would leave them (``.cleaned`` files, a half-done rename to
``.swap``, old segments partly or wholly renamed ``.deleted``, the new files partly renamed to
their final names). Loading must give either the log as it was (before the ``.swap`` files
are all there) or the cleaned log (from then on), with strictly increasing offsets, no
leftover files, the aborted transactions of the cleaned log, and a log that takes appends.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from broker.log.cleaner import CleanerConfig, LogCleaner
from broker.log.config import LogConfig
from broker.log.log import Log
from broker.log.manager import LogManager
from protocol.record_batch import iter_batches

T0 = 1_700_000_000_000
CONFIG = LogConfig(cleanup_policy="compact", segment_bytes=700, min_cleanable_dirty_ratio=0.01)
SUFFIXES = (".log", ".index", ".timeindex", ".txnindex")


def batch(recs: list[tuple[str, str]], *, pid: int = -1, epoch: int = -1, seq: int = -1,
          transactional: bool = False) -> bytearray:
    b = DefaultRecordBatchBuilder(2, 0, transactional, pid, epoch, seq, 1 << 20)
    for i, (k, v) in enumerate(recs):
        b.append(i, timestamp=T0 + i, key=k.encode(), value=v.encode(), headers=[])
    return bytearray(b.build())


def build(log_dir: Path) -> None:
    """Small segments with overwritten keys and an aborted transaction, cleanly shut down."""
    lm = LogManager([log_dir], CONFIG)
    lm.load()
    log = lm.create_log("t", 0, CONFIG)
    log.append(batch([("x", "aborted")], pid=5, epoch=0, seq=0, transactional=True), T0)
    for r in range(24):
        log.append(batch([(f"k{r % 5}", f"v{r}")]), T0)
        if r == 3:
            log.append_end_txn_marker(5, 0, 0, False, T0)
        if r % 3 == 2:
            log.roll(T0)
    log.append(batch([("k0", "active")]), T0)
    lm.shutdown()


def records(log: Log) -> list[tuple[int, bytes, bytes]]:
    out = []
    for seg in log.segments:
        data = seg.read_bytes(0, seg.size)
        for pos, h in iter_batches(data):
            b = DefaultRecordBatch(bytes(data[pos : pos + h.size_in_bytes]))
            assert b.validate_crc()
            out += [(r.offset, r.key, r.value) for r in b if not b.is_control_batch]
    offsets = [o for o, _k, _v in out]
    assert offsets == sorted(set(offsets)), "duplicate or unordered offsets"
    return out


def open_log(log_dir: Path, recovery_point: int) -> Log:
    return Log.load(log_dir / "t-0", CONFIG, "t", 0, clean_shutdown=False,
                    recovery_point=recovery_point)


def aborted(log: Log) -> list[tuple[int, int, int]]:
    return [(t.producer_id, t.first_offset, t.last_offset)
            for t in log.collect_aborted_transactions(0, log.log_end_offset)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("swap")
    before_dir = root / "before"
    build(before_dir)
    cleaned_dir = root / "cleaned"
    shutil.copytree(before_dir, cleaned_dir)
    lm = LogManager([cleaned_dir], CONFIG)
    lm.load()
    log = lm.logs[("t", 0)]
    old_bases = [s.base_offset for s in log.segments]
    assert LogCleaner(CleanerConfig(), lm).clean_once(T0 + 1000)
    new_bases = [s.base_offset for s in log.segments]
    lm.shutdown()
    # the first group: the cleaned segment at base 0 replaced old segments [0, next new base)
    group = [b for b in old_bases if b < new_bases[1]]
    assert len(group) >= 2, "the test needs a group of several segments"
    before = open_log(before_dir, 0)
    after = open_log(cleaned_dir, 0)
    group_end = new_bases[1]
    # a crash state has the first group swapped (or not), the rest of the log as it was
    swapped_first = [r for r in records(after) if r[0] < group_end] + [
        r for r in records(before) if r[0] >= group_end]
    facts = {
        "before_dir": before_dir, "cleaned_dir": cleaned_dir, "group": group,
        "before": records(before), "after": swapped_first, "end": before.log_end_offset,
        "aborted_after": aborted(after),
    }
    assert all(t[2] < group_end for t in facts["aborted_after"])  # type: ignore[attr-defined]
    assert facts["before"] != facts["after"]
    assert after.log_end_offset == before.log_end_offset
    before.close()
    after.close()
    return facts


def _name(base: int, suffix: str) -> str:
    return f"{base:020d}{suffix}"


def _put_cleaned(facts: dict[str, object], target: Path, suffix_of: dict[str, str]) -> None:
    """Copy the cleaned segment (base 0) into ``target`` with a suffix per file kind."""
    src = Path(str(facts["cleaned_dir"])) / "t-0"
    for kind in SUFFIXES:
        path = src / _name(0, kind)
        if path.exists():
            shutil.copy2(path, target / (_name(0, kind) + suffix_of.get(kind, "")))


def _delete_old(target: Path, base: int, kinds: tuple[str, ...] = SUFFIXES) -> None:
    for kind in kinds:
        path = target / _name(base, kind)
        if path.exists():
            os.rename(path, target / (_name(base, kind) + ".deleted"))


def _state(facts: dict[str, object], target: Path, step: str) -> None:
    group = list(facts["group"])  # type: ignore[call-overload]
    if step == "cleaned":
        _put_cleaned(facts, target, dict.fromkeys(SUFFIXES, ".cleaned"))
    elif step == "half_swapped":
        _put_cleaned(facts, target, {".index": ".swap", ".timeindex": ".swap",
                                     ".txnindex": ".swap", ".log": ".cleaned"})
    elif step == "swapped":
        _put_cleaned(facts, target, dict.fromkeys(SUFFIXES, ".swap"))
    elif step == "first_deleted":
        _put_cleaned(facts, target, dict.fromkeys(SUFFIXES, ".swap"))
        _delete_old(target, group[0])
    elif step == "second_half_deleted":
        _put_cleaned(facts, target, dict.fromkeys(SUFFIXES, ".swap"))
        _delete_old(target, group[0])
        _delete_old(target, group[1], (".index", ".timeindex", ".txnindex"))
    elif step == "all_deleted":
        _put_cleaned(facts, target, dict.fromkeys(SUFFIXES, ".swap"))
        for base in group:
            _delete_old(target, base)
    elif step == "indexes_final":
        for base in group:
            _delete_old(target, base)
        _put_cleaned(facts, target, {".log": ".swap"})
    elif step == "done":
        for base in group:
            _delete_old(target, base)
        _put_cleaned(facts, target, {})
    else:
        raise AssertionError(step)


BEFORE_SWAP = ["cleaned", "half_swapped"]
AFTER_SWAP = ["swapped", "first_deleted", "second_half_deleted", "all_deleted",
              "indexes_final", "done"]


@pytest.mark.parametrize("recovery_at_end", [False, True], ids=["recover-all", "recovered"])
@pytest.mark.parametrize("step", BEFORE_SWAP + AFTER_SWAP)
def test_a_crash_at_each_step_of_the_swap_loses_and_duplicates_nothing(
    built: dict[str, object], tmp_path: Path, step: str, recovery_at_end: bool
) -> None:
    root = tmp_path / "crash"
    shutil.copytree(Path(str(built["before_dir"])), root)
    target = root / "t-0"
    _state(built, target, step)
    end = int(built["end"])  # type: ignore[call-overload]
    log = open_log(root, end if recovery_at_end else 0)
    try:
        got = records(log)
        expected = built["before"] if step in BEFORE_SWAP else built["after"]
        assert got == expected
        assert log.log_end_offset == end
        leftovers = [p.name for p in target.iterdir()
                     if p.name.endswith((".cleaned", ".swap", ".deleted"))]
        assert leftovers == []
        if step in AFTER_SWAP:
            assert aborted(log) == built["aborted_after"]
        # the loaded log takes appends and serves reads from every offset it holds
        info = log.append(batch([("k1", "later")]), T0)
        assert info.first_offset == end
        for offset, _k, _v in got:
            assert log.read(offset, 1 << 20)
    finally:
        log.close()


def test_the_cleaned_log_keeps_the_aborted_transaction_entry(built: dict[str, object]) -> None:
    # the cleaned log still holds the aborted transaction's (emptied) batch: its entry stays
    assert built["aborted_after"] and built["aborted_after"][0][0] == 5  # type: ignore[index]
