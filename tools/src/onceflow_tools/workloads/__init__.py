"""Generated workloads that the demo, tests and benches push through the pipeline."""

from typing import Any

# A job's result table as the demo and the checks compare it: result key -> the row, a JSON object.
ResultTable = dict[str, dict[str, Any]]
