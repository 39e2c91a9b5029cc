"""Scan's page tokens, whichever store answers: a ``ScanPosition`` pinned to one table, so a
scan that spans a promotion reads one version throughout, never rows of two."""

from __future__ import annotations

from google.protobuf.message import DecodeError

from onceflow.topology import SEPARATOR, split
from onceflow.v1.sink_pb2 import ScanPosition


def position_of(token: bytes) -> ScanPosition:
    """The position a page token holds; ValueError for bytes no store of this service made."""
    try:
        return ScanPosition.FromString(token)
    except DecodeError:
        raise ValueError("not a page token this service gave") from None


def check_pinned(job: str, table: str) -> None:
    """A token's table must be one ``job`` may read: itself when ``job`` names a version, else
    one of the job's versions or its unversioned table."""
    try:
        pinned, _version = split(table)
    except ValueError:
        raise ValueError("not a page token this service gave") from None
    if table != job and (SEPARATOR in job or pinned != job):
        raise ValueError(f"it continues a scan of table {table!r}, not of job {job!r}")
