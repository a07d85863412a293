# syntax=docker/dockerfile:1
# ate-devplugin container image: the node daemon and nothing else.
#
# Build:  tools/build-image.sh   (buildah; makes the base locally when it
#         cannot be pulled).  Plain `docker build .` works as well.
#
# Both stages use the same Debian release, so the virtualenv built in the
# first stage runs on the very same /usr/bin/python3 in the second one.
# No compilers in either stage: every dependency must come as a wheel.

# tools/build-image.sh builds each architecture FROM its own base: another than the
# host's gets the official image's name for that architecture alone (arm64v8/debian).
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

# ---------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS build

# pip may need a CA bundle other than the image's (a TLS-inspecting proxy);
# pass it with `-v HOST_BUNDLE:/run/host-ca.crt:ro --build-arg PIP_CERT=/run/host-ca.crt`.
# Empty (the default) means the image's own bundle.
ARG PIP_CERT=""

# Versions come from the Debian release the base pins; exact pins would break at every point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . /src

# Only binary wheels (no compiler exists here to build one); the project itself
# is built from source by its declared build backend. Then bytecode for
# everything in the venv, hashed rather than timestamped, because the root
# filesystem is read-only at run time and nothing can be written back.
RUN if [ -z "${PIP_CERT}" ]; then unset PIP_CERT; fi \
 && python3 -m venv /opt/ate-devplugin \
 && /opt/ate-devplugin/bin/pip install --no-cache-dir --no-compile \
        --disable-pip-version-check --only-binary=:all: '/src[dra]' \
 && /opt/ate-devplugin/bin/pip uninstall --yes --disable-pip-version-check pip setuptools wheel \
 && find /opt/ate-devplugin -name '__pycache__' -type d -prune -exec rm -rf {} + \
 && /opt/ate-devplugin/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/ate-devplugin/lib \
 && /opt/ate-devplugin/bin/ate-devplugin version

# ---------------------------------------------------------------------------
FROM ${BASE_IMAGE}

ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=unknown
ARG LICENSES=""
ARG BASE_IMAGE

LABEL org.opencontainers.image.title="ate-devplugin" \
      org.opencontainers.image.description="Kubernetes device plugin handing host character devices (e.g. /dev/kvm) to pods as extended resources" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="${LICENSES}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.documentation="chart/README.md in the source repository"

# Interpreter only (no pip, no compilers, no recommends); the standard
# library's bytecode is compiled by Debian's package scripts at install time.
# Versions come from the Debian release the base pins; exact pins would break at every point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /usr/share/doc/* /usr/share/man/*

COPY --from=build /opt/ate-devplugin /opt/ate-devplugin

# ATE_DEVPLUGIN_REVISION: the commit the image is built from, reported by the daemon as
# the revision label of ate_devplugin_build_info (a label alone never reaches the process).
# MALLOC_ARENA_MAX=2: glibc otherwise gives gRPC's threads arenas of their own under load
# (0.5-1.0 MiB more RSS after concurrent Allocates, no throughput gained; docs/benchmarks.md).
ENV PATH="/opt/ate-devplugin/bin:${PATH}" \
    MALLOC_ARENA_MAX=2 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    ATE_DEVPLUGIN_LOG_FORMAT=json \
    ATE_DEVPLUGIN_REVISION="${REVISION}"

# The daemon runs as UID 0 because the kubelet's device-plugin socket
# directory is root-owned; it needs no capability at all (the chart drops
# ALL, forbids privilege escalation and mounts the root filesystem read-only).
# 9477: /metrics, /healthz, /readyz.
EXPOSE 9477
STOPSIGNAL SIGTERM
ENTRYPOINT ["ate-devplugin"]
CMD ["run"]
