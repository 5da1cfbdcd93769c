"""The consistency checker's analysis on histories made by hand and by Hypothesis: a clean
history shows no anomaly, and each anomaly put into one is found, alone. Then the CLI's
replication defaults and the choice of the node a cluster fault hits."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bench.consistency import Assign, History, Outcome, Poll, Record, Send, analyse
from bench.consistency.__main__ import parse, replication, workload_of
from bench.consistency.faults import fault_node


def send(value: str, partition: int, offset: int | None, producer: str = "p0",
         txn: int | None = None, error: str | None = None) -> Send:
    acked = None if error is not None or offset is None else 1.0
    return Send(producer, value, partition, offset, error, 0.0, acked, txn)


def poll(consumer: str, *records: tuple[int, int, str], committed: bool = False) -> Poll:
    return Poll(consumer, tuple(Record(p, o, v) for p, o, v in records), 2.0, committed)


def found(history: History) -> dict[str, int]:
    return {k: n for k, n in analyse(history).counts().items() if n}


# -- by hand ---------------------------------------------------------------------------------


def test_clean_history_with_gaps_has_no_anomaly() -> None:
    h = History(sends=[send("a", 0, 0), send("b", 0, 2), send("c", 1, 0)],
                reads=[poll("c0", (0, 0, "a"), (1, 0, "c")), poll("c0", (0, 2, "b"))],
                drained=True)
    analysis = analyse(h)
    assert analysis.ok and found(h) == {}
    assert (analysis.sent, analysis.acknowledged, analysis.read) == (3, 3, 3)


def test_lost_acknowledged_record_before_a_read_offset() -> None:
    h = History(sends=[send("a", 0, 0), send("b", 0, 1), send("c", 0, 2)],
                reads=[poll("c0", (0, 0, "a"), (0, 2, "c"))])
    analysis = analyse(h)
    assert found(h) == {"lost": 1}
    assert analysis.anomalies["lost"][0]["value"] == "b"
    assert analysis.anomalies["lost"][0]["highest_read"] == 2
    assert not analysis.ok


def test_unseen_is_a_failure_only_when_drained() -> None:
    sends = [send("a", 0, 0), send("b", 0, 1), send("u", 1, None)]
    sends[2] = dataclasses.replace(sends[2], acked_s=1.0)  # acknowledged without an offset
    reads: list[Poll | Assign] = [poll("c0", (0, 0, "a"))]
    early = analyse(History(sends=sends, reads=reads, drained=False))
    assert early.counts()["unseen"] == 2 and early.ok
    drained = analyse(History(sends=sends, reads=reads, drained=True))
    assert drained.failures() == {"unseen": 2}


def test_refused_and_unanswered_sends_are_not_acknowledged() -> None:
    h = History(sends=[send("a", 0, 0), send("x", 0, None, error="REQUEST_TIMED_OUT"),
                       send("y", 0, None)],
                reads=[poll("c0", (0, 0, "a"))], drained=True)
    assert found(h) == {}
    assert analyse(h).acknowledged == 1


def test_duplicate_value_at_two_offsets() -> None:
    h = History(sends=[send("a", 0, 0)],
                reads=[poll("c0", (0, 0, "a"), (0, 1, "a"))], drained=True)
    assert found(h) == {"duplicate": 1}
    assert analyse(h).anomalies["duplicate"][0]["positions"] == [[0, 0], [0, 1]]


def test_inconsistent_offsets_between_ack_and_read() -> None:
    h = History(sends=[send("a", 0, 0), send("b", 0, 0, producer="p1")],
                reads=[poll("c0", (0, 0, "b"))], drained=True)
    # "a" was acknowledged at 0, "b" sits there: "a" is lost and the offset has two records
    assert found(h) == {"inconsistent_offsets": 1, "lost": 1}
    assert analyse(h).anomalies["inconsistent_offsets"][0]["values"] == ["a", "b"]


def test_nonmonotonic_poll_unless_assigned_in_between() -> None:
    first = poll("c0", (0, 0, "a"), (0, 1, "b"))
    again = poll("c0", (0, 1, "b"))
    sends = [send("a", 0, 0), send("b", 0, 1)]
    h = History(sends=sends, reads=[first, again], drained=True)
    assert found(h) == {"nonmonotonic_poll": 1}
    assert analyse(h).anomalies["nonmonotonic_poll"][0]["offsets"] == [1, 1]
    sought = History(sends=sends, reads=[first, Assign("c0", (0,)), again], drained=True)
    assert found(sought) == {}
    other_partition = History(sends=sends, reads=[first, Assign("c0", (1,)), again])
    assert found(other_partition) == {"nonmonotonic_poll": 1}


def test_nonmonotonic_poll_inside_one_poll() -> None:
    h = History(sends=[send("a", 0, 0), send("b", 0, 1)],
                reads=[poll("c0", (0, 1, "b"), (0, 0, "a"))], drained=True)
    assert found(h) == {"nonmonotonic_poll": 1}


def test_nonmonotonic_send() -> None:
    h = History(sends=[send("b", 0, 1), send("a", 0, 0), send("c", 1, 0)],
                reads=[poll("c0", (0, 0, "a"), (0, 1, "b"), (1, 0, "c"))], drained=True)
    assert found(h) == {"nonmonotonic_send": 1}
    case = analyse(h).anomalies["nonmonotonic_send"][0]
    assert case["values"] == ["b", "a"] and case["offsets"] == [1, 0]


def test_aborted_read_only_for_read_committed() -> None:
    sends = [send("a", 0, 0, txn=0), send("b", 0, 2, txn=1)]
    txns = {("p0", 0): Outcome.COMMITTED, ("p0", 1): Outcome.ABORTED}
    bad = History(sends=sends, txns=txns, drained=True,
                  reads=[poll("c0", (0, 0, "a"), (0, 2, "b"), committed=True)])
    assert found(bad) == {"aborted_read": 1}
    assert analyse(bad).anomalies["aborted_read"][0]["txn"] == 1
    uncommitted = History(sends=sends, txns=txns, drained=True,
                          reads=[poll("c0", (0, 0, "a"), (0, 2, "b"))])
    assert found(uncommitted) == {}


def test_transaction_records_count_only_once_committed() -> None:
    sends = [send("a", 0, 0, txn=0), send("b", 0, 2, txn=1), send("c", 0, 4, txn=2)]
    txns = {("p0", 0): Outcome.COMMITTED, ("p0", 1): Outcome.UNKNOWN,
            ("p0", 2): Outcome.ABORTED}
    h = History(sends=sends, txns=txns, drained=True,
                reads=[poll("c0", (0, 0, "a"), committed=True)])
    assert found(h) == {}
    assert analyse(h).acknowledged == 1


def test_to_dict_is_json_ready() -> None:
    import json

    h = History(sends=[send("a", 0, 0), send("b", 0, 1)], reads=[poll("c0", (0, 1, "b"))])
    summary = analyse(h).to_dict()
    assert json.loads(json.dumps(summary))["failures"] == {"lost": 1}
    assert summary["examples"]["lost"][0]["value"] == "a"


# -- by Hypothesis ---------------------------------------------------------------------------

# The machine is shared: generation may be slow there without anything being wrong.
CHECK = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.filter_too_much])


@st.composite
def clean_histories(draw: st.DrawFn, min_sends: int = 0) -> History:
    """A history a correct broker could give: sends in one global order with offsets per
    partition (gaps where transaction markers go), some refused, transactions committed,
    aborted or of unknown outcome; consumers reading prefixes in order (some seeking back
    after an assignment) and a final consumer reading everything."""
    partitions = draw(st.integers(1, 3))
    producers = draw(st.integers(1, 3))
    transactional = draw(st.booleans())
    order = draw(st.lists(st.tuples(st.integers(0, producers - 1), st.integers(0, partitions - 1),
                                    st.integers(0, 2), st.booleans(), st.booleans(),
                                    st.sampled_from(list(Outcome))),
                          min_size=min_sends, max_size=30))
    next_offset = [0] * partitions
    sends: list[Send] = []
    txns: dict[tuple[str, int], Outcome] = {}
    txn_of = [0] * producers
    log: list[list[Record]] = [[] for _ in range(partitions)]  # what each consumer can read
    for i, (producer, partition, gap, refused, new_txn, outcome) in enumerate(order):
        name, value = f"p{producer}", f"v{i}"
        txn = None
        if transactional:
            txn_of[producer] += new_txn
            txn = txn_of[producer]
            txns.setdefault((name, txn), outcome)
        if refused and not transactional:
            sends.append(send(value, partition, None, name, error="NOT_ENOUGH_REPLICAS"))
            continue
        offset = next_offset[partition] + gap
        next_offset[partition] = offset + 1
        sends.append(send(value, partition, offset, name, txn))
        if txn is None or txns[(name, txn)] is not Outcome.ABORTED:
            log[partition].append(Record(partition, offset, value))
    rng = random.Random(draw(st.integers(0, 2**32)))  # the reads: cheap to draw
    reads: list[Poll | Assign] = []
    for c in range(draw(st.integers(0, 3))):
        reads += _read(rng, f"c{c}", log, transactional, everything=False)
    reads += _read(rng, "drain", log, transactional, everything=True)
    return History(sends=sends, reads=reads, txns=txns, drained=True)


def _read(rng: random.Random, consumer: str, log: list[list[Record]], committed: bool,
          everything: bool) -> list[Poll | Assign]:
    """One consumer's polls: a prefix of each partition (all of it for ``everything``), in
    chunks that mix partitions, maybe read again after an assignment."""
    events: list[Poll | Assign] = [Assign(consumer, tuple(range(len(log))))]
    rounds = 1 if everything else rng.randint(1, 2)
    for _ in range(rounds):
        queues = [records if everything else records[:rng.randint(0, len(records))]
                  for records in log]
        positions = [0] * len(log)
        while any(positions[p] < len(q) for p, q in enumerate(queues)):
            chunk: list[Record] = []
            for p, q in enumerate(queues):
                take = rng.randint(0, 3)
                chunk += q[positions[p]:positions[p] + take]
                positions[p] = min(len(q), positions[p] + take)
            events.append(Poll(consumer, tuple(chunk), 1.0, committed))
        events.append(Assign(consumer, tuple(range(len(log)))))
    return events


@CHECK
@given(clean_histories())
def test_clean_histories_have_no_anomaly(h: History) -> None:
    analysis = analyse(h)
    assert analysis.counts() == dict.fromkeys(analysis.counts(), 0)
    assert analysis.ok


def _read_offsets(h: History) -> dict[int, int]:
    highest: dict[int, int] = {}
    for p in h.polls():
        for r in p.records:
            highest[r.partition] = max(highest.get(r.partition, -1), r.offset)
    return highest


@CHECK
@given(clean_histories(min_sends=3), st.data())
def test_injected_lost_is_found(h: History, data: st.DataObject) -> None:
    highest = _read_offsets(h)
    candidates = [s for s in h.sends if h.acknowledged(s) and s.offset is not None
                  and s.offset < highest.get(s.partition, -1)]
    assume(candidates)
    victim = data.draw(st.sampled_from(candidates)).value
    h.reads = [dataclasses.replace(e, records=tuple(r for r in e.records if r.value != victim))
               if isinstance(e, Poll) else e for e in h.reads]
    assert found(h) == {"lost": 1}


@CHECK
@given(clean_histories(min_sends=3), st.integers(0, 2))
def test_injected_unseen_is_found(h: History, partition: int) -> None:
    beyond = max([s.offset for s in h.sends if s.offset is not None], default=0) + 5
    h.sends.append(send("never-read", partition, beyond, producer="late"))
    assert found(h) == {"unseen": 1}


@CHECK
@given(clean_histories(min_sends=3), st.data())
def test_injected_duplicate_is_found(h: History, data: st.DataObject) -> None:
    records = [r for p in h.polls() for r in p.records]
    assume(records)
    r = data.draw(st.sampled_from(records))
    beyond = max(s.offset for s in h.sends if s.offset is not None) + 1
    h.reads.append(poll("extra", (r.partition, beyond, r.value)))
    assert found(h) == {"duplicate": 1}


@CHECK
@given(clean_histories(min_sends=3), st.data())
def test_injected_inconsistent_offset_is_found(h: History, data: st.DataObject) -> None:
    records = [r for p in h.polls() for r in p.records]
    assume(records)
    r = data.draw(st.sampled_from(records))
    h.reads.append(poll("extra", (r.partition, r.offset, "ghost")))
    assert found(h) == {"inconsistent_offsets": 1}


@CHECK
@given(clean_histories(min_sends=3), st.data())
def test_injected_nonmonotonic_poll_is_found(h: History, data: st.DataObject) -> None:
    nonempty = [i for i, e in enumerate(h.reads) if isinstance(e, Poll) and e.records]
    assume(nonempty)
    i = data.draw(st.sampled_from(nonempty))
    h.reads.insert(i + 1, h.reads[i])  # the same records again, no assignment between
    assert found(h).keys() == {"nonmonotonic_poll"}


@CHECK
@given(clean_histories(min_sends=3), st.data())
def test_injected_nonmonotonic_send_is_found(h: History, data: st.DataObject) -> None:
    pairs = [(i, j) for i, a in enumerate(h.sends) for j, b in enumerate(h.sends)
             if i < j and a.offset is not None and b.offset is not None
             and (a.producer, a.partition) == (b.producer, b.partition)
             and not any(c.offset is not None and (c.producer, c.partition) == (a.producer,
                                                                                a.partition)
                         for c in h.sends[i + 1:j])]
    assume(pairs)
    i, j = data.draw(st.sampled_from(pairs))
    h.sends[i], h.sends[j] = h.sends[j], h.sends[i]
    assert found(h) == {"nonmonotonic_send": 1}


@CHECK
@given(clean_histories(min_sends=3), st.data())
def test_injected_aborted_read_is_found(h: History, data: st.DataObject) -> None:
    read = {r.value for p in h.polls() for r in p.records}
    committed = sorted({(s.producer, s.txn) for s in h.sends if s.txn is not None
                        and s.value in read and h.outcome(s) is Outcome.COMMITTED})
    assume(committed)
    key = data.draw(st.sampled_from(committed))
    h.txns[key] = Outcome.ABORTED
    assert found(h).keys() == {"aborted_read"}


# -- the CLI's replication and the cluster's fault aim -----------------------------------------


@pytest.mark.parametrize(("flags", "expected"), [
    ([], (1, None)),  # one broker: one replica, the broker's min.insync.replicas
    (["--cluster", "3"], (3, 2)),  # acks=all then survives one broker down
    (["--cluster", "5"], (3, 2)),
    (["--cluster", "2"], (2, 2)),
    (["--cluster", "1"], (1, 1)),
    (["--cluster", "3", "--replication-factor", "2"], (2, 2)),
    (["--cluster", "3", "--replication-factor", "1"], (1, 1)),
    (["--cluster", "3", "--min-insync-replicas", "3"], (3, 3)),
    (["--replication-factor", "1", "--min-insync-replicas", "1"], (1, 1)),
])
def test_replication_defaults(flags: list[str], expected: tuple[int, int | None]) -> None:
    args = parse(flags)
    assert replication(args) == expected
    w = workload_of(args)
    assert (w.replication_factor, w.min_insync_replicas) == expected
    assert w.topic.startswith("consistency-") if args.cluster else w.topic == ""


def test_cluster_excludes_bootstrap() -> None:
    with pytest.raises(SystemExit):
        parse(["--cluster", "3", "--bootstrap", "127.0.0.1:9092"])
    with pytest.raises(SystemExit):
        parse(["--cluster", "-1"])


def test_cluster_faults_hit_a_leader_or_an_isr_follower() -> None:
    states: list[tuple[int | None, list[int]]] = [(1, [1, 2, 3]), (2, [2, 3]), (3, [3])]
    for seed in range(20):
        node, partition = fault_node("kill", states, [1, 2, 3], random.Random(seed))
        assert partition is not None and node == states[partition][0]
        node, partition = fault_node("move-leader", states, [1, 2, 3], random.Random(seed))
        assert partition in (0, 1)  # partition 2 has no follower in its ISR
        leader, isr = states[partition]
        assert node in isr and node != leader


def test_cluster_fault_without_a_leader_hits_any_node() -> None:
    offline: list[tuple[int | None, list[int]]] = [(None, []), (None, [2])]
    hit = {fault_node(kind, offline, [1, 2, 3], random.Random(seed))
           for kind in ("pause", "move-leader") for seed in range(30)}
    assert {partition for _, partition in hit} == {None}
    assert {node for node, _ in hit} == {1, 2, 3}
    assert fault_node("kill", [], [4], random.Random(0)) == (4, None)
