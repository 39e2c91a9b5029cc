"""Generated workloads that the demo, tests and benches push through the pipeline."""
