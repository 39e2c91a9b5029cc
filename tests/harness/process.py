"""The fault harness runs services through the same class the CLI uses."""

from onceflow_tools.process import ServiceProcess, free_port

__all__ = ["ServiceProcess", "free_port"]
