"""purgatory: a hierarchical timing wheel on the event loop and Kafka's delayed-operation
purgatory. Imports nothing of the broker; see docs/purgatory.md."""

from purgatory.clock import Clock, LoopClock, ManualClock, ManualHandle
from purgatory.delayed_operation import DelayedOperation
from purgatory.purgatory import Purgatory
from purgatory.timer import Timer
from purgatory.timer_task_list import TaskCounter, TimerTask, TimerTaskEntry, TimerTaskList
from purgatory.timing_wheel import TimingWheel

__all__ = [
    "Clock",
    "DelayedOperation",
    "LoopClock",
    "ManualClock",
    "ManualHandle",
    "Purgatory",
    "TaskCounter",
    "Timer",
    "TimerTask",
    "TimerTaskEntry",
    "TimerTaskList",
    "TimingWheel",
]
