/*
 * circle_nms.cu -- greedy centre-distance NMS (circle NMS) on CUDA: the C API entry points
 * (pcops.h), which ask the plan for a path and launch it; no host synchronisation.
 *
 * N = boxes, D = coordinate dims of a centre (only x and y are used).
 * centers[N,D], scores[N], groups[N]? -> keep_mask[N] (bool), keep_idx[N] (int64),
 * num_kept[1].
 *
 * Same semantics and arithmetic as circle_nms.c: boxes are visited by the score key of
 * circle_nms.h (descending score, NaN first, ties to the lower index), and box j (later) is
 * removed by a kept box i (earlier) of its group when pcops_dist2_xy (geometry.h: dx*dx + dy*dy,
 * every operation rounded on its own) < (T)radius2. CPU and CUDA keep exactly the same boxes.
 *
 * One header per path under circle_nms/, each reading top to bottom (what it does, when it
 * wins, invariants, kernels, launcher):
 *   circle_nms/grid.cuh    GRID: a hashed grid of cells a radius wide, rounds (any N);
 *   circle_nms/block.cuh   BLOCK: one thread block, shared memory only (N <= 4096);
 *   circle_nms/flow.cuh    FLOW: one cooperative launch, a block per 32 boxes (N <= 4096);
 *   circle_nms/common.cuh  what they share (keys, rounds, the grid over the bounding box);
 *   circle_nms/plan.cuh    which path runs (AUTO's per-architecture thresholds).
 * A new path: a row in kernels/circle_nms_paths.h (and pcops/_paths.py), its header here, a case
 * in nms_path_takes / nms_plan and in launch_path below, its N bound in the bindings.
 */
#include "circle_nms/plan.cuh"

namespace {

template <typename T>
cudaError_t launch_path(const NmsPlan& plan, const T* centers, int64_t D,
                        pcops_dtype score_dtype, const void* scores, const int64_t* groups,
                        int64_t N, double radius2, void* workspace, bool* keep_mask,
                        int64_t* keep_idx, int64_t* num_kept, cudaStream_t stream) {
    auto launch = [&](auto* s) {
        switch (plan.path) {
            case PCOPS_CIRCLE_NMS_BLOCK:
                return launch_block(centers, D, s, groups, N, radius2, keep_mask, keep_idx,
                                    num_kept, stream);
            case PCOPS_CIRCLE_NMS_FLOW:
                return launch_flow(centers, D, s, groups, N, radius2, workspace, keep_mask,
                                   keep_idx, num_kept, stream);
            default:
                return launch_grid(centers, D, score_dtype, s, groups, N, radius2, workspace,
                                   keep_mask, keep_idx, num_kept, stream);
        }
    };
    if (score_dtype == PCOPS_FLOAT32) return launch((const float*)scores);
    return launch((const double*)scores);
}

}  // namespace

extern "C" size_t pcops_circle_nms_cuda_workspace_bytes(pcops_dtype dtype,
                                                        pcops_dtype score_dtype, int64_t N,
                                                        int path) {
    const size_t elem = pcops_dtype_size(dtype);
    bool ok;
    const NmsPlan plan = nms_plan(N, path, ok);
    if (!ok || elem == 0) return 0;
    switch (plan.path) {
        case PCOPS_CIRCLE_NMS_FLOW: return flow_layout(nullptr, N).bytes;
        case PCOPS_CIRCLE_NMS_GRID: return grid_layout(nullptr, elem, score_dtype, N, 0).bytes;
        default: return 0;  // BLOCK (shared memory only), or nothing to launch
    }
}

extern "C" cudaError_t pcops_circle_nms_cuda_path(
    pcops_dtype dtype, const void* centers, int64_t D, pcops_dtype score_dtype,
    const void* scores, const int64_t* groups, int64_t N, double radius2, void* workspace,
    bool* keep_mask, int64_t* keep_idx, int64_t* num_kept, int path, cudaStream_t stream) {
    bool ok;
    const NmsPlan plan = nms_plan(N, path, ok);
    if (!ok || D < 2) return cudaErrorInvalidValue;
    if (score_dtype != PCOPS_FLOAT32 && score_dtype != PCOPS_FLOAT64)
        return cudaErrorInvalidValue;
    if (N > 0 && (!centers || !scores || (plan.path != PCOPS_CIRCLE_NMS_BLOCK && !workspace)))
        return cudaErrorInvalidValue;
    if (N == 0)
        return pcops_launch_tail(
            num_kept ? cudaMemsetAsync(num_kept, 0, sizeof(int64_t), stream) : cudaSuccess,
            stream);
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return launch_path<T>(plan, (const T*)centers, D, score_dtype, scores, groups, N,
                              radius2, workspace, keep_mask, keep_idx, num_kept, stream);
    });
}

extern "C" cudaError_t pcops_circle_nms_cuda(pcops_dtype dtype, const void* centers, int64_t D,
                                             pcops_dtype score_dtype, const void* scores,
                                             const int64_t* groups, int64_t N, double radius2,
                                             void* workspace, bool* keep_mask,
                                             int64_t* keep_idx, int64_t* num_kept,
                                             cudaStream_t stream) {
    return pcops_circle_nms_cuda_path(dtype, centers, D, score_dtype, scores, groups, N,
                                      radius2, workspace, keep_mask, keep_idx, num_kept,
                                      PCOPS_CIRCLE_NMS_AUTO, stream);
}
