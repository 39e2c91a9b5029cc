"""Settings describe themselves once: every field of every settings class has a description,
``onceflow-<service> --help`` prints it, and the settings tables of docs/services/*.md are
generated from it (``python -m onceflow.settings_docs --write``), so a page cannot drift."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from onceflow import service_main, settings_docs
from onceflow.config import CommonSettings, repo_root

pytestmark = pytest.mark.devex

ROOT = repo_root()
SERVICES = sorted(p.parent.name for p in (ROOT / "services").glob("*/pyproject.toml"))


def page(service: str) -> Path:
    return ROOT / "docs" / "services" / f"{service}.md"


def settings_class(service: str) -> type[BaseSettings]:
    """The class the service's page generates its table from: one block, naming the service's own."""
    targets = settings_docs.blocks(page(service).read_text())
    assert len(targets) == 1, f"docs/services/{service}.md has {len(targets)} settings blocks, want 1"
    found = settings_docs.load(targets[0])
    assert found.model_config.get("env_prefix") == f"ONCEFLOW_{service.upper()}_", targets[0]
    return found


def _squeezed(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("service", SERVICES)
def test_every_setting_has_a_description(service: str) -> None:
    # The nested groups (CommonSettings, LoopSettings) and the fields holding them included.
    assert settings_docs.undocumented(settings_class(service)) == []


def test_a_setting_without_a_description_is_named() -> None:
    class _Toy(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="ONCEFLOW_TOY_")
        described: int = Field(default=1, description="Has one.")
        bare: int = 2
        common: CommonSettings = Field(default_factory=CommonSettings, description="The common ones.")

    assert settings_docs.undocumented(_Toy) == ["_Toy.bare"]


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_page_holds_the_generated_settings_tables(service: str) -> None:
    text = page(service).read_text()
    assert settings_docs.rewrite(text, page(service), ROOT) == text, (
        f"docs/services/{service}.md is stale: run .venv/bin/python -m onceflow.settings_docs --write"
    )


@pytest.mark.parametrize("service", SERVICES)
def test_the_documented_defaults_are_what_the_service_runs_with(service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each default, written into the environment as the page shows it, loads as the default."""
    for name in [n for n in os.environ if n.startswith("ONCEFLOW_")]:
        monkeypatch.delenv(name)
    cls = settings_class(service)
    expected = cls().model_dump()
    for group in settings_docs.groups(cls):
        for setting in group.settings:
            monkeypatch.setenv(setting.variable, setting.default)
    assert cls().model_dump() == expected


def _tampered_sink_page() -> tuple[str, str]:
    """The sink page, and a copy with a default and a description edited by hand."""
    text = page("sink").read_text()
    tampered = text.replace("| `ONCEFLOW_SINK_PORT` | `15055` |", "| `ONCEFLOW_SINK_PORT` | `15056` |", 1)
    tampered = tampered.replace("Ack the applied changes' anchors", "Ack the edges", 1)
    assert tampered.count("`15056`") == 1 and "Ack the edges" in tampered
    return text, tampered


def test_the_docs_check_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    text, tampered = _tampered_sink_page()
    copy = tmp_path / "docs" / "services" / "sink.md"
    copy.parent.mkdir(parents=True)
    copy.write_text(tampered)
    assert settings_docs.rewrite(tampered, copy, tmp_path) == text
    monkeypatch.setattr(settings_docs, "repo_root", lambda: tmp_path)
    assert settings_docs.main(["--check"]) == 1
    assert "docs/services/sink.md" in capsys.readouterr().err
    assert copy.read_text() == tampered  # --check writes nothing
    assert settings_docs.main(["--write"]) == 0
    assert copy.read_text() == text
    assert settings_docs.main(["--check"]) == 0


def test_prose_around_the_block_is_kept() -> None:
    text, _ = _tampered_sink_page()
    begin = text.index("<!-- settings:begin ")
    end = text.index(settings_docs.END) + len(settings_docs.END)
    emptied = text[:begin] + text[begin : text.index("\n", begin) + 1] + settings_docs.END + text[end:]
    assert settings_docs.rewrite(emptied, page("sink"), ROOT) == text


def test_help_lists_every_setting_with_its_default_and_description(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    cls = settings_class("sink")

    def never_run(_settings: BaseSettings) -> int:
        raise AssertionError("the service was started")

    with pytest.raises(SystemExit) as ended:
        service_main.main("sink", "The sink.", cls, never_run, argv=["--help"])
    assert ended.value.code == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    flat = _squeezed(out)
    positions = []
    for group in settings_docs.groups(cls):
        assert _squeezed(settings_docs.plain(group.note)) in flat
        for setting in group.settings:
            assert f"{setting.variable} [{setting.default}]" in flat
            assert _squeezed(settings_docs.plain(setting.description)) in flat, setting.variable
            positions.append(flat.index(f"{setting.variable} ["))
    assert positions == sorted(positions)  # the sink's own, then the loop's, then the common ones
    assert flat.index("ONCEFLOW_SINK_HOST [") < flat.index("ONCEFLOW_LOOP_LINGER_MS [") < flat.index("ONCEFLOW_KAFKA_BOOTSTRAP [")
    assert "`" not in out


@pytest.mark.parametrize(
    ("value", "shown"),
    [(True, "true"), (None, ""), ({}, "{}"), ({"spark.cores.max": "1"}, '{"spark.cores.max": "1"}'), (1.5, "1.5")],
)
def test_defaults_are_shown_as_written_in_the_environment(value: object, shown: str) -> None:
    assert settings_docs.env_value(value) == shown
