/*
 * warp.cuh -- warp-wide reductions of 32-bit words shared by the CUDA kernels: redux on sm_80+,
 * butterfly shuffles before (every kernel also compiles for the oldest architecture torch
 * ships for, sm_75, which has no redux).
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

}  // namespace pcops_warp
