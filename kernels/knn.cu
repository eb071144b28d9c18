/*
 * knn.cu -- k nearest neighbours on CUDA: the C API (kernels/pcops.h), a plan and a launch.
 *
 * query[B,M,3], ref[B,N,3] -> dist2[B,M,K], idx[B,M,K] (int64): for each valid query the K
 * smallest keys (dist2, idx) among the valid refs with a distance below +inf, sorted, +inf / -1
 * past them; the squared distance of geometry.h, ties to the lower index, so every path, and
 * the CPU (kernels/knn.c), return the same bits.
 *
 * The paths (kernels/knn_paths.h), one header each, read top to bottom (what it does, when it
 * wins, invariants, kernels, launcher):
 *   knn/brute.cuh        "brute": a thread per query over every ref, register lists (k <= 64),
 *                        the refs split over several threads when queries are few; the reference
 *   knn/heap.cuh         "brute_heap": the same with a max-heap per query, any k
 *   knn/warp_select.cuh  "warp_select": a warp per query selects by key bits (float32, N <= 1024)
 *   knn/grid.cuh         "grid": refs and queries binned into a grid on the device, a thread per
 *                        query walking rings of cells ("grid_baseline": the same with the
 *                        general build, knn/plan.cuh)
 *   knn/grid_batch.cuh   "grid_batch": the grid walk with batched insertion (float32, k <= 64)
 *   knn/grid_select.cuh  "grid_select": the grid walked by a warp per query (float32, k <= 128)
 * knn/common.cuh holds what they share; knn/plan.cuh chooses one per call (eligibility, then
 * the tuning table's preference) and sizes its workspace; the launch only follows the plan.
 */
#include <cstdint>

#include "geometry.h"
#include "knn_paths.h"
#include "pcops.h"

#include "knn/common.cuh"
#include "knn/brute.cuh"
#include "knn/heap.cuh"
#include "knn/warp_select.cuh"
#include "knn/grid.cuh"
#include "knn/grid_batch.cuh"
#include "knn/grid_select.cuh"
#include "knn/plan.cuh"  // after the paths

namespace {

// The launcher of the plan's path.
template <typename T>
cudaError_t launch(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a) {
    if (plan.workspace_bytes > 0 && a.workspace == nullptr) return cudaErrorInvalidValue;
    switch (plan.path) {
#define PCOPS_KNN_LAUNCH(NAME, id, name, devices, dtypes) \
    case PCOPS_KNN_##NAME:                                \
        return KnnPath<PCOPS_KNN_##NAME>::template launch<T>(plan, a);
        PCOPS_KNN_PATHS(PCOPS_KNN_LAUNCH)
#undef PCOPS_KNN_LAUNCH
        default:
            return cudaErrorInvalidValue;
    }
}

}  // namespace

extern "C" cudaError_t pcops_knn_cuda_plan_make(pcops_dtype dtype, int64_t B, int64_t M,
                                                int64_t N, int64_t K, pcops_knn_path path,
                                                pcops_knn_cuda_plan* plan) {
    return make_plan(dtype, B, M, N, K, path, plan);
}

extern "C" cudaError_t pcops_knn_cuda_run(const pcops_knn_cuda_plan* plan, const void* query,
                                          const void* ref, const int64_t* query_lengths,
                                          const int64_t* ref_lengths, void* workspace,
                                          void* dist2, int64_t* idx, cudaStream_t stream) {
    if (!plan) return cudaErrorInvalidValue;
    if (plan->B == 0 || plan->M == 0) return cudaSuccess;
    return pcops_dispatch_float(plan->dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        const KnnArgs<T> a{(const T*)query, (const T*)ref, query_lengths, ref_lengths,
                           workspace,       (T*)dist2,     idx,           stream};
        return launch<T>(*plan, a);
    });
}

extern "C" size_t pcops_knn_cuda_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t M,
                                                 int64_t N, int64_t K) {
    pcops_knn_cuda_plan plan;
    if (make_plan(dtype, B, M, N, K, PCOPS_KNN_AUTO, &plan) != cudaSuccess) return 0;
    return plan.workspace_bytes;
}

extern "C" cudaError_t pcops_knn_cuda(pcops_dtype dtype, const void* query, const void* ref,
                                      const int64_t* query_lengths, const int64_t* ref_lengths,
                                      int64_t B, int64_t M, int64_t N, int64_t K,
                                      void* workspace, void* dist2, int64_t* idx,
                                      cudaStream_t stream) {
    pcops_knn_cuda_plan plan;
    const cudaError_t err = make_plan(dtype, B, M, N, K, PCOPS_KNN_AUTO, &plan);
    if (err != cudaSuccess) return err;
    return pcops_knn_cuda_run(&plan, query, ref, query_lengths, ref_lengths, workspace, dist2,
                              idx, stream);
}
