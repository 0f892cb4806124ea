# syntax=docker/dockerfile:1
#
# The Isthmus image: the server (`isthmus serve`, the entrypoint) and, in a KubeRay
# RayCluster, the Ray head and workers that run the executors. One image for all of them,
# so the server and every executor run the same Python, Ray and JAX.
#
#   CPU (default):  docker build -t isthmus:0.1.0 .
#   NVIDIA GPUs:    docker build --build-arg JAX_EXTRA=cuda12 -t isthmus:0.1.0-cuda12 .
#
# The CUDA variant differs only in JAX's extra: JAX's CUDA wheels bring CUDA, cuDNN and NCCL
# with them, so the base stays the same and a GPU node needs only its NVIDIA driver and
# device plugin (docs/kubernetes.md). The pins below equal the versions the project's
# pyproject.toml resolves in CI; tests/k8s/test_image.py fails when they drift apart.
# The base is pinned by tag and digest; to move it, `docker buildx imagetools inspect
# python:<tag>` gives the digest.

FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

ARG RAY_VERSION=2.60.0
ARG JAX_VERSION=0.10.2
# cpu, cuda12 or cuda13: the `jax[...]` extra to install.
ARG JAX_EXTRA=cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A numeric, non-root user: Kubernetes' runAsNonRoot can check a number, not a name.
RUN groupadd --gid 10001 isthmus \
    && useradd --uid 10001 --gid 10001 --no-log-init --create-home --shell /bin/bash isthmus

# The package is built from the context mounted for this step only (writable for the
# build's own files, which are discarded), so no source tree is left in the image.
RUN --mount=type=bind,target=/src,rw \
    pip install /src "ray==${RAY_VERSION}" "jax[${JAX_EXTRA}]==${JAX_VERSION}" "jaxlib==${JAX_VERSION}"

USER 10001:10001
WORKDIR /home/isthmus
ENV HOME=/home/isthmus
EXPOSE 8470

# Binds 127.0.0.1 unless told otherwise: serving beyond the container takes
# ISTHMUS_HOST=0.0.0.0, ISTHMUS_ALLOW_REMOTE=1 and an explicit ISTHMUS_TOKEN (docs/security.md).
ENTRYPOINT ["isthmus", "serve"]
