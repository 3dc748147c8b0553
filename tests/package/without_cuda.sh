#!/bin/sh
# without_cuda.sh COMMAND [ARG...]: runs COMMAND on this machine as if it had
# no CUDA toolkit. In a private mount namespace (unshare -m; unshare -rm where
# the caller is not root) an empty directory is bind-mounted over every
# toolkit directory found (/usr/local/cuda*, CUDA_HOME, CUDA_PATH, the one
# holding nvcc), which also empties the links into them (/usr/local/include/*
# on this CI image); CUDA_* variables are unset and PATH loses its CUDA
# entries. The mounts are private: the rest of the machine still sees the toolkit.
#
# Before COMMAND runs, the hiding is checked: no nvcc runs, and the
# compiler finds no <cuda_runtime.h>. Where a namespace cannot be made or the
# toolkit stays visible (e.g. installed under /usr), prints "package test
# SKIPPED: <why>" and exits 0, which CTest reports as skipped.
set -eu

skip() {
  echo "package test SKIPPED: $*"
  exit 0
}

if [ -z "${PARALLAX_WITHOUT_CUDA_INSIDE:-}" ]; then
  if [ "$(id -u)" -eq 0 ] && unshare -m true 2>/dev/null; then
    PARALLAX_WITHOUT_CUDA_INSIDE=1 exec unshare -m "$0" "$@"
  elif unshare -r -m true 2>/dev/null; then
    PARALLAX_WITHOUT_CUDA_INSIDE=1 exec unshare -r -m "$0" "$@"
  fi
  skip "cannot make a mount namespace (unshare -m) to hide the CUDA toolkit"
fi

empty="$(mktemp -d)"
hidden=""
nvcc_dir=""
if command -v nvcc >/dev/null 2>&1; then
  nvcc_dir="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
fi
for d in /usr/local/cuda /usr/local/cuda-* ${CUDA_HOME:-} ${CUDA_PATH:-} ${CUDAToolkit_ROOT:-} $nvcc_dir; do
  [ -d "$d" ] || continue
  real="$(readlink -f "$d")"
  case " $hidden " in *" $real "*) continue ;; esac
  mount --bind "$empty" "$real" || skip "cannot bind-mount over $real"
  hidden="$hidden $real"
done
unset CUDA_HOME CUDA_PATH CUDAToolkit_ROOT CUDACXX NVCC_PREPEND_FLAGS NVCC_APPEND_FLAGS
PATH="$(printf '%s' "$PATH" | tr ':' '\n' | grep -iv cuda | paste -sd: -)"
export PATH

if nvcc --version >/dev/null 2>&1; then
  skip "nvcc still runs, from $(command -v nvcc)"
fi
if printf '#include <cuda_runtime.h>\n' | "${CXX:-c++}" -E -x c++ - >/dev/null 2>&1; then
  skip "the compiler still finds <cuda_runtime.h> with$hidden hidden"
fi
echo "without_cuda: hidden:${hidden:- nothing (no toolkit here)}"
exec "$@"
