"""Where the source resumes a partition, decided from its stored position, the topic id that
position was stored for, and the partition's log as it is now. Pure: no Kafka.

Every stored position carries the id of the topic it was read from (``topic_id=<id>``, as commit
metadata of the group's offsets or beside the offset in ``source.offsets``). The rules, each with
its reason, so that no record is skipped without a line in the log and no record is copied
twice under one record id:

- nothing stored: the partition's start;
- stored for another topic id: the topic was deleted and created again under its name. Its
  records are new records with new record ids (the topic id is part of them): copy it from its
  start, and say so (WARNING);
- stored with no topic id (by a source before topic ids, or while the broker had none): taken as
  the current topic's (docs/services/source.md, "Upgrading");
- before the log's start: retention deleted records the source had not copied. They are gone;
  resume at the log's start and say how many were lost (ERROR). Offsets only grow, so no record
  id is used twice;
- past the log's end: the log is shorter than what was already copied (an unclean leader
  election, or a topic recreated on a broker without topic ids). Records written there next would
  carry record ids already copied, and skipping them would lose them: neither is safe, so the
  source refuses to guess (``PositionRefused``) until an operator resets the position."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING

METADATA_PREFIX = "topic_id="
_UNKNOWN = "-"


class PositionRefused(Exception):
    """A stored position the source cannot resume from without losing or repeating a record."""


def position_metadata(topic_id: str) -> str:
    """What a stored position carries: the topic id it was read from (``-``: none known)."""
    return f"{METADATA_PREFIX}{topic_id or _UNKNOWN}"


def stored_topic_id(metadata: str | None) -> str | None:
    """The topic id a position was stored for: None when it says none (stored before topic ids
    were kept, or written by something else), "" when the broker had none to give."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return None
    found = metadata.removeprefix(METADATA_PREFIX)
    return "" if found == _UNKNOWN else found


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a partition resumes, and the log line that says why (empty: the ordinary case)."""

    offset: int  # OFFSET_BEGINNING: the log's start
    level: int = logging.DEBUG
    note: str = ""


def resume_at(topic: str, partition: int, stored: int, metadata: str | None, topic_id: str, low: int, high: int) -> Resume:
    """Where ``topic``'s ``partition`` resumes: ``stored`` is the committed next offset (negative:
    none) with its ``metadata``; ``topic_id`` the topic's id now ("" if unknown); ``low`` and
    ``high`` the log's start and end now. Raises PositionRefused past the end."""
    if stored < 0:
        return Resume(OFFSET_BEGINNING)
    was = stored_topic_id(metadata)
    if was and topic_id and was != topic_id:
        return Resume(OFFSET_BEGINNING, logging.WARNING,
                      f"topic {topic} was recreated (id {was} -> {topic_id}): copying it from its start under its new "
                      f"identity (partition {partition}: the old topic's position {stored} does not apply)")
    if stored < low:
        return Resume(low, logging.ERROR,
                      f"{topic} partition {partition}: the stored position {stored} is before the log's start {low}: "
                      f"{low - stored} records were deleted (retention) before the source copied them and are lost; "
                      f"resuming at {low}")
    if stored > high:
        raise PositionRefused(
            f"{topic} partition {partition}: the stored position {stored} is past the log's end {high}: the log is "
            f"shorter than what was already copied (an unclean leader election, or the topic recreated on a broker "
            f"without topic ids). Records written there next would carry record ids already copied; the source "
            f"does not guess: reset this position (docs/services/source.md, \"Positions\") and start it again")
    return Resume(stored)
