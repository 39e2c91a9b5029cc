# The plain entry point. `make demo` and `make test` each run `make setup` first, so either
# works alone on a fresh clone. Every step is idempotent and cached.
SHELL := /bin/bash
# uv's version and the sha256 of its wheels: infra/uv/requirements.txt (pip --require-hashes).
# Tilt is built from source by infra/tilt/install.sh, which pins each version's checksum.
TILT_VERSION := 0.34.0
# Helm 3 likewise, by infra/helm/install.sh (the chart: deploy/helm/onceflow, docs/helm.md).
HELM_VERSION := 3.22.0
TOOLS := .tools
UV := $(TOOLS)/uv-venv/bin/uv
PY := .venv/bin/python
ONCEFLOW := .venv/bin/onceflow
PROTOS := $(wildcard proto/onceflow/v1/*.proto)
GEN_STAMP := libs/onceflow-wire/src/onceflow/v1/.generated

.PHONY: setup venv proto kafka-jars spark-cds redis browser compose-schema console demo test test-cluster test-extended test-fast fuzz typecheck infra-up infra-down bench soak soak-cluster soak-spark clean

setup: venv proto kafka-jars spark-cds redis

$(UV): infra/uv/requirements.txt
	python3 -m venv $(TOOLS)/uv-venv
	$(TOOLS)/uv-venv/bin/pip install --quiet --require-hashes -r infra/uv/requirements.txt
	touch $(UV)

venv: $(UV)
	$(UV) sync --all-packages --locked --quiet

proto: venv $(GEN_STAMP)

$(GEN_STAMP): $(PROTOS) proto/generate.sh | $(UV)
	proto/generate.sh $(PY)
	touch $@

kafka-jars: venv
	$(ONCEFLOW) infra install

# The Spark driver's AppCDS archive in .onceflow/spark (once per pyspark and JVM): workers start
# about a third sooner (onceflow_compute/engine/cds.py).
spark-cds: proto
	@$(PY) -m onceflow_compute.engine.cds

redis:
	@command -v redis-server >/dev/null || infra/redis/install.sh

# Debian's Chromium, which the console's browser tests drive (pytest -m console).
browser:
	@command -v chromium >/dev/null || infra/browser/install.sh

# Tilt in .tools/bin, built from the Go module proxy and the npm registry (cold: ~10 min), then
# kept in the user's cache: a fresh clone copies it in a second.
.PHONY: tilt
tilt:
	TILT_VERSION=$(TILT_VERSION) infra/tilt/install.sh

# Helm in .tools/bin, built from the Go module proxy (cold: ~3 min), then kept in the user's
# cache like Tilt; the suite lints and renders the chart with it (tests/test_helm.py).
.PHONY: helm
helm:
	@HELM_VERSION=$(HELM_VERSION) infra/helm/install.sh

# The Compose Specification's JSON schema (from compose-go, via the Go module proxy), which the
# devex tests validate docker-compose.yml against.
compose-schema:
	@infra/compose/schema.sh >/dev/null

infra-up: setup
	$(ONCEFLOW) infra up

infra-down:
	$(ONCEFLOW) infra down

demo: setup
	$(ONCEFLOW) demo

# The operations console on infra/services.toml's services (`tilt up` runs it too).
console: setup
	$(ONCEFLOW) console

# The suite also runs `tilt ci` on the Tiltfile and validates the compose file. It leaves the
# clusters out (markers cluster, spark_cluster): a 3-broker KRaft cluster and a Spark standalone
# cluster beside the suite's own stacks cost a 2-core machine about 12 of its worker-minutes;
# `make test-cluster` runs them, the extended ones too. It prints the 20 slowest tests, to keep
# it under 20 minutes. Three xdist workers, each with a Kafka and a Redis of its own
# (tests/conftest.py): many tests wait on timeouts (sessions, trees, Spark starts), and a third
# worker fills those waits (16.5 min for the tests on a fresh clone, against 18.4 with two and
# fewer tests; 17:56 with three and 467 tests on 2026-11-26, after ingest's 15-second start was fixed and
# compute runs on pandas where it is not the subject). The longest tests go first. A module that needs one fixture for all its tests
# is one xdist_group.
PYTEST_WORKERS ?= 3
test: setup browser tilt helm compose-schema
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not extended and not cluster and not spark_cluster and not fuzz and not deploy" --durations=20

test-cluster: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "cluster or spark_cluster" --durations=20

# Every test marked extended: the cluster's sabotaged build and two compute workers on the Spark
# cluster (both in test-cluster too), the whole pipeline on the secure stack, the six Nexmark
# queries make test leaves out (q0-q4, q7) through kill -9s, a Sentinel failover on a stack of
# its own, the replay that runs out of attempts, and other second proofs of what make test proves
# once (each test says why it is here).
test-extended: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m extended

# Every gRPC boundary of a running pipeline under hypothesis-generated requests (structured from
# the protos, and raw bytes), and the source's mapping under arbitrary records: each call ends in a
# precise status, every service stays up and answering, no service's memory runs away. Counts per
# method and status go to .onceflow/logs/fuzz-report.json. FUZZ_EXAMPLES per boundary (300).
FUZZ_EXAMPLES ?= 300
fuzz: setup
	mkdir -p .onceflow/logs
	ONCEFLOW_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) ONCEFLOW_FUZZ_REPORT_DIR=$(CURDIR)/.onceflow/logs $(PY) -m pytest -s -m fuzz tests/test_fuzz.py

test-fast: setup browser tilt helm compose-schema
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not fault and not cluster and not spark_cluster and not extended and not fuzz and not deploy"

# Containers without a registry (docs/deploy.md): Debian's podman, set up by
# infra/containers/install.sh (the engine's settings in .tools/containers, named by CONTAINERS_CONF).
# `make images` builds the Debian bases (mmdebstrap), one image per Dockerfile target, Kafka from
# the pinned jars and Redis from Debian's package; `make compose-up` runs docker-compose.yml
# through podman-compose (ONCEFLOW_ADMIN_TOKEN required), waiting until every service is healthy.
CONTAINERS_CONF ?= $(CURDIR)/.tools/containers/containers.conf
.PHONY: containers images compose-up compose-down test-deploy
# The engine and its settings (idempotent: a second run only checks the packages).
containers:
	@infra/containers/install.sh

images: containers kafka-jars
	@CONTAINERS_CONF=$(CONTAINERS_CONF) infra/containers/images.sh

compose-up: venv containers
	@CONTAINERS_CONF=$(CONTAINERS_CONF) $(PY) infra/containers/compose.py up

compose-down: venv
	@CONTAINERS_CONF=$(CONTAINERS_CONF) $(PY) infra/containers/compose.py down

# The deploy tests (pytest -m deploy): the images built, the compose stack exact end to end, one
# service upgraded and a container killed under load; the Helm chart's pods under podman kube play. Not in `make test`: they need podman and
# take the 2-core machine for about ten minutes beside the suite's own stacks.
test-deploy: setup helm images
	CONTAINERS_CONF=$(CONTAINERS_CONF) $(PY) -m pytest -n 0 -m deploy tests/test_deploy.py tests/test_helm_pods.py --durations=10

# mypy over the packages `[tool.mypy]` in pyproject.toml lists (the core, the client, every
# service, the tools and the bench scripts), with the generated wire contracts' .pyi stubs. tests/test_types.py runs the same
# check in the suite.
typecheck: proto
	$(PY) -m mypy

# The long chaos campaigns (docs/verification.md); the suite runs short ones.
soak: setup
	$(ONCEFLOW) verify --duration 30m --json > .onceflow/verify-soak.json

soak-cluster: setup
	$(ONCEFLOW) verify --brokers 3 --duration 30m --json > .onceflow/verify-soak-cluster.json

soak-spark: setup
	$(ONCEFLOW) verify --spark standalone --duration 30m --json > .onceflow/verify-soak-spark.json

# `onceflow bench` first: the pipeline in both guarantees and its hops against the peers
# (bench/peers/quix sets up its own venv); then each service against its own baseline.
bench: setup
	$(ONCEFLOW) bench
	$(PY) bench/ingest_throughput.py
	$(PY) bench/client_throughput.py
	$(PY) bench/source_throughput.py
	$(PY) bench/acker_throughput.py
	$(PY) bench/dedup_throughput.py
	$(PY) bench/sink_apply.py
	$(PY) bench/postgres_sink_apply.py
	$(PY) bench/kafka_sink_throughput.py
	$(PY) bench/compute_throughput.py
	$(PY) bench/spark_cluster.py
	$(PY) bench/nexmark.py
	$(PY) bench/visibility_latency.py
	$(PY) bench/spark_job_warmup.py
	$(PY) bench/load_latency.py
	$(PY) bench/hop_batches.py

clean:
	-$(ONCEFLOW) infra down
	rm -rf .onceflow .venv $(TOOLS)
	find libs/onceflow-wire/src/onceflow/v1 -maxdepth 1 -name '*_pb2*' -delete
