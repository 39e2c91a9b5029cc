"""The type check and the private-names rule over what mypy checks (`[tool.mypy]` in the root
pyproject.toml: the core, the client, every service, the tools and the bench scripts).

mypy runs as `make typecheck` does; its config is strict enough to matter (every def typed,
untyped bodies checked, no bare generics, unused `type: ignore`s are errors). The private-names
rule: no module reads another's `_name`, neither by import nor through an object, nor through
`self` a name its module does not define (a subclass reaching into its base class's privates).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.config import repo_root

pytestmark = pytest.mark.devex

ROOT = repo_root()
# Folders and globs (`bench/*.py`), relative to the root, as mypy takes them.
MYPY_FILES: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
# What is written in Python and not checked: the generated wire contracts (their .pyi stubs are
# what the checked code sees) and the Quix Streams peer, which runs in a venv of its own.
UNCHECKED = {"libs/onceflow-wire/src", "bench/peers"}
# Third-party names that only look private: confluent_kafka's error codes (KafkaError._PARTITION_EOF
# and the like are its documented API) and os._exit (exit without cleanup, after a fatal state).
FOREIGN = {"KafkaError", "os"}


def test_mypy_finds_no_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"mypy failed (make typecheck):\n{result.stdout}{result.stderr}"


def sources(root: Path = ROOT, entries: list[str] = MYPY_FILES) -> Iterator[Path]:
    """Every file mypy checks: each folder's .py files, each glob's matches."""
    for entry in entries:
        if any(char in entry for char in "*?["):
            yield from sorted(root.glob(entry))
        else:
            yield from sorted((root / entry).rglob("*.py"))


def python_homes(root: Path) -> set[str]:
    """Where the workspace keeps Python: each package's src folder, and the bench folder."""
    homes = {str(src.relative_to(root)) for pattern in ("libs/*/src", "services/*/src") for src in root.glob(pattern)}
    return homes | {"bench"} if (root / "bench").is_dir() else homes


def unchecked_python(root: Path, entries: list[str], exempt: set[str]) -> list[str]:
    """The Python files under ``root`` that neither mypy (``entries``) nor ``exempt`` covers."""
    checked = set(sources(root, entries))
    return sorted(
        str(path.relative_to(root))
        for home in python_homes(root)
        for path in (root / home).rglob("*.py")
        if path not in checked and not any(path.is_relative_to(root / folder) for folder in exempt)
    )


def test_mypy_checks_every_package_and_bench_script() -> None:
    assert unchecked_python(ROOT, MYPY_FILES, UNCHECKED) == [], "add them to [tool.mypy] files, or say here why not"


def test_the_coverage_check_can_fail(tmp_path: Path) -> None:
    for path in ("libs/core/src/core/a.py", "libs/tools/src/tools/b.py", "bench/c.py", "bench/peers/quix/apps.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert unchecked_python(tmp_path, ["libs/core/src"], {"bench/peers"}) == ["bench/c.py", "libs/tools/src/tools/b.py"]
    assert unchecked_python(tmp_path, ["libs/core/src", "libs/tools/src", "bench/*.py"], {"bench/peers"}) == []


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def own_names(tree: ast.AST) -> set[str]:
    """What a module defines: functions, classes, module names and `self.` attributes it assigns."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return names


def foreign_privates(path: Path, root: Path = ROOT) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    defined = own_names(tree)
    where = path.relative_to(root)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if private(alias.name):
                    yield f"{where}:{node.lineno} imports {alias.name} from {node.module}"
        elif isinstance(node, ast.Attribute) and private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                if node.attr not in defined:
                    yield f"{where}:{node.lineno} uses {owner.id}.{node.attr}, defined in another module"
            elif not (
                isinstance(owner, ast.Name) and owner.id in FOREIGN
                or isinstance(owner, ast.Attribute) and owner.attr in FOREIGN  # confluent_kafka.KafkaError
            ):
                yield f"{where}:{node.lineno} reads {ast.unparse(node)}"


def test_no_module_uses_another_modules_private_names() -> None:
    found = [violation for path in sources() for violation in foreign_privates(path)]
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_the_private_names_rule_covers_the_tools_and_the_benches() -> None:
    checked = {str(path.relative_to(ROOT)) for path in sources()}
    assert "tools/src/onceflow_tools/bench/hops.py" in checked
    assert "bench/source_throughput.py" in checked


def test_the_private_names_check_can_fail(tmp_path: Path) -> None:
    source = tmp_path / "bench.py"
    source.write_text(
        "import os\n"
        "from onceflow import faults\n"
        "from onceflow_tools.bench.hops import _run_peer\n"
        "from confluent_kafka import KafkaError\n"
        "class Fast(Base):\n"
        "    def __init__(self):\n"
        "        self._own = 1\n"
        "    def go(self):\n"
        "        faults._sabotages = frozenset()\n"
        "        self._own, self._inherited\n"
        "        KafkaError._PARTITION_EOF, os._exit\n"
    )
    assert list(foreign_privates(source, tmp_path)) == [
        "bench.py:3 imports _run_peer from onceflow_tools.bench.hops",
        "bench.py:9 reads faults._sabotages",
        "bench.py:10 uses self._inherited, defined in another module",
    ]
