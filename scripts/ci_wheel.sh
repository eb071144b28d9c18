#!/usr/bin/env bash
# CI's wheel phase (.ci/run): builds the pcops wheel (CPU kernels only: the binding code and the
# packaging are what this checks; the CUDA code is compiled by CI's main build) from a copy of
# the tree, installs it into two fresh virtual environments, one with the newest torch and one
# with the oldest torch the stable ABI targets (TORCH_OLD, default the target in setup.py,
# 2.10), and runs tests unchanged in each, against the installed wheel: the tests run from the
# copy with pcops/ removed, so `import pcops` (also in the tests' subprocesses, which put the
# tree on PYTHONPATH) is the wheel.
#
# What runs where (the default; the whole suite takes ~16-19 min per venv on the 2-core CI
# machine, so it runs once, where a rebuild-free install matters most):
#   - torch 2.10 (TORCH_OLD): the WHOLE CPU suite, against the wheel built with the newest torch;
#     and bindings/*.cpp compiled (syntax only) against its headers, as a source build would;
#   - newest torch (TORCH_NEW): only tests/test_package.py, tests/test_stable_abi.py and
#     tests/test_export.py (packaging, the stable-ABI error mapping, torch.export). The rest of
#     the CPU suite against the newest torch is run by CI's main step (.ci/run), from the source
#     build, not from the wheel.
#
#   bash scripts/ci_wheel.sh                   (the split above)
#   bash scripts/ci_wheel.sh [pytest args]     (these args in both venvs, e.g. -q for the whole
#                                               suite in each)
#
# TORCH_NEW / TORCH_OLD: pip requirement of each environment's torch ("torch" and
# "torch==2.10.*" by default). The venvs are fresh (no system site-packages); the downloads are
# kept between runs in CI_WHEELHOUSE (default ~/.cache/pcops-ci-wheelhouse). Prints the time of
# each step.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
target=$($PY - <<'PY'
import re
src = open("setup.py").read()
m = re.search(r"TORCH_TARGET\s*=\s*\((\d+),\s*(\d+)\)", src)
print(f"{m.group(1)}.{m.group(2)}")
PY
)
TORCH_NEW=${TORCH_NEW:-torch}
TORCH_OLD=${TORCH_OLD:-torch==$target.*}
HOUSE=${CI_WHEELHOUSE:-$HOME/.cache/pcops-ci-wheelhouse}
REQS=(numpy pytest tqdm matplotlib)
NEW_TESTS=(tests/test_package.py tests/test_stable_abi.py tests/test_export.py)
if [ $# -gt 0 ]; then
    OLD_ARGS=("$@")
    NEW_ARGS=("$@")
else
    OLD_ARGS=(-q)                 # the whole CPU suite
    NEW_ARGS=(-q "${NEW_TESTS[@]}")
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
SECONDS=0
stamp() { echo "CI wheel [+${SECONDS}s] $*"; }

# A copy of the tracked and unignored files: the wheel build writes build/ and
# pcops/_build_info.py, which must not touch the tree CI tests in place.
stamp "copy the tree, build the wheel (PCOPS_CUDA=0)"
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$work/src"
(cd "$work/src" && PCOPS_CUDA=0 MAX_JOBS="${MAX_JOBS:-2}" $PY -m pip wheel -q --no-build-isolation \
    --no-deps -w "$work/dist" .)
wheel=$(ls "$work"/dist/pcops-*.whl)
stamp "built $(basename "$wheel")"
rm -rf "$work/src/pcops" "$work/src/build"

status=0
for which in new old; do
    if [ $which = new ]; then
        spec=$TORCH_NEW
        args=("${NEW_ARGS[@]}")
    else
        spec=$TORCH_OLD
        args=("${OLD_ARGS[@]}")
    fi
    venv="$work/venv-${spec//[^A-Za-z0-9.]/_}"
    stamp "fresh venv with $spec"
    $PY -m venv "$venv"
    # The package index here sends wheels that pip does not cache (about 4 GB per torch with its
    # CUDA libraries): they are kept in a wheelhouse, which `pip download` tops up (it skips the
    # files already there), and the venv installs from it without the index (--no-compile: no
    # byte-compiling of torch's thousands of modules at install time).
    house="$HOUSE/${spec//[^A-Za-z0-9.]/_}"
    mkdir -p "$house"
    $PY -m pip download -q -d "$house" "$spec" "${REQS[@]}"
    "$venv/bin/python" -m pip install -q --no-compile --no-index --find-links "$house" "$spec" "${REQS[@]}" "$wheel"
    (cd "$work/src" && "$venv/bin/python" -c "
import os, sys, torch, pcops
print('CI wheel: torch', torch.__version__, '| pcops', pcops.__version__, 'from', os.path.dirname(pcops.__file__))
sys.exit(0 if pcops.__file__.startswith(sys.prefix) else 1)
")
    if [ $which = old ]; then
        # A source build against this torch too: the bindings compile with its headers (the
        # wheel above was compiled against the newest torch; a newer header's names must not
        # creep in). Syntax only, CPU and CUDA variants, setup.py's defines.
        stamp "bindings/*.cpp against the headers of $spec (g++ -fsyntax-only)"
        tinc=$("$venv/bin/python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")
        pinc=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
        tver=$(printf '0x%02x%02x000000000000' "${target%%.*}" "${target#*.}")
        cuda_inc=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include
        for f in bindings/*.cpp; do
            for cuda in "" "-DPCOPS_WITH_CUDA -DUSE_CUDA -I$cuda_inc"; do
                # shellcheck disable=SC2086
                if ! ${CXX:-g++} -std=c++17 -fsyntax-only -DTORCH_TARGET_VERSION="$tver" \
                    -DTORCH_STABLE_ONLY -DPy_LIMITED_API=0x030a0000 -fvisibility=hidden $cuda -I"$tinc" \
                    -Ikernels -Ibindings -I"$pinc" "$f"; then
                    echo "CI wheel: $f does not compile against the headers of $spec ${cuda:+(CUDA)}"
                    status=1
                fi
            done
        done
    fi
    stamp "CPU tests against the wheel, $spec: pytest ${args[*]}"
    if ! (cd "$work/src" && env -u PYTEST_ADDOPTS "$venv/bin/python" -m pytest -p no:cacheprovider "${args[@]}"); then
        echo "CI wheel: the tests FAILED with $spec"
        status=1
    fi
    rm -rf "$venv"
done
stamp "done (status $status)"
exit $status
