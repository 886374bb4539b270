#!/usr/bin/env bash
# Builds what the GPU proof runs and gathers it into .gpu/ (ignored by git),
# with the machine libraries it needs that a GPU machine may lack (abseil,
# OpenBLAS), so that the device tool can carry one folder:
#
#   tools/gpu_bundle.sh            # here, where the CUDA toolkit is
#   bash tests/gpu/run_on_gpu.sh   # there, with .gpu (or .carry/gpu.tar.xz) carried
#
# It also writes .carry/gpu.tar.xz, the folder compressed (about 14 MB: what a
# 64 MiB carry limit takes, with the tree), and prints both sizes.
#
# The CUDA libraries themselves (cudart, cuBLAS) are not bundled: the GPU
# machine has them (its CUDA toolkit or torch's nvidia packages).
set -euo pipefail
cd "$(dirname "$0")/.."

bazel build //:muon //muon/math/cuda:cuda_backend_test //muon/math/cuda:cuda_split_test \
  //tests/gpu:ns_bench
rm -rf .gpu
mkdir -p .gpu/lib .gpu/bin
cp -L bazel-bin/libmuon.so bazel-bin/libmuon_cuda.so .gpu/lib/
cp -L bazel-bin/muon/math/cuda/cuda_backend_test bazel-bin/muon/math/cuda/cuda_split_test \
  bazel-bin/tests/gpu/ns_bench .gpu/bin/
chmod -R u+w .gpu

# Every library they load, except the C/C++ runtime and CUDA's own.
skip='^(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux.*|linux-vdso|libcu.*|libnv.*)\.so'
for f in .gpu/lib/*.so .gpu/bin/*; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $skip ]]; then cp -L "$path" ".gpu/lib/$name"; fi
done
mkdir -p .carry
tar cf - .gpu | xz -T0 -4 >.carry/gpu.tar.xz
du -sh .gpu .carry/gpu.tar.xz
