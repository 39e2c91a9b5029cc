"""Ingest off loopback takes records from known producers only, unless told otherwise
(docs/decisions/0027)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from onceflow.producers import token_sha256
from onceflow_ingest.config import IngestSettings


def test_off_loopback_a_producers_file_is_required_unless_anonymous_callers_are_chosen(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="takes records from known producers only"):
        IngestSettings(host="0.0.0.0")
    assert not IngestSettings(host="0.0.0.0", require_producer="false").producer_required
    assert not IngestSettings().producer_required  # loopback: anonymous callers, as before
    producers = tmp_path / "producers.toml"
    producers.write_text(f'[[producer]]\nname = "shop"\ntoken_sha256 = "{token_sha256("t")}"\n')
    settings = IngestSettings(host="0.0.0.0", producers_file=str(producers))
    assert settings.producer_required and settings.producers() is not None
    assert IngestSettings(producers_file=str(producers), require_producer="true").producer_required
    producers.write_text('[[producer]]\nname = "shop"\ntoken_sha256 = "t"\n')
    with pytest.raises(ValidationError, match="never the token itself"):
        IngestSettings(producers_file=str(producers))
