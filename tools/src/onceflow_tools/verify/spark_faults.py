"""Faults on the local Spark standalone cluster compute runs on (`onceflow verify --spark
standalone`): an executor, a worker daemon or the master killed with kill -9. Spark retries a
lost executor's tasks elsewhere; with no executor left (or no master to grant one) a batch
stalls, is cancelled at its timeout and retried, the service NOT_SERVING meanwhile."""

from __future__ import annotations

import json
import os
import random
import signal
import time

from onceflow_tools.infra import spark
from onceflow_tools.infra.settings import InfraSettings

SPARK_KINDS = ("spark-executor-kill9", "spark-worker-kill9", "spark-master-kill9")
# How long a killed daemon stays down before it is started again.
DOWN_S = (3.0, 10.0)


def available() -> bool:
    """Asked for (ONCEFLOW_SPARK_CLUSTER=standalone; the campaign's `infra up` starts it): compute
    then runs on it."""
    return InfraSettings().spark_cluster == "standalone"


def compute_settings() -> dict[str, str]:
    """The compute worker's settings (without ONCEFLOW_COMPUTE_) to run on the cluster. One core
    per application: a zombie and its replacement are two applications at once."""
    return {
        "SPARK_MASTER": spark.cluster()[0].master_url,
        "SPARK_EXECUTOR_PYTHON": spark.executor_python(),
        "SPARK_CONF": json.dumps({"spark.cores.max": "1"}),
        # Past a lost worker or master a batch waits for an executor; give up sooner than the
        # default 120 s so the campaign sees NOT_SERVING and retries, not a long silence.
        "BATCH_TIMEOUT_S": "30",
    }


def inject(kind: str, rng: random.Random, timeout_s: float = 120.0) -> str:
    daemons = spark.cluster()
    master, workers = daemons[0], daemons[1:]
    started = time.monotonic()
    if kind == "spark-executor-kill9":
        home = master.home
        victims = spark.busy_executors(home) or spark.executor_pids(home)
        if not victims:
            return "spark executor kill -9: no executor ran (skipped)"
        pid = rng.choice(victims)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return f"spark executor kill -9: {pid} had already exited"
        return f"spark executor {pid} kill -9"
    victim = master if kind == "spark-master-kill9" else rng.choice(workers)
    victim.kill9()
    time.sleep(rng.uniform(*DOWN_S))
    spark.up(timeout_s, daemons)
    return f"{victim.name} kill -9, back after {time.monotonic() - started:.0f} s"
