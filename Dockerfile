# syntax=docker/dockerfile:1.7
# RunPod serverless worker on the official vLLM image, at the vLLM version the project pins.
#
#   docker build -t worker .            # MODEL_NAME at run time (the default SmolLM2 is not in the image)
#   docker build -t worker --build-arg MODEL_NAME=org/model-AWQ \
#       --secret id=hf_token,env=HF_TOKEN .                              # model baked into the image
#
# CMD runs the serverless handler; pod mode:  docker run ... worker python3 -m worker serve --host 0.0.0.0
ARG VLLM_VERSION=0.34.0
# A vLLM cache root to carry (end of file): empty unless the build names a context for it,
# docker build --build-context cache-seed=DIR
FROM scratch AS cache-seed

FROM vllm/vllm-openai:v${VLLM_VERSION}

# The base image's Python: the one tests/test_image_deps.py resolves the image's dependency set for.
# The build stops here if the base image has another.
ARG PYTHON_VERSION=3.12
RUN python3 -c "import sys; v = '%d.%d' % sys.version_info[:2]; \
    sys.exit(None if v == '${PYTHON_VERSION}' else 'base image Python ' + v + ', not ${PYTHON_VERSION}')"

# Two of vLLM's own pins the worker relies on, resolved with the rest by tests/test_image_deps.py:
# torch, and the CUTLASS DSL (vLLM 0.34's kernel warm-up imports `cutlass` on every CUDA boot; an
# engine core without it fails). The build stops here if the base image has other versions.
ARG TORCH_VERSION=2.14.0
ARG CUTLASS_DSL_VERSION=4.8.0
RUN python3 -c "import importlib.metadata as m, re, sys; \
    found = {re.sub('[-_.]+', '-', d.metadata['Name']).lower(): d.version for d in m.distributions()}; \
    wanted = {'vllm': '${VLLM_VERSION}', 'torch': '${TORCH_VERSION}', 'nvidia-cutlass-dsl': '${CUTLASS_DSL_VERSION}'}; \
    off = [f'{n} {found.get(n, \"not installed\")}, not {v}' for n, v in wanted.items() if found.get(n, '').split('+')[0] != v]; \
    sys.exit('base image: ' + '; '.join(off) if off else None)"

# vLLM's compile cache on the network volume: only an endpoint's first worker compiles (the worker
# keeps Triton's kernel cache beside it, TRITON_CACHE_DIR).
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/runpod-volume/huggingface \
    WORKER_CACHE_DIR=/runpod-volume/worker-cache \
    VLLM_CACHE_ROOT=/runpod-volume/vllm-cache
WORKDIR /app

# The worker's own dependencies, pinned to the versions the tests run with (a subset of
# requirements-cpu.lock; vLLM and torch come with the base image).
COPY requirements-worker.lock .
RUN python3 -m pip install --no-deps -r requirements-worker.lock

COPY pyproject.toml README.md handler.py test_input.json ./
COPY worker ./worker
RUN python3 -m pip install --no-deps --no-build-isolation .

# Packages no serving path uses that transformers imports at every boot whenever they are
# installed (scikit-learn, and pandas with it): the list and why in scripts/image_trim.txt.
COPY scripts/image_trim.txt /tmp/image_trim.txt
RUN python3 -m pip uninstall -y -r /tmp/image_trim.txt && rm /tmp/image_trim.txt

# The seam's contract checked once, here, against the vLLM the image ships: where every entry
# holds, a stamp that spares each boot the check (worker/vllm_internals/check.py says what it
# vouches for). Where it cannot be written (an entry broken, or a module that will not import on a
# builder without a GPU), the build goes on without it, the step's output says why, and every boot
# runs the check itself: a vLLM that breaks the contract then fails the boot, naming what it lacks.
RUN python3 -m worker vllm-contract --stamp || echo "no contract stamp: each boot checks the contract itself"

# Bytecode for every package of the image's Python and the app: the base image's packages come
# without it (uv writes none unless asked), and every RunPod cold start is a fresh container that
# would compile torch, vLLM and transformers again before booting. The script fails the build when
# those still have none.
COPY scripts/compile_bytecode.py /tmp/compile_bytecode.py
RUN python3 /tmp/compile_bytecode.py /app && rm /tmp/compile_bytecode.py

# Optional model baking. The token is a build secret: it never lands in a layer.
ARG MODEL_NAME=""
ARG MODEL_REVISION=""
ARG QUANTIZATION=""
ARG SPECULATIVE_MODEL=""
RUN --mount=type=secret,id=hf_token,required=false \
    if [ -n "$MODEL_NAME" ]; then \
      HF_TOKEN="$(cat /run/secrets/hf_token 2>/dev/null || true)" \
      python3 -m worker download --model "$MODEL_NAME" ${MODEL_REVISION:+--revision "$MODEL_REVISION"} \
        ${SPECULATIVE_MODEL:+--draft "$SPECULATIVE_MODEL"} --dest /models; \
    fi
# A baked model is served from /models, offline, under its hub name; otherwise MODEL_NAME is
# read at run time: served from RunPod's cached models when the endpoint has them
# (/runpod-volume/huggingface-cache/hub, RUNPOD_MODEL_CACHE_DIR), else downloaded to the
# network volume (HF_HOME).
ENV MODEL_NAME=${MODEL_NAME:+/models/target} \
    OPENAI_SERVED_MODEL_NAME_OVERRIDE=${MODEL_NAME} \
    SPECULATIVE_MODEL=${SPECULATIVE_MODEL:+/models/draft} \
    QUANTIZATION=${QUANTIZATION} \
    HF_HUB_OFFLINE=${MODEL_NAME:+1}

# Optional: a vLLM cache root every worker whose own folders are empty starts from (CACHE_SEED,
# worker/boot/cache_seed.py says why): Triton's kernels, vLLM's model-class answers and startup plan.
# The build has no GPU to fill one: it is a test job's VLLM_CACHE_ROOT on the endpoint's card kind,
# given as the build context named cache-seed (README, Docker); without it, the empty stage above,
# and the worker seeds nothing. Last, so that a new seed rebuilds no other layer.
COPY --from=cache-seed / /opt/cache-seed/
ENV CACHE_SEED=/opt/cache-seed

ENTRYPOINT []
CMD ["python3", "handler.py"]
