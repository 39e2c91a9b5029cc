"""onceflow's shared core: the pieces every service is built from."""

__version__ = "0.1.0"
