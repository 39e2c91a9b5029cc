"""The .sql file as text: statements, positions and the job's name, before any parsing.

Comments and string literals are blanked (same length, newlines kept) before anything looks
for `;` or a keyword, so a `;` or `TUMBLE(` inside a string never splits or refuses a query."""

from __future__ import annotations

import re
from dataclasses import dataclass

from onceflow.topology import check_job_name


class SqlError(ValueError):
    """A .sql job refused: the message names the construct (and its line and column)."""


@dataclass(frozen=True)
class Statement:
    text: str  # as written
    start: int  # offset in the file


def position(source: str, offset: int) -> tuple[int, int]:
    """1-based line and column of ``offset``."""
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def blank(source: str) -> str:
    """``source`` with comments and the insides of string literals replaced by spaces."""
    out = list(source)
    i, n = 0, len(source)

    def clear(a: int, b: int) -> None:
        for j in range(a, min(b, n)):
            if out[j] != "\n":
                out[j] = " "

    while i < n:
        if source.startswith("--", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            clear(i, end)
            i = end
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            if end < 0:
                line, column = position(source, i)
                raise SqlError(f"line {line}, column {column}: a comment that is never closed")
            clear(i, end + 2)
            i = end + 2
        elif source[i] in "'\"`":
            quote, j = source[i], i + 1
            while j < n and source[j] != quote:
                j += 2 if source[j] == "\\" and quote != "`" else 1
            if j >= n:
                line, column = position(source, i)
                raise SqlError(f"line {line}, column {column}: a quoted text that is never closed")
            clear(i + 1, j)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def statements(source: str) -> list[Statement]:
    """The file's statements, split at `;` outside strings and comments; empty ones dropped."""
    blanked = blank(source)
    found, start = [], 0
    for match in [*re.finditer(";", blanked), None]:
        end = match.start() if match else len(source)
        if blanked[start:end].strip():
            lead = len(blanked[start:end]) - len(blanked[start:end].lstrip())
            found.append(Statement(source[start + lead : end].rstrip(), start + lead))
        start = end + 1
    return found


JOB_COMMENT = re.compile(r"^[ \t]*--[ \t]*job:[ \t]*(.*?)[ \t]*$", re.MULTILINE)


def job_name(source: str, stem: str) -> str:
    """The `-- job: name` line's name, or the file's stem; a name that cannot name topics is refused."""
    match = JOB_COMMENT.search(source)
    name = match.group(1) if match else stem
    try:
        return check_job_name(name)
    except ValueError as exc:
        hint = "" if match else " (the file's name; give one with a `-- job: name` line)"
        raise SqlError(f"{exc}{hint}") from None


def padded(source: str, statement: Statement) -> str:
    """The statement preceded by blanks that keep its place in the file, so the line and
    column Spark reports are the file's."""
    return re.sub(r"[^\n]", " ", source[: statement.start]) + statement.text
