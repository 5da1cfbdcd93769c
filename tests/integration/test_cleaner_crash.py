"""The log cleaner across SIGKILLs of the broker, restarted on the same data dir and port.

Each round writes 20,000 acknowledged updates over 5,000 keys of a compacted topic (16 KB
segments, so a clean rewrites dozens of segment groups, each through `.cleaned`, `.swap` and
`.deleted` files), rolls the active segment and kills the broker at a moment drawn from a
seeded random.Random (the seed is printed; CLEANER_CRASH_SEED replays the schedule, though
thread timing still varies): as soon as a `.cleaned`, a `.swap` or a `.deleted` file shows in
the partition directory, or after a random delay; some rounds kill the restart too, while the
log loads (and completes a swap the kill left). After each restart, before anything else is
written: the high watermark is where it was, the segments hold no offset twice, and a consumer
reading from offset 0 sees offsets strictly increasing and, for every key, its last
acknowledged value as the last one. After the last round the cleaner still finishes: one
record per key (each round's roll record has a key of its own) and no cleaner files left
behind.

Recovery points are checkpointed every second (log.flush.offset.checkpoint.interval.ms), so
each restart rereads what was rolled since the last checkpoint and the active segment, as a
broker running for long does, instead of the whole log: every round's broker lives well under
the default minute, and without a checkpoint each restart would reread every segment.

The topic's min.cleanable.dirty.ratio is 0, so any dirty inactive segment is cleaned. With a
ratio above 0 that final count is a race, not a property of the cleaner: a clean that starts
between a round's last produce and its roll stops at the round's last segment, which then
holds the round's few last records (20,000 mod 136 records a segment = 8); once the roll
makes them cleanable they are well under 1% of the log, so the older values of their keys
stay, as in Kafka. `test_a_small_dirty_tail_is_cleaned` makes that interleaving happen.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from tests.integration.test_compaction import (
    CLEANER_OVERRIDES,
    HOUR_MS,
    ROLL_KEY,
    T0,
    _read_to_end,
    _writes,
    assert_offsets_increase,
    compact_config,
    produce,
    roll,
    wait_deleted_gone,
    wait_stored,
)
from tests.integration.test_crash_loop import _kill_during_start
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    Rec,
    create_topic,
    disk_batches,
    partition_dir,
    unique_topic,
    wait_until,
    watermarks,
)

KEYS, UPDATES = 5000, 20_000
# One kill per round, at the moment named; some rounds kill the restart too.
KINDS = ["cleaned", "cleaned", "swap", "swap", "deleted", "delay", "delay", "delay"]
START_KILLS = 0.4
DEBRIS = (".cleaned", ".swap", ".deleted")
#: the broker's settings: the cleaner's, and a recovery-point checkpoint every second
OVERRIDES = {**CLEANER_OVERRIDES, "log.flush.offset.checkpoint.interval.ms": "1000"}
WATCH_S = 20.0  # how long a round waits for the file it kills on


def _topic_config() -> dict[str, str]:
    """Compacted, 16 KB segments, and every dirty inactive segment cleanable (see above)."""
    return compact_config(**{"min.cleanable.dirty.ratio": "0"})


def _cleaner_checkpoint(log_dir, topic: str) -> int | None:
    """The partition's entry in the cleaner-offset-checkpoint file: where the last clean
    stopped."""
    try:
        lines = (log_dir / "cleaner-offset-checkpoint").read_text().splitlines()
    except FileNotFoundError:
        return None
    for line in lines[2:]:
        name, partition, offset = line.split()
        if name == topic and partition == "0":
            return int(offset)
    return None


def _debris(path) -> set[str]:
    """Suffixes of the cleaner's transient files in the partition directory."""
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return set()
    return {s for n in names for s in DEBRIS if n.endswith(s)}


def _kill_when(b: BrokerProcess, path, kind: str, rng: random.Random) -> str:
    """SIGKILL the broker at the moment `kind` names; returns where the kill landed."""
    began = time.monotonic()
    if kind == "delay":
        delay = rng.uniform(0.0, 1.5)
        time.sleep(delay)
        landed = f"{delay:.2f}s after the roll"
    else:
        suffix = f".{kind}"
        seen = False
        while time.monotonic() - began < WATCH_S:
            if suffix in _debris(path):
                seen = True
                break
            time.sleep(0.0005)
        landed = (f"{suffix} seen {time.monotonic() - began:.2f}s after the roll" if seen
                  else f"no {suffix} within {WATCH_S}s")
    b.kill()
    assert b.proc is not None and b.proc.returncode == -signal.SIGKILL, (
        f"the broker exited by itself with {b.proc.returncode if b.proc else None}")
    return landed


def _assert_no_offset_twice(b: BrokerProcess, topic: str) -> None:
    """Batches of all `.log` segments, in file order, cover strictly increasing offsets."""
    def batches():
        try:
            return disk_batches(b.data_dir / "logs", topic)
        except FileNotFoundError:  # a segment swapped away by the cleaner while reading
            return None

    found = wait_until(batches, 10, "a consistent listing of the segments")
    for prev, nxt in zip(found, found[1:], strict=False):
        assert prev.last_offset < nxt.base_offset, (
            f"offsets {nxt.base_offset}..{nxt.last_offset} in {nxt.segment.name} overlap "
            f"{prev.base_offset}..{prev.last_offset} in {prev.segment.name}")


def _check(b: BrokerProcess, topic: str, latest: dict[bytes, bytes], produced: dict[bytes, set],
           high: int, context: str) -> None:
    assert watermarks(b.bootstrap, topic) == (0, high), context
    _assert_no_offset_twice(b, topic)
    got = _read_to_end(b.bootstrap, topic, high, "read_uncommitted")
    assert_offsets_increase(got)
    last: dict[bytes, bytes] = {}
    for g in got:
        assert g.rec.value in produced[g.rec.key], f"{context}: unknown value {g.rec}"
        last[g.rec.key] = g.rec.value
    wrong = {k: (last.get(k), v) for k, v in latest.items() if last.get(k) != v}
    assert not wrong, f"{context}: {len(wrong)} keys without their last acknowledged value, " \
                      f"e.g. {list(wrong.items())[:3]}"


@pytest.mark.slow
@pytest.mark.timeout(480)  # 170 s alone on a quiet box, 280 s in a loaded full run
def test_sigkill_during_cleaning(broker_factory) -> None:
    seed = int(os.environ.get("CLEANER_CRASH_SEED", random.randrange(2**32)))
    print(f"cleaner crash seed {seed} (CLEANER_CRASH_SEED={seed} replays the schedule)")
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    b: BrokerProcess = broker_factory(OVERRIDES)
    topic = unique_topic("cleaner-crash")
    create_topic(b.bootstrap, topic, config=_topic_config())
    path = partition_dir(b.data_dir / "logs", topic)

    latest: dict[bytes, bytes] = {}
    produced: dict[bytes, set] = {}
    high = 0
    history: list[str] = []
    left_debris = 0
    for r, kind in enumerate(kinds):
        start_ts = T0 + 2 * r * HOUR_MS
        sent = _writes(KEYS, UPDATES // KEYS, seed=rng.randrange(2**32), value_bytes=100,
                       prefix=f"r{r}", start_ts=start_ts)
        offsets = produce(b.bootstrap, topic, sent)
        assert offsets == list(range(high, high + len(sent))), f"round {r}"
        for rec in sent:
            latest[rec.key] = rec.value  # type: ignore[index]
            produced.setdefault(rec.key, set()).add(rec.value)  # type: ignore[arg-type]
        roll_key = ROLL_KEY + b"-%d" % r
        assert roll(b.bootstrap, topic, start_ts + HOUR_MS, roll_key) == high + len(sent)
        latest[roll_key] = b"roll"
        produced[roll_key] = {b"roll"}
        high += len(sent) + 1

        landed = _kill_when(b, path, kind, rng)
        debris = _debris(path)
        left_debris += bool(debris & {".cleaned", ".swap"})
        history.append(f"round {r}: kill on {kind}: {landed}; left {sorted(debris) or 'nothing'}")
        if rng.random() < START_KILLS:
            # Again while the restarted broker loads the log (completing a swap left behind).
            delay = rng.uniform(0.0, 0.8)
            _kill_during_start(b, delay)
            history[-1] += f"; killed again {delay:.2f}s into the restart"
        print(history[-1])
        b.start()
        _check(b, topic, latest, produced, high, f"seed {seed}, {history[-1]}")

    context = f"seed {seed}\n" + "\n".join(history)
    assert left_debris, f"no kill landed in the middle of a clean:\n{context}"
    wait_stored(b.data_dir / "logs", topic, len(latest), 90,
                f"the cleaner to finish after the kills ({context})")
    _check(b, topic, latest, produced, high, context)
    assert not _debris(path) & {".cleaned", ".swap"}, f"cleaner files left: {os.listdir(path)}"
    wait_deleted_gone(path, "the swapped-out segments removed after file.delete.delay.ms")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_small_dirty_tail_is_cleaned(broker_factory) -> None:
    """The interleaving that leaves a few superseded records behind, forced: the last clean
    stops at a segment that then takes a few updates, and a roll makes them cleanable. With
    the crash test's topic config they are cleaned too: one record per key."""
    b: BrokerProcess = broker_factory(CLEANER_OVERRIDES)
    logs = b.data_dir / "logs"
    topic = unique_topic("cleaner-tail")
    create_topic(b.bootstrap, topic, config=_topic_config())
    sent = _writes(KEYS, UPDATES // KEYS, seed=5, value_bytes=100, prefix="r0", start_ts=T0)
    assert produce(b.bootstrap, topic, sent) == list(range(len(sent)))
    first_roll = roll(b.bootstrap, topic, T0 + HOUR_MS, ROLL_KEY + b"-0")
    wait_until(lambda: _cleaner_checkpoint(logs, topic) == first_roll, 60,
               "a clean up to the segment the roll started")
    # A few updates join the first roll record in the active segment; the next roll makes
    # them the whole dirty section, under 1% of the log.
    tail = [Rec(b"k%d" % k, b"tail-%d" % k, (), T0 + HOUR_MS + 1 + k) for k in range(8)]
    assert produce(b.bootstrap, topic, tail) == list(range(first_roll + 1, first_roll + 9))
    high = roll(b.bootstrap, topic, T0 + 2 * HOUR_MS, ROLL_KEY + b"-1") + 1
    latest: dict[bytes, bytes] = {}
    produced: dict[bytes, set] = {}
    for rec in [*sent, *tail]:
        latest[rec.key] = rec.value  # type: ignore[index]
        produced.setdefault(rec.key, set()).add(rec.value)  # type: ignore[arg-type]
    for key in (ROLL_KEY + b"-0", ROLL_KEY + b"-1"):
        latest[key] = b"roll"
        produced[key] = {b"roll"}
    wait_stored(logs, topic, len(latest), 30, "the tail cleaned")
    wait_until(lambda: _cleaner_checkpoint(logs, topic) == high - 1, 10,
               "the cleaner checkpoint at the active segment")
    _check(b, topic, latest, produced, high, "after the tail's clean")
