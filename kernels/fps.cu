/*
 * fps.cu -- furthest point sampling on CUDA: the C API (kernels/pcops.h) over the paths of
 * kernels/fps/.
 *
 * B = batch, N = points per cloud, L = valid points of a cloud (lengths[b] clamped to [0, N]),
 * npoint = samples. xyz[B,N,3] -> idx[B,npoint] (int64), dist2[B,npoint]. Same algorithm and
 * arithmetic as fps.c, so every path here and on the CPU chooses bitwise the same indices.
 *
 * pcops_fps_cuda_make_plan picks the path and its shape once, from the sizes and the device
 * (kernels/fps/plan.cuh); pcops_fps_cuda_run launches that plan. The paths, a file each (what
 * it does, when AUTO takes it and its invariants at its top; kernels/fps_paths.h lists them):
 *
 *   fps/common.cuh         the step, the candidates and their reductions: every path
 *   fps/group.cuh          SIMPLE (the reference), WARP, BLOCK: points in registers
 *   fps/pruned.cuh         BLOCK_PRUNED: the block path skipping the warps a sample cannot change
 *   fps/cluster.cuh        CLUSTER (sm_90+): a thread-block cluster per cloud
 *   fps/grid.cuh           GRID: a cooperative grid on one cloud at a time
 *   fps/bucket.cuh         BUCKET, and the Morton sort into buckets of every bucket path
 *   fps/bucket_groups.cuh  BUCKET_GROUPS (float): a step's flagged buckets shared over the warps
 *   fps/bucket_rounds.cuh  BUCKET_ROUNDS, BUCKET_ROUNDS_CLUSTER (float): several samples a round
 *   fps/plan.cuh           eligibility, AUTO's preference (the per-architecture tuning table),
 *                          the workspace
 */
#include "fps/plan.cuh"

namespace {

// Launches plan p: the workspace's pieces, the sort of the bucket paths, then the path.
template <typename T>
cudaError_t run_plan(const pcops_fps_cuda_plan* p, const T* xyz, const int64_t* lengths,
                     const int64_t* start, int64_t B, int64_t N, int64_t npoint, void* workspace,
                     int64_t* idx, T* dist2, cudaStream_t stream) {
    Scratch<T> s;
    plan_layout<T>(p, workspace, &s);
    if (p->workspace_bytes > 0 && workspace == nullptr) return cudaErrorInvalidValue;
    if (is_bucket_path(p->path)) {
        const cudaError_t err = sort_into_buckets<T>(s.sort, xyz, lengths, B, N, stream);
        if (err != cudaSuccess) return err;
    }
    switch (p->path) {
        case PCOPS_FPS_SIMPLE:
        case PCOPS_FPS_WARP:
        case PCOPS_FPS_BLOCK:
            return launch_group<T>(p, xyz, lengths, start, B, N, npoint, s.temp, idx, dist2,
                                   stream);
        case PCOPS_FPS_BLOCK_PRUNED:
            return launch_pruned<T>(p, xyz, lengths, start, B, N, npoint, idx, dist2, stream);
        case PCOPS_FPS_CLUSTER:
            return launch_cluster<T>(p, xyz, lengths, start, B, N, npoint, s.temp, idx, dist2,
                                     stream);
        case PCOPS_FPS_GRID:
            return launch_grid<T>(p, xyz, lengths, start, B, N, npoint, s.temp, s.slots, idx,
                                  dist2, stream);
        case PCOPS_FPS_BUCKET:
            return launch_bucket<T>(p, s.sort.sorted, s.temp, xyz, lengths, start, B, N, npoint,
                                    idx, dist2, stream);
        case PCOPS_FPS_BUCKET_GROUPS:
            return launch_bucket_groups<T>(p, s.sort.sorted, s.temp, xyz, lengths, start, B, N,
                                           npoint, idx, dist2, stream);
        case PCOPS_FPS_BUCKET_ROUNDS:
        case PCOPS_FPS_BUCKET_ROUNDS_CLUSTER:
            return launch_bucket_rounds<T>(p, s.sort.sorted, s.temp, xyz, lengths, start, N,
                                           npoint, idx, dist2, stream);
        default: return cudaErrorInvalidValue;
    }
}

}  // namespace

extern "C" cudaError_t pcops_fps_cuda_make_plan(pcops_dtype dtype, int64_t B, int64_t N,
                                                int64_t npoint, int path,
                                                pcops_fps_cuda_plan* plan) {
    if (!plan || B < 0 || N < 0 || N > INT_MAX || npoint < 1) return cudaErrorInvalidValue;
    if (path < PCOPS_FPS_AUTO || path >= PCOPS_FPS_PATH_END || path == PCOPS_FPS_TREE)
        return cudaErrorInvalidValue;  // TREE: the CPU's
    pcops_fps_cuda_plan p = {};
    p.dtype = dtype;
    p.B = B;
    p.N = N;
    cudaError_t err;
    if (dtype == PCOPS_FLOAT32) err = make_plan<float>(B, N, npoint, path, &p);
    else if (dtype == PCOPS_FLOAT64) err = make_plan<double>(B, N, npoint, path, &p);
    else return cudaErrorInvalidValue;
    if (err != cudaSuccess) return err;
    if (p.blocks > INT_MAX) return cudaErrorInvalidValue;
    if (dtype == PCOPS_FLOAT32) {
        Scratch<float> s;
        p.workspace_bytes = plan_layout<float>(&p, nullptr, &s);
    } else {
        Scratch<double> s;
        p.workspace_bytes = plan_layout<double>(&p, nullptr, &s);
    }
    if (p.workspace_bytes == SIZE_MAX) return cudaErrorInvalidValue;
    *plan = p;
    return cudaSuccess;
}

extern "C" cudaError_t pcops_fps_cuda_run(const pcops_fps_cuda_plan* plan, pcops_dtype dtype,
                                          const void* xyz, const int64_t* lengths,
                                          const int64_t* start, int64_t B, int64_t N,
                                          int64_t npoint, void* workspace, int64_t* idx,
                                          void* dist2, cudaStream_t stream) {
    if (!plan || plan->dtype != dtype || plan->B != B || plan->N != N || npoint < 1)
        return cudaErrorInvalidValue;
    if (B == 0) return cudaSuccess;
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return run_plan<T>(plan, (const T*)xyz, lengths, start, B, N, npoint, workspace, idx,
                           (T*)dist2, stream);
    });
}
