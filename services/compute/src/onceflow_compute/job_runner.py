"""The job over one table, the way the map hop and batch mode both run it: on the engine, and
when it raises, bisected to the records it raises on alone."""

from __future__ import annotations

import re

import pyarrow as pa

from onceflow_compute.api import Aggregation, Job, Join
from onceflow_compute.engines import Engine, EngineStalled

_IMPORT_ERROR = re.compile(r"\b(ModuleNotFoundError|ImportError)\b")


class JobFailed(RuntimeError):
    """The job failed on every record of a batch: the job (or the engine) is broken, not a
    record. The loop aborts, backs off and reports the service unhealthy."""


class JobRunner:
    def __init__(self, job: Job, engine: Engine, bisect_budget: int = 64, proven: bool = False) -> None:
        self.job = job
        self.engine = engine
        self.bisect_budget = bisect_budget
        self._last_error = ""
        # Once the job has worked on something in this process, a lone failing record is
        # poison; before that, it may as well be the job. (Batch mode starts proven: it has
        # one table, and a one-record input that fails is reported, not raised.)
        self._proven = proven

    def run(self, table: pa.Table) -> tuple[list[pa.Table], dict[int, str]]:
        """The job's output tables and the rows it failed on alone (row -> reason). Raises
        JobFailed when the job, not a record, is to blame: everything failed, the engine
        stalled, Spark refused the plan, or the failures could not be isolated within
        ``bisect_budget`` engine runs."""
        outputs, failed = self._bisect(table, list(range(table.num_rows)), [self.bisect_budget])
        if failed and len(failed) == table.num_rows and (len(failed) > 1 or not self._proven):
            raise JobFailed(f"job {self.job.name} failed on all {len(failed)} records: {next(iter(failed.values()))}")
        if len(failed) < table.num_rows:
            self._proven = True
        return outputs, failed

    def _bisect(self, table: pa.Table, rows: list[int], budget: list[int]) -> tuple[list[pa.Table], dict[int, str]]:
        """Each step costs an engine run: past ``budget`` runs the batch fails as a whole (a
        record is only dead-lettered once it failed alone)."""
        if budget[0] <= 0:
            raise JobFailed(
                f"job {self.job.name} fails on many records; they could not be isolated within "
                f"{self.bisect_budget} engine runs; last error: {self._last_error}"
            )
        budget[0] -= 1
        try:
            return [self._engine_run(table)], {}
        except EngineStalled as exc:
            raise JobFailed(f"job {self.job.name}: {exc}") from exc  # the engine, not a record: no bisection
        except Exception as exc:  # noqa: BLE001 - the user's job may raise anything
            self._last_error = describe(exc)
            if type(exc).__name__ == "AnalysisException":
                # Spark refused the plan itself (a missing column, a bad expression): no record
                # is to blame, so there is nothing to bisect.
                raise JobFailed(f"job {self.job.name}: Spark cannot plan it: {self._last_error}") from exc
            if _IMPORT_ERROR.search(self._last_error):
                # The executors' Python lacks a module: the environment is broken, not a record.
                raise JobFailed(
                    f"job {self.job.name}: Spark's Python workers cannot import what it needs: {self._last_error} "
                    "(on a cluster: does ONCEFLOW_COMPUTE_SPARK_EXECUTOR_PYTHON name a Python with onceflow-compute "
                    "and the job's dependencies? The job's own package is shipped)"
                ) from exc
            if len(rows) == 1:
                return [], {rows[0]: self._last_error}
        middle = len(rows) // 2
        left, left_failed = self._bisect(table.slice(0, middle), rows[:middle], budget)
        right, right_failed = self._bisect(table.slice(middle), rows[middle:], budget)
        return left + right, left_failed | right_failed

    def _engine_run(self, table: pa.Table) -> pa.Table:
        if isinstance(self.job, Aggregation):
            return self.engine.partials(self.job, table)
        if isinstance(self.job, Join):
            return self.engine.join_rows(self.job, table)
        return self.engine.transform(self.job, table)


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    # Spark's PythonException carries the worker's whole traceback: keep its last line.
    lines = [line for line in text.splitlines() if line.strip()]
    summary = lines[-1] if lines else ""
    return f"{type(exc).__name__}: {summary}"[:1000]
