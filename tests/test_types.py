"""The type check and the private-names rule over the packages mypy checks (`[tool.mypy]` in
the root pyproject.toml: the core, the client and every service).

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
CHECKED = [ROOT / path for path in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"]]
# Third-party names that only look private: confluent_kafka's error codes (KafkaError._PARTITION_EOF
# and the like are its documented API) and os._exit (exit without cleanup, after a fatal state).
FOREIGN = {"KafkaError", "os"}


def test_mypy_finds_no_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"mypy failed (make typecheck):\n{result.stdout}{result.stderr}"


def sources() -> Iterator[Path]:
    for package_root in CHECKED:
        yield from sorted(package_root.rglob("*.py"))


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


def foreign_privates(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    defined = own_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if private(alias.name):
                    yield f"{path.relative_to(ROOT)}:{node.lineno} imports {alias.name} from {node.module}"
        elif isinstance(node, ast.Attribute) and private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                if node.attr not in defined:
                    yield f"{path.relative_to(ROOT)}:{node.lineno} uses {owner.id}.{node.attr}, defined in another module"
            elif not (
                isinstance(owner, ast.Name) and owner.id in FOREIGN
                or isinstance(owner, ast.Attribute) and owner.attr in FOREIGN  # confluent_kafka.KafkaError
            ):
                yield f"{path.relative_to(ROOT)}:{node.lineno} reads {ast.unparse(node)}"


def test_no_module_uses_another_modules_private_names() -> None:
    found = [violation for path in sources() for violation in foreign_privates(path)]
    assert not found, "private names used across modules:\n" + "\n".join(found)
