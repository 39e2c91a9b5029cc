"""Jobs the compute tests run by module path (ONCEFLOW_COMPUTE_JOB=tests.harness.jobs.<name>)."""
