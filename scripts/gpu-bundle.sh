#!/usr/bin/env bash
# Builds the CUDA binaries HERE (a machine with nvcc, no GPU needed) and packs what a lent GPU
# machine needs to run scripts/gpu-check.sh into .gpu-bundle/ (ignored by git; carried with the
# device tool's `carry: [".gpu-bundle"]`, at most 64 MiB in all, docs/gpu.md "The prepared check"):
#   bin/      tetrad, the GPU test binaries (test_cuda_kernels, test_backend_conformance when the
#             seam's suite is built, test_gpu_comm_mpi, test_comm_conformance (the communication
#             interface's suite: NCCL on one rank), test_gpu_model and test_device_model_mpi
#             (the model on the GPU, 1 rank and 2 ranks on one GPU through MPI) and
#             test_gpu_memory (the backend's memory figure and MFU peak) when present)
#   lib/      every non-CUDA, non-glibc shared library they load (ldd), so the lent machine needs
#             none of our Debian packages (it has none: oneDNN, Open MPI, SentencePiece, ...)
#   ompi/     a relocatable copy of Debian's Open MPI (orterun, orted, its components and help
#             files) for the 2-rank run, used through OPAL_PREFIX
# compressed into .gpu-bundle/bundle.tar.xz (the uncompressed tree is deleted). CUDA's own
# libraries (cuBLASLt, NCCL) are not packed: the lent machine has them as Python wheels, and
# gpu-check.sh puts their folders on LD_LIBRARY_PATH; the CUDA runtime is linked statically.
#
# Usage: bash scripts/gpu-bundle.sh [BUILD_DIR]   (default build-gpu; configures it if needed)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${1:-build-gpu}
OUT=$ROOT/.gpu-bundle
STAGE=$OUT/stage
export CCACHE_DIR=${CCACHE_DIR:-/work/.ccache} CCACHE_BASEDIR=${CCACHE_BASEDIR:-/work}

if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  echo "gpu-bundle: no nvcc here (CUDA toolkit not installed): cannot build the CUDA backend" >&2
  exit 2
fi
# Portable CPU code (-DTETRAD_NATIVE=OFF): the lent machine's CPU is not this one.
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTETRAD_CUDA=ON -DTETRAD_NATIVE=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90 "${launcher[@]}" > "$BUILD.log" 2>&1 ||
    { tail -30 "$BUILD.log"; exit 1; }
fi
targets=(tetrad test_cuda_kernels test_gpu_comm_mpi test_comm_conformance)
for t in test_backend_conformance test_gpu_model test_gpu_memory test_device_model_mpi; do
  grep -q "^$t:" "$BUILD/Makefile" 2>/dev/null && targets+=("$t") || true
done
cmake --build "$BUILD" -j"${JOBS:-2}" --target "${targets[@]}" 2>&1 | grep -E "error|Error" | head -30 || true
for t in "${targets[@]}"; do
  f=$(find "$BUILD" -maxdepth 3 -type f -name "$t" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "gpu-bundle: $t was not built" >&2; exit 1; }
done

rm -rf "$OUT"
mkdir -p "$STAGE/bin" "$STAGE/lib" "$STAGE/ompi"
for t in "${targets[@]}"; do
  f=$(find "$BUILD" -maxdepth 3 -type f -name "$t" -perm -u+x | head -1)
  cp "$f" "$STAGE/bin/"
  strip --strip-debug "$STAGE/bin/$t" 2>/dev/null || true
done

# Shared libraries: everything ldd resolves except glibc's own and CUDA's (and the driver's).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libcuda\.so|libcublas|libcudart|libnccl|libnvidia)'
ompi_libdir=/usr/lib/x86_64-linux-gnu/openmpi
for f in "$STAGE"/bin/* /usr/bin/orted /usr/bin/orterun $(find "$ompi_libdir/lib/openmpi3" -name '*.so' 2>/dev/null); do
  ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    if ! [[ $name =~ $skip ]] && [ ! -e "$STAGE/lib/$name" ]; then cp -L "$path" "$STAGE/lib/$name"; fi
  done
done

# Open MPI, relocated: the same tree under ompi/ as under /usr, so OPAL_PREFIX=ompi/usr finds
# its components (lib/x86_64-linux-gnu/openmpi/lib/openmpi3) and help files (share/openmpi).
mkdir -p "$STAGE/ompi/usr/bin" "$STAGE/ompi/usr/lib/x86_64-linux-gnu" "$STAGE/ompi/usr/share"
cp -L /usr/bin/orterun /usr/bin/orted "$STAGE/ompi/usr/bin/"
ln -s orterun "$STAGE/ompi/usr/bin/mpirun"
cp -rL "$ompi_libdir" "$STAGE/ompi/usr/lib/x86_64-linux-gnu/"
cp -rL /usr/share/openmpi "$STAGE/ompi/usr/share/"
mkdir -p "$STAGE/ompi/etc"
cp -L /etc/openmpi/openmpi-mca-params.conf "$STAGE/ompi/etc/" 2>/dev/null || true

git rev-parse HEAD > "$STAGE/COMMIT" 2>/dev/null || echo unknown > "$STAGE/COMMIT"
(cd "$STAGE" && tar -cf - . | xz -T2 -6 > "$OUT/bundle.tar.xz")
raw=$(du -sm "$STAGE" | cut -f1)
rm -rf "$STAGE"
packed=$(du -sm "$OUT/bundle.tar.xz" | cut -f1)
echo "gpu-bundle: .gpu-bundle/bundle.tar.xz ${packed} MiB (${raw} MiB unpacked): ${targets[*]}"
if [ "$packed" -gt 60 ]; then
  echo "gpu-bundle: over the 64 MiB a device call carries (with the source tree): trim it" >&2
  exit 1
fi
