#!/usr/bin/env bash
# Packs a CUDA build made on this machine, with the MPI runtime and the other
# libraries its programs load, for a GPU node that has the CUDA driver,
# toolkit and NCCL but no compiler or package registry for the rest
# (docs/gpu.md, "Running the GPU checks").
#
#   scripts/gpu-pack.sh BUILD_DIR PACK_DIR
#
# PACK_DIR then holds build.tar.gz (BUILD_DIR without object files, its
# programs stripped), runtime.tar.gz (mpiexec.hydra, hydra_pmi_proxy, the
# shared libraries the programs and the launcher need, UCX's transports) and
# unpack.sh. On the node, from the repository root (the same path as here;
# CTest's files name absolute paths):
#
#   source PACK_DIR/unpack.sh BUILD_DIR   # unpacks; sets PATH, LD_LIBRARY_PATH
#   PARALLAX_GPU_BUILD_DIR=BUILD_DIR PARALLAX_GPU_PREBUILT=1 scripts/gpu-check.sh
#
# Left out: the C and C++ runtimes and the dynamic loader, the CUDA driver,
# and the CUDA toolkit's own libraries (cudart, cuBLAS, NCCL): the node's
# serve, so that the programs use the NCCL and driver the node was set up
# with. The node's C library must be as new as this machine's.
set -euo pipefail
if [ $# -ne 2 ]; then
  sed -n '2,20p' "$0" >&2
  exit 2
fi
build="$(cd "$1" && pwd)"
pack="$2"
mkdir -p "$pack"
pack="$(cd "$pack" && pwd)"
[ -f "$build/CTestTestfile.cmake" ] || { echo "gpu-pack: $build holds no configured build" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The build without what only the compiler needs.
mkdir -p "$work/build"
tar -C "$build" --exclude=CMakeFiles --exclude='*.o' --exclude='*.a' --exclude='*.d' --exclude=Makefile \
  --exclude='*.make' --exclude=gpu-results -cf - . | tar -C "$work/build" -xf -
programs=()
while IFS= read -r -d '' f; do
  if file -b "$f" | grep -q '^ELF'; then
    strip --strip-unneeded "$f"
    programs+=("$f")
  fi
done < <(find "$work/build" -type f -perm -u+x -print0)
tar -C "$work/build" -czf "$pack/build.tar.gz" .

# The runtime: the launcher and every library the programs load, except the
# C library, the loader, the driver and CUDA's own.
mkdir -p "$work/runtime/bin" "$work/runtime/lib"
for b in mpiexec.hydra hydra_pmi_proxy; do
  cp -L "$(command -v "$b")" "$work/runtime/bin/"
done
ln -s mpiexec.hydra "$work/runtime/bin/mpiexec"
# The C library's own (libresolv, ...) and the C++ runtime are the node's: a
# newer one serves programs built against an older one, and the node's CUDA
# libraries may need its newer C++ runtime.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv|libnsl|libutil|libanl|'
skip+='libstdc\+\+|libgcc_s|libcuda\.so|libnvidia|libcudart|libcublas|libnccl)'
for f in "${programs[@]}" "$work/runtime/bin/mpiexec.hydra" "$work/runtime/bin/hydra_pmi_proxy"; do
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if ! [[ "$name" =~ $skip ]]; then
    cp -L "$path" "$work/runtime/lib/$name"
  fi
done
ucx_modules="$(dirname "$(readlink -f "$(ldconfig -p | awk '/libucs.so.0 /{print $NF; exit}')")")/ucx"
if [ -d "$ucx_modules" ]; then
  mkdir -p "$work/runtime/lib/ucx"
  cp -L "$ucx_modules"/*.so.0 "$work/runtime/lib/ucx/" 2>/dev/null || true
  # The modules' own libraries (verbs, rdmacm) where this machine has them.
  for m in "$work/runtime/lib/ucx"/*.so.0; do
    ldd "$m" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
  done | sort -u | while read -r name path; do
    if ! [[ "$name" =~ $skip ]] && [ ! -e "$work/runtime/lib/$name" ]; then cp -L "$path" "$work/runtime/lib/$name"; fi
  done
fi
strip --strip-unneeded "$work/runtime/lib"/*.so* "$work/runtime/lib/ucx"/*.so* 2>/dev/null || true
tar -C "$work/runtime" -czf "$pack/runtime.tar.gz" .

# CTest's files name the launcher of this machine; unpack.sh points them at
# the packed one (a node's own mpiexec may be another MPI's).
configured_mpiexec="$(sed -n 's/^MPIEXEC_EXECUTABLE:[A-Z]*=//p' "$build/CMakeCache.txt")"
printf '%s\n' "$configured_mpiexec" >"$pack/mpiexec.configured"
cat >"$pack/unpack.sh" <<'EOF'
# source unpack.sh BUILD_DIR: unpacks the build into BUILD_DIR and the runtime
# beside this file, and sets PATH, LD_LIBRARY_PATH and UCX_MODULE_DIR. The
# node's CUDA libraries (cudart, cuBLAS, NCCL) are found where the node keeps
# them: the loader's cache, CUDA_HOME, or a Python package's copy.
pack_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$1" "$pack_dir/runtime"
tar -C "$1" -xzf "$pack_dir/build.tar.gz"
tar -C "$pack_dir/runtime" -xzf "$pack_dir/runtime.tar.gz"
export PATH="$pack_dir/runtime/bin:$PATH"
configured="$(cat "$pack_dir/mpiexec.configured")"
if [ -n "$configured" ]; then
  find "$1" -name CTestTestfile.cmake -exec sed -i "s#\"$configured\"#\"$pack_dir/runtime/bin/mpiexec\"#g" {} +
fi
export LD_LIBRARY_PATH="$pack_dir/runtime/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$pack_dir/runtime/lib/ucx"
for lib in libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
  if ! ldconfig -p | grep -q "$lib "; then
    found="$(find "${CUDA_HOME:-/usr/local/cuda}/" /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -n 1 || true)"
    if [ -n "$found" ]; then
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
    else
      echo "unpack.sh: $lib not found on this node" >&2
    fi
  fi
done
EOF
du -h "$pack"/*.tar.gz
