/*
 * warp.cuh -- the warp-wide reductions of the CUDA kernels: 32-bit words by redux on sm_80+ and
 * butterfly shuffles before (every kernel also compiles for the oldest architecture torch ships
 * for, sm_75, which has no redux), and a butterfly over several values of any type at once.
 */
#pragma once

#include <cstdint>

namespace pcops_warp {

// name(v): v reduced over the warp, on every lane: the redux instruction on sm_80+, else a
// butterfly of five shuffles combined by combine(mine, other).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define PCOPS_WARP_REDUCE(name, T, redux, combine) \
    __device__ __forceinline__ T name(T v) { return redux(0xffffffffu, v); }
#else
#define PCOPS_WARP_REDUCE(name, T, redux, combine)                       \
    __device__ __forceinline__ T name(T v) {                             \
        for (int off = 16; off > 0; off /= 2)                            \
            v = combine(v, __shfl_xor_sync(0xffffffffu, v, off));        \
        return v;                                                        \
    }
#endif

__device__ __forceinline__ uint32_t plus(uint32_t a, uint32_t b) { return a + b; }
__device__ __forceinline__ uint32_t bit_or(uint32_t a, uint32_t b) { return a | b; }

PCOPS_WARP_REDUCE(sum_u32, uint32_t, __reduce_add_sync, plus)
PCOPS_WARP_REDUCE(max_u32, uint32_t, __reduce_max_sync, max)
PCOPS_WARP_REDUCE(min_u32, uint32_t, __reduce_min_sync, min)
PCOPS_WARP_REDUCE(min_i32, int32_t, __reduce_min_sync, min)
PCOPS_WARP_REDUCE(max_i32, int32_t, __reduce_max_sync, max)
PCOPS_WARP_REDUCE(or_u32, uint32_t, __reduce_or_sync, bit_or)
#undef PCOPS_WARP_REDUCE

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
