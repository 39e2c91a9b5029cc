# One multi-stage Dockerfile, one target per service: `docker build --target ingest .`
# (No Docker engine runs on the development machines; the compose file is validated in tests
# once the compose issue lands.)
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy
COPY infra/uv/requirements.txt /tmp/uv-requirements.txt
RUN pip install --no-cache-dir --require-hashes -r /tmp/uv-requirements.txt
# The services run as this unprivileged user, never as root.
RUN useradd --system --uid 10001 --create-home --home-dir /home/onceflow onceflow
WORKDIR /app
COPY pyproject.toml uv.lock ./
COPY libs ./libs
COPY services ./services
COPY tools ./tools
COPY proto ./proto
COPY infra/topics.toml ./infra/topics.toml
RUN uv run --no-project --with grpcio-tools==1.85.1 proto/generate.sh python

FROM base AS ingest
RUN uv sync --locked --no-dev --package onceflow-ingest
ENV ONCEFLOW_INGEST_HOST=0.0.0.0
EXPOSE 15051 9101
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15051"]
USER onceflow
CMD ["/app/.venv/bin/onceflow-ingest"]

FROM base AS acker
RUN uv sync --locked --no-dev --package onceflow-acker
ENV ONCEFLOW_ACKER_HOST=0.0.0.0
EXPOSE 15052 9102
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15052"]
USER onceflow
CMD ["/app/.venv/bin/onceflow-acker"]

FROM base AS dedup
RUN uv sync --locked --no-dev --package onceflow-dedup
ENV ONCEFLOW_DEDUP_HOST=0.0.0.0
EXPOSE 15053 9103
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15053"]
USER onceflow
CMD ["/app/.venv/bin/onceflow-dedup"]

FROM base AS compute
# Spark needs a JVM (17+); Debian's headless runtime is enough for local[*] mode.
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless && rm -rf /var/lib/apt/lists/*
RUN uv sync --locked --no-dev --package onceflow-compute
ENV ONCEFLOW_COMPUTE_HOST=0.0.0.0
EXPOSE 15054 9104
HEALTHCHECK --start-period=60s CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15054"]
USER onceflow
CMD ["/app/.venv/bin/onceflow-compute"]

FROM base AS sink
RUN uv sync --locked --no-dev --package onceflow-sink
ENV ONCEFLOW_SINK_HOST=0.0.0.0
EXPOSE 15055 9105
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15055"]
USER onceflow
CMD ["/app/.venv/bin/onceflow-sink"]

FROM base AS source
RUN uv sync --locked --no-dev --package onceflow-source
ENV ONCEFLOW_SOURCE_HOST=0.0.0.0
EXPOSE 15056 9106
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15056"]
USER onceflow
CMD ["/app/.venv/bin/onceflow-source"]

FROM base AS tools
# The onceflow CLI (compose's `topics` job; `onceflow admin`, `verify`, ...): the tools package,
# which depends on the core and every service. No service image carries it.
RUN uv sync --locked --no-dev --package onceflow-tools
USER onceflow
ENTRYPOINT ["/app/.venv/bin/onceflow"]
