"""`onceflow-compute` / `python -m onceflow_compute`: run one compute worker: a job's map and merge hops on PySpark."""

from __future__ import annotations

from onceflow import service_main

from onceflow_compute.config import ComputeSettings
from onceflow_compute.service import run


def main() -> None:
    service_main.main("compute", "Run one compute worker: a job's map and merge hops on PySpark.", ComputeSettings, run)


if __name__ == "__main__":
    main()
