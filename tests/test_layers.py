"""Imports flow one way: the wire contracts (libs/onceflow-wire) -> the client
(libs/onceflow-client) -> the runtime core (libs/onceflow) -> the services -> the tools
(tools). Every import counts, also one inside a function: a service image has
the core and its own package installed and nothing else, so an upward import fails there."""

from __future__ import annotations

import ast
import sys
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


def imported_modules(source: Path) -> Iterator[tuple[int, str]]:
    """(line, full module name) of every absolute import in the file."""
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


# What an application that depends on onceflow-client gets: grpcio, protobuf and the wire
# contracts; confluent-kafka only with the `tail` extra, for ResultsTail and DeadLetters, and faust-streaming only
# with the `faust` extra, for the Faust bridge.
EXTRAS = {"tail.py": "confluent_kafka", "dlq.py": "confluent_kafka", "faust.py": "faust"}
CLIENT_MAY_IMPORT = ("onceflow.v1", "onceflow_client", "grpc", "google.protobuf", "__future__")


def client_violations(package_dir: Path) -> list[str]:
    stdlib = sys.stdlib_module_names
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        for line, module in imported_modules(path):
            allowed = module.split(".")[0] in stdlib or any(module == m or module.startswith(m + ".") for m in CLIENT_MAY_IMPORT)
            extra = EXTRAS.get(path.name)
            if not allowed and not (extra and (module == extra or module.startswith(extra + "."))):
                found.append(f"{path.relative_to(package_dir.parent)}:{line} imports {module}")
    return found


def test_the_client_needs_grpc_protobuf_and_the_wire_contracts_only() -> None:
    assert client_violations(ROOT / "libs" / "onceflow-client" / "src" / "onceflow_client") == []
    wire = ROOT / "libs" / "onceflow-wire" / "src" / "onceflow" / "v1"
    assert {p.name for p in wire.glob("*.py") if "_pb2" not in p.name} == {"__init__.py"}, "the wire package holds generated code only"


def test_the_client_check_can_fail(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text("import json\nfrom onceflow.config import CommonSettings\nimport confluent_kafka\n")
    assert client_violations(package) == ["pkg/m.py:2 imports onceflow.config", "pkg/m.py:3 imports confluent_kafka"]


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


LIBS = {"onceflow-wire", "onceflow-client", "onceflow"}


def folder_problems(root: Path) -> list[str]:
    """What is out of place: a package in libs/ that is not one of the base layers, or no tools/."""
    found = {p.name for p in (root / "libs").iterdir() if (p / "pyproject.toml").is_file()}
    problems = [f"libs/{name} is not a base layer (the wire, the client, the core)" for name in sorted(found - LIBS)]
    if not (root / "tools" / "pyproject.toml").is_file():
        problems.append("no tools/ package at the root")
    return problems


def test_the_folders_show_the_layers() -> None:
    """libs/ holds the layers everything stands on (the wire, the client, the core); the services
    stand on them; tools/ (CLI, infra, verify, the bench harness, the console) stands on top."""
    assert folder_problems(ROOT) == []


def test_the_folder_check_can_fail(tmp_path: Path) -> None:
    for name in (*LIBS, "onceflow-tools"):  # the layout before issue 40
        (tmp_path / "libs" / name).mkdir(parents=True)
        (tmp_path / "libs" / name / "pyproject.toml").touch()
    assert folder_problems(tmp_path) == [
        "libs/onceflow-tools is not a base layer (the wire, the client, the core)", "no tools/ package at the root",
    ]
