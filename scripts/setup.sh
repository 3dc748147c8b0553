#!/usr/bin/env bash
# Installs what parallax needs on a fresh Debian machine, if missing:
# MPICH, Catch2, Boost.Program_options, Google Benchmark, OpenBLAS (the
# examples' matrix products), Thrust (the host build's; CUB beside it), CMake,
# a C++17 compiler. The CUDA configuration's toolkit (nvcc, NCCL, CCCL,
# cuBLAS) is expected at /usr/local/cuda (or CUDA_HOME); the host build does
# not need it. Safe to run again: installs nothing twice.
set -euo pipefail

packages=(cmake g++ make mpich libmpich-dev catch2 libboost-program-options-dev libbenchmark-dev
          libthrust-dev libcub-dev  # Thrust headers for host builds (cmake/ParallaxFindThrust.cmake)
          libopenblas-openmp-dev)  # the examples' BLAS: OpenBLAS's OpenMP build (cmake/ParallaxExamplesBlas.cmake)
packages+=("$@")  # callers may add more (e.g. python3-matplotlib for plots)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [ -x "$cuda_home/bin/nvcc" ]; then
  case ":$PATH:" in *":$cuda_home/bin:"*) ;; *) export PATH="$cuda_home/bin:$PATH" ;; esac
fi
if [ -x "$cuda_home/bin/nvcc" ] && [ ! -f "$cuda_home/include/cccl/thrust/version.h" ] &&
   [ ! -f "$cuda_home/include/thrust/version.h" ]; then
  echo "setup: the CUDA toolkit at $cuda_home has no CCCL (Thrust/CUB); the CUDA configuration needs it" >&2
  exit 1
fi
