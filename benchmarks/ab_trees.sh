#!/usr/bin/env bash
# ab_trees.sh -- is one tree's kNN / ball query faster or slower than another's, beyond noise?
# Builds several pcops trees on one GPU machine and times their searches against each other:
#
#   bash benchmarks/ab_trees.sh [-o OUT] [-w WORK] [--rounds R] [--procs P] [--torch P]
#                               [--torch-labels A,B] [--deadline S] LABEL=TREE [LABEL=TREE ...]
#
# TREE is a directory holding a pcops tree (e.g. from `git archive REV | tar -x -C DIR`) or a
# git revision of the repository this script runs in. The first tree is the reference. Stages,
# each writing its results to OUT (default ./ab_out) as it goes (builds and their logs go to
# WORK, default OUT):
#   1. lab builds: every tree's kernels/knn.cu and kernels/ball_query.cu, with that tree's own
#      kernels/Makefile flags, linked into WORK/lib/libpcops_<LABEL>.so (shared CUDA runtime,
#      -Bsymbolic); a copy of the reference library is added as "<LABEL>copy", the noise floor.
#   2. in one process: lab/build/cuda/ab_search (this tree's) on all of them, R rounds of
#      interleaved calls in rotating order, L2 flushed, CUDA events (lab/ab_search.c: method)
#      -> OUT/inprocess.txt.
#   3. across processes: ab_search on one build at a time, P processes per build, in the order
#      A B B A A B ... (both orders equally often) -> OUT/processes.txt: how much a fresh
#      process moves the medians, against what a tree changes.
#   4. with --torch P: every tree (or those of --torch-labels A,B) built as the torch extension
#      (setup.py build_ext --inplace, in WORK/torch/<LABEL>), then benchmarks/ab_torch.py (the
#      peer benchmark's timing of pcops.knn / pcops.ball_query) in P processes per tree,
#      alternating as in 3 -> OUT/torch.txt.
#   5. benchmarks/ab_summary.py -> OUT/summary.md (also printed).
# A stage is skipped when fewer than its estimate of seconds are left before --deadline (seconds
# from the start; default none), so a time-limited call still returns what it measured.
set -uo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"  # this tree: ab_search, ab_torch.py, ab_summary.py
OUT=$PWD/ab_out
WORK=""
ROUNDS=150
PROCS=6
TORCH_PROCS=0
TORCH_LABELS=""
DEADLINE=0
SPECS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -o) OUT=$(realpath -m "$2"); shift 2 ;;
        -w) WORK=$(realpath -m "$2"); shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --procs) PROCS=$2; shift 2 ;;
        --torch) TORCH_PROCS=$2; shift 2 ;;
        --torch-labels) TORCH_LABELS=$2; shift 2 ;;
        --deadline) DEADLINE=$2; shift 2 ;;
        *=*) SPECS+=("$1"); shift ;;
        *) echo "ab_trees.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ ${#SPECS[@]} -ge 1 ] || { echo "ab_trees.sh: give LABEL=TREE at least once" >&2; exit 2; }
WORK=${WORK:-$OUT}
mkdir -p "$OUT" "$WORK/lib" "$WORK/trees" "$WORK/logs"
START=$SECONDS
PY=${PYTHON:-python3}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
export LD_LIBRARY_PATH="$CUDA_HOME/lib64:$CUDA_HOME/lib:${LD_LIBRARY_PATH:-}"
export PYTHONUNBUFFERED=1
stamp() { echo "[$(date +%H:%M:%S) +$((SECONDS - START))s] $*"; }
# time_left N: whether N seconds are left before the deadline (always, without one)
time_left() { [ "$DEADLINE" -le 0 ] || [ $((DEADLINE - (SECONDS - START))) -ge "$1" ]; }
# order P N: the indices 0 .. N-1 in the order of process round P (odd: ascending; even:
# descending), so every build runs first and last equally often
order() { if [ $(($1 % 2)) -eq 1 ]; then seq 0 $(($2 - 1)); else seq $(($2 - 1)) -1 0; fi; }

{
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
    "$NVCC" --version | tail -n 1
    $PY -c "import torch; print('torch', torch.__version__)" 2>/dev/null || echo "no torch"
    echo "trees: ${SPECS[*]}"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# The trees: a directory as it is, a revision through git archive.
LABELS=()
TREES=()
for spec in "${SPECS[@]}"; do
    label=${spec%%=*}
    tree=${spec#*=}
    if [ ! -d "$tree" ]; then
        rev=$tree
        tree="$WORK/trees/$label"
        rm -rf "$tree" && mkdir -p "$tree"
        git -C "$HERE" archive "$rev" | tar -x -C "$tree" || { echo "no tree or revision: $rev" >&2; exit 2; }
    fi
    LABELS+=("$label")
    TREES+=("$(realpath "$tree")")
done
REF=${LABELS[0]}

# 1. lab builds, in parallel
stamp "lab builds"
for i in "${!LABELS[@]}"; do
    (
        k="${TREES[$i]}/kernels"
        make -C "$k" NVCC="$NVCC" BUILD_DIR=build/ab build/ab/knn.cu.o build/ab/ball_query.cu.o &&
            "$NVCC" -shared -cudart shared -Xlinker -Bsymbolic -o "$WORK/lib/libpcops_${LABELS[$i]}.so" \
                "$k/build/ab/knn.cu.o" "$k/build/ab/ball_query.cu.o"
    ) > "$WORK/logs/build_${LABELS[$i]}.log" 2>&1 &
done
make -C "$HERE/lab" NVCC="$NVCC" ab > "$WORK/logs/build_ab_search.log" 2>&1 &
wait
AB="$HERE/lab/build/cuda/ab_search"
for label in "${LABELS[@]}"; do
    [ -f "$WORK/lib/libpcops_$label.so" ] || { echo "build of $label failed:"; tail -n 20 "$WORK/logs/build_$label.log"; exit 1; }
done
[ -x "$AB" ] || { echo "ab_search build failed:"; tail -n 20 "$WORK/logs/build_ab_search.log"; exit 1; }
cp "$WORK/lib/libpcops_$REF.so" "$WORK/lib/libpcops_${REF}copy.so"
BUILDS=()
for label in "${LABELS[@]}"; do BUILDS+=("$label=$WORK/lib/libpcops_$label.so"); done

# 2. one process, every build and the reference's copy
if time_left 60; then
    stamp "in one process: ${LABELS[*]} ${REF}copy, $ROUNDS rounds"
    "$AB" --rounds "$ROUNDS" "${BUILDS[0]}" "${REF}copy=$WORK/lib/libpcops_${REF}copy.so" \
        "${BUILDS[@]:1}" > "$OUT/inprocess.txt" 2>&1
    echo "rc $?" >> "$OUT/inprocess.txt"
fi

# 3. one build per process, alternating (A B, then B A, ...); the float32 rows only
if time_left 60; then
    stamp "across processes: $PROCS per build"
    : > "$OUT/processes.txt"
    for p in $(seq 1 "$PROCS"); do
        for j in $(order "$p" ${#BUILDS[@]}); do
            b=${BUILDS[$j]}
            echo "PROC $p ${b%%=*}" >> "$OUT/processes.txt"
            "$AB" --rounds 60 --rows K1,K2,K3,K4,K5,K8,Q1,Q2 "$b" >> "$OUT/processes.txt" 2>&1
        done
        time_left 30 || break
    done
fi

# 4. the torch extension of every tree, alternating processes
TIDX=()
for i in "${!LABELS[@]}"; do
    [[ -z "$TORCH_LABELS" || ",$TORCH_LABELS," == *",${LABELS[$i]},"* ]] && TIDX+=("$i")
done
if [ "$TORCH_PROCS" -gt 0 ] && [ ${#TIDX[@]} -gt 0 ] && time_left 240; then
    stamp "torch builds"
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
    export MAX_JOBS=${MAX_JOBS:-$(( $(nproc) / ${#TIDX[@]} > 1 ? $(nproc) / ${#TIDX[@]} : 1 ))}
    for i in "${TIDX[@]}"; do
        (
            dst="$WORK/torch/${LABELS[$i]}"
            rm -rf "$dst" && mkdir -p "$dst"
            (cd "${TREES[$i]}" && tar -c --exclude=./build --exclude='*.so' --exclude=./kernels/build \
                --exclude=./lab/build .) | tar -x -C "$dst"
            cd "$dst" && PCOPS_CUDA=1 $PY setup.py build_ext --inplace
        ) > "$WORK/logs/torch_build_${LABELS[$i]}.log" 2>&1 &
    done
    wait
    for i in "${TIDX[@]}"; do
        ls "$WORK/torch/${LABELS[$i]}"/pcops/_C*.so > /dev/null 2>&1 ||
            { echo "torch build of ${LABELS[$i]} failed:"; tail -n 20 "$WORK/logs/torch_build_${LABELS[$i]}.log"; }
    done
    stamp "torch: $TORCH_PROCS processes per tree"
    : > "$OUT/torch.txt"
    for p in $(seq 1 "$TORCH_PROCS"); do
        for j in $(order "$p" ${#TIDX[@]}); do
            i=${TIDX[$j]}
            echo "PROC $p ${LABELS[$i]}" >> "$OUT/torch.txt"
            $PY "$HERE/benchmarks/ab_torch.py" --tree "$WORK/torch/${LABELS[$i]}" \
                --label "${LABELS[$i]}" >> "$OUT/torch.txt" 2>&1
        done
        time_left 40 || break
    done
fi

# 5. the summary
stamp "summary"
$PY "$HERE/benchmarks/ab_summary.py" "$OUT" | tee "$OUT/summary.md"
stamp "done"
