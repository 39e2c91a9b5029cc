"""Job discovery: built-in jobs by name, or any importable module that defines ``job``."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from pathlib import Path
from typing import Any

from onceflow.topology import check_job_name

from onceflow_compute.api import Aggregation, Job, Join, Transform


def builtin_names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def builtin_sql_names() -> list[str]:
    """The SQL jobs shipped with the worker (``sql:NAME``): the Nexmark queries' SQL twins."""
    return sorted(p.stem for p in (Path(__file__).parent / "sql").glob("*.sql"))


class NoSuchJob(ValueError):
    """The name is neither a built-in nor an importable module defining ``job``."""


def _sql_job(sql_job: Any) -> Job:
    for warning in sql_job.plan.warnings:
        logging.getLogger(__name__).warning("job %s: %s", sql_job.name, warning)
    job: Job = sql_job.job
    return job


def sql_file(name: str) -> Path:
    """``sql:path/to/file.sql``'s file, or a built-in SQL job's (``sql:nexmark_q7``)."""
    path = Path(name.removeprefix("sql:"))
    if path.suffix != ".sql" and len(path.parts) == 1:
        builtin = Path(__file__).parent / "sql" / f"{path.name}.sql"
        if not builtin.is_file():
            raise NoSuchJob(f"no job {name!r}: not a built-in SQL job ({', '.join(builtin_sql_names())}) nor a .sql file")
        return builtin
    if not path.is_file():
        raise NoSuchJob(f"no job {name!r}: no SQL file {path}")
    return path


def load_job(name: str) -> Job:
    """``wordcount`` (built-in) or ``my_pkg.my_job`` (a module with a ``job`` attribute). A
    module that exists but raises on import raises that. ``sql:path/to/file.sql``: a SQL job
    (docs/sql.md), analysed by Spark; a query it refuses raises its SqlError (a ValueError).
    ``sql:NAME``: a built-in SQL job (jobs/sql/NAME.sql)."""
    if name.startswith("sql:"):
        from onceflow_compute import sql  # pyspark: only for a SQL job

        return _sql_job(sql.load(sql_file(name)))
    module_name = name if "." in name else f"{__name__}.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and not module_name.startswith(exc.name) and not exc.name.startswith(module_name):
            raise  # the module exists and imports something missing: its own failure, not a bad name
        known = ", ".join(builtin_names())
        raise NoSuchJob(f"no job {name!r}: not a built-in ({known}) nor an importable module ({exc})") from exc
    job = getattr(module, "job", None)
    text = getattr(module, "sql", None)
    if job is None and isinstance(text, str):  # a module with sql = "CREATE TABLE ...; SELECT ..."
        from onceflow_compute import sql

        return _sql_job(sql.load_text(text, module_name.rsplit(".", 1)[-1]))
    if not isinstance(job, (Aggregation, Join, Transform)):
        raise NoSuchJob(f"module {module_name} has no `job` (an Aggregation, a Join or a Transform) nor `sql` (a SQL job's text)")
    check_job_name(job.name)  # it names the job's topics
    return job
