#!/usr/bin/env bash
# The GPU check, in one go, on any machine with an NVIDIA GPU, nvcc and torch:
#   1. build pcops for the visible GPU (TORCH_CUDA_ARCH_LIST, default 9.0) in place;
#   2. run the test suite (CPU and CUDA tests; the CUDA ones are those the CPU CI skips);
#   3. run the small `sanitizer` tests again under compute-sanitizer: memcheck, racecheck,
#      initcheck, synccheck (errors are attributed to our kernels/*.cu or to other code);
#   4. run the benchmarks;
#   5. print a summary table last.
# Full logs go to $OUT (default ./gpu_check_out). Stages can be chosen:
#   bash scripts/gpu_check.sh [build] [test] [sanitize] [bench] [train]   (default: the first four)
# `train` runs the PointNet++ training-step benchmark. Environment: SAN_TOOLS (default: all four),
# SAN_TIMEOUT (per tool, s), BENCHES (e.g. "fps knn"; default: every benchmarks/bench_*.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
STAGES=${*:-build test sanitize bench}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
has() { [[ " $STAGES " == *" $1 "* ]]; }
stamp() { echo "[$(date +%H:%M:%S)] $*"; }

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nvcc --version | tail -n 2
    $PY -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if has build; then
    stamp "build (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
    PCOPS_CUDA=1 $PY setup.py build_ext --inplace > "$OUT/build.log" 2>&1
    echo $? > "$OUT/build.rc"
    tail -n 3 "$OUT/build.log"
fi

if has test; then
    stamp "tests"
    $PY -m pytest -q -p no:cacheprovider -m "not slow or cuda" --junitxml="$OUT/junit.xml" \
        --durations=15 tests > "$OUT/pytest.log" 2>&1
    echo $? > "$OUT/pytest.rc"
    tail -n 5 "$OUT/pytest.log"
fi

if has sanitize; then
    SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    # racecheck is slow on the 1024-thread NMS kernels (3.4 min for 8 of the NMS tests on the
    # H100): it runs one test file at a time, each with its own timeout, so that one slow file
    # cannot starve the others; the other tools take the whole suite at once.
    SAN_FILES=$(grep -l "mark.sanitizer" tests/test_*.py)
    for tool in ${SAN_TOOLS:-memcheck racecheck initcheck synccheck}; do
        stamp "compute-sanitizer --tool $tool"
        if [ "$tool" = racecheck ]; then targets=$SAN_FILES; else targets=tests; fi
        : > "$OUT/sanitizer_$tool.log"
        rc=0
        for target in $targets; do
            # Outputs are not poisoned here: initcheck must see reads of memory nothing wrote.
            PCOPS_TEST_NO_POISON=1 timeout "${SAN_TIMEOUT:-300}" "$SAN" --tool "$tool" \
                --print-limit 50 $PY -m pytest -q -p no:cacheprovider -m sanitizer "$target" \
                >> "$OUT/sanitizer_$tool.log" 2>&1
            r=$?
            [ "$rc" -eq 0 ] && rc=$r
        done
        echo "$rc" > "$OUT/sanitizer_$tool.rc"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/sanitizer_$tool.log" | tail -n 2
    done
fi

if has bench; then
    rm -f "$OUT/bench.txt"
    # BENCHES="fps knn" limits the run to those benchmarks (default: all but the training step)
    if [ -n "${BENCHES:-}" ]; then list=$(for n in $BENCHES; do echo "benchmarks/bench_$n.py"; done)
    else list=$(ls benchmarks/bench_*.py); fi
    for b in $list; do
        case "$b" in *bench_train_step.py) continue ;; esac
        stamp "$b"
        timeout 300 $PY "$b" --device cuda --out "$OUT/bench.txt" >> "$OUT/bench.log" 2>&1 \
            || echo "FAILED: $b (rc $?)" | tee -a "$OUT/bench.txt"
    done
fi

if has train; then
    stamp "train-step benchmark"
    timeout 300 $PY benchmarks/bench_train_step.py --device cuda --out "$OUT/bench_train.txt" \
        > "$OUT/bench_train.log" 2>&1 || echo "FAILED: bench_train_step (rc $?)"
fi

$PY scripts/gpu_summary.py "$OUT"
