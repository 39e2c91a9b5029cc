"""Producer identity's pure rules (docs/decisions/0027): the producers file, a credential's
producer, the gate's id space per producer, and fields a client cannot set."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from onceflow import streams
from onceflow.codec import decode_envelope
from onceflow.producers import Producers, ProducersFileError, is_loopback, token_sha256
from onceflow.spout import Limits, check_record, envelope_bytes
from onceflow.v1.envelope_pb2 import Envelope
from onceflow.v1.ingest_pb2 import IngestRecord, IngestRequest

LIMITS = Limits(max_payload_bytes=100, max_key_bytes=10)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "producers.toml"
    path.write_text(text)
    return path


def test_a_token_names_its_producer_and_the_file_holds_no_token(tmp_path: Path) -> None:
    path = write(tmp_path, f'[[producer]]\nname = "shop"\ntoken_sha256 = "{token_sha256("s3cret")}"\n'
                           f'[[producer]]\nname = "crm"\ntoken_sha256 = "{token_sha256("other")}"\n')
    producers = Producers.load(path)
    assert (producers.name_of("s3cret"), producers.name_of("other"), producers.name_of("guess")) == ("shop", "crm", None)
    assert "s3cret" not in path.read_text()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[[producer]]\nname = "shop"\ntoken_sha256 = "s3cret"\n', "never the token itself"),
        ('[[producer]]\nname = "a b"\ntoken_sha256 = "' + "0" * 64 + '"\n', "name 'a b'"),
        ('[[producer]]\nname = "a"\ntoken_sha256 = "' + "0" * 64 + '"\n[[producer]]\nname = "b"\ntoken_sha256 = "' + "0" * 64 + '"\n',
         "another producer's"),
        ("", "no [[producer]] entries"),
        ("[[producer", "producers.toml"),
    ],
)
def test_a_file_that_cannot_be_used_is_refused_naming_the_entry(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ProducersFileError, match=None) as refused:
        Producers.load(write(tmp_path, text))
    assert says in str(refused.value)


def test_a_producer_bound_to_streams_writes_those_only(tmp_path: Path) -> None:
    """Issue 39: a producer's entry may name the streams it writes; without it, any."""
    path = write(tmp_path, f'[[producer]]\nname = "shop"\ntoken_sha256 = "{token_sha256("a")}"\nstreams = ["orders", "default"]\n'
                           f'[[producer]]\nname = "crm"\ntoken_sha256 = "{token_sha256("b")}"\n')
    producers = Producers.load(path)
    assert producers.may_write("shop", "orders") and producers.may_write("shop", "") and producers.may_write("shop", "default")
    assert not producers.may_write("shop", "payments")
    assert producers.may_write("crm", "payments") and producers.may_write("", "payments")
    assert producers.streams_of("shop") == "default, orders"
    with pytest.raises(ProducersFileError, match="stream 'a b'"):
        Producers.load(write(tmp_path, f'[[producer]]\nname = "x"\ntoken_sha256 = "{token_sha256("c")}"\nstreams = ["a b"]\n'))
    with pytest.raises(ProducersFileError, match="a list of stream names"):
        Producers.load(write(tmp_path, f'[[producer]]\nname = "x"\ntoken_sha256 = "{token_sha256("c")}"\nstreams = "orders"\n'))


def test_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5") and not is_loopback("ingest.internal")


KEYS = st.tuples(
    st.sampled_from(["", "orders"]), st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=5),
    st.sampled_from(["", "usersum"]), st.integers(0, 2), st.sampled_from(["", "shop", "crm"]),
)


@given(KEYS, KEYS)
def test_two_records_share_a_gate_key_only_if_everything_that_scopes_them_does(a: tuple, b: tuple) -> None:
    def norm(k: tuple) -> tuple:
        stream, record_id, job, count, producer = k
        return (stream, record_id, job, count if job else 0, producer)

    assert (streams.identity(*a[:4], producer=a[4]) == streams.identity(*b[:4], producer=b[4])) == (norm(a) == norm(b))
    assert streams.split_identity(streams.identity(*a[:4], producer=a[4])) == (streams.display(a[0]), a[1])


def test_a_client_cannot_name_a_producer_nor_smuggle_envelope_fields() -> None:
    refused = check_record(0, IngestRecord(record_id=b"a", producer="shop"), LIMITS)
    assert refused is not None and refused.field == "records[0].producer"
    # An Envelope field IngestRecord does not declare (first_appended_ms, 10) rides as an
    # unknown field into the envelope's bytes unless ingest discards it, as it does.
    inner = IngestRecord(record_id=b"a").SerializeToString() + Envelope(first_appended_ms=1).SerializeToString()
    smuggled = IngestRequest(records=[IngestRecord.FromString(inner)]).SerializeToString()
    request = IngestRequest.FromString(smuggled)
    assert decode_envelope(envelope_bytes(request.records[0], 5, 1, 2)).first_appended_ms == 1  # what discarding prevents
    request.DiscardUnknownFields()
    envelope = decode_envelope(envelope_bytes(request.records[0], 5, 1, 2, producer="shop"))
    assert (envelope.first_appended_ms, envelope.producer) == (0, "shop")
