#!/usr/bin/env bash
# A pcops wheel on a GPU machine, without a rebuild. Installs a wheel with CUDA code built
# elsewhere (on the CPU machine, against another torch) into a virtual environment on top of
# this machine's torch, and then, against that install and not the source tree:
#   aoti   runs the AOTInductor example on CUDA (examples/aoti/export.py --device cuda: export,
#          package, run from C++, compare with eager);
#   host   times the host side of the small peer rows (benchmarks/host_cost.py);
#   test   runs the CUDA tests (pytest -m cuda), last, with the time left.
# Needs no network. Logs go to $OUT (default ./device_wheel_out); a summary is printed last.
#
#   bash scripts/device_wheel_check.sh [aoti] [host] [test]        (default: all three)
#
# WHEEL: the wheel (default: the newest .whl/pcops-*+cu*.whl; carry .whl). BUDGET: seconds for
# the whole run (default 480); AOTI_TIMEOUT (default 150) and HOST_TIMEOUT (default 40) cap
# their stages, the tests get the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_wheel_out}
mkdir -p "$OUT"
rm -f "$OUT"/*.rc
PY=${PYTHON:-python3}
STAGES=${*:-aoti host test}
BUDGET=${BUDGET:-480}
WHEEL=${WHEEL:-$(ls -t .whl/pcops-*+cu*.whl 2>/dev/null | head -n 1)}
export PYTHONUNBUFFERED=1
SECONDS=0
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "[$(date +%H:%M:%S) +${SECONDS}s] $*"; }
if [ -z "$WHEEL" ] || [ ! -f "$WHEEL" ]; then
    echo "device_wheel_check: no wheel (put pcops-*+cu*.whl in .whl/ and carry .whl, or set WHEEL)"
    exit 2
fi

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
    echo "wheel $(basename "$WHEEL")"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The environment: this machine's torch (wherever its Python finds it: a virtual environment
# would hide a user-site install) plus the wheel, unpacked into a folder of its own by pip, no
# build.
work=$(mktemp -d)
stamp "install the wheel into $work/site over the machine's torch"
$PY -m pip install --no-index --no-deps --target "$work/site" "$WHEEL" > "$OUT/install.log" 2>&1
echo $? > "$OUT/install.rc"
VPY="env PYTHONPATH=$work/site $PY"
# The stages run from a folder without the source tree's pcops, so `import pcops` is the wheel.
mkdir "$work/run"
cp -r tests pytest.ini examples benchmarks "$work/run/"
(cd "$work/run" && $VPY -c "
import os, sys, torch, pcops
print('torch', torch.__version__, '| pcops', pcops._build_info.VERSION, 'built with torch',
      pcops._build_info.BUILT_WITH_TORCH, '|', pcops._build_info.CUDA_ARCHS)
print('pcops from', os.path.dirname(pcops.__file__))
sys.exit(0 if pcops.__file__.startswith('$work/site') and pcops.WITH_CUDA else 1)
") > "$OUT/import.log" 2>&1
echo $? > "$OUT/import.rc"
cat "$OUT/import.log"

if has aoti; then
    stamp "AOTInductor example on CUDA"
    (cd "$work/run" && timeout "${AOTI_TIMEOUT:-150}" $VPY examples/aoti/export.py --device cuda \
        --out "$work/aoti") > "$OUT/aoti.log" 2>&1
    echo $? > "$OUT/aoti.rc"
    grep -E "predictions|MATCHES|DIFFERS|failed" "$OUT/aoti.log"
fi

if has host; then
    stamp "host cost of the small rows"
    (cd "$work/run" && timeout "${HOST_TIMEOUT:-40}" $VPY benchmarks/host_cost.py) \
        > "$OUT/host_cost.log" 2>&1
    echo $? > "$OUT/host_cost.rc"
    tail -n 12 "$OUT/host_cost.log"
fi

if has test; then
    left=$((BUDGET - SECONDS - 10))
    [ "$left" -gt 60 ] || left=60
    stamp "CUDA tests (at most ${left} s)"
    (cd "$work/run" && timeout "$left" $VPY -m pytest -q -p no:cacheprovider -m cuda \
        --junitxml="$OUT/junit.xml" --durations=10 tests) > "$OUT/pytest.log" 2>&1
    echo $? > "$OUT/pytest.rc"
    tail -n 4 "$OUT/pytest.log"
fi

echo "================ device wheel check ($SECONDS s) ================"
head -n 3 "$OUT/env.txt"
for stage in install import aoti host_cost pytest; do
    [ -f "$OUT/$stage.rc" ] && printf '%-10s rc %s\n' "$stage" "$(cat "$OUT/$stage.rc")"
done
[ -f "$OUT/pytest.log" ] && grep -E "passed|failed" "$OUT/pytest.log" | tail -n 1
rm -rf "$work"
