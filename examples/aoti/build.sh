#!/usr/bin/env bash
# Builds run_model (run_model.cpp) against the libtorch of the Python environment's torch (its
# bundled headers and libraries): with CMake (CMakeLists.txt, torch.utils.cmake_prefix_path), or,
# where there is no cmake, with one c++ command.
#   bash examples/aoti/build.sh [build dir]      -> <build dir>/run_model (default build/aoti/build)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build/aoti/build}
mkdir -p "$build"
PY=${PYTHON:-python3}
if command -v cmake > /dev/null; then
    prefix=$($PY -c "import torch; print(torch.utils.cmake_prefix_path)")
    cmake -S "$here" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
        > "$build/cmake.log" 2>&1 || { cat "$build/cmake.log"; exit 1; }
    cmake --build "$build" -j "${MAX_JOBS:-2}"
else
    torch_dir=$($PY -c "import os, torch; print(os.path.dirname(torch.__file__))")
    libs=(-ltorch -ltorch_cpu -lc10)
    # libtorch_cuda registers the CUDA runner of AOTInductor packages when it is loaded
    [ -e "$torch_dir/lib/libtorch_cuda.so" ] && libs+=(-ltorch_cuda -lc10_cuda)
    ${CXX:-c++} -std=c++20 -O2 "$here/run_model.cpp" -o "$build/run_model" \
        -I"$torch_dir/include" -I"$torch_dir/include/torch/csrc/api/include" \
        -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib" \
        -Wl,--no-as-needed "${libs[@]}" -Wl,--as-needed -Wl,--allow-shlib-undefined -ldl
fi
