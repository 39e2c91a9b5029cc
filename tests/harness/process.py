"""The fault harness runs services through the same class the CLI uses."""

from onceflow.process import ServiceProcess

__all__ = ["ServiceProcess"]
