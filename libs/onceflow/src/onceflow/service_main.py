"""The command line of every service binary (`onceflow-ingest`, `python -m onceflow_acker`, ...).

A service is configured by its environment only, so its command line is small: ``--help`` lists
the variables it reads with their defaults and descriptions (the settings fields' own, as in
docs/services/*.md: ``onceflow.settings_docs``), ``--print-settings`` the values it would run with
(secrets masked), ``--version`` prints the version, and anything else is refused rather than ignored (before, ``onceflow-ingest --help`` started the service). Bad
settings end with exit 2 and one line per variable, not a traceback."""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, SettingsError

from onceflow import __version__, faults, logs, settings_docs
from onceflow.config import CommonSettings, LoopSettings, takeover_order_problem

EXIT_USAGE = 2
S = TypeVar("S", bound=BaseSettings)
# A setting whose name holds one of these is shown as set or not, never by value.
_SECRET_WORDS = ("token", "password", "secret")


def _common(settings: BaseSettings) -> CommonSettings:
    """The common group every service's settings carry as ``common`` (the settings classes are
    the services' own, so this is said at run time)."""
    common = getattr(settings, "common", None)
    if not isinstance(common, CommonSettings):
        raise TypeError(f"{type(settings).__name__} has no common settings group")
    return common


def effective_settings(settings: BaseSettings) -> list[tuple[str, str]]:
    """(variable, value) for every setting of a loaded ``settings``, nested groups included;
    secrets (and URLs, which may embed a password) masked."""
    rows = []
    prefix = str(type(settings).model_config.get("env_prefix", ""))
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, BaseSettings):
            rows += effective_settings(value)
        elif not isinstance(value, BaseModel):
            rows.append((f"{prefix}{name.upper()}", _shown(name, value)))
    return rows


def _shown(name: str, value: object) -> str:
    text = settings_docs.env_value(value)  # as one would set it: true, forward, not True or AckMode.FORWARD
    if any(word in name.lower() for word in _SECRET_WORDS):
        return "(set, hidden)" if text else ""
    if "://" in text and "@" in text:  # redis://user:password@host
        scheme, rest = text.split("://", 1)
        return f"{scheme}://(credentials hidden)@{rest.rsplit('@', 1)[1]}"
    return text


def _error_line(prefix: str, loc: tuple[int | str, ...], value: object) -> str:
    """A bad setting as ``VARIABLE=value``, the value as --print-settings shows it (secrets and
    URL credentials masked), or the variable alone. A model check's error (loc ``()``) holds every
    value of its group, the admin token and the passwords among them, and a group's JSON may hold
    them too: those are never printed."""
    variable = prefix + "_".join(str(part) for part in loc).upper() if loc else f"{prefix}*"
    if isinstance(value, bool | int | float) or (isinstance(value, str) and not value.lstrip().startswith(("{", "["))):
        return f"{variable}={_shown(variable, value)!r}"
    return variable


def _settings_classes(settings_class: type[BaseSettings]) -> list[type[BaseSettings]]:
    nested = [f.annotation for f in settings_class.model_fields.values() if isinstance(f.annotation, type)]
    return [settings_class, *(cls for cls in nested if issubclass(cls, BaseSettings))]


def _wrapped(text: str, width: int, indent: str = "") -> list[str]:
    # Whole words only, so that a wrapped description still reads as written (and tests find it).
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False)


def _usage(binary: str, description: str, settings_class: type[BaseSettings]) -> str:
    width = max(60, min(100, shutil.get_terminal_size((100, 24)).columns))
    lines = [f"usage: {binary} [--help] [--print-settings] [--version]", "", description, "",
             "Configured by the environment only (default in brackets)."]
    for group in settings_docs.groups(settings_class):
        title = f"{group.name.capitalize()} settings" if group.name else f"{binary} settings"
        lines += ["", *_wrapped(f"{title} ({group.prefix}*): {settings_docs.plain(group.note)}", width)]
        for setting in group.settings:
            lines.append(f"  {setting.variable} [{setting.default}]")
            lines += _wrapped(settings_docs.plain(setting.description), width, " " * 6)
    return "\n".join(lines)


def _start_problem(settings: BaseSettings) -> str | None:
    """A refusal that no single setting's bound can say: the transaction timeout of a consuming
    service against its session timeout (`onceflow.config.takeover_order_problem`)."""
    common, loop = getattr(settings, "common", None), getattr(settings, "loop", None)
    if isinstance(common, CommonSettings) and isinstance(loop, LoopSettings):
        return takeover_order_problem(common, loop)
    return None


def main(
    service: str, description: str, settings_class: type[S], run: Callable[[S], int], argv: Sequence[str] | None = None,
) -> None:
    binary = f"onceflow-{service}"
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--help"], ["-h"]):
        print(_usage(binary, description, settings_class))
        sys.exit(0)
    if args == ["--version"]:
        print(f"{binary} {__version__}")
        sys.exit(0)
    printing = args == ["--print-settings"]
    if args and not printing:
        print(f"{binary}: unexpected argument(s) {' '.join(args)}; it is configured by ONCEFLOW_* environment "
              "variables (--help lists them)", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    try:
        settings = settings_class()
    except ValidationError as exc:
        print(f"{binary}: invalid settings:", file=sys.stderr)
        # A nested group (common, loop) fails on its own construction: exc.title names its class.
        groups = {cls.__name__: cls for cls in _settings_classes(settings_class)}
        prefix = str(groups.get(exc.title, settings_class).model_config.get("env_prefix", ""))
        for error in exc.errors(include_url=False, include_input=True):
            print(f"  {_error_line(prefix, error['loc'], error.get('input'))}: {error['msg']}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except SettingsError as exc:  # a nested group's variable that is not JSON: pydantic-settings names no value
        print(f"{binary}: invalid settings:\n  {exc}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    problem = _start_problem(settings)
    if problem:
        print(f"{binary}: invalid settings:\n  {problem}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if printing:
        rows = effective_settings(settings)
        width = max(len(variable) for variable, _ in rows)
        print("\n".join(f"{variable.ljust(width)}  {value}" for variable, value in rows))
        sys.exit(0)
    logs.setup(service, getattr(settings, "instance", ""), _common(settings).log_level)
    # The exactly-once guard (the server's, at start) and Status read the guarantee as parsed.
    faults.note_settings(_common(settings).processing_guarantee)
    try:
        code = run(settings)
    finally:
        faults.note_settings(None)
    sys.exit(code)
