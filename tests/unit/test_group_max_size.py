"""group.max.size in the classic coordinator, as Kafka's acceptJoiningMember: while a rebalance
gathers members the ones already rejoined count, otherwise the members do; a new member past
the limit is answered GROUP_MAX_SIZE_REACHED and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.group.classic_group import GroupState
from broker.group.classic_member import JoinResult
from broker.replica.delayed_result import Completion
from protocol.errors import ErrorCode
from tests.support.components import Components, build
from tests.unit.test_group_coordinator import GROUP, OVERRIDES, join, join_new, stable_pair, state


@pytest.fixture
async def capped(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {**OVERRIDES, "group.max.size": "2"})
    yield c
    await c.close()


def _refused(result: Completion[JoinResult]) -> bool:
    """Answered at once (already done) with GROUP_MAX_SIZE_REACHED and no member id."""
    if not result.done():
        return False
    joined = result.result()
    return joined.error == ErrorCode.GROUP_MAX_SIZE_REACHED and joined.member_id == ""


async def test_a_full_stable_group_refuses_a_new_member_and_keeps_its_own(capped) -> None:
    a, b = await stable_pair(capped)
    assert _refused(join(capped, client="c"))
    assert state(capped) == GroupState.STABLE
    assert set(capped.coordinator.groups.classic(GROUP).members) == {a, b}
    rejoin = join(capped, a)  # a member of the group is never refused
    assert isinstance(rejoin, Completion) and not rejoin.done()  # parked for the rebalance


async def test_while_rebalancing_the_members_already_rejoined_count(capped) -> None:
    join_new(capped, "a")
    join_new(capped, "b")  # two awaiting their join: the limit
    assert state(capped) == GroupState.PREPARING_REBALANCE
    assert _refused(join(capped, client="c"))
    assert _refused(join(capped, client="d", require_known_id=False))
    assert len(capped.coordinator.groups.classic(GROUP).members) == 2
