# One image for every part of speedforge: the Kubeflow components, the Ray head and workers
# (KubeRay), and the evaluator's sandbox inside them. The CUDA devel base brings nvcc, which
# builds candidates; the package is installed with its native parts and every extra (kfp among
# them: components install nothing when they start). Nothing secret or heavy is baked in: S3
# credentials come from a Kubernetes secret at run time, and no model weights are installed
# (the policy model comes from the store or a volume, e.g. the checkpoint training wrote).
#
#   docker build -t speedforge:0.1.0 .
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 -t speedforge:cu126 .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/speedforge \
    PATH=/opt/speedforge/bin:$PATH \
    SPEEDFORGE_CACHE=/cache

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Build tools for candidates (g++ for the cpp family and the ANN engine, nvcc from the base) and
# a Python; their versions are those of the base image's Ubuntu release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ ninja-build ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv "${VIRTUAL_ENV}" \
    && pip install --no-cache-dir pip==25.3 setuptools==80.9.0 wheel==0.45.1

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY native ./native
COPY speedforge ./speedforge
COPY components ./components
COPY pipelines ./pipelines
# The CUDA build of torch first, so the package's torch requirement is met by it; then the
# package from this tree (its own requirements are pinned in pyproject.toml where they must be).
# hadolint ignore=DL3013
RUN pip install --no-cache-dir "${TORCH_SPEC}" --index-url "${TORCH_INDEX}" \
    && pip install --no-cache-dir ".[all]" \
    && rm -rf /src/build

# A non-root user (uid 1000, what k8s/ runs as) owning the build cache; Ubuntu's own uid-1000
# user goes first.
RUN (userdel --remove ubuntu 2>/dev/null || true) \
    && useradd --create-home --uid 1000 --user-group --shell /bin/bash speedforge \
    && mkdir -p /cache \
    && chown speedforge:speedforge /cache
# numeric, so the kubelet can check runAsNonRoot
USER 1000:1000
WORKDIR /home/speedforge
CMD ["speedforge", "--help"]
