"""`onceflow-sink` / `python -m onceflow_sink`: run one sink instance."""

from __future__ import annotations

import sys

from onceflow import logs

from onceflow_sink.config import SinkSettings
from onceflow_sink.service import run


def main() -> None:
    settings = SinkSettings()
    logs.setup("sink", settings.instance, settings.common.log_level)
    sys.exit(run(settings))


if __name__ == "__main__":
    main()
