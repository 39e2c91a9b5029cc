"""Is a consumer that holds no partitions still in its group? One rule for every consume loop
(the shared loop, the sink): after a broker restart under load, a sink's consumer timed out of
its session, was revoked, and never joined again; it polled on, holding nothing, for the seven
minutes until the run ended, while the other services' consumers rejoined at once. An
instance can also hold nothing legitimately (more instances than partitions), so the group is
asked, and only a member the group does not list as part of a stable membership counts.

After ``stuck_after_s`` without partitions, the group is described every ``check_every_s``;
``confirmations`` answers in a row that leave this member out of a stable group end the
process with ``ConsumerStuck`` (exit 4), so that a new one joins. A broker that does not
answer the question counts for nothing: a new process would not reach it either."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from onceflow.config import CommonSettings
from onceflow.kafka import clients
from onceflow.txn.errors import ConsumerStuck

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupView:
    state: ConsumerGroupState
    member_ids: frozenset[str]


def describe_group(admin: AdminClient, group_id: str, timeout_s: float = 10.0) -> GroupView | None:
    """The group's state and members as its coordinator reports them; None if it cannot say.
    ``admin`` must outlive the call: a collected client never completes its futures."""
    try:
        future = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)[group_id]
        description = future.result(timeout=timeout_s + 5)
    except (KafkaException, TimeoutError) as exc:
        log.info("describing group %s: %s", group_id, exc)
        return None
    return GroupView(description.state, frozenset(m.member_id for m in description.members))


class MembershipWatch:
    def __init__(
        self,
        group_id: str,
        describe: Callable[[str], GroupView | None],
        stuck_after_s: float = 60.0,
        check_every_s: float = 15.0,
        confirmations: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._group_id = group_id
        self._describe = describe
        self._stuck_after_s = stuck_after_s
        self._check_every_s = check_every_s
        self._confirmations = confirmations
        self._clock = clock
        self._unassigned_since: float | None = None
        self._next_check = 0.0
        self._outside = 0  # answers in a row that left this member out

    def observe(self, consumer: Consumer) -> None:
        """Call once per poll round. Raises ConsumerStuck when the member has been confirmed lost."""
        now = self._clock()
        if consumer.assignment():
            self._unassigned_since, self._outside = None, 0
            return
        if self._unassigned_since is None:
            self._unassigned_since = now
        if now - self._unassigned_since < self._stuck_after_s or now < self._next_check:
            return
        self._next_check = now + self._check_every_s
        view = self._describe(self._group_id)
        if view is None:
            return
        member = consumer.memberid() or ""
        if view.state == ConsumerGroupState.STABLE and member in view.member_ids:
            self._outside = 0  # a member without partitions: more instances than partitions
            return
        self._outside += 1
        log.warning(
            "group %s: no partitions for %.0f s and member %r is not in a stable membership (%s, %d members); %d of %d",
            self._group_id, now - self._unassigned_since, member, view.state.name, len(view.member_ids),
            self._outside, self._confirmations,
        )
        if self._outside >= self._confirmations:
            raise ConsumerStuck(
                f"group {self._group_id}: no partitions for {now - self._unassigned_since:.0f} s and this member "
                f"({member or 'no member id'}) is outside the group ({view.state.name}, {len(view.member_ids)} members)"
            )


def watch_membership(common: CommonSettings, group_id: str) -> MembershipWatch:
    admin: list[AdminClient] = []  # made at the first question: most consumers never ask one

    def describe(group: str) -> GroupView | None:
        if not admin:
            admin.append(clients.admin(common))
        return describe_group(admin[0], group)

    return MembershipWatch(group_id, describe)
