# syntax=docker/dockerfile:1
#
# kfan container image.
#
#   docker build -t kfan:0.1.0 .
#   docker run --rm -p 9092:9092 -p 9100:9100 \
#     -e KFAN_BOOTSTRAP=broker-1:9092,broker-2:9092 -e KFAN_ADVERTISE=localhost:9092 \
#     -e KFAN_METRICS_LISTEN=0.0.0.0:9100 kfan:0.1.0
#
# Configuration comes from KFAN_* environment variables (or flags after
# `serve`). The Helm chart in charts/kfan runs this image (command `kfan`,
# args `serve --listen=... --metrics-listen=...`, uid 10001, ports 9092 and
# 9100); tests/test_chart.py checks that the two agree.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: install kfan and its dependencies into a self-contained venv ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/kfan
WORKDIR /src
# .dockerignore keeps the context to what `pip install .` needs.
COPY . .
RUN /opt/kfan/bin/pip install . \
    && /opt/kfan/bin/kfan --help >/dev/null

# ---- runtime: the venv alone, run as an unprivileged user ----
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kfan" \
      org.opencontainers.image.description="A stateless Kafka protocol proxy: one endpoint in front of a multi-broker cluster" \
      org.opencontainers.image.licenses="Apache-2.0"
# A numeric uid lets Kubernetes' runAsNonRoot check the user without
# reading /etc/passwd; the chart's securityContext uses the same ids.
RUN groupadd --system --gid 10001 kfan \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin kfan
# The venv's scripts point at /opt/kfan/bin/python, so it keeps its path.
COPY --from=build /opt/kfan /opt/kfan
# No .pyc writes: the chart mounts the root filesystem read-only.
# KFAN_LISTEN: reachable from outside the container.
ENV PATH=/opt/kfan/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KFAN_LISTEN=0.0.0.0:9092
USER 10001:10001
# 9092: Kafka clients. 9100: /metrics, /healthz, /readyz (the chart's and the
# examples' metrics port).
EXPOSE 9092 9100
# Exec form: kfan is PID 1 and gets SIGTERM itself (graceful drain).
ENTRYPOINT ["kfan"]
CMD ["serve"]
