"""purgatory: a hierarchical timing wheel on the event loop and Kafka's delayed-operation
purgatory. Imports nothing of the broker; see docs/purgatory.md."""

from purgatory.clock import (
    SYSTEM_WALL_CLOCK,
    Clock,
    LoopClock,
    ManualClock,
    ManualHandle,
    SystemWallClock,
    WallClock,
    system_wall_ms,
)
from purgatory.delayed_operation import DelayedOperation
from purgatory.purgatory import Purgatory
from purgatory.timer import Timer
from purgatory.timer_task_list import TaskCounter, TimerTask, TimerTaskEntry, TimerTaskList
from purgatory.timing_wheel import TimingWheel

__all__ = [
    "SYSTEM_WALL_CLOCK",
    "Clock",
    "DelayedOperation",
    "LoopClock",
    "ManualClock",
    "ManualHandle",
    "Purgatory",
    "SystemWallClock",
    "TaskCounter",
    "Timer",
    "TimerTask",
    "TimerTaskEntry",
    "TimerTaskList",
    "TimingWheel",
    "WallClock",
    "system_wall_ms",
]
