/*
 * warp.cuh -- warp-wide reductions shared by the CUDA kernels, every lane getting the result:
 * one redux instruction on sm_80+, a butterfly of five shuffles before (every kernel also
 * compiles for the oldest architecture torch ships for, sm_75, which has no redux). 32-bit
 * words, the OR of a 64-bit word as two 32-bit ORs, and a butterfly over several values of any
 * type at once.
 */
#pragma once

#include <cstdint>

namespace pcops_warp {

// The body of a reduction of `v`: __reduce_<op>_sync on sm_80+; before, `combine` (an expression
// of v and o, o the value of the partner lane) at each step of the butterfly.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PCOPS_WARP_REDUCE(op, combine) return __reduce_##op##_sync(0xffffffffu, v)
#else
#define PCOPS_WARP_REDUCE(op, combine)                        \
    for (int off = 16; off > 0; off /= 2) {                   \
        const auto o = __shfl_xor_sync(0xffffffffu, v, off);  \
        v = combine;                                          \
    }                                                         \
    return v
#endif

__device__ __forceinline__ uint32_t sum_u32(uint32_t v) { PCOPS_WARP_REDUCE(add, v + o); }
__device__ __forceinline__ int32_t sum_i32(int32_t v) { PCOPS_WARP_REDUCE(add, v + o); }
__device__ __forceinline__ uint32_t max_u32(uint32_t v) { PCOPS_WARP_REDUCE(max, max(v, o)); }
__device__ __forceinline__ uint32_t min_u32(uint32_t v) { PCOPS_WARP_REDUCE(min, min(v, o)); }
__device__ __forceinline__ int32_t max_i32(int32_t v) { PCOPS_WARP_REDUCE(max, max(v, o)); }
__device__ __forceinline__ int32_t min_i32(int32_t v) { PCOPS_WARP_REDUCE(min, min(v, o)); }
__device__ __forceinline__ uint32_t or_u32(uint32_t v) { PCOPS_WARP_REDUCE(or, v | o); }

#undef PCOPS_WARP_REDUCE

__device__ __forceinline__ uint64_t or_u64(uint64_t v) {
    return (uint64_t)or_u32((uint32_t)v) | ((uint64_t)or_u32((uint32_t)(v >> 32)) << 32);
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
