#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release, 2023) from source into VENV, against the torch installed there,
# with the gloo controller (CPU) and without MPI, TensorFlow or MXNet.
#
#     scripts/build_horovod.sh VENV          (about 8 minutes on 2 cores)
#
# Two things stop the release from building against today's torch (tried with torch 2.14.1+cu130 and 2.9.0):
# - it compiles as C++14, and torch >= 2.1's headers need C++17 (`'is_enum_v' is not a member of 'std'`,
#   `'optional' in namespace 'std' does not name a template type`); 2.14's need C++20: the two CMake lines
#   that set the standard are raised below;
# - a CUDA-built torch wheel (even on a machine without GPUs) makes horovod's CMake look for the CUDA
#   toolkit (`Could NOT find CUDAToolkit (missing: CUDAToolkit_INCLUDE_DIR CUDA_CUDART)`): CUDA_HOME must
#   name one (default /usr/local/cuda), with its bin/ on PATH.
set -euo pipefail
venv=${1:?usage: scripts/build_horovod.sh VENV}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/pip" download --quiet --no-deps --no-binary :all: horovod==0.28.1 -d "$work"
tar -xzf "$work"/horovod-0.28.1.tar.gz -C "$work"
src="$work/horovod-0.28.1"
sed -i 's/^set(CMAKE_CXX_STANDARD 14)$/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt"
sed -i 's/^    set(CMAKE_CXX_STANDARD 14)$/    set(CMAKE_CXX_STANDARD 20)/' "$src/horovod/torch/CMakeLists.txt"
grep -q '^set(CMAKE_CXX_STANDARD 17)$' "$src/CMakeLists.txt"
grep -q '^    set(CMAKE_CXX_STANDARD 20)$' "$src/horovod/torch/CMakeLists.txt"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export HOROVOD_CUDA_HOME=$CUDA_HOME CUDAToolkit_ROOT=$CUDA_HOME PATH=$CUDA_HOME/bin:$PATH  # all three: CMake's FindCUDAToolkit
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_CPU_OPERATIONS=gloo
export HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
export MAKEFLAGS=-j$(nproc)
"$venv/bin/pip" install --quiet --no-build-isolation "$src"
(cd / && "$venv/bin/python" -c "import horovod.torch as hvd; hvd.init(); print('horovod', hvd.size(), 'process, gloo built:', hvd.gloo_built())")
