"""The membership rule (``onceflow.txn.membership``) asked of the real broker: an idle member of
a stable group (more consumers than partitions) holds nothing and is not stuck; a consumer the
group does not list is, and the rule says which group and member."""

from __future__ import annotations

import time

import pytest

from onceflow.kafka import clients
from onceflow.topology import Topic
from onceflow.txn.errors import ConsumerStuck
from onceflow.txn.membership import MembershipWatch, describe_group
from tests.conftest import Pipeline

pytestmark = pytest.mark.integration


def _settle(consumers: list, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not any(c.assignment() for c in consumers):
        for consumer in consumers:
            consumer.consume(1, 0.2)
    for _ in range(10):  # a few more rounds for the second member's join to settle
        for consumer in consumers:
            consumer.consume(1, 0.2)


def test_the_group_vouches_for_an_idle_member_and_not_for_a_stranger(pipeline: Pipeline) -> None:
    group = pipeline.topic("membership-group")
    topic = pipeline.topic(Topic.SINK_DLQ)  # one partition (infra/topics.toml)
    consumers = [clients.consumer(pipeline.common, group) for _ in range(2)]
    admin = clients.admin(pipeline.common)
    try:
        for consumer in consumers:
            consumer.subscribe([topic])
        _settle(consumers)
        idle = next(c for c in consumers if not c.assignment())
        view = describe_group(admin, group)
        assert view is not None and idle.memberid() in view.member_ids, view

        def watch(group_id: str) -> MembershipWatch:
            return MembershipWatch(group_id, lambda g: describe_group(admin, g), stuck_after_s=0, check_every_s=0, confirmations=2)

        member_watch = watch(group)
        for _ in range(3):
            member_watch.observe(idle)  # a member of a stable group: never stuck
        stranger_watch = watch(pipeline.topic("some-other-group"))
        stranger_watch.observe(idle)
        with pytest.raises(ConsumerStuck, match="is outside the group"):
            stranger_watch.observe(idle)
    finally:
        for consumer in consumers:
            consumer.close()
