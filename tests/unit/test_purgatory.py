"""DelayedOperation and Purgatory on a manual clock."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from purgatory import DelayedOperation, ManualClock, Purgatory, Timer


class Op(DelayedOperation):
    """Completes when ``ready`` is set; counts its callbacks."""

    def __init__(self, delay_ms: int, name: object = None) -> None:
        super().__init__(delay_ms)
        self.name = name
        self.ready = False
        self.completions = 0
        self.expirations = 0
        self.checks = 0
        self.on_complete_hook: Callable[[], None] | None = None
        self.on_expiration_hook: Callable[[], None] | None = None
        self.events: list[str] = []

    def try_complete(self) -> bool:
        self.checks += 1
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.completions += 1
        self.events.append("complete")
        if self.on_complete_hook:
            self.on_complete_hook()

    def on_expiration(self) -> None:
        self.expirations += 1
        self.events.append("expire")
        if self.on_expiration_hook:
            self.on_expiration_hook()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def timer(clock: ManualClock) -> Timer:
    return Timer(clock)


@pytest.fixture
def purgatory(timer: Timer) -> Purgatory[Op]:
    return Purgatory("test", timer)


def test_completes_immediately_without_watching(purgatory: Purgatory[Op], timer: Timer) -> None:
    op = Op(100)
    op.ready = True
    assert purgatory.try_complete_else_watch(op, ["a", "b"]) is True
    assert op.completions == 1 and op.checks == 1
    assert purgatory.watched == 0 and purgatory.delayed == 0 and timer.size == 0


def test_parks_on_every_key_and_in_the_timer(purgatory: Purgatory[Op], clock: ManualClock) -> None:
    op = Op(100)
    assert purgatory.try_complete_else_watch(op, [("t", 0), ("t", 1), ("t", 2)]) is False
    assert op.checks == 2  # before and after watching
    assert purgatory.watched == 3 and purgatory.delayed == 1 and purgatory.watched_keys == 3
    assert clock.live == 1


def test_event_completes_and_frees_the_timer_at_once(
    purgatory: Purgatory[Op], clock: ManualClock, timer: Timer
) -> None:
    ops = [Op(100, i) for i in range(3)]
    for op in ops:
        purgatory.try_complete_else_watch(op, ["k"])
    ops[0].ready = ops[2].ready = True
    assert purgatory.check_and_complete("k") == 2
    assert [op.completions for op in ops] == [1, 0, 1]
    assert purgatory.delayed == 1 and timer.size == 1  # unlinked now, not at the deadline
    assert purgatory.watched == 1
    ops[1].ready = True
    assert purgatory.check_and_complete("k") == 1
    assert purgatory.watched_keys == 0  # empty watcher list removed with its key
    assert clock.live == 0  # the bucket emptied: its wake-up is gone too
    assert purgatory.check_and_complete("k") == 0


def test_expiry_completes_then_expires(purgatory: Purgatory[Op], clock: ManualClock) -> None:
    op = Op(250)
    purgatory.try_complete_else_watch(op, ["k"])
    clock.advance(249)
    assert op.events == []
    clock.advance(1)
    assert op.events == ["complete", "expire"]
    assert purgatory.delayed == 0
    assert purgatory.check_and_complete("k") == 0  # completed entries are dropped, not re-run
    assert op.completions == 1 and purgatory.watched_keys == 0


def test_condition_met_between_the_two_checks_is_not_missed(purgatory: Purgatory[Op]) -> None:
    """An event that fires while the operation is being watched (after the first check) must
    complete it: the second check after watching catches it, and it never enters the timer."""

    class Racy(Op):
        def try_complete(self) -> bool:
            self.checks += 1
            if self.checks == 2:  # the condition became true in between
                return self.force_complete()
            return False

    op = Racy(100)
    assert purgatory.try_complete_else_watch(op, ["a", "b"]) is True
    assert op.completions == 1 and purgatory.delayed == 0


def test_completed_while_watching_stops_watching_the_remaining_keys(
    purgatory: Purgatory[Op],
) -> None:
    op = Op(100)
    first: list[str] = []

    class Keys:
        def __iter__(self):  # completes the op once the first key is watched
            yield "a"
            first.append("a")
            op.force_complete()
            yield "b"

    assert purgatory.try_complete_else_watch(op, Keys()) is False or op.is_completed
    assert op.completions == 1 and purgatory.watched == 1 and purgatory.delayed == 0


def test_exactly_once_when_completion_and_expiry_race(
    purgatory: Purgatory[Op], clock: ManualClock
) -> None:
    """Two operations due in the same bucket: the first one's expiry fires an event that
    completes the second. The second must complete once and never expire."""
    a, b = Op(100, "a"), Op(100, "b")
    purgatory.try_complete_else_watch(a, ["k"])
    purgatory.try_complete_else_watch(b, ["k"])

    def event() -> None:
        b.ready = True
        assert purgatory.check_and_complete("k") == 1

    a.on_expiration_hook = event
    clock.advance(100)
    assert a.events == ["complete", "expire"]
    assert b.events == ["complete"]
    assert purgatory.delayed == 0 and purgatory.watched_keys == 0


def test_exactly_once_under_reentrant_and_repeated_completion(
    purgatory: Purgatory[Op], clock: ManualClock
) -> None:
    op = Op(100)
    purgatory.try_complete_else_watch(op, ["k", "j"])
    calls: list[bool] = []
    op.on_complete_hook = lambda: calls.append(op.force_complete())  # re-entrant
    op.ready = True
    assert purgatory.check_and_complete("k") == 1
    assert purgatory.check_and_complete("j") == 0
    assert op.force_complete() is False
    op.run()  # a late expiry finds it completed
    clock.advance(1000)
    assert op.completions == 1 and op.expirations == 0 and calls == [False]


def test_randomised_completion_expiry_race_exactly_once(clock: ManualClock, timer: Timer) -> None:
    rng = random.Random(5)
    purgatory: Purgatory[Op] = Purgatory("race", timer, purge_interval=50)
    ops = []
    for i in range(3000):
        op = Op(rng.randint(1, 60), i)
        purgatory.try_complete_else_watch(op, [rng.randrange(10) for _ in range(3)])
        ops.append(op)
        if rng.random() < 0.3:
            victim = rng.choice(ops)
            victim.ready = True
            # Sometimes the completion lands in the same ms as the deadline.
            purgatory.check_and_complete(rng.randrange(10))
        clock.advance(rng.choice((0, 0, 1, 2)))
    clock.advance(1000)
    assert all(op.completions == 1 for op in ops)
    assert all(op.expirations <= 1 for op in ops)
    assert all(op.events in (["complete"], ["complete", "expire"]) for op in ops)
    assert purgatory.delayed == 0 and timer.size == 0 and clock.live == 0


def test_purge_is_triggered_by_the_estimated_completed_count(timer: Timer) -> None:
    """Kafka's rule: E - delayed > purge_interval."""
    purgatory: Purgatory[Op] = Purgatory("p", timer, purge_interval=10, adaptive_purge=False)
    ops = [Op(1000) for _ in range(30)]
    for op in ops:
        purgatory.try_complete_else_watch(op, ["a", "b"])
    assert purgatory.estimated_total == 30 and purgatory.purges == 0
    for op in ops[:12]:
        op.force_complete()  # completed elsewhere: still on the watcher lists
    assert purgatory.watched == 60 and purgatory.delayed == 18
    extra = Op(1000)
    purgatory.try_complete_else_watch(extra, ["c"])  # E - delayed = 31 - 19 = 12 > 10
    assert purgatory.purges == 1
    assert purgatory.estimated_total == 19  # reset to the pending count
    assert purgatory.watched == 18 * 2 + 1


def test_adaptive_threshold_follows_the_pending_count(timer: Timer) -> None:
    """Default rule: E - delayed > max(purge_interval, delayed), so a purge always removes at
    least as many entries as it keeps."""
    purgatory: Purgatory[Op] = Purgatory("p", timer, purge_interval=10)
    ops = [Op(1000) for _ in range(30)]
    for op in ops:
        purgatory.try_complete_else_watch(op, ["a", "b"])
    for op in ops[:12]:
        op.force_complete()
    purgatory.try_complete_else_watch(Op(1000), ["c"])  # 12 completed <= 19 pending: no purge
    assert purgatory.purges == 0
    for op in ops[12:20]:
        op.force_complete()
    purgatory.try_complete_else_watch(Op(1000), ["c"])  # E 32 - delayed 12 = 20 > 12
    assert purgatory.purges == 1
    assert purgatory.estimated_total == 12
    assert purgatory.watched == 10 * 2 + 2


def test_purge_proceeds_in_bounded_steps(timer: Timer) -> None:
    purgatory: Purgatory[Op] = Purgatory("p", timer, purge_interval=5)
    purgatory.purge_step = 4  # entries per step
    ops = [Op(1000) for _ in range(40)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [i % 10])  # 10 keys, 4 entries each
    for op in ops:
        op.force_complete()
    assert purgatory.watched == 40
    purgatory.try_complete_else_watch(Op(1000), ["x"])  # triggers; first step: one list
    assert purgatory.purges == 1
    assert purgatory.watched == 40 - 4 + 1
    for _ in range(9):  # each further watch filters one more list
        purgatory.try_complete_else_watch(Op(1000), ["x"])
    assert purgatory.watched == 10 and purgatory.watched_keys == 1
    assert purgatory._purge_keys != []  # "x" is still ahead in this cycle
    purgatory.try_complete_else_watch(Op(1000), ["x"])
    assert purgatory._purge_keys == [] and purgatory.purges == 1  # cycle finished


def test_no_purge_when_many_are_pending_but_few_completed(timer: Timer) -> None:
    """The old design purged whenever the lists were long; here a long list of pending
    operations never triggers a scan."""
    purgatory: Purgatory[Op] = Purgatory("p", timer, purge_interval=10)
    for _ in range(5000):
        purgatory.try_complete_else_watch(Op(1000), ["a", "b", "c"])
    for _ in range(10):
        op = Op(1000)
        purgatory.try_complete_else_watch(op, ["a"])
        op.force_complete()
    assert purgatory.purges == 0
    assert purgatory.watched == 15010


def test_purge_removes_emptied_watcher_lists(timer: Timer) -> None:
    purgatory: Purgatory[Op] = Purgatory("p", timer, purge_interval=3)
    done = [Op(1000) for _ in range(5)]
    for i, op in enumerate(done):
        purgatory.try_complete_else_watch(op, [f"k{i}"])
        op.force_complete()
    # The 5th watch saw E - delayed = 5 - 1 > 3 and purged: k0..k3 emptied and removed.
    assert purgatory.watched_keys == 1
    assert purgatory.purges == 1
    assert purgatory.purge_completed() == 1
    assert purgatory.watched_keys == 0


def test_cancel_for_key(purgatory: Purgatory[Op], clock: ManualClock) -> None:
    ops = [Op(100) for _ in range(3)]
    for op in ops:
        purgatory.try_complete_else_watch(op, [("t", 0)])
    ops[0].force_complete()
    other = Op(100)
    purgatory.try_complete_else_watch(other, [("t", 1)])
    assert purgatory.cancel_for_key(("t", 0)) == ops[1:]
    assert all(not op.is_completed for op in ops[1:])
    assert purgatory.delayed == 1 and purgatory.watched_keys == 1
    assert purgatory.cancel_for_key(("t", 0)) == []
    clock.advance(200)
    assert ops[1].events == [] and other.events == ["complete", "expire"]


def test_watch_added_by_a_callback_during_a_check_survives(
    purgatory: Purgatory[Op],
) -> None:
    a = Op(100, "a")
    purgatory.try_complete_else_watch(a, ["k"])
    late = Op(100, "late")
    a.on_complete_hook = lambda: purgatory.try_complete_else_watch(late, ["k"])
    a.ready = True
    assert purgatory.check_and_complete("k") == 1
    assert purgatory.watched == 1 and purgatory.delayed == 1
    late.ready = True
    assert purgatory.check_and_complete("k") == 1


def test_empty_keys_are_refused(purgatory: Purgatory[Op]) -> None:
    with pytest.raises(ValueError):
        purgatory.try_complete_else_watch(Op(10), [])


def test_timer_size_equals_pending_operations(clock: ManualClock, timer: Timer) -> None:
    rng = random.Random(9)
    purgatory: Purgatory[Op] = Purgatory("p", timer, purge_interval=20)
    live: list[Op] = []
    for _ in range(5000):
        op = Op(rng.randint(1, 500))
        purgatory.try_complete_else_watch(op, [rng.randrange(20)])
        live.append(op)
        if rng.random() < 0.4:
            rng.choice(live).force_complete()
        clock.advance(rng.choice((0, 1)))
        live = [op for op in live if not op.is_completed]  # what is pending, in one pass
        assert timer.size == purgatory.delayed == len(live)


def test_purgatories_sharing_a_timer_count_their_own(clock: ManualClock, timer: Timer) -> None:
    produce: Purgatory[Op] = Purgatory("produce", timer, purge_interval=5)
    fetch: Purgatory[Op] = Purgatory("fetch", timer, purge_interval=5)
    for _ in range(100):
        fetch.try_complete_else_watch(Op(10_000), ["f"])
    for _ in range(7):
        op = Op(100)
        produce.try_complete_else_watch(op, ["p"])
        op.force_complete()
    assert timer.size == 100 and fetch.delayed == 100 and produce.delayed == 0
    assert produce.purges == 1  # fetch's pending ops do not hide produce's completed ones
