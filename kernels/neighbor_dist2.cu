/*
 * neighbor_dist2.cu -- squared distance of each query to each of its listed neighbours, on
 * CUDA. Same contract and arithmetic as neighbor_dist2.c:
 *
 *   dist2[b,m,s] = |query[b,m] - ref[b, idx[b,m,s]]|^2, 0 where idx lies outside [0, N)
 *
 * with geometry.h's pcops_dist2 (rounded operations, no FMA contraction), which gives the CPU's
 * bits and those of pcops's searches. idx is int64 or int32 (read as is).
 *
 * pcops_neighbor_dist2_count_cuda: the same pass over a ball query's idx and count (the second
 * half of ball_query_dist2): slots s >= count[b,m] are emptied, idx -1 (in place) and dist2 0.
 *
 * Threads: one per output slot (b,m,s), grid-stride; the S slots of a query are consecutive
 * threads, so the query's coordinates come from L1 and idx / dist2 are coalesced.
 */
#include <cuda_runtime.h>

#include "geometry.h"
#include "pcops.h"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float dist2_of(float ax, float ay, float az, float bx, float by,
                                          float bz) {
    return pcops_dist2_checked_f32(ax, ay, az, bx, by, bz);
}
__device__ __forceinline__ double dist2_of(double ax, double ay, double az, double bx,
                                           double by, double bz) {
    return pcops_dist2_checked_f64(ax, ay, az, bx, by, bz);
}

// count == NULL: neighbor_dist2. count given (the _count launcher; then idx_w is idx): slots
// s >= count[row] are emptied, idx_w -1 and dist2 0.
template <typename T, typename IdxT>
__global__ void neighbor_dist2_kernel(const T* __restrict__ query, const T* __restrict__ ref,
                                      const IdxT* idx, const int64_t* __restrict__ count,
                                      IdxT* idx_w, int64_t M, int64_t N, int64_t S,
                                      int64_t total, T* __restrict__ dist2) {
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * kThreads) {
        const int64_t row = i / S;  // b*M + m
        const int64_t b = row / M;
        if (count && i - row * S >= count[row]) {
            idx_w[i] = (IdxT)-1;
            dist2[i] = (T)0;
            continue;
        }
        const int64_t n = (int64_t)idx[i];
        T d = (T)0;
        if (n >= 0 && n < N) {
            const T* q = query + row * 3;
            const T* r = ref + (b * N + n) * 3;
            d = dist2_of(q[0], q[1], q[2], r[0], r[1], r[2]);
        }
        dist2[i] = d;
    }
}

}  // namespace

extern "C" cudaError_t pcops_neighbor_dist2_cuda(pcops_dtype dtype, const void* query,
                                                 const void* ref, const void* idx,
                                                 pcops_index_dtype idx_dtype, int64_t B,
                                                 int64_t M, int64_t N, int64_t S, void* dist2,
                                                 cudaStream_t stream) {
    if (B < 0 || M < 0 || N < 0 || S < 0) return cudaErrorInvalidValue;
    if (idx_dtype != PCOPS_INDEX_INT64 && idx_dtype != PCOPS_INDEX_INT32)
        return cudaErrorInvalidValue;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return cudaErrorInvalidValue;
    const int64_t total = B * M * S;
    if (total == 0) return cudaSuccess;
    const unsigned grid = pcops_grid_stride_blocks(total, kThreads);
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        if (idx_dtype == PCOPS_INDEX_INT32)
            neighbor_dist2_kernel<T, int32_t><<<grid, kThreads, 0, stream>>>(
                (const T*)query, (const T*)ref, (const int32_t*)idx, nullptr, nullptr, M, N, S,
                total, (T*)dist2);
        else
            neighbor_dist2_kernel<T, int64_t><<<grid, kThreads, 0, stream>>>(
                (const T*)query, (const T*)ref, (const int64_t*)idx, nullptr, nullptr, M, N, S,
                total, (T*)dist2);
        return cudaGetLastError();
    });
}

extern "C" cudaError_t pcops_neighbor_dist2_count_cuda(pcops_dtype dtype, const void* query,
                                                       const void* ref, int64_t* idx,
                                                       const int64_t* count, int64_t B,
                                                       int64_t M, int64_t N, int64_t S,
                                                       void* dist2, cudaStream_t stream) {
    if (B < 0 || M < 0 || N < 0 || S < 0) return cudaErrorInvalidValue;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return cudaErrorInvalidValue;
    const int64_t total = B * M * S;
    if (total == 0) return cudaSuccess;
    if (!count) return cudaErrorInvalidValue;
    const unsigned grid = pcops_grid_stride_blocks(total, kThreads);
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        neighbor_dist2_kernel<T, int64_t><<<grid, kThreads, 0, stream>>>(
            (const T*)query, (const T*)ref, idx, count, idx, M, N, S, total, (T*)dist2);
        return cudaGetLastError();
    });
}
