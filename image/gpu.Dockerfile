# macaron-ray's GPU image (k8s/macaron/values-tall-h20.yaml, values-venti-b300.yaml): Ray's own ray-llm
# image at the Ray version the project pins (Ray, the CUDA build of vLLM and NIXL come with it), plus
# macaron-ray. Not buildable on the CPU machines this project is developed on (no registry image is
# reachable there); tests/unit/test_image.py checks its tag and pins against pyproject.toml.
#
#   docker build -f image/gpu.Dockerfile -t macaron-ray:0.1.0-gpu .
FROM rayproject/ray-llm:2.60.0-py311-cu128

# The package with the `gpu` extra (ray[serve,llm]==2.60.0: already satisfied by the base image).
COPY --chown=ray:users . /opt/macaron-ray
RUN pip install --no-cache-dir "/opt/macaron-ray[gpu]" \
 && python -c "import macaron_ray.serve.args, vllm, ray; assert ray.__version__ == '2.60.0', ray.__version__"
ENV HF_HUB_OFFLINE=1
CMD ["macaron", "--help"]
