/*
 * circle_nms/plan.cuh -- which CUDA path of circle NMS runs: first which paths MAY take N (their
 * bounds, from the path headers), then which one AUTO prefers (the per-architecture thresholds
 * below).
 *
 * The paths (kernels/circle_nms_paths.h):
 *   GRID   any N up to PCOPS_CIRCLE_NMS_CUDA_MAX: a hashed grid of cells a radius wide,
 *          rounds of keep / pull, an in-order finish (grid.cuh);
 *   BLOCK  N <= kBlockMaxBoxes = 4096, one thread block (block.cuh);
 *   FLOW   N <= kFlowMaxBoxes = 4096, one cooperative launch of ceil(N / 32) blocks; it runs
 *          BLOCK itself where that launch cannot run (flow.cuh).
 * AUTO takes FLOW up to the row's flow_max_boxes, GRID above. A forced path that cannot take N
 * is refused (cudaErrorInvalidValue), never replaced by another.
 */
#pragma once

#include "block.cuh"
#include "common.cuh"
#include "flow.cuh"
#include "grid.cuh"

namespace {

// AUTO's thresholds on one architecture.
struct NmsTuning {
    int sm;                  // compute capability (major * 10 + minor) the row was measured on
    int64_t flow_max_boxes;  // FLOW up to this many boxes, GRID above (at most kFlowMaxBoxes)
};

// Oldest first; a GPU takes the newest row not newer than itself (an older one the oldest row).
constexpr NmsTuning kNmsTuning[] = {
    {80, 4096},  // sm_80: python benchmarks/tune.py circle_nms
    {90, 4096},  // sm_90: python benchmarks/tune.py circle_nms
};

constexpr bool tuning_within_bounds() {
    for (const NmsTuning& t : kNmsTuning)
        if (t.flow_max_boxes > kFlowMaxBoxes) return false;
    return true;
}
static_assert(tuning_within_bounds(), "AUTO may only take FLOW where it can run");

// The row of the current device (its compute capability read once per device ordinal < 64).
const NmsTuning& nms_tuning() {
    static std::atomic<int> sm_of[64];  // zero until read
    int dev = 0, sm = 0;
    if (cudaGetDevice(&dev) == cudaSuccess) {
        if (dev < 64) sm = sm_of[dev].load(std::memory_order_relaxed);
        int major = 0, minor = 0;
        if (sm == 0 &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess) {
            sm = major * 10 + minor;
            if (dev < 64) sm_of[dev].store(sm, std::memory_order_relaxed);
        }
    }
    const NmsTuning* row = &kNmsTuning[0];
    for (const NmsTuning& t : kNmsTuning)
        if (t.sm <= sm) row = &t;
    return *row;
}

// Whether CUDA path `path` (not AUTO) can take N boxes.
bool nms_path_takes(int path, int64_t N) {
    switch (path) {
        case PCOPS_CIRCLE_NMS_GRID: return N <= PCOPS_CIRCLE_NMS_CUDA_MAX;
        case PCOPS_CIRCLE_NMS_BLOCK: return N <= kBlockMaxBoxes;
        case PCOPS_CIRCLE_NMS_FLOW: return N <= kFlowMaxBoxes;
        default: return false;  // SWEEP runs on the CPU; anything else is no path
    }
}

// The path that runs for N boxes when `path` is asked for (AUTO: the plan's choice); AUTO
// itself when N == 0 (nothing to launch). ok = false when that path cannot take N. The size
// query and the launcher both call it, so they agree.
struct NmsPlan {
    int path;
};

NmsPlan nms_plan(int64_t N, int path, bool& ok) {
    NmsPlan plan{PCOPS_CIRCLE_NMS_AUTO};
    ok = N >= 0 && N <= PCOPS_CIRCLE_NMS_CUDA_MAX &&
         (path == PCOPS_CIRCLE_NMS_AUTO || nms_path_takes(path, N));
    if (!ok || N == 0) return plan;
    plan.path = path != PCOPS_CIRCLE_NMS_AUTO
                    ? path
                    : (N <= nms_tuning().flow_max_boxes ? PCOPS_CIRCLE_NMS_FLOW
                                                        : PCOPS_CIRCLE_NMS_GRID);
    return plan;
}

}  // namespace
