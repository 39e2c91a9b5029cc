"""Imports flow one way: the runtime core (libs/onceflow) -> the services -> the tools
(libs/onceflow-tools). Every import counts, also one inside a function: a service image has
the core and its own package installed and nothing else, so an upward import fails there."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.config import repo_root

pytestmark = pytest.mark.devex

ROOT = repo_root()
SERVICES = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").is_file())
SERVICE_PACKAGES = {f"onceflow_{name}" for name in SERVICES}
CLI_LIBRARIES = {"typer", "rich", "matplotlib"}


def imported(source: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level module) of every absolute import in the file."""
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def violations(package_dir: Path, forbidden: set[str]) -> list[str]:
    return [
        f"{path.relative_to(package_dir.parent)}:{line} imports {module}"
        for path in sorted(package_dir.rglob("*.py"))
        for line, module in imported(path)
        if module in forbidden
    ]


def test_the_core_imports_no_service_and_no_tool() -> None:
    core = ROOT / "libs" / "onceflow" / "src" / "onceflow"
    assert violations(core, SERVICE_PACKAGES | {"onceflow_tools"} | CLI_LIBRARIES) == []


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_the_core_only(service: str) -> None:
    source = ROOT / "services" / service / "src" / f"onceflow_{service}"
    assert violations(source, (SERVICE_PACKAGES - {f"onceflow_{service}"}) | {"onceflow_tools"} | CLI_LIBRARIES) == []


def test_the_check_can_fail(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text("def f():\n    from onceflow_tools.infra import paths\n")
    assert violations(package, {"onceflow_tools"}) == ["pkg/m.py:2 imports onceflow_tools"]
