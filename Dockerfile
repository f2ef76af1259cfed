# syntax=docker/dockerfile:1
# pkgq's image: built in one stage, run from another. It installs the way the Makefile does
# (deploy/local/ensure-venv.sh: a venv, pip upgraded, `pip install -c constraints.txt`), but
# not editable and without the dev extras. Build: docker build -t pkgq:dev .
# deploy/k8s/README.md runs it; deploy/k8s/verify.sh lints this file (it cannot build it).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/pkgq/.venv
WORKDIR /src
# .dockerignore lets in only what the package is built from.
COPY . .
RUN /opt/pkgq/.venv/bin/python -m pip install --upgrade 'pip>=23.2' \
    && /opt/pkgq/.venv/bin/python -m pip install -c constraints.txt . \
    && /opt/pkgq/.venv/bin/pkgq --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="pkgq" \
      org.opencontainers.image.description="Telecom package queue on RabbitMQ and PostgreSQL"
ENV PATH=/opt/pkgq/.venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PKGQ_LOG_FORMAT=json
COPY --from=builder /opt/pkgq/.venv /opt/pkgq/.venv
# A numeric user that exists nowhere in /etc/passwd: Kubernetes' runAsNonRoot can check it,
# and the read-only root filesystem leaves it nothing to write anyway.
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["pkgq"]
CMD ["--help"]
