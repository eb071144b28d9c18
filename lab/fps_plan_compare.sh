#!/usr/bin/env bash
# lab/fps_plan_compare.sh [REV] -- do this tree's CUDA FPS plans equal those of git revision REV
# (default HEAD)? Builds lab/fps_plan_dump.cpp against each tree's kernels/fps.cu (sm_90 host
# code; ptxas -O0, as the dump never launches a kernel) and compares the dumps: AUTO's and every
# forced path's plan (path, shape, workspace bytes, the kernels it asked the runtime about) for
# about 400 000 (dtype, B, N, npoint, path) on each of eleven simulated devices (sm_75 to
# sm_120). No GPU needed; a few minutes on two cores. Prints the first differing lines and
# exits 1 when the plans differ. FPS_PLAN_SIMS=text compares only the simulated devices whose
# name contains text (e.g. FPS_PLAN_SIMS="sm_90 " lab/fps_plan_compare.sh main).
set -euo pipefail
rev=${1:-HEAD}
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-nvcc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/old"
git -C "$root" archive "$rev" kernels | tar -x -C "$tmp/old"
for side in old new; do
    tree=$([ "$side" = old ] && echo "$tmp/old" || echo "$root")
    echo "fps_plan_compare: building the dump of $([ "$side" = old ] && echo "$rev" || echo "this tree")"
    "$nvcc" -std=c++17 -arch=sm_90 -Xptxas -O0 -I"$tree/kernels" -c "$tree/kernels/fps.cu" \
        -o "$tmp/fps_$side.o"
    "$nvcc" -std=c++17 -arch=sm_90 -I"$tree/kernels" "$root/lab/fps_plan_dump.cpp" \
        "$tmp/fps_$side.o" -cudart shared -o "$tmp/dump_$side"
    "$tmp/dump_$side" | gzip -1 > "$tmp/plans_$side.gz"  # ~300 MB of text
done
lines=$(zcat "$tmp/plans_new.gz" | wc -l)
if cmp -s <(zcat "$tmp/plans_old.gz") <(zcat "$tmp/plans_new.gz"); then
    echo "fps_plan_compare: the same plans ($lines lines) as $rev"
else
    diff <(zcat "$tmp/plans_old.gz") <(zcat "$tmp/plans_new.gz") | head -40
    echo "fps_plan_compare: the plans differ from $rev's (first lines above)"
    exit 1
fi
