# One multi-stage Dockerfile, one target per service: `docker build --target ingest .`
# The base is a build argument: Python 3.11 on Debian bookworm. With a registry it is the
# official image; without one, `make images` builds a Debian base with mmdebstrap and passes it
# (`--build-arg BASE=localhost/onceflow-base:py`, compute's with a JRE: docs/deploy.md).
# Every service target ends with the release a deploy stamps (images.sh --release=R):
# /app/RELEASE and the label onceflow.release. A RUN writes it because a RUN's cache key holds
# the argument's value, where podman's layer cache reuses a LABEL (or a --label given to the
# build) whatever the value.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE} AS base
# No managed Python downloads: the image's own python3 runs everything. uv trusts the system
# certificate store (as pip does), which a build behind a TLS-inspecting proxy replaces.
ENV PYTHONUNBUFFERED=1 UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_PYTHON=python3 UV_SYSTEM_CERTS=1
COPY infra/uv/requirements.txt /tmp/uv-requirements.txt
# uv in a venv of its own: Debian's python3 refuses pip installs into the system (PEP 668).
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir --require-hashes -r /tmp/uv-requirements.txt \
    && ln -s /opt/uv/bin/uv /usr/local/bin/uv
# The services run as this unprivileged user, never as root.
RUN useradd --system --uid 10001 --create-home --home-dir /home/onceflow onceflow
WORKDIR /app
COPY pyproject.toml uv.lock ./
COPY libs ./libs
COPY services ./services
COPY tools ./tools
COPY proto ./proto
COPY infra/topics.toml ./infra/topics.toml
# uv's cache is a build cache mount, shared by the targets and never part of an image (it held
# 2.3 GB of wheels and pyspark's build in the compute image).
RUN --mount=type=cache,target=/root/.cache/uv uv run --no-project --with grpcio-tools==1.85.1 proto/generate.sh python

FROM base AS ingest
RUN --mount=type=cache,target=/root/.cache/uv uv sync --locked --no-dev --package onceflow-ingest
ENV ONCEFLOW_INGEST_HOST=0.0.0.0
EXPOSE 15051 9101
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15051"]
ARG ONCEFLOW_RELEASE=dev
RUN echo "$ONCEFLOW_RELEASE" > /app/RELEASE
LABEL onceflow.release=$ONCEFLOW_RELEASE
USER onceflow
CMD ["/app/.venv/bin/onceflow-ingest"]

FROM base AS acker
RUN --mount=type=cache,target=/root/.cache/uv uv sync --locked --no-dev --package onceflow-acker
ENV ONCEFLOW_ACKER_HOST=0.0.0.0
EXPOSE 15052 9102
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15052"]
ARG ONCEFLOW_RELEASE=dev
RUN echo "$ONCEFLOW_RELEASE" > /app/RELEASE
LABEL onceflow.release=$ONCEFLOW_RELEASE
USER onceflow
CMD ["/app/.venv/bin/onceflow-acker"]

FROM base AS dedup
RUN --mount=type=cache,target=/root/.cache/uv uv sync --locked --no-dev --package onceflow-dedup
ENV ONCEFLOW_DEDUP_HOST=0.0.0.0
EXPOSE 15053 9103
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15053"]
ARG ONCEFLOW_RELEASE=dev
RUN echo "$ONCEFLOW_RELEASE" > /app/RELEASE
LABEL onceflow.release=$ONCEFLOW_RELEASE
USER onceflow
CMD ["/app/.venv/bin/onceflow-dedup"]

FROM base AS compute
# Spark needs a JVM (17+); Debian's headless runtime is enough for local[*] mode. A base that
# has one (onceflow-base:jre) skips the install; the JRE's postinst needs man1 on slim images.
RUN command -v java >/dev/null || (mkdir -p /usr/share/man/man1 && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless && rm -rf /var/lib/apt/lists/*)
RUN --mount=type=cache,target=/root/.cache/uv uv sync --locked --no-dev --package onceflow-compute
ENV ONCEFLOW_COMPUTE_HOST=0.0.0.0
EXPOSE 15054 9104
HEALTHCHECK --start-period=60s CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15054"]
ARG ONCEFLOW_RELEASE=dev
RUN echo "$ONCEFLOW_RELEASE" > /app/RELEASE
LABEL onceflow.release=$ONCEFLOW_RELEASE
USER onceflow
CMD ["/app/.venv/bin/onceflow-compute"]

FROM base AS sink
RUN --mount=type=cache,target=/root/.cache/uv uv sync --locked --no-dev --package onceflow-sink
ENV ONCEFLOW_SINK_HOST=0.0.0.0
EXPOSE 15055 9105
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15055"]
ARG ONCEFLOW_RELEASE=dev
RUN echo "$ONCEFLOW_RELEASE" > /app/RELEASE
LABEL onceflow.release=$ONCEFLOW_RELEASE
USER onceflow
CMD ["/app/.venv/bin/onceflow-sink"]

FROM base AS source
RUN --mount=type=cache,target=/root/.cache/uv uv sync --locked --no-dev --package onceflow-source
ENV ONCEFLOW_SOURCE_HOST=0.0.0.0
EXPOSE 15056 9106
HEALTHCHECK CMD ["/app/.venv/bin/python", "-m", "onceflow.probe", "127.0.0.1:15056"]
ARG ONCEFLOW_RELEASE=dev
RUN echo "$ONCEFLOW_RELEASE" > /app/RELEASE
LABEL onceflow.release=$ONCEFLOW_RELEASE
USER onceflow
CMD ["/app/.venv/bin/onceflow-source"]

FROM base AS tools
# The onceflow CLI (compose's `topics` job; `onceflow admin`, `verify`, ...): the tools package,
# which depends on the core and every service. No service image carries it.
RUN --mount=type=cache,target=/root/.cache/uv uv sync --locked --no-dev --package onceflow-tools
# The console's view of the compose network (docker-compose.yml's `console`).
COPY infra/containers/services.toml ./infra/containers/services.toml
ARG ONCEFLOW_RELEASE=dev
RUN echo "$ONCEFLOW_RELEASE" > /app/RELEASE
LABEL onceflow.release=$ONCEFLOW_RELEASE
USER onceflow
ENTRYPOINT ["/app/.venv/bin/onceflow"]
