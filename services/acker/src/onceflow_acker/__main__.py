"""`onceflow-acker` / `python -m onceflow_acker`: run one acker instance."""

from __future__ import annotations

import sys

from onceflow import logs

from onceflow_acker.config import AckerSettings
from onceflow_acker.service import run


def main() -> None:
    settings = AckerSettings()
    logs.setup("acker", settings.instance, settings.common.log_level)
    sys.exit(run(settings))


if __name__ == "__main__":
    main()
