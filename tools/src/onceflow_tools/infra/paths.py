"""Where local infrastructure lives: templates in ``<repo>/infra``, runtime state in
``<repo>/.onceflow`` (gitignored) or ``$ONCEFLOW_HOME``."""

from __future__ import annotations

import os
from pathlib import Path

from onceflow.config import repo_root, runtime_dir

__all__ = ["display_path", "infra_dir", "runtime_dir"]


def infra_dir() -> Path:
    """The checked-in templates: pom.xml, server.properties, redis.conf, topics.toml."""
    return repo_root() / "infra"


def display_path(path: Path) -> str:
    """Relative to the working directory when under it: shorter tables and messages."""
    try:
        return os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
    except ValueError:
        return str(path)
