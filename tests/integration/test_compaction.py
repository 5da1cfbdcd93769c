"""Log compaction as clients see it, against a real broker whose cleaner runs every 100 ms.

A compacted topic (cleanup.policy=compact, 16 KB segments, min.cleanable.dirty.ratio 0.01):

* 20,000 updates over 100 keys shrink to one record per key, each at the offset of its key's
  last acknowledged update, with the high watermark unchanged; confluent-kafka, kafka-python
  and aiokafka read it from offset 0 across the gaps, and a read from a removed offset starts
  at the next record kept;
* tombstones stay (once each, older values gone) until delete.retention.ms after the clean
  that first saw them, and a later clean removes them;
* a transactional topic: aborted updates are removed, even where they were a key's last
  write, and each key keeps its last committed value;
* `__consumer_offsets` (16 KB segments) stays under a tenth of the 1.4 MB written by 30,000
  offset commits, and after a restart every group's committed offsets are its last commits,
  where a subscribing consumer resumes;
* and a smoke run of bench.cleaner.

The cleaner never touches the active segment, so each phase ends by rolling it: a last record
whose CreateTime is an hour after the first record of the active segment, past segment.ms.
Every wait polls the segment files with a deadline; the one sleep is to a known instant (the
tombstones' delete horizon), after which a clean is made due and polled for.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    BASE_TS,
    CONSUMERS,
    ClientError,
    Got,
    Rec,
    confluent_consume,
    confluent_consumer,
    confluent_produce,
    create_topic,
    disk_batches,
    partition_dir,
    unique_topic,
    wait_until,
    watermarks,
)

CLEANER_OVERRIDES = {
    "log.cleaner.backoff.ms": "100",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
}
ROOT = Path(__file__).resolve().parents[2]
SEGMENT_BYTES = 16384
ROLL_MS = 600_000  # segment.ms: no roll by time while producing, one on demand (roll())
HOUR_MS = 3_600_000
# CreateTime of the first update of a test: three hours back, so the rolls an hour apart stay
# in the past.
T0 = BASE_TS - 3 * HOUR_MS
ROLL_KEY = b"~roll"
CONTROL = 0x20  # batch attribute: a transaction marker


# How long segments the cleaner swaps out stay on disk renamed .deleted (Kafka's default is
# a minute): short, so a test sees them come and go.
DELETE_DELAY_MS = 1000


def compact_config(**extra: str) -> dict[str, str]:
    return {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES),
            "segment.ms": str(ROLL_MS), "min.cleanable.dirty.ratio": "0.01",
            "file.delete.delay.ms": str(DELETE_DELAY_MS), **extra}


def wait_deleted_gone(path: Path, what: str) -> None:
    """The swapped-out segments' .deleted files are removed once file.delete.delay.ms has
    passed (the clean that made the last of them has finished when this is called)."""
    wait_until(lambda: not any(n.endswith(".deleted") for n in os.listdir(path)),
               10 + DELETE_DELAY_MS / 1000, what)


def produce(bootstrap: str, topic: str, records: list[Rec], timeout: float = 60) -> list[int]:
    """confluent-kafka with acks=all, in batches well under a 16 KB segment (a batch larger
    than segment.bytes is refused, as Kafka's RECORD_LIST_TOO_LARGE); idempotent, so a request
    that timed out on a loaded machine and was retried keeps its place and is stored once."""
    return confluent_produce(bootstrap, topic, records, timeout=timeout,
                             extra={"batch.size": SEGMENT_BYTES // 4, "enable.idempotence": True})


def roll(bootstrap: str, topic: str, timestamp: int, key: bytes = ROLL_KEY) -> int:
    """Append one record an hour or more after the active segment's first record, which rolls
    the segment (segment.ms), so everything before it becomes cleanable. Returns its offset.
    Each roll of a topic takes a key of its own: the record stays in the active segment, which
    is never cleaned, so an earlier record of the same key would stay beside it."""
    return produce(bootstrap, topic, [Rec(key, b"roll", (), timestamp)])[0]


def rolled(b: BrokerProcess, topic: str) -> int:
    """Segments of the topic rolled since the broker started, from its log: the files
    themselves may have been merged by the cleaner meanwhile."""
    return sum(1 for line in b.new_log_lines()
               if line.get("event") == "rolled segment" and line.get("topic") == topic)


def stored_records(log_dir: Path, topic: str, partition: int = 0) -> int | None:
    """Records of data batches in the partition's segments (markers not counted); None while
    the cleaner swaps files under the reader."""
    try:
        batches = disk_batches(log_dir, topic, partition)
    except (FileNotFoundError, AssertionError):
        return None
    return sum(b.record_count for b in batches if not b.attributes & CONTROL)


def wait_stored(log_dir: Path, topic: str, want: int, timeout: float, what: str,
                partition: int = 0) -> None:
    """Until the partition's segments hold exactly `want` data records."""
    last: list[int | None] = [None]

    def done() -> bool:
        last[0] = stored_records(log_dir, topic, partition)
        return last[0] == want

    try:
        wait_until(done, timeout, what, interval=0.2)
    except AssertionError as e:
        raise AssertionError(f"{e}: {last[0]} records stored, {want} expected") from None


def assert_offsets_increase(got: list[Got]) -> None:
    offsets = [g.offset for g in got]
    assert all(a < b for a, b in zip(offsets, offsets[1:], strict=False)), (
        f"offsets not strictly increasing: {offsets[:50]}")


def assert_compacted(got: list[Got], latest: dict[bytes, tuple[int, bytes | None]],
                     high_watermark: int) -> None:
    """`got`, read from offset 0, is exactly the last write of each key of `latest`
    (key -> (offset, value)), at that write's offset, in offset order, up to the end."""
    assert_offsets_increase(got)
    keys = [g.rec.key for g in got]
    repeated = {k for k in keys if keys.count(k) > 1}
    assert not repeated, f"keys stored more than once after compaction: {sorted(repeated)[:10]}"
    assert {k: (g.offset, g.rec.value) for k, g in zip(keys, got, strict=True)} == latest
    assert got[-1].offset == high_watermark - 1


def _writes(keys: int, rounds: int, seed: int, value_bytes: int, prefix: str,
            start_ts: int) -> list[Rec]:
    """`rounds` updates of each of `keys` keys in a shuffled order, values naming key and
    update number, padded to `value_bytes`."""
    rng = random.Random(seed)
    order = [k for k in range(keys) for _ in range(rounds)]
    rng.shuffle(order)
    out = []
    for n, k in enumerate(order):
        value = f"{prefix}:k{k}:u{n}:".encode().ljust(value_bytes, b".")
        out.append(Rec(f"k{k}".encode(), value, (), start_ts + n))
    return out


def _latest(records: list[Rec], offsets: list[int]) -> dict[bytes, tuple[int, bytes | None]]:
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for r, o in zip(records, offsets, strict=True):
        latest[r.key] = (o, r.value)  # type: ignore[index]
    return latest


@pytest.fixture(scope="module")
def cbroker(tmp_path_factory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("compaction-broker"), CLEANER_OVERRIDES).start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.kill()


# -- 20,000 updates over 100 keys ---------------------------------------------------------------

KEYS, UPDATES = 100, 20_000


@dataclass
class Compacted:
    topic: str
    latest: dict[bytes, tuple[int, bytes | None]]
    produced_bytes: int
    rolls: int  # segments rolled while the updates were written
    seconds: float  # from the roll to the fully compacted log


@pytest.fixture(scope="module")
def compacted(cbroker: BrokerProcess) -> Compacted:
    logs = cbroker.data_dir / "logs"
    topic = unique_topic("compact")
    create_topic(cbroker.bootstrap, topic, config=compact_config())
    sent = _writes(KEYS, UPDATES // KEYS, seed=1, value_bytes=100, prefix="v", start_ts=T0)
    offsets = produce(cbroker.bootstrap, topic, sent)
    assert offsets == list(range(UPDATES))
    rolls = rolled(cbroker, topic)
    roll_at = roll(cbroker.bootstrap, topic, T0 + HOUR_MS)
    assert roll_at == UPDATES
    latest = _latest(sent, offsets)
    latest[ROLL_KEY] = (roll_at, b"roll")
    began = time.monotonic()
    wait_stored(logs, topic, len(latest), 90, "the cleaner to keep one record per key")
    return Compacted(topic, latest, sum(len(r.key or b"") + len(r.value or b"") for r in sent),
                     rolls, time.monotonic() - began)


def test_compacted_topic_keeps_one_record_per_key(cbroker: BrokerProcess,
                                                  compacted: Compacted) -> None:
    """On disk: one record per key, a few segments instead of the ~160 written, and the
    offsets a consumer relies on unchanged (log start 0, high watermark after the roll)."""
    logs = cbroker.data_dir / "logs"
    print(f"compacted in {compacted.seconds:.1f}s after the roll; {compacted.rolls} segments "
          f"rolled while writing")
    assert compacted.rolls >= 50, "the updates did not roll 16 KB segments"
    assert watermarks(cbroker.bootstrap, compacted.topic) == (0, UPDATES + 1)
    batches = disk_batches(logs, compacted.topic)
    assert sum(b.record_count for b in batches) == KEYS + 1
    stored = sum(p.stat().st_size for p in partition_dir(logs, compacted.topic).glob("*.log"))
    assert stored < compacted.produced_bytes // 20, (stored, compacted.produced_bytes)
    # Batches are whole and in offset order, none overlapping another.
    ends = [(b.base_offset, b.last_offset) for b in batches]
    assert all(prev[1] < nxt[0] for prev, nxt in zip(ends, ends[1:], strict=False)), ends
    for d in partition_dir(logs, compacted.topic).iterdir():
        assert not d.name.endswith((".cleaned", ".swap")), f"debris: {d.name}"
    wait_deleted_gone(partition_dir(logs, compacted.topic),
                      "the swapped-out segments removed after file.delete.delay.ms")


@pytest.mark.parametrize("client", list(CONSUMERS))
def test_consumers_read_across_the_gaps(cbroker: BrokerProcess, compacted: Compacted,
                                        client: str) -> None:
    """Each client reads the compacted log from offset 0: the last update of every key at its
    own offset, offsets strictly increasing with gaps, up to the high watermark."""
    got = CONSUMERS[client](cbroker.bootstrap, compacted.topic, KEYS + 1, timeout=30)
    assert_compacted(got, compacted.latest, UPDATES + 1)
    assert got[-1].offset - got[0].offset > len(got), "no gaps: nothing was compacted"


def test_fetch_from_a_removed_offset(cbroker: BrokerProcess, compacted: Compacted) -> None:
    """A consumer positioned on an offset the cleaner removed gets the next record kept."""
    kept = sorted(o for o, _v in compacted.latest.values())
    gap = next(o + 1 for o, n in zip(kept, kept[1:], strict=False) if n > o + 1)
    after = [o for o in kept if o >= gap]
    got = confluent_consume(cbroker.bootstrap, compacted.topic, len(after), start=gap)
    assert [g.offset for g in got] == after


# -- tombstones --------------------------------------------------------------------------------

TOMBSTONE_KEYS, DELETED = 60, 30
DELETE_RETENTION_MS = 2000


def test_tombstones_removed_after_delete_retention(cbroker: BrokerProcess) -> None:
    """A tombstone survives the clean that removes its key's older values, alone, for
    delete.retention.ms; a clean after that removes it too, and the key is gone."""
    logs = cbroker.data_dir / "logs"
    topic = unique_topic("tombstones")
    create_topic(cbroker.bootstrap, topic,
                 config=compact_config(**{"delete.retention.ms": str(DELETE_RETENTION_MS)}))
    sent = _writes(TOMBSTONE_KEYS, 5, seed=2, value_bytes=200, prefix="v", start_ts=T0)
    deletes = [Rec(f"k{k}".encode(), None, (), T0 + len(sent) + k) for k in range(DELETED)]
    offsets = produce(cbroker.bootstrap, topic, sent + deletes)
    latest = _latest(sent + deletes, offsets)
    latest[ROLL_KEY] = (roll(cbroker.bootstrap, topic, T0 + HOUR_MS), b"roll")
    assert rolled(cbroker, topic) >= 4

    wait_stored(logs, topic, len(latest), 60, "the first clean: tombstones kept, values gone")
    # Each tombstone's delete horizon is at most delete.retention.ms from now.
    horizon = time.monotonic() + DELETE_RETENTION_MS / 1000
    got = confluent_consume(cbroker.bootstrap, topic, len(latest))
    assert_compacted(got, latest, offsets[-1] + 2)
    assert sum(g.rec.value is None for g in got) == DELETED

    # Past the horizon, a clean (made due by more updates and a roll) drops the tombstones.
    time.sleep(max(0.0, horizon - time.monotonic()) + 0.2)
    more = _writes(TOMBSTONE_KEYS, 1, seed=3, value_bytes=200, prefix="w",
                   start_ts=T0 + HOUR_MS + 1)
    more = [r for r in more if int(r.key[1:]) >= DELETED]  # type: ignore[index]
    more_offsets = produce(cbroker.bootstrap, topic, more)
    after = {k: v for k, v in latest.items() if v[1] is not None}
    after.update(_latest(more, more_offsets))
    second = ROLL_KEY + b"-2"
    after[second] = (roll(cbroker.bootstrap, topic, T0 + 2 * HOUR_MS, second), b"roll")
    wait_stored(logs, topic, len(after), 60, "a clean past the delete horizon")
    got = confluent_consume(cbroker.bootstrap, topic, len(after))
    assert_compacted(got, after, after[second][0] + 1)
    assert not [g for g in got if g.rec.value is None], "tombstones outlived delete.retention.ms"


# -- transactions ------------------------------------------------------------------------------

TXN_KEYS, TXN_ROUNDS = 50, 8


def _txn_producer(bootstrap: str, txn_id: str):
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                     "transactional.id": txn_id, "transaction.timeout.ms": 10000,
                     "acks": "all", "linger.ms": 5, "socket.timeout.ms": 10000,
                     "batch.size": SEGMENT_BYTES // 4})


def test_aborted_transactions_compacted_away(cbroker: BrokerProcess) -> None:
    """Rounds of transactional updates of every key, every other round aborted (after a flush,
    so its records are in the log), the last round aborted too: after cleaning, readers at
    either isolation level see each key's last committed value and nothing aborted, where a
    cleaner that ignored the aborts would have kept the aborted last writes."""
    logs = cbroker.data_dir / "logs"
    topic = unique_topic("compact-txn")
    create_topic(cbroker.bootstrap, topic, config=compact_config())
    producer = _txn_producer(cbroker.bootstrap, f"{topic}-txn")
    failed: list = []
    producer.init_transactions(20)
    committed: dict[bytes, bytes] = {}
    ts = T0
    for r in range(TXN_ROUNDS):
        aborted = r % 2 == 1
        producer.begin_transaction()
        round_values = {}
        for k in range(TXN_KEYS):
            key = f"k{k}".encode()
            value = f"{'aborted' if aborted else 'committed'}:r{r}:k{k}:".encode().ljust(200, b".")
            producer.produce(topic, key=key, value=value, partition=0, timestamp=ts,
                             on_delivery=lambda err, _m: failed.append(err) if err else None)
            round_values[key] = value
            ts += 1
        if aborted:
            assert producer.flush(20) == 0
            producer.abort_transaction(20)
        else:
            producer.commit_transaction(20)
            committed.update(round_values)
    assert not failed, failed
    assert producer.flush(10) == 0
    # Transaction markers carry the broker's clock, not the producer's CreateTime: the roll
    # record is an hour ahead of it instead.
    roll_at = roll(cbroker.bootstrap, topic, int(time.time() * 1000) + HOUR_MS)
    assert rolled(cbroker, topic) >= 4

    wait_stored(logs, topic, TXN_KEYS + 1, 60, "the aborted updates to be cleaned away")
    expected = {**committed, ROLL_KEY: b"roll"}
    for isolation in ("read_uncommitted", "read_committed"):
        got = _read_to_end(cbroker.bootstrap, topic, roll_at + 1, isolation)
        assert_offsets_increase(got)
        assert {g.rec.key: g.rec.value for g in got} == expected, isolation
        assert len(got) == len(expected), f"{isolation}: {len(got)} records"
        assert not [g for g in got if g.rec.value.startswith(b"aborted")], isolation


def _consume(bootstrap: str, conf: dict, start: Callable, take: Callable,
             done: Callable[[], bool], timeout: float) -> None:
    """A confluent-kafka consumer: `start(consumer)`, then each message to `take` until `done()`
    or the deadline; any error the client reports fails."""
    errors: list = []
    consumer = confluent_consumer(bootstrap, errors, conf)
    try:
        start(consumer)
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                errors.append(msg.error())
                continue
            take(msg)
    finally:
        consumer.close()
    if errors:
        raise ClientError(f"consume: {errors}")


def _read_to_end(bootstrap: str, topic: str, end: int, isolation: str,
                 timeout: float = 30) -> list[Got]:
    """confluent-kafka from offset 0 until the record before `end` is read."""
    from confluent_kafka import TopicPartition

    out: list[Got] = []
    _consume(bootstrap, {"isolation.level": isolation},
             lambda c: c.assign([TopicPartition(topic, 0, 0)]),
             lambda msg: out.append(Got(msg.offset(), Rec(msg.key(), msg.value(), (),
                                                          msg.timestamp()[1]), "")),
             lambda: bool(out) and out[-1].offset >= end - 1, timeout)
    if not out or out[-1].offset < end - 1:
        raise ClientError(f"{topic}: read up to {out[-1].offset if out else None}, end {end}")
    return out


# -- __consumer_offsets ------------------------------------------------------------------------

GROUPS, GROUP_PARTITIONS, COMMIT_ROUNDS = 4, 25, 300
RECORDS_PER_PARTITION = 10
OFFSETS_SEGMENT_BYTES = 16384
OFFSETS_BOUND = 128 * 1024  # bytes of __consumer_offsets-0 once cleaned (1.4 MB uncleaned)


def _committer(bootstrap: str, group: str):
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4",
                     "group.id": group, "enable.auto.commit": False,
                     "socket.timeout.ms": 10000})


def _final_commit(g: int, p: int) -> int:
    """Each group's last commit: small, so that it lies inside the topic, and below the
    earlier commits, so that 'the largest offset wins' would be caught."""
    return (7 * g + p) % RECORDS_PER_PARTITION


def _dir_bytes(path: Path) -> int:
    total = 0
    for f in path.iterdir():
        try:
            total += f.stat().st_size
        except FileNotFoundError:  # swapped away by the cleaner meanwhile
            pass
    return total


@pytest.mark.timeout(180)
def test_consumer_offsets_stay_bounded(broker_factory) -> None:
    """GROUPS groups commit GROUP_PARTITIONS offsets COMMIT_ROUNDS times each (30,000 offset
    records, 1.4 MB uncleaned): `__consumer_offsets` is cleaned down to a bound, and after a
    restart every group's committed offsets are its last commits, from which a member
    resumes."""
    from confluent_kafka import TopicPartition

    b: BrokerProcess = broker_factory({
        **CLEANER_OVERRIDES, "offsets.topic.segment.bytes": str(OFFSETS_SEGMENT_BYTES)})
    offsets_dir = partition_dir(b.data_dir / "logs", "__consumer_offsets", 0)
    topic = unique_topic("committed")
    create_topic(b.bootstrap, topic, partitions=GROUP_PARTITIONS)
    for p in range(GROUP_PARTITIONS):
        confluent_produce(b.bootstrap, topic, [
            Rec(None, f"p{p}:{i}".encode(), (), BASE_TS + i)
            for i in range(RECORDS_PER_PARTITION)], partition=p)

    groups = [f"{topic}-g{g}" for g in range(GROUPS)]
    committers = [_committer(b.bootstrap, g) for g in groups]
    peak = 0
    try:
        for r in range(COMMIT_ROUNDS):
            for g, c in enumerate(committers):
                last = r == COMMIT_ROUNDS - 1
                done = c.commit(offsets=[
                    TopicPartition(topic, p, _final_commit(g, p) if last else 1000 * r + p + 100)
                    for p in range(GROUP_PARTITIONS)], asynchronous=False)
                assert not [tp for tp in done if tp.error], done
            if r % 20 == 0:
                peak = max(peak, _dir_bytes(offsets_dir))
    finally:
        for c in committers:
            c.close()
    _, high = watermarks(b.bootstrap, "__consumer_offsets")
    written = GROUPS * GROUP_PARTITIONS * COMMIT_ROUNDS
    assert high >= written, f"{high} offset records for {written} commits"
    sizes = [_dir_bytes(offsets_dir)]

    def cleaned() -> bool:
        sizes.append(_dir_bytes(offsets_dir))
        return sizes[-1] < OFFSETS_BOUND

    try:
        wait_until(cleaned, 60, "the cleaner", interval=0.25)
    except AssertionError as e:
        raise AssertionError(f"{e}: __consumer_offsets-0 holds {sizes[-1]} bytes (at the last "
                             f"commit {sizes[0]}), bound {OFFSETS_BOUND}") from None
    size = sizes[-1]
    print(f"__consumer_offsets-0: {high} records written, {size} bytes on disk now, "
          f"peak seen {peak}")

    b.restart()
    expected = {g: {p: _final_commit(gi, p) for p in range(GROUP_PARTITIONS)}
                for gi, g in enumerate(groups)}
    for g in groups:
        c = _committer(b.bootstrap, g)
        try:
            got = c.committed([TopicPartition(topic, p) for p in range(GROUP_PARTITIONS)],
                              timeout=20)
        finally:
            c.close()
        assert {tp.partition: tp.offset for tp in got} == expected[g], g

    # A member of the first group resumes at each partition's last commit.
    first: dict[int, int] = {}
    _consume(b.bootstrap, {"group.id": groups[0], "auto.offset.reset": "error",
                           "session.timeout.ms": 6000},
             lambda c: c.subscribe([topic]),
             lambda msg: first.setdefault(msg.partition(), msg.offset()),
             lambda: len(first) == GROUP_PARTITIONS, 30)
    assert first == expected[groups[0]]


# -- the benchmark ------------------------------------------------------------------------------


def test_bench_cleaner_quick() -> None:
    """`python -m bench.cleaner --json --quick` prints a clean row (the backlog's dirty bytes
    all read, two thirds of its records removed) and a produce row with each phase's rate."""
    proc = subprocess.run([sys.executable, "-m", "bench.cleaner", "--json", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    clean, produce_row = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert clean["bench"] == "clean" and clean["mb_per_s"] > 0, clean
    assert clean["cleaner_read_mb"] == clean["dirty_mb"], clean
    assert clean["cleaner_records_removed"] == clean["records"] - 1 - clean["keys"], clean
    assert produce_row["bench"] == "produce", produce_row
    for key in ("alone_records_per_s", "compacted_uncleaned_records_per_s",
                "while_cleaning_records_per_s"):
        assert produce_row[key] > 0, produce_row
    assert produce_row["cleans"] >= 1, produce_row
