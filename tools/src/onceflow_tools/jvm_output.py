"""Keeping the JVM's output out of the terminal: Spark's driver JVM inherits this process's
stderr when a session starts, and prints its warnings and notices there for as long as it lives."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def stderr_to(path: Path) -> Iterator[Path]:
    """While the block runs, file descriptor 2 is ``path`` (appended): this process's stderr and
    that of every process started meanwhile, which keeps it (the Spark driver JVM). The
    terminal gets its stderr back afterwards; the JVM goes on writing to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield path
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
