/*
 * knn.c -- k nearest neighbours on the CPU.
 *
 * B = batch, M = queries per cloud, N = reference points per cloud, K = neighbours.
 * query[B,M,3], ref[B,N,3] -> dist2[B,M,K], idx[B,M,K] (int64).
 *
 * Brute force, written to vectorise. The refs of a cloud are visited in tiles of KNN_TILE
 * points; a tile is copied once into structure-of-arrays form (x[], y[], z[] on the stack) and
 * then serves a block of KNN_QBLOCK queries: for each query one vectorised loop writes the
 * tile's squared distances into a small buffer, and a selection pass compares them with the
 * query's current K-th distance, 16 at a time (a vectorised "any below?" test), inserting
 * rarely. The selection list of a query lives in its own output rows (dist2[b,m,:],
 * idx[b,m,:]), so the function needs no workspace:
 *  - while at most KNN_SORTED_MAX neighbours are kept, a sorted list with insertion;
 *  - above that, a max-heap on the key (dist2, idx), sorted in place (heapsort) at the end.
 * Both keep exactly the K smallest keys (dist2, idx) among the valid refs whose distance is
 * below +inf, as the CUDA kernels do, so both return the same indices. Refs are visited in
 * index order and a ref is only taken when its distance is strictly below the current K-th,
 * so a later ref never displaces an equal earlier one (ties to the lower index).
 *
 * Work sharing: OpenMP over (cloud, block of queries) pairs, schedule(dynamic).
 */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.h"
#include "pcops.h"

/* Refs per tile: the SoA copy and the distance buffer of a tile stay in L1. */
#define KNN_TILE 512
/* Queries that share one SoA copy of a tile. */
#define KNN_QBLOCK 32
/* Distances tested together by the vectorised "any below the threshold?" check. */
#define KNN_CHUNK 16
/* Kept neighbours up to which a sorted list with insertion is used; a heap above. */
#define KNN_SORTED_MAX 96

/* Queries per block: KNN_QBLOCK, halved (down to 4) while there are too few blocks to keep
 * every thread busy (one small cloud, few queries). */
static int64_t knn_query_block(int64_t B, int64_t M) {
#ifdef _OPENMP
    const int64_t threads = omp_get_max_threads();
#else
    const int64_t threads = 1;
#endif
    int64_t qblock = KNN_QBLOCK;
    while (qblock > 4 && B * ((M + qblock - 1) / qblock) < 4 * threads) qblock /= 2;
    return qblock;
}

/* Bit j of the result is set when d[j] < thr, for the KNN_CHUNK = 16 distances d[0, 16) (a
 * NaN is never below). SSE2 (the x86-64 baseline; VEX-encoded in the AVX2 clones): four or
 * eight compares and movemasks per chunk. */
#if defined(__SSE2__)
#include <emmintrin.h>
static inline uint32_t knn_below_mask_f32(const float* d, float thr) {
    const __m128 t = _mm_set1_ps(thr);
    uint32_t mask = 0;
    for (int j = 0; j < KNN_CHUNK; j += 4)
        mask |= (uint32_t)_mm_movemask_ps(_mm_cmplt_ps(_mm_loadu_ps(d + j), t)) << j;
    return mask;
}
static inline uint32_t knn_below_mask_f64(const double* d, double thr) {
    const __m128d t = _mm_set1_pd(thr);
    uint32_t mask = 0;
    for (int j = 0; j < KNN_CHUNK; j += 2)
        mask |= (uint32_t)_mm_movemask_pd(_mm_cmplt_pd(_mm_loadu_pd(d + j), t)) << j;
    return mask;
}
#else
static inline uint32_t knn_below_mask_f32(const float* d, float thr) {
    uint32_t mask = 0;
    for (int j = 0; j < KNN_CHUNK; ++j) mask |= (uint32_t)(d[j] < thr) << j;
    return mask;
}
static inline uint32_t knn_below_mask_f64(const double* d, double thr) {
    uint32_t mask = 0;
    for (int j = 0; j < KNN_CHUNK; ++j) mask |= (uint32_t)(d[j] < thr) << j;
    return mask;
}
#endif

/* Index of the lowest set bit of a non-zero mask. */
static inline int knn_lowest_bit(uint32_t mask) {
#if defined(__GNUC__)
    return __builtin_ctz(mask);
#else
    int j = 0;
    while (!(mask & 1u)) {
        mask >>= 1;
        ++j;
    }
    return j;
#endif
}

#define T float
#define TI int32_t
#define FN(name) name##_f32
#include "knn_cpu.inc"
#undef T
#undef TI
#undef FN

#define T double
#define TI int64_t
#define FN(name) name##_f64
#include "knn_cpu.inc"
#undef T
#undef TI
#undef FN

pcops_status pcops_knn_cpu(pcops_dtype dtype, const void* query, const void* ref,
                           const int64_t* query_lengths, const int64_t* ref_lengths, int64_t B,
                           int64_t M, int64_t N, int64_t K, void* dist2, int64_t* idx) {
    if (B < 0 || M < 0 || N < 0 || K < 1) return PCOPS_ERROR_INVALID_VALUE;
    if (B == 0 || M == 0) return PCOPS_SUCCESS;
    if (!query || !dist2 || !idx || (N > 0 && !ref)) return PCOPS_ERROR_INVALID_VALUE;
    switch (dtype) {
        case PCOPS_FLOAT32:
            knn_batch_f32((const float*)query, (const float*)ref, query_lengths, ref_lengths, B,
                          M, N, K, (float*)dist2, idx);
            return PCOPS_SUCCESS;
        case PCOPS_FLOAT64:
            knn_batch_f64((const double*)query, (const double*)ref, query_lengths, ref_lengths,
                          B, M, N, K, (double*)dist2, idx);
            return PCOPS_SUCCESS;
        default:
            return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    }
}
