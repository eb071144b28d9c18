/*
 * warp.cuh -- the warp-wide reductions of the CUDA kernels: 32-bit words by redux on sm_80+ and
 * butterfly shuffles before (every kernel also compiles for the oldest architecture torch ships
 * for, sm_75, which has no redux), and a butterfly over several values of any type at once.
 */
#pragma once

#include <cstdint>

namespace pcops_warp {

__device__ __forceinline__ uint32_t sum_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_add_sync(0xffffffffu, v);
#else
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
#endif
}

__device__ __forceinline__ uint32_t max_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xffffffffu, v);
#else
    for (int off = 16; off > 0; off /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
#endif
}

__device__ __forceinline__ uint32_t min_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_min_sync(0xffffffffu, v);
#else
    for (int off = 16; off > 0; off /= 2) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
#endif
}

__device__ __forceinline__ int32_t min_i32(int32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_min_sync(0xffffffffu, v);
#else
    for (int off = 16; off > 0; off /= 2) v = min(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
#endif
}

__device__ __forceinline__ int32_t max_i32(int32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(0xffffffffu, v);
#else
    for (int off = 16; off > 0; off /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
#endif
}

__device__ __forceinline__ uint32_t or_u32(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_or_sync(0xffffffffu, v);
#else
    for (int off = 16; off > 0; off /= 2) v |= __shfl_xor_sync(0xffffffffu, v, off);
    return v;
#endif
}

// For each j < N, v[j] reduced over the warp on every lane: by lo(mine, other) for j < n, by
// hi(mine, other) for the others. A butterfly of shuffles, the N values side by side at each
// step (a box: three mins, then three maxes, in one pass). With a min and a max every lane ends
// with the extreme values (of equal values, +0 and -0, a lane may keep its own).
template <int N, typename T, typename Lo, typename Hi>
__device__ __forceinline__ void all_reduce_split(T (&v)[N], int n, Lo lo, Hi hi) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
#pragma unroll
        for (int j = 0; j < n; ++j) v[j] = lo(v[j], __shfl_xor_sync(0xffffffffu, v[j], off));
#pragma unroll
        for (int j = n; j < N; ++j) v[j] = hi(v[j], __shfl_xor_sync(0xffffffffu, v[j], off));
    }
}

}  // namespace pcops_warp
