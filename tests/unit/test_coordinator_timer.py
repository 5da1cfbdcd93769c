"""CoordinatorTimer: one deadline per key on the timing wheel, on a manual clock."""

from __future__ import annotations

from broker.coordinator.timer import CoordinatorTimer
from purgatory import ManualClock, Timer


def make() -> tuple[ManualClock, Timer, CoordinatorTimer[str], list[tuple[str, float]]]:
    clock = ManualClock()
    timer = Timer(clock)
    return clock, timer, CoordinatorTimer(timer), []


def test_a_deadline_runs_once_at_its_time() -> None:
    clock, _timer, deadlines, fired = make()
    deadlines.schedule("a", 100, lambda: fired.append(("a", clock.time())))
    assert deadlines.is_scheduled("a") and len(deadlines) == 1
    clock.advance(99)
    assert fired == []
    clock.advance(1)
    assert fired == [("a", 100)]
    assert not deadlines.is_scheduled("a"), "a deadline that fired is gone"
    clock.advance(1000)
    assert fired == [("a", 100)]


def test_scheduling_a_key_again_replaces_its_deadline() -> None:
    clock, timer, deadlines, fired = make()
    deadlines.schedule("a", 100, lambda: fired.append(("first", clock.time())))
    clock.advance(50)
    deadlines.schedule("a", 100, lambda: fired.append(("second", clock.time())))
    assert len(deadlines) == 1 and timer.size == 1, "the replaced deadline left the wheel"
    clock.advance(60)
    assert fired == []
    clock.advance(40)
    assert fired == [("second", 150)]


def test_cancel_drops_one_key_and_cancel_all_every_key() -> None:
    clock, timer, deadlines, fired = make()
    for key in ("a", "b", "c"):
        deadlines.schedule(key, 10, lambda key=key: fired.append((key, clock.time())))
    deadlines.cancel("b")
    deadlines.cancel("missing")  # nothing to cancel: no error
    clock.advance(10)
    assert sorted(fired) == [("a", 10), ("c", 10)]
    for key in ("d", "e"):
        deadlines.schedule(key, 10, lambda key=key: fired.append((key, clock.time())))
    deadlines.cancel_all()
    assert len(deadlines) == 0 and timer.size == 0
    clock.advance(100)
    assert sorted(fired) == [("a", 10), ("c", 10)]


def test_a_callback_may_schedule_its_own_key_again() -> None:
    clock, _timer, deadlines, fired = make()

    def again() -> None:
        fired.append(("a", clock.time()))
        if len(fired) < 3:
            deadlines.schedule("a", 10, again)

    deadlines.schedule("a", 10, again)
    clock.advance(100)
    assert fired == [("a", 10), ("a", 20), ("a", 30)]
    assert not deadlines.is_scheduled("a")


def test_a_past_deadline_runs_on_the_next_tick_never_inline() -> None:
    clock, _timer, deadlines, fired = make()
    deadlines.schedule("late", -5, lambda: fired.append(("late", clock.time())))
    assert fired == [], "never run inside schedule()"
    clock.advance(1)
    assert [name for name, _ in fired] == ["late"]
