/*
 * common.h -- small helpers shared by the C and CUDA kernels (not part of the public C API).
 */
#ifndef PCOPS_COMMON_H
#define PCOPS_COMMON_H

#include <stdint.h>

#if defined(__CUDACC__)
#define PCOPS_HD __host__ __device__ __forceinline__
#else
#define PCOPS_HD static inline
#endif

/* The number of valid points of batch b: lengths[b] clamped to [0, N], or N without lengths. */
PCOPS_HD int64_t pcops_valid_length(const int64_t* lengths, int64_t b, int64_t N) {
    if (lengths == 0) return N;
    int64_t L = lengths[b];
    return L < 0 ? 0 : (L > N ? N : L);
}

/* x mod L in [0, L) for any sign of x; L > 0. */
PCOPS_HD int64_t pcops_positive_mod(int64_t x, int64_t L) {
    int64_t r = x % L;
    return r < 0 ? r + L : r;
}

/* Hot CPU loops are compiled twice, for AVX2 and for the x86-64 baseline, and the loader picks
 * one at start-up (GCC function multi-versioning), so a build from source runs well on any
 * x86-64 machine without -march=native. */
#if !defined(__CUDACC__) && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define PCOPS_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PCOPS_CPU_CLONES
#endif

#endif /* PCOPS_COMMON_H */
