# toolserve's image: the one the Helm chart runs in every Ray pod.
#
# Base: Ray's own image for the Ray release toolserve pins (pyproject.toml,
# the chart's image.rayVersion), Python 3.11, CUDA 12.8. KubeRay starts Ray
# in each pod from the image's own Python, so toolserve is installed into that
# Python, beside that Ray. Not `rayproject/ray-llm`: it ships the vLLM that
# Ray's release tested, and toolserve's engine plugin targets the vLLM it pins.
#
#   docker build -t ghcr.io/toolserve/toolserve:0.1.0 .
#   docker build --build-arg ENGINE=cpu \
#     --build-arg RAY_IMAGE=rayproject/ray:2.60.0-py311-cpu -t toolserve:cpu .
#   docker run --rm -p 8000:8000 --user root --cap-add SYS_ADMIN \
#     --security-opt apparmor=unconfined toolserve:cpu toolserve up --demo
# Tool processes confine themselves with namespaces, mounts and seccomp, which
# needs root and CAP_SYS_ADMIN in the container (docs/kubernetes.md says why;
# the chart's pods get them); without them a hosted tool call fails with
# `error_kind: confinement` and never runs unconfined.
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311-cu128
FROM ${RAY_IMAGE}

# gpu: vLLM's CUDA build and LMCache; cpu: vLLM's CPU build (with a `-cpu`
# RAY_IMAGE). Either image holds the embedded models, converted at build time.
ARG ENGINE=gpu

ENV PIP_NO_CACHE_DIR=1 \
    TOOLSERVE_CACHE_DIR=/home/ray/.cache/toolserve

USER 0
RUN install -d -o 1000 -g 100 /app
USER 1000
WORKDIR /app
COPY --chown=1000:100 . /app

# Tool processes load the system's libseccomp (Ubuntu's apt depends on it, so
# Ray's image has it); checked here so that a base without it fails the build
# and not the first tool call.
RUN TOOLSERVE_VENV=system TOOLSERVE_ENGINE="${ENGINE}" TOOLSERVE_EXTRAS="" \
      bash cluster/setup.sh \
 && python -c "import pyseccomp, vllm, deployments.app" \
 && toolserve --help >/dev/null

EXPOSE 8000
