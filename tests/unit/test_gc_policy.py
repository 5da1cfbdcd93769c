"""The GC policies and the pause record, each run in a fresh interpreter where the policy
changes process-wide state (a frozen generation, thresholds) that must not leak into pytest's."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest

from broker import gc_policy
from broker.config import BrokerConfig, ConfigError


def _in_fresh_interpreter(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True,
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("policy, frozen, gen0", [
    ("default", False, 700), ("freeze", True, 700), ("tuned", True, 12345)])
def test_policies_freeze_and_set_gen0(policy, frozen, gen0):
    got = _in_fresh_interpreter(f"""
        import gc, json
        from broker import gc_policy
        keep = [[i] for i in range(1000)]  # survivors of start-up
        thresholds = gc_policy.apply({policy!r}, 12345)
        print(json.dumps({{"thresholds": list(thresholds), "frozen": gc.get_freeze_count(),
                          "now": list(gc.get_threshold())}}))
    """)
    assert got["thresholds"] == got["now"]
    assert got["now"][0] == gen0
    assert (got["frozen"] >= 1000) is frozen


def test_unknown_policy_refused():
    with pytest.raises(ValueError, match="unknown GC policy"):
        gc_policy.apply("off", 1)


def test_pauses_count_collections_per_generation():
    pauses = gc_policy.GcPauses().install()
    try:
        a: list = []
        a.append(a)  # a cycle only the collector frees
        del a
        gc.collect(0)
        gc.collect(2)
    finally:
        pauses.uninstall()
    assert pauses not in gc.callbacks
    summary = pauses.summary()
    assert summary["collections"][0] >= 1 and summary["collections"][2] >= 1
    assert summary["collected"] >= 1
    assert summary["total_pause_ms"] == pytest.approx(sum(summary["pause_ms"]), abs=0.01)
    assert all(m <= t for m, t in zip(summary["max_pause_ms"], summary["pause_ms"], strict=True))


def test_config_keys():
    cfg = BrokerConfig.from_properties(None, [])
    assert cfg["minibroker.gc.policy"] == "tuned"
    assert cfg["minibroker.gc.gen0.threshold"] == 50000
    cfg = BrokerConfig.from_properties(None, ["minibroker.gc.policy=freeze",
                                              "minibroker.gc.gen0.threshold=100000"])
    assert (cfg["minibroker.gc.policy"], cfg["minibroker.gc.gen0.threshold"]) == ("freeze", 100000)
    with pytest.raises(ConfigError, match=r"minibroker\.gc\.policy"):
        BrokerConfig.from_properties(None, ["minibroker.gc.policy=off"])
    with pytest.raises(ConfigError, match=r"minibroker\.gc\.gen0\.threshold"):
        BrokerConfig.from_properties(None, ["minibroker.gc.gen0.threshold=0"])
