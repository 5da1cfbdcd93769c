"""The Go clients' programs for the conformance suite: sarama and kafka-go, from Debian 12's
packages, built by tests/conformance/go/install.sh into .cache/go/bin/.

`require()` runs install.sh in build-only mode first, so a test always runs a binary built from
the current sources; when the clients are not installed (or cannot be built) it skips with the
reason install.sh left in .cache/go/unavailable, also raised as a warning so that it shows in
the summary of a plain `pytest -q` run.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients import Rec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CACHE = ROOT / ".cache" / "go"
REASON = CACHE / "unavailable"
INSTALL = "run `bash tests/conformance/go/install.sh` (`make test` does)"


@dataclass(frozen=True)
class Program:
    path: Path
    version: str  # the Debian package version it was built against

    def run(self, bootstrap: str, scenario: str, *args: object, timeout: float = 100) -> dict:
        """Run one scenario; its JSON summary line. A timeout or an exit code other than 0
        fails the test with the program's stderr."""
        cmd = [str(self.path), bootstrap, scenario, *map(str, args)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"{self.path.name} {scenario} timed out after {timeout}s; "
                                 f"stderr:\n{_text(e.stderr)[-6000:]}") from None
        assert proc.returncode == 0, (
            f"{self.path.name} {scenario} exited {proc.returncode}:\n{proc.stderr[-6000:]}")
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        assert lines, f"{self.path.name} {scenario} printed no summary:\n{proc.stderr[-6000:]}"
        summary = json.loads(lines[-1])
        assert summary["client"] == self.version, summary["client"]
        return summary


@cache
def _built() -> str | None:
    """install.sh in build-only mode, once per session; None when it built both programs."""
    env = {**os.environ, "GO_CLIENTS_BUILD_ONLY": "1"}
    try:
        subprocess.run(["bash", str(HERE / "install.sh")], env=env, capture_output=True,
                       timeout=600, check=False)
    except subprocess.TimeoutExpired:
        return "tests/conformance/go/install.sh did not finish building in 600 s"
    if REASON.exists():
        return REASON.read_text().strip() or f"no reason given: {INSTALL}"
    return None


def require(name: str) -> Program:
    """The program `name` (sarama or kafkago), or a skip with the reason, also warned."""
    reason = _built()
    path = CACHE / "bin" / name
    stamp = path.with_name(f"{name}.version")
    if reason is None and not (path.exists() and stamp.exists()):
        reason = f"{path} was not built: {INSTALL}"
    if reason is not None:
        warnings.warn(f"Go client tests skipped: {reason}", stacklevel=2)
        pytest.skip(reason)
    return Program(path, stamp.read_text().strip())


# -- records in the programs' text form ------------------------------------------------------


def token(b: bytes | None) -> str:
    """The programs' byte encoding: "-" is null, "=" + base64 is bytes (empty included)."""
    return "-" if b is None else "=" + base64.b64encode(b).decode()


def untoken(t: str) -> bytes | None:
    return None if t == "-" else base64.b64decode(t[1:])


def write_records(path: Path, records: list[Rec]) -> None:
    """One line per record: CreateTime, key, value, then header key/value pairs, tab-separated."""
    lines = []
    for r in records:
        fields = [str(r.timestamp), token(r.key), token(r.value)]
        for k, v in r.headers:
            fields += [token(k.encode()), token(v)]
        lines.append("\t".join(fields) + "\n")
    path.write_text("".join(lines))


def refusals(broker: BrokerProcess) -> list[str]:
    """Why the broker closed connections ("unsupported version 2 of Produce", ...)."""
    reasons = []
    for line in broker.log_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("event") == "closing connection":
            reasons.append(str(row.get("reason")))
    return reasons


def _text(out: bytes | str | None) -> str:
    if isinstance(out, bytes):
        return out.decode(errors="replace")
    return out or ""
