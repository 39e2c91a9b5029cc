"""onceflow's tools: the `onceflow` CLI, the local stack (infra), `onceflow verify`, `onceflow bench`
and the workloads. They depend on the runtime core and on the services; nothing depends on them."""
