"""A job module that fails on import, as a user's module with a bug does (issue 38)."""

raise RuntimeError("the config file sensors.yaml is missing")
