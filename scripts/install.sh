#!/usr/bin/env bash
# Installs pcops and everything it needs into the current Python environment:
#   1. the requirements (torch from the package index, with its CUDA libraries);
#   2. an nvcc matching torch's CUDA major version from pip, only if this machine has an nvcc of
#      another major version (or PCOPS_CUDA=1 and none at all): scripts/cuda_toolkit.py decides;
#   3. pcops itself, built against the installed torch (no build isolation), editable.
# CUDA code (setup.py's rules): SASS for the visible GPUs; on a machine without a GPU none (the
# CPU ops only, in about a minute) unless TORCH_CUDA_ARCH_LIST (SASS for those) or PCOPS_CUDA=1
# (PTX of compute_75, which the driver compiles at first use) asks for it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -m pip install -q -r requirements.txt
toolkit=$($PY scripts/cuda_toolkit.py)
if [ -n "$toolkit" ]; then
    echo "pcops: installing an nvcc that matches torch's CUDA: $toolkit"
    $PY -m pip install -q $toolkit
fi
$PY -m pip install -q --no-build-isolation -e .
$PY -c "import pcops; print(f'pcops {pcops.__version__} installed (CUDA kernels built: {pcops.WITH_CUDA})')"
