"""onceflow sink: result changes applied to Redis exactly once."""
