"""The consistency checker: a bounded workload under faults, then Jepsen's anomalies for
Kafka found in what the clients saw (``python -m bench.consistency --help``).

``analyse(history)`` is the pure analysis; ``run_check(...)`` runs a workload and analyses it.
The workload's names are imported on first use, so the analysis needs no Kafka client.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from bench.consistency.analysis import KINDS, Analysis, analyse
from bench.consistency.history import Assign, History, Outcome, Poll, Record, Send

__all__ = ["KINDS", "Analysis", "Assign", "History", "Outcome", "Poll", "Record", "Send",
           "analyse", "run_check", "Workload", "FaultTarget", "FaultEvent"]

_LAZY = {"run_check": "bench.consistency.workload", "Workload": "bench.consistency.workload",
         "FaultTarget": "bench.consistency.faults", "FaultEvent": "bench.consistency.faults"}


def __getattr__(name: str) -> Any:
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home), name)
