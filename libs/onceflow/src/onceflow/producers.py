"""Producer identity (issue 39, docs/decisions/0027): who sends a record, proven by a credential,
scopes its record_ids, so no producer can drop another's records by sending their ids first.

Ingest maps a caller's bearer token to a producer name through a producers file (TOML, one
``[[producer]]`` per producer with its ``name`` and the ``token_sha256`` of its token: the file
holds no secret). The name goes into ``Envelope.producer`` (set by ingest, refused from a
client), and the gate deduplicates a named producer's records by (stream, producer, record_id).
A record without a producer (an anonymous caller where they are allowed, the Kafka source without
``ONCEFLOW_SOURCE_PRODUCER``, a record written before this) keeps the unscoped identity it always
had. An entry may name the ``streams`` its producer may write (``["orders", "default"]``); without
it, every stream.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from onceflow import streams as stream_names

PRODUCER_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class ProducersFileError(ValueError):
    """The producers file cannot be used; the message names the file and the entry."""


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Producers:
    """token sha256 -> producer name; producer name -> the streams it may write (canonical
    names, "" the default stream), for those whose entry names them."""

    by_digest: dict[str, str]
    streams: dict[str, frozenset[str]] = field(default_factory=dict)
    # A client certificate's common name -> producer name, for entries with `certificate_cn`:
    # under mutual TLS the certificate the CA signed names the producer, no token needed.
    by_certificate: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Producers:
        try:
            entries = tomllib.loads(path.read_text()).get("producer", [])
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ProducersFileError(f"{path}: {exc}") from None
        by_digest: dict[str, str] = {}
        by_certificate: dict[str, str] = {}
        allowed: dict[str, frozenset[str]] = {}
        names: set[str] = set()
        for index, entry in enumerate(entries, 1):
            name, digest, common_name = entry.get("name"), entry.get("token_sha256"), entry.get("certificate_cn")
            if not isinstance(name, str) or not PRODUCER_NAME.fullmatch(name):
                raise ProducersFileError(f"{path}: producer {index}: name {name!r}: 1 to 100 of A-Z, a-z, 0-9, '_', '.', ':' and '-'")
            if digest is None and common_name is None:
                raise ProducersFileError(f"{path}: producer {name}: give token_sha256, certificate_cn, or both")
            if digest is not None and (not isinstance(digest, str) or not SHA256_HEX.fullmatch(digest)):
                raise ProducersFileError(
                    f"{path}: producer {name}: token_sha256 must be 64 lower-case hex digits (`onceflow producer hash`), "
                    "never the token itself"
                )
            if common_name is not None and (not isinstance(common_name, str) or not common_name.strip()):
                raise ProducersFileError(f"{path}: producer {name}: certificate_cn must be a client certificate's common name")
            if name in names or digest in by_digest or common_name in by_certificate:
                raise ProducersFileError(f"{path}: producer {name}: its name, its token or its certificate is another producer's")
            names.add(name)
            if digest is not None:
                by_digest[digest] = name
            if common_name is not None:
                by_certificate[common_name] = name
            if "streams" in entry:
                allowed[name] = _streams(path, name, entry["streams"])
        if not names:
            raise ProducersFileError(f"{path}: no [[producer]] entries")
        return cls(by_digest, allowed, by_certificate)

    def name_of_certificate(self, common_names: list[str]) -> str | None:
        """The producer a verified client certificate names (its common name), or None."""
        return next((self.by_certificate[cn] for cn in common_names if cn in self.by_certificate), None)

    def may_write(self, producer: str, stream: str) -> bool:
        """Whether ``producer`` may send records of ``stream``: an anonymous caller ("") and a
        producer whose entry names no streams may write any."""
        allowed = self.streams.get(producer)
        return allowed is None or stream_names.canonical(stream) in allowed

    def streams_of(self, producer: str) -> str:
        """The streams ``producer`` may write, for a refusal."""
        return ", ".join(sorted(stream_names.display(s) for s in self.streams.get(producer, ()))) or "none"

    def name_of(self, token: str) -> str | None:
        """The producer whose token this is, or None; compared in constant time per entry."""
        digest = token_sha256(token)
        found = None
        for known, name in self.by_digest.items():
            if hmac.compare_digest(known, digest):
                found = name
        return found


def _streams(path: Path, name: str, value: object) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProducersFileError(f"{path}: producer {name}: streams must be a list of stream names, e.g. [\"orders\", \"default\"]")
    for stream in value:
        if stream != stream_names.DEFAULT and not stream_names.STREAM_NAME.fullmatch(stream):
            raise ProducersFileError(f"{path}: producer {name}: stream {stream!r}: 1 to 100 of A-Z, a-z, 0-9, '_' and '-'")
    return frozenset(stream_names.canonical(v) for v in value)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
