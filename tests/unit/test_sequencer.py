from dataclasses import dataclass

from broker.network.sequencer import ResponseSequencer, payload_size


@dataclass(eq=False)
class Entry:
    """Stands for a Request: the sequencer reads and writes only ``payload``."""

    size: int
    payload: bytes | None = None


def make():
    signals: list[int] = []
    seq = ResponseSequencer(lambda: signals.append(len(signals)))
    return seq, signals


def test_out_of_order_completion_leaves_in_request_order():
    seq, signals = make()
    a, b, c = seq.reserve(Entry(1)), seq.reserve(Entry(2)), seq.reserve(Entry(3))
    seq.complete(c, b"C")
    seq.complete(b, b"B")
    assert seq.take() == [] and signals == [] and len(seq) == 3
    seq.complete(a, b"A")
    assert signals == [0]  # one signal for the whole batch
    ready = seq.take()
    assert [e.payload for e in ready] == [b"A", b"B", b"C"]
    assert [e.size for e in ready] == [1, 2, 3] and len(seq) == 0


def test_one_signal_per_batch_until_it_is_taken():
    seq, signals = make()
    a, b = seq.reserve(Entry(1)), seq.reserve(Entry(1))
    seq.complete(a, b"A")
    assert signals == [0] and seq.has_ready and len(seq) == 2
    seq.complete(b, b"B")
    assert signals == [0]  # the batch not yet written takes it along
    assert [e.payload for e in seq.take()] == [b"A", b"B"]
    c = seq.reserve(Entry(1))
    seq.complete(c, b"C")
    assert signals == [0, 1] and [e.payload for e in seq.take()] == [b"C"]


def test_gather_lists_wait_in_order_and_count_the_sum_of_their_parts():
    seq, _ = make()
    a, b = seq.reserve(Entry(1)), seq.reserve(Entry(1))
    seq.complete(b, [b"head", memoryview(b"records")])
    seq.complete(a, b"A")
    assert [e.payload for e in seq.take()] == [b"A", [b"head", memoryview(b"records")]]
    assert payload_size([b"head", memoryview(b"records"), bytearray(3)]) == 14
    assert payload_size(b"abc") == 3


def test_clear_returns_pending_and_ready_entries_for_release():
    seq, _ = make()
    a = seq.reserve(Entry(5))
    seq.reserve(Entry(10))
    seq.reserve(Entry(20))
    seq.complete(a, b"A")
    assert sorted(s.size for s in seq.clear()) == [5, 10, 20]
    assert len(seq) == 0 and not seq.has_ready and seq.take() == []
