/*
 * interpolate.cu -- weighted gather (PointNet++ feature propagation), on CUDA.
 *
 * B = batch, N = known points per cloud, C = channels, M = unknown (target) points,
 * K = neighbours per target; idx int64 or int32. Same contract as interpolate.c:
 *
 *   out[b,m,c] = sum over k = 0..K-1 of weight[b,m,k] * features[b, idx[b,m,k], c]
 *
 * the products rounded once and added in ascending k from 0 with geometry.h's rounded
 * operations (no FMA contraction, whatever the compiler flags), which gives the CPU's bits.
 * Slots with an index outside [0, N) add nothing.
 *
 * Threads: one per output element (b,m,c), grid-stride, c fastest: consecutive threads read
 * consecutive channels of the same feature rows (coalesced), and the K (idx, weight) pairs of a
 * row are shared through the L1 cache. No atomics: the backward (a scatter) is composed in
 * Python from group_backward, which is deterministic.
 */
#include <cuda_runtime.h>

#include "geometry.h"
#include "pcops.h"

namespace {

constexpr int kThreads = 256;

// geometry.h's rounded multiply and add, by type.
__device__ __forceinline__ float rounded_mul(float a, float b) { return pcops_mul_f32(a, b); }
__device__ __forceinline__ double rounded_mul(double a, double b) { return pcops_mul_f64(a, b); }
__device__ __forceinline__ float rounded_add(float a, float b) { return pcops_add_f32(a, b); }
__device__ __forceinline__ double rounded_add(double a, double b) { return pcops_add_f64(a, b); }

template <typename T, typename IdxT>
__global__ void interpolate_kernel(const T* __restrict__ features, const IdxT* __restrict__ idx,
                                   const T* __restrict__ weight, int64_t N, int64_t C, int64_t M,
                                   int64_t K, int64_t total, T* __restrict__ out) {
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * kThreads) {
        const int64_t r = i / C;  // row b*M + m
        const int64_t c = i - r * C;
        const int64_t b = r / M;
        const T* fb = features + b * N * C + c;
        T acc = (T)0;
        for (int64_t k = 0; k < K; ++k) {
            const int64_t n = (int64_t)idx[r * K + k];
            if (n < 0 || n >= N) continue;
            acc = rounded_add(acc, rounded_mul(weight[r * K + k], fb[n * C]));
        }
        out[i] = acc;
    }
}

}  // namespace

extern "C" cudaError_t pcops_interpolate_cuda(pcops_dtype dtype, const void* features,
                                              const void* idx, pcops_index_dtype idx_dtype,
                                              const void* weight, int64_t B, int64_t N,
                                              int64_t C, int64_t M, int64_t K, void* out,
                                              cudaStream_t stream) {
    if (B < 0 || N < 0 || C < 0 || M < 0 || K < 0) return cudaErrorInvalidValue;
    if (idx_dtype != PCOPS_INDEX_INT64 && idx_dtype != PCOPS_INDEX_INT32)
        return cudaErrorInvalidValue;
    const int64_t total = B * M * C;
    if (total == 0) return cudaSuccess;
    const unsigned grid = pcops_grid_stride_blocks(total, kThreads);
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        if (idx_dtype == PCOPS_INDEX_INT32)  // pointnet2_ops's indices, read as is
            interpolate_kernel<T, int32_t><<<grid, kThreads, 0, stream>>>(
                (const T*)features, (const int32_t*)idx, (const T*)weight, N, C, M, K, total,
                (T*)out);
        else
            interpolate_kernel<T, int64_t><<<grid, kThreads, 0, stream>>>(
                (const T*)features, (const int64_t*)idx, (const T*)weight, N, C, M, K, total,
                (T*)out);
        return cudaGetLastError();
    });
}
