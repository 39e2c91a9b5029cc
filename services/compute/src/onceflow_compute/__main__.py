"""`onceflow-compute` / `python -m onceflow_compute`: run one compute worker."""

from __future__ import annotations

import sys

from onceflow import logs

from onceflow_compute.config import ComputeSettings
from onceflow_compute.service import run


def main() -> None:
    settings = ComputeSettings()
    logs.setup("compute", settings.instance, settings.common.log_level)
    sys.exit(run(settings))


if __name__ == "__main__":
    main()
