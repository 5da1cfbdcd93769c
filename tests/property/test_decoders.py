"""kafka-python's decoders plus schema_violation, on valid and mutated encodings of every served
request and version: a body either fails to decode (the connection closes) or decodes into a
message that schema_violation refuses exactly when it holds a null the schema forbids; what it
lets through is what the schema promises handlers, field by field (see messages.problems)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.api_message import ApiMessage

from protocol.registry import ApiSpec
from protocol.validate import schema_violation
from tests.property.messages import Builder, as_tree, mutate, problems, served_strategy

served = served_strategy()
rnds = st.randoms(use_true_random=False)


def _build(spec: ApiSpec, version: int, rnd: random.Random) -> tuple[ApiMessage, bytes]:
    message = Builder(rnd).message(spec.request, version)
    return message, bytes(ApiMessage.encode(message, version=version))


@settings(max_examples=300, deadline=None, database=None)
@given(which=served, rnd=rnds)
def test_valid_requests_decode_whole_and_pass(which, rnd) -> None:
    spec, version = which
    sent, body = _build(spec, version, rnd)
    message = spec.request.decode(body, version=version)
    assert problems(message, version) == []
    assert schema_violation(message, version) is None
    assert as_tree(message, version) == as_tree(sent, version)


@settings(max_examples=1500, deadline=None, database=None)
@given(which=served, rnd=rnds)
def test_mutated_requests_are_refused_or_whole(which, rnd) -> None:
    spec, version = which
    body = mutate(_build(spec, version, rnd)[1], rnd)
    try:
        message = spec.request.decode(body, version=version)
    except Exception:  # noqa: BLE001 - any decode error closes the connection, as it should
        return
    found = problems(message, version)
    reason = schema_violation(message, version)
    nulls = [path for kind, path in found if kind == "null"]
    if reason is None:
        assert found == [], "passed validation, yet a handler would get this"
    else:
        assert nulls, f"refused a request that keeps to its schema: {reason}"
        assert nulls[0].removesuffix("[]") in reason, (reason, nulls)
