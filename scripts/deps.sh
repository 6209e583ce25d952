#!/usr/bin/env bash
# scripts/deps.sh MODE - the Debian packages (and a few PyPI packages) the project uses.
#   MODE build: compilers' libraries (OpenBLAS, PCRE2, cJSON, liburing) for `make` and `make demo`
#   MODE test:  build + what the test suite needs (PyTorch, NumPy, matplotlib, tiktoken, safetensors, MPI, clang
#               for libFuzzer)
# Checks what is missing; as root it installs it (apt-get, pip), otherwise it prints the
# command to run and exits 1.
set -euo pipefail
mode="${1:-test}"
mode="${mode#--}"
build_pkgs=(gcc g++ make libopenblas-openmp-dev libpcre2-dev zlib1g-dev libcjson-dev liburing-dev curl)
test_pkgs=(python3 python3-numpy python3-torch python3-matplotlib python3-pip openmpi-bin libopenmpi-dev clang)
# libFuzzer's runtime (clang only recommends it); older releases ship it inside clang's packages
apt-cache show libclang-rt-dev > /dev/null 2>&1 && test_pkgs+=(libclang-rt-dev)
case "$mode" in
build) pkgs=("${build_pkgs[@]}") ;;
test) pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
*) echo "usage: scripts/deps.sh build|test" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
need_tiktoken=0
if [ "$mode" = test ] && ! /usr/bin/python3 -c "import tiktoken" 2>/dev/null; then need_tiktoken=1; fi
need_safetensors=0
if [ "$mode" = test ] && ! /usr/bin/python3 -c "import safetensors" 2>/dev/null; then need_safetensors=1; fi
# cuobjdump + nvdisasm for test/test_sass.sh, where nvcc exists but the toolkit lacks them
need_sass=0
has_sass_tools() { /usr/bin/python3 -c "import glob, site, sys; sys.exit(not any(glob.glob(d + '/nvidia/cu*/bin/nvdisasm') for d in site.getsitepackages()))" 2>/dev/null; }
if [ "$mode" = test ] && command -v nvcc >/dev/null && ! command -v nvdisasm >/dev/null && ! has_sass_tools; then need_sass=1; fi
[ "${#missing[@]}" -eq 0 ] && [ "$need_tiktoken" -eq 0 ] && [ "$need_safetensors" -eq 0 ] && [ "$need_sass" -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "missing dependencies; install them with:" >&2
    [ "${#missing[@]}" -gt 0 ] && echo "  sudo apt-get install -y ${missing[*]}" >&2
    [ "$need_tiktoken" -eq 1 ] && echo "  /usr/bin/python3 -m pip install --break-system-packages tiktoken" >&2
    [ "$need_safetensors" -eq 1 ] && echo "  /usr/bin/python3 -m pip install --break-system-packages safetensors" >&2
    [ "$need_sass" -eq 1 ] && echo "  /usr/bin/python3 -m pip install --break-system-packages --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm" >&2
    exit 1
fi
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
if [ "$need_tiktoken" -eq 1 ] || ! /usr/bin/python3 -c "import tiktoken" 2>/dev/null; then
    echo "installing tiktoken (PyPI) for the tokenizer tests"
    /usr/bin/python3 -m pip install -q --break-system-packages tiktoken
fi
if [ "$need_safetensors" -eq 1 ]; then
    echo "installing safetensors (PyPI) for the Hugging Face directory tests"
    /usr/bin/python3 -m pip install -q --break-system-packages safetensors
fi
if [ "$need_sass" -eq 1 ]; then
    echo "installing cuobjdump and nvdisasm (PyPI) for the SASS check"
    /usr/bin/python3 -m pip install -q --break-system-packages --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
fi
