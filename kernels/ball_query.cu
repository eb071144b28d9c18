/*
 * ball_query.cu -- ball query on CUDA: the C API (kernels/pcops.h), a plan and a launch.
 *
 * query[B,M,3], ref[B,N,3] -> idx[B,M,S] (int64), count[B,M] (int64): the first S valid refs
 * in index order with d = pcops_dist2(ref, query) < (T)radius2, empty slots repeating the first
 * neighbour, -1 everywhere (count 0) for a query with no neighbour and for an invalid query;
 * every path, and the CPU (kernels/ball_query.c), return the same indices.
 *
 * The paths (kernels/ball_query_paths.h), one header each, read top to bottom (what it does,
 * when it wins, invariants, kernels, launcher):
 *   ball_query/brute.cuh  "brute": a warp per query scans the refs in index order; the
 *                         reference, any S (pcops_ball_query_cuda runs it without a plan)
 *   ball_query/split.cuh  "brute_split": a thread per query, the refs split among the warps of
 *                         a block, each warp skipping the refs outside its queries' box;
 *                         "split_sorted": the same on queries first put in a spatial order
 *                         (S <= 64)
 *   ball_query/grid.cuh   "grid": the refs binned into a grid on the device, a thread per query
 *                         visiting the cells of its ball
 * ball_query/common.cuh holds what they share; ball_query/plan.cuh chooses one per call
 * (eligibility, then the tuning table's preference) and sizes its workspace.
 */
#include <cstdint>

#include "ball_query_paths.h"
#include "geometry.h"
#include "pcops.h"

#include "ball_query/common.cuh"
#include "ball_query/brute.cuh"
#include "ball_query/split.cuh"
#include "ball_query/grid.cuh"
#include "ball_query/plan.cuh"  // after the paths

namespace {

// The launcher of the plan's path.
template <typename T>
cudaError_t launch(const pcops_ball_query_cuda_plan& plan, const BallQueryArgs<T>& a) {
    switch (plan.path) {
#define PCOPS_BALL_QUERY_LAUNCH(NAME, id, name, devices, dtypes) \
    case PCOPS_BALL_QUERY_##NAME:                                \
        return BallQueryPath<PCOPS_BALL_QUERY_##NAME>::template launch<T>(plan, a);
        PCOPS_BALL_QUERY_PATHS(PCOPS_BALL_QUERY_LAUNCH)
#undef PCOPS_BALL_QUERY_LAUNCH
        default:
            return cudaErrorInvalidValue;
    }
}

}  // namespace

extern "C" cudaError_t pcops_ball_query_cuda_plan_make(pcops_dtype dtype, int64_t B, int64_t M,
                                                       int64_t N, double radius2, int64_t S,
                                                       pcops_ball_query_path path,
                                                       pcops_ball_query_cuda_plan* plan) {
    return make_plan(dtype, B, M, N, radius2, S, path, plan);
}

extern "C" cudaError_t pcops_ball_query_cuda_run(const pcops_ball_query_cuda_plan* plan,
                                                 const void* query, const void* ref,
                                                 const int64_t* query_lengths,
                                                 const int64_t* ref_lengths, void* workspace,
                                                 int64_t* idx, int64_t* count,
                                                 cudaStream_t stream) {
    if (!plan) return cudaErrorInvalidValue;
    if (plan->path == PCOPS_BALL_QUERY_BRUTE)  // the checks of the plan-free entry point
        return pcops_ball_query_cuda(plan->dtype, query, ref, query_lengths, ref_lengths, plan->B,
                                     plan->M, plan->N, plan->radius2, plan->S, idx, count, stream);
    if (plan->B == 0 || plan->M == 0) return cudaSuccess;
    return pcops_dispatch_float(plan->dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        const BallQueryArgs<T> a{(const T*)query, (const T*)ref, query_lengths, ref_lengths,
                                 workspace,       idx,           count,         stream};
        return launch<T>(*plan, a);
    });
}

extern "C" cudaError_t pcops_ball_query_cuda(pcops_dtype dtype, const void* query,
                                             const void* ref, const int64_t* query_lengths,
                                             const int64_t* ref_lengths, int64_t B, int64_t M,
                                             int64_t N, double radius2, int64_t S, int64_t* idx,
                                             int64_t* count, cudaStream_t stream) {
    if (B < 0 || M < 0 || N < 0 || S < 1) return cudaErrorInvalidValue;
    if (B == 0 || M == 0) return cudaSuccess;
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return launch_ball_query((const T*)query, (const T*)ref, query_lengths, ref_lengths, B, M,
                                 N, radius2, S, idx, count, stream);
    });
}
