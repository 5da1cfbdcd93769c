"""LogManager.abandon: the crash path of an embedded broker's kill (no flush, no checkpoint, no
clean-shutdown marker, locks released), and the recovery the next load runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.log import LogConfig, LogManager
from broker.log.checkpoint import read_offset_checkpoint
from broker.log.manager import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_CHECKPOINT_FILE
from protocol.record_batch import iter_batches
from tests.unit.test_log_manager import T0, batch


def test_abandon_leaves_the_dirs_to_recovery_and_unlocked(tmp_path: Path) -> None:
    mgr = LogManager([tmp_path], LogConfig())
    mgr.load()
    log = mgr.create_log("t", 0)
    for _ in range(3):
        log.append(batch(), T0)
    mgr.flush_all()  # recovery point 6 checkpointed
    for _ in range(2):
        log.append(batch(), T0)  # offsets 6-9: written, never flushed nor checkpointed
    with pytest.raises(RuntimeError, match="locked"):
        LogManager([tmp_path], LogConfig()).load()

    mgr.abandon()

    assert log.closed
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT_FILE) == {("t", 0): 6}
    segment = tmp_path / "t-0" / f"{0:020d}.log"
    data = bytearray(segment.read_bytes())
    fourth = [p for p, _h in iter_batches(bytes(data))][3]
    data[fourth + 70] ^= 1  # a bad CRC past the recovery point: a clean load would trust it
    segment.write_bytes(data)
    again = LogManager([tmp_path], LogConfig())  # the lock went with the abandoned manager
    reopened = again.load()[("t", 0)]
    assert reopened.log_end_offset == 6, "recovery from the recovery point cut the bad batch"
    again.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
