"""The rule for a consumer that holds no partitions: only a member its group confirms, several
times, to be outside a stable membership ends the process (exit 4); an idle member of a
stable group, a short rebalance and an unreachable broker do not."""

from __future__ import annotations

import pytest
from confluent_kafka import ConsumerGroupState

from onceflow.txn.errors import ConsumerStuck
from onceflow.txn.membership import GroupView, MembershipWatch


class _Consumer:
    def __init__(self, member: str = "me") -> None:
        self.partitions: list[int] = []
        self.member = member

    def assignment(self) -> list[int]:
        return self.partitions

    def memberid(self) -> str:
        return self.member


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watch(views: list[GroupView | None], clock: _Clock) -> tuple[MembershipWatch, list[str]]:
    asked: list[str] = []

    def describe(group: str) -> GroupView | None:
        asked.append(group)
        return views.pop(0) if views else None

    return MembershipWatch("g", describe, stuck_after_s=60, check_every_s=15, confirmations=3, clock=clock), asked


def _run(watch: MembershipWatch, consumer: _Consumer, clock: _Clock, until_s: float) -> None:
    while clock.now < until_s:
        watch.observe(consumer)
        clock.now += 1.0


OUTSIDE = GroupView(ConsumerGroupState.STABLE, frozenset({"someone-else"}))
REBALANCING = GroupView(ConsumerGroupState.PREPARING_REBALANCING, frozenset({"me"}))
IDLE_MEMBER = GroupView(ConsumerGroupState.STABLE, frozenset({"me", "other"}))


def test_a_member_left_out_of_its_group_is_stuck_after_three_confirmations() -> None:
    clock, consumer = _Clock(), _Consumer()
    watch, asked = _watch([OUTSIDE, REBALANCING, OUTSIDE], clock)
    with pytest.raises(ConsumerStuck, match="group g: no partitions for 90 s"):
        _run(watch, consumer, clock, until_s=200)
    assert len(asked) == 3  # at 60, 75 and 90 s, not before


def test_an_idle_member_of_a_stable_group_and_an_unreachable_broker_are_not_stuck() -> None:
    clock, consumer = _Clock(), _Consumer()
    watch, asked = _watch([OUTSIDE, OUTSIDE, IDLE_MEMBER, OUTSIDE, None, None, OUTSIDE, None], clock)
    _run(watch, consumer, clock, until_s=60 + 15 * 8)
    assert len(asked) == 8  # two outside, then a member: the count starts again and never reaches 3


def test_partitions_reset_the_watch() -> None:
    clock, consumer = _Clock(), _Consumer()
    watch, asked = _watch([OUTSIDE, OUTSIDE, OUTSIDE], clock)
    _run(watch, consumer, clock, until_s=80)  # one check at 60, one at 75
    consumer.partitions = [0]
    _run(watch, consumer, clock, until_s=100)
    consumer.partitions = []
    _run(watch, consumer, clock, until_s=150)  # unassigned again from 100: no check before 160
    assert len(asked) == 2
