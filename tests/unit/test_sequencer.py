from dataclasses import dataclass

from broker.network.sequencer import ResponseSequencer


@dataclass(eq=False)
class Entry:
    """Stands for a Request: the sequencer reads and writes only ``payload``."""

    size: int
    payload: bytes | None = None


def make():
    written: list[bytes] = []
    sent: list[int] = []
    seq = ResponseSequencer(written.append, lambda entry: sent.append(entry.size))
    return seq, written, sent


def test_out_of_order_completion_leaves_in_request_order():
    seq, written, sent = make()
    a, b, c = seq.reserve(Entry(1)), seq.reserve(Entry(2)), seq.reserve(Entry(3))
    seq.complete(c, b"C")
    seq.complete(b, b"B")
    assert written == [] and len(seq) == 3
    seq.complete(a, b"A")
    assert written == [b"A", b"B", b"C"]
    assert sent == [1, 2, 3] and len(seq) == 0


def test_head_completion_writes_at_once():
    seq, written, _ = make()
    a, b = seq.reserve(Entry(1)), seq.reserve(Entry(1))
    seq.complete(a, b"A")
    assert written == [b"A"]
    seq.complete(b, b"B")
    assert written == [b"A", b"B"]


def test_clear_returns_pending_slots_for_release():
    seq, written, _ = make()
    seq.reserve(Entry(10))
    seq.reserve(Entry(20))
    assert [s.size for s in seq.clear()] == [10, 20]
    assert len(seq) == 0 and written == []
