/*
 * three_nn_pointnet2.cu -- a kNN result in pointnet2_ops's three_nn layout, on CUDA. Same
 * contract as three_nn_pointnet2.c:
 *
 *   dist2[n] (dtype), idx[n] int64 -> dist[n] = sqrt(dist2[n]) (dtype),
 *                                     idx32[n] = idx[n] as int32, 0 where idx[n] is -1
 *
 * The square roots are __fsqrt_rn / __dsqrt_rn, correctly rounded whatever -prec-sqrt or
 * --use_fast_math say, so the bits are the CPU's (sqrtf / sqrt). dist may be dist2 (in place).
 *
 * Threads: one per element, grid-stride; loads and stores coalesced.
 */
#include <cuda_runtime.h>

#include "geometry.h"
#include "pcops.h"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sqrt_rn(float x) { return __fsqrt_rn(x); }
__device__ __forceinline__ double sqrt_rn(double x) { return __dsqrt_rn(x); }

// No __restrict__ on dist2 / dist: they may be one buffer.
template <typename T>
__global__ void three_nn_pointnet2_kernel(const T* dist2, const int64_t* __restrict__ idx,
                                          int64_t n, T* dist, int32_t* __restrict__ idx32) {
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * kThreads) {
        const int64_t j = idx[i];
        dist[i] = sqrt_rn(dist2[i]);
        idx32[i] = j < 0 ? 0 : (int32_t)j;
    }
}

}  // namespace

extern "C" cudaError_t pcops_three_nn_pointnet2_cuda(pcops_dtype dtype, const void* dist2,
                                                     const int64_t* idx, int64_t n, void* dist,
                                                     int32_t* idx32, cudaStream_t stream) {
    if (n < 0) return cudaErrorInvalidValue;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return cudaErrorInvalidValue;
    if (n == 0) return cudaSuccess;
    if (!dist2 || !idx || !dist || !idx32) return cudaErrorInvalidValue;
    const unsigned grid = pcops_grid_stride_blocks(n, kThreads);
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        three_nn_pointnet2_kernel<T><<<grid, kThreads, 0, stream>>>((const T*)dist2, idx, n,
                                                                    (T*)dist, idx32);
        return cudaGetLastError();
    });
}
