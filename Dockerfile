# syntax=docker/dockerfile:1
# gpupool's server image: `gpupool server` with the Kubernetes backend on a PostgreSQL store, as
# deploy/kubernetes/gpupool.yaml and the Helm chart run it (they give their own arguments to the entrypoint).
#   docker build -t ghcr.io/gpupool/gpupool:0.1.0 .
# No image registry is reachable where this repository is tested, so the image is never built there:
# tests/deploy/test_dockerfile.py reads this file and runs the builder stage's own steps on the same sources.

FROM python:3.11.13-slim-bookworm AS builder
# The portal's browser libraries come from npm at build time (scripts/build-portal), with Debian's node and npm.
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scripts/build-portal scripts/build-portal
COPY src src
RUN scripts/build-portal
# gpupool's wheel (the portal's assets inside) and every dependency's, so the final stage installs offline and
# needs neither node nor a compiler.
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[server,postgres,kubernetes]"

FROM python:3.11.13-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "gpupool[server,postgres,kubernetes]"
# The uid and gid the chart's and the manifests' pods run as (runAsUser, fsGroup), never root. /data is the
# data dir; in a pod an emptyDir is mounted there.
RUN groupadd --gid 10001 gpupool \
 && useradd --uid 10001 --gid 10001 --no-log-init --create-home --shell /usr/sbin/nologin gpupool \
 && install -d -o 10001 -g 10001 /data
USER 10001:10001
WORKDIR /home/gpupool
EXPOSE 8470
# /healthz: the process answers (no token, no store). Kubernetes ignores this and uses the pod's own probes.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8470/healthz', timeout=4)"]
ENTRYPOINT ["gpupool"]
# Plain HTTP: TLS ends in front of the server (or give --tls-cert and --tls-key instead of --insecure-http).
CMD ["server", "--backend", "kubernetes", "--host", "0.0.0.0", "--insecure-http", "--port", "8470", "--data-dir", "/data"]
