"""TimerTaskList, TimingWheel and Timer on a manual clock: exact, and never sleeping."""

from __future__ import annotations

import random
from typing import Any

import pytest

from purgatory import ManualClock, TaskCounter, Timer, TimerTask, TimerTaskList, TimingWheel


class Task(TimerTask):
    """Records the clock time at which it ran."""

    __slots__ = ("name", "clock", "log", "ran_at", "deadline")

    def __init__(self, delay_ms: float, name: object, clock: Any, log: list) -> None:
        super().__init__(delay_ms)
        self.name = name
        self.clock = clock
        self.log = log
        self.ran_at: float | None = None
        self.deadline = 0.0

    def run(self) -> None:
        self.ran_at = self.clock.time()
        self.log.append((self.name, self.ran_at))


class Entry(TimerTask):
    def run(self) -> None:  # pragma: no cover - never run in these tests
        raise AssertionError


def make(start: int = 0, **kw: int) -> tuple[ManualClock, Timer, list]:
    clock = ManualClock(start)
    return clock, Timer(clock, **kw), []


def occupied(wheel: TimingWheel) -> list[list[tuple[int, int | None]]]:
    """(bucket index, bucket expiration) of each non-empty bucket, per level."""
    return [
        [(i, b.expiration) for i, b in enumerate(w.buckets) if not b.is_empty()]
        for w in wheel.levels()
    ]


def assert_handle_iff_nonempty(timer: Timer) -> None:
    for wheel in timer.wheel.levels():
        for bucket in wheel.buckets:
            assert (bucket.handle is not None) == (not bucket.is_empty()), bucket
            assert (bucket.expiration is not None) == (not bucket.is_empty()), bucket


# -- TimerTaskList ---------------------------------------------------------------------------


def test_bucket_is_a_circular_list_with_a_sentinel() -> None:
    bucket = TimerTaskList()
    counter = TaskCounter()
    entries = [Entry(1) for _ in range(3)]
    for e in entries:
        e._counter = counter
        bucket.add(e)
    assert bucket.entries() == entries
    assert counter.n == 3
    root = bucket._root
    assert root._next is entries[0] and root._prev is entries[-1]
    assert entries[-1]._next is root


def test_cancel_unlinks_in_place_and_only_from_its_own_bucket() -> None:
    bucket = TimerTaskList()
    other = TimerTaskList()
    a, b, c = Entry(1), Entry(1), Entry(1)
    for e in (a, b, c):
        bucket.add(e)
    other.remove(b)  # not its bucket: no effect
    assert bucket.entries() == [a, b, c]
    b.cancel()
    assert bucket.entries() == [a, c]
    assert b._list is None and b._next is None and b._prev is None
    b.cancel()  # idempotent
    assert bucket.entries() == [a, c]


def test_add_moves_an_entry_between_buckets() -> None:
    first, second = TimerTaskList(), TimerTaskList()
    counter = TaskCounter()
    e = Entry(1)
    e._counter = counter
    first.add(e)
    second.add(e)
    assert first.is_empty() and second.entries() == [e]
    assert counter.n == 1


def test_expiration_set_on_reuse_and_cleared_when_emptied() -> None:
    bucket = TimerTaskList()
    assert bucket.expiration is None
    assert bucket.set_expiration(40) is True
    assert bucket.set_expiration(40) is False  # same round: no new wake-up
    cancelled: list[bool] = []

    class Handle:
        def cancel(self) -> None:
            cancelled.append(True)

    e = Entry(1)
    bucket.add(e)
    bucket.handle = Handle()
    e.cancel()
    assert bucket.expiration is None and bucket.handle is None and cancelled == [True]
    assert bucket.set_expiration(40) is True  # reused: needs its wake-up again


# -- TimingWheel arithmetic ------------------------------------------------------------------


def wheel(tick: int = 1, size: int = 20, start: int = 0) -> tuple[TimingWheel, list]:
    timed: list[TimerTaskList] = []
    return TimingWheel(tick, size, start, timed.append), timed


def entry_at(expiration: int) -> Entry:
    e = Entry(0)
    e.expiration_ms = expiration
    return e


def test_current_time_is_truncated_to_a_tick_multiple() -> None:
    w, _ = wheel(tick=5, start=17)
    assert w.current_time == 15
    assert w.interval == 100
    w.advance_clock(19)  # less than a tick ahead: no move
    assert w.current_time == 15
    w.advance_clock(23)
    assert w.current_time == 20


def test_add_refuses_a_task_already_due() -> None:
    w, timed = wheel(start=100)
    assert w.add(entry_at(99)) is False
    assert w.add(entry_at(100)) is False  # expiration < current + tick
    assert w.add(entry_at(101)) is True
    assert timed == [w.buckets[1]]


def test_first_level_buckets_by_tick_and_reuses_an_expired_bucket() -> None:
    """tick 1 ms, 20 buckets: 2 ms -> bucket 2; at 2 ms, 8 ms -> bucket 10 and 19 ms -> bucket 1
    (the bucket of 1 ms, expired, reused for 21 ms)."""
    w, timed = wheel()
    assert w.add(entry_at(2))
    assert occupied(w) == [[(2, 2)]]
    w.advance_clock(2)
    w.buckets[2].pop()  # bucket 2 was flushed
    assert w.add(entry_at(2 + 8)) and w.add(entry_at(2 + 19))
    assert occupied(w) == [[(1, 21), (10, 10)]]
    assert w.overflow_wheel is None  # everything fits in [2, 22)


def test_350_ms_goes_to_the_second_level_and_450_ms_to_the_third() -> None:
    """350 ms goes to level 2 bucket 17 (expiration 340); 450 ms to level 3 bucket 1
    (expiration 400), with every deadline in [400, 800) (446, 455, 473 ms)."""
    w, timed = wheel()
    assert w.add(entry_at(350))
    assert occupied(w) == [[], [(17, 340)]]
    assert w.overflow_wheel is not None and w.overflow_wheel.overflow_wheel is None
    for ms in (450, 446, 455, 473):
        assert w.add(entry_at(ms))
    levels = w.levels()
    assert [lv.tick_ms for lv in levels] == [1, 20, 400]
    assert [lv.interval for lv in levels] == [20, 400, 8000]
    assert occupied(w) == [[], [(17, 340)], [(1, 400)]]
    assert len(levels[2].buckets[1]) == 4
    assert [b.expiration for b in timed] == [340, 400]  # one new expiration per bucket


def test_overflow_wheel_created_on_demand_with_coarser_tick() -> None:
    w, _ = wheel(tick=1, size=20, start=7)
    assert w.overflow_wheel is None
    w.add(entry_at(26))  # within [7, 27): this level
    assert w.overflow_wheel is None
    w.add(entry_at(27))
    ow = w.overflow_wheel
    assert ow is not None
    assert (ow.tick_ms, ow.wheel_size, ow.current_time) == (20, 20, 0)  # start 7 truncated
    w.add(entry_at(7 + 8000))
    assert ow.overflow_wheel is not None and ow.overflow_wheel.tick_ms == 400
    assert ow.overflow_wheel.overflow_wheel is not None  # 8007 is beyond 7 + 8000 - 1


def test_advance_clock_moves_every_level() -> None:
    w, _ = wheel()
    w.add(entry_at(10_000))  # builds four levels
    w.advance_clock(8_437)
    assert [lv.current_time for lv in w.levels()] == [8_437, 8_420, 8_400, 8_000]


# -- Timer on a manual clock -----------------------------------------------------------------


def test_defaults_are_kafkas() -> None:
    _, timer, _ = make()
    assert (timer.wheel.tick_ms, timer.wheel.wheel_size) == (1, 20)


def test_cascade_across_three_levels_runs_at_the_deadline() -> None:
    clock, timer, log = make()
    t = Task(450, "t", clock, log)
    timer.add(t)
    assert occupied(timer.wheel) == [[], [], [(1, 400)]]
    assert clock.next_due() == 400
    clock.advance_to(400)
    assert log == []
    assert occupied(timer.wheel) == [[], [(2, 440)], []]  # 50 ms left: level 2, [440, 460)
    clock.advance_to(440)
    assert occupied(timer.wheel) == [[(10, 450)], [], []]  # 10 ms left: level 1, [450, 451)
    clock.advance_to(449)
    assert log == []
    clock.advance_to(450)
    assert log == [("t", 450)]
    assert clock.fired == 3  # one wake-up per level, none per tick
    assert timer.size == 0 and clock.live == 0


def test_350_ms_task_fires_exactly_at_350() -> None:
    clock, timer, log = make()
    timer.add(Task(350, "a", clock, log))
    clock.advance(10_000)
    assert log == [("a", 350)]
    assert clock.fired == 2  # level-2 bucket at 340, level-1 bucket at 350


def test_random_deadlines_fire_exactly_in_order_and_never_early() -> None:
    rng = random.Random(7)
    clock, timer, log = make(start=1234)
    tasks = []
    for i in range(5000):
        clock.advance(rng.choice((0, 0, 1, 3)))
        t = Task(rng.randint(1, 20_000), i, clock, log)
        t.deadline = clock.time() + t.delay_ms
        timer.add(t)
        tasks.append(t)
    clock.advance(30_000)
    assert len(log) == 5000
    assert all(t.ran_at == t.deadline for t in tasks)
    times = [at for _, at in log]
    assert times == sorted(times)


def test_one_wake_up_per_bucket_not_per_task_nor_per_tick() -> None:
    clock, timer, _ = make()
    for _ in range(1000):
        timer.add(Task(5, None, clock, []))
    assert clock.scheduled == 1 and clock.live == 1
    clock.advance(100)
    assert clock.fired == 1
    # A lone task far away wakes the process once per level on its way down, not per ms.
    timer.add(Task(7_013, None, clock, []))  # due at 7113: buckets 6800, 7100, 7113
    clock.advance(7_013)
    assert clock.fired == 1 + 3


def test_cancel_removes_the_entry_from_its_bucket_at_once() -> None:
    clock, timer, log = make()
    a, b = Task(30, "a", clock, log), Task(30, "b", clock, log)
    timer.add(a)
    timer.add(b)
    bucket = a._list
    assert bucket is not None and bucket.entries() == [a, b]
    a.cancel()
    assert bucket.entries() == [b] and a._list is None
    assert timer.size == 1
    clock.advance(100)
    assert log == [("b", 30)]


def test_no_call_at_handle_for_an_empty_bucket() -> None:
    clock, timer, log = make()
    tasks = [Task(d, d, clock, log) for d in (5, 5, 30, 450, 9_000)]
    for t in tasks:
        timer.add(t)
    assert clock.live == timer.live_callbacks() == 4  # buckets 5, 20(30), 400(450), 8000
    assert_handle_iff_nonempty(timer)
    tasks[0].cancel()
    assert clock.live == 4  # bucket 5 still holds a task
    tasks[1].cancel()
    assert clock.live == 3
    assert_handle_iff_nonempty(timer)
    for t in tasks[2:]:
        t.cancel()
    assert clock.live == 0 and timer.live_callbacks() == 0 and timer.size == 0
    assert_handle_iff_nonempty(timer)
    assert clock.advance(20_000) == 0  # idle: nothing fires
    assert log == []


def test_bucket_reused_after_cancels_is_scheduled_again() -> None:
    clock, timer, log = make()
    t = Task(10, "first", clock, log)
    timer.add(t)
    t.cancel()
    assert clock.live == 0
    timer.add(Task(10, "second", clock, log))
    assert clock.live == 1
    clock.advance(10)
    assert log == [("second", 10)]


def test_size_equals_pending_under_random_adds_cancels_and_expiries() -> None:
    rng = random.Random(3)
    clock, timer, log = make()
    pending: set[Task] = set()

    class Tracked(Task):
        def run(self) -> None:
            pending.discard(self)
            super().run()

    for step in range(20_000):
        r = rng.random()
        if r < 0.5:
            t = Tracked(rng.choice((1, 2, 19, 20, 21, 399, 400, 401, 5000)), step, clock, log)
            timer.add(t)
            pending.add(t)
        elif r < 0.7 and pending:
            t = rng.choice(tuple(pending))
            t.cancel()
            pending.discard(t)
        else:
            clock.advance(rng.randint(0, 25))
        assert timer.size == len(pending)
        if step % 1000 == 0:
            assert_handle_iff_nonempty(timer)
    clock.advance(10_000)
    assert timer.size == 0 and clock.live == 0


def test_task_may_cancel_a_later_task_of_the_same_bucket() -> None:
    clock, timer, log = make()
    victim = Task(10, "victim", clock, log)

    class Killer(Task):
        def run(self) -> None:
            super().run()
            victim.cancel()

    timer.add(Killer(10, "killer", clock, log))
    timer.add(victim)
    clock.advance(50)
    assert log == [("killer", 10)]
    assert timer.size == 0


def test_task_run_may_add_tasks() -> None:
    clock, timer, log = make()

    class Chain(Task):
        def run(self) -> None:
            super().run()
            if self.name < 5:
                timer.add(Chain(7, self.name + 1, clock, log))

    timer.add(Chain(7, 0, clock, log))
    clock.advance(1000)
    assert log == [(i, 7 * (i + 1)) for i in range(6)]


def test_due_task_runs_on_the_next_callback_never_inline() -> None:
    clock, timer, log = make(start=50)
    t = Task(0, "now", clock, log)
    timer.add(t)
    assert log == [] and timer.size == 1
    clock.advance(0)
    assert log == [("now", 50)] and timer.size == 0
    u = Task(-5, "cancelled", clock, log)
    timer.add(u)
    u.cancel()
    assert clock.live == 0
    clock.advance(0)
    assert log == [("now", 50)]


def test_late_and_out_of_order_callbacks_still_flush_in_deadline_order() -> None:
    """A loop may run callbacks late and out of time order (uvloop runs one already due via
    call_soon). Flushing everything due, in order, keeps deadlines exact and the wheel sound."""

    class ShuffledLateClock(ManualClock):
        def advance_to(self, t_ms: float) -> int:
            due: list = []
            kept: list = []
            for h in self._heap:  # one pass: the due ones out, the rest kept in order
                (due if h.when <= t_ms and not h.cancelled else kept).append(h)
            self._heap = kept
            self._now = t_ms
            rng.shuffle(due)
            ran = 0
            for h in due:
                if h.cancelled:
                    continue
                h.done = True
                self.live -= 1
                ran += 1
                h._callback(*h._args)
            return ran

    rng = random.Random(11)
    clock = ShuffledLateClock()
    timer = Timer(clock)
    log: list = []
    tasks = []
    for i in range(3000):
        t = Task(rng.randint(1, 3000), i, clock, log)
        t.deadline = clock.time() + t.delay_ms
        timer.add(t)
        tasks.append(t)
        if i % 10 == 0:
            clock.advance_to(clock.time() + rng.randint(0, 60))  # late by up to 60 ms
    while timer.size:
        clock.advance_to(clock.time() + 50)
    assert all(t.ran_at >= t.deadline for t in tasks)
    # However shuffled the callbacks, the first one flushes everything due, in deadline order.
    by_name = {t.name: t for t in tasks}
    deadlines = [by_name[name].deadline for name, _ in log]
    assert len(log) == len(tasks) and deadlines == sorted(deadlines)
    assert_handle_iff_nonempty(timer)


def test_coarse_tick_fires_at_bucket_start_as_in_kafka() -> None:
    clock, timer, log = make(tick_ms=10, wheel_size=8)
    timer.add(Task(37, "t", clock, log))
    clock.advance(100)
    assert log == [("t", 30)]  # up to one tick early with a coarse tick


def test_failing_task_is_logged_and_the_flush_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    clock, timer, log = make()

    class Boom(Task):
        def run(self) -> None:
            raise RuntimeError("boom")

    timer.add(Boom(5, "boom", clock, log))
    timer.add(Task(5, "ok", clock, log))
    clock.advance(5)
    assert log == [("ok", 5)]
    assert "boom" in caplog.text


def test_close_cancels_wake_ups_and_refuses_adds() -> None:
    clock, timer, log = make()
    timer.add(Task(5, "a", clock, log))
    timer.add(Task(0, "b", clock, log))
    timer.close()
    assert clock.live == 0
    clock.advance(100)
    assert log == []
    with pytest.raises(RuntimeError):
        timer.add(Task(5, "c", clock, log))


def test_readding_a_task_moves_it() -> None:
    clock, timer, log = make()
    t = Task(10, "t", clock, log)
    timer.add(t)
    clock.advance(5)
    timer.add(t)  # now due at 15
    assert timer.size == 1
    clock.advance(100)
    assert log == [("t", 15)]


def test_order_heap_does_not_grow_while_idle() -> None:
    clock, timer, _ = make()
    for _ in range(10_000):
        t = Task(30_000, None, clock, [])
        timer.add(t)
        t.cancel()
    assert len(timer._queue) <= 512
    assert clock.live == 0

