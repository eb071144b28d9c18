/*
 * neighbor_dist2.c -- squared distance of each query to each of its listed neighbours, on the
 * CPU (PyTorch3D's ball_query returns these beside the indices).
 *
 * B = batch, M = queries per cloud, N = reference points per cloud, S = neighbours per query.
 *
 *   query[B,M,3], ref[B,N,3], idx[B,M,S] (int64 or int32) -> dist2[B,M,S],
 *   dist2[b,m,s] = |query[b,m] - ref[b, idx[b,m,s]]|^2, 0 where idx lies outside [0, N)
 *
 * The distance is geometry.h's pcops_dist2 (no FMA contraction), the one every search of pcops
 * uses, with its overflow rule (pcops_dist2_checked: an overflow between finite points is the
 * max, a non-finite point gives +inf or NaN), so dist2 of a kNN's neighbours equals the kNN's
 * own dist2 bit for bit, on the CPU and on CUDA (neighbor_dist2.cu).
 *
 * pcops_neighbor_dist2_count_cpu is the same pass over a ball query's int64 idx and count (the
 * second half of ball_query_dist2): slots s >= count[b,m] are emptied, idx -1 (written in place)
 * and dist2 0, as PyTorch3D pads its ball query.
 *
 * Work sharing: OpenMP over the B*M query rows; small calls run on one thread.
 */
#include "cpu.h"
#include "pcops.h"

/* Below this many distances a call runs on one thread. */
#define NEIGHBOR_DIST2_PARALLEL_MIN 32768.0

#define NEIGHBOR_DIST2_ROWS(T, SUF)                                                            \
    do {                                                                                       \
        const T* PCOPS_RESTRICT q = (const T*)query;                                           \
        const T* PCOPS_RESTRICT r = (const T*)ref;                                             \
        T* PCOPS_RESTRICT o = (T*)dist2;                                                       \
        const int parallel = (double)B * (double)M * (double)S >= NEIGHBOR_DIST2_PARALLEL_MIN; \
        _Pragma("omp parallel for schedule(static) if (parallel)")                             \
        for (int64_t row = 0; row < B * M; ++row) {                                            \
            const int64_t b = row / M;                                                         \
            const T* qp = q + row * 3;                                                         \
            const T* rb = r + b * N * 3;                                                       \
            for (int64_t s = 0; s < S; ++s) {                                                  \
                const int64_t i = row * S + s;                                                 \
                if (cnt && s >= cnt[row]) { /* _count: past the row's count, emptied */        \
                    idx_w[i] = -1;                                                             \
                    o[i] = (T)0;                                                               \
                    continue;                                                                  \
                }                                                                              \
                const int64_t n = idx32 ? (int64_t)((const int32_t*)idx)[i]                    \
                                        : ((const int64_t*)idx)[i];                            \
                if (n < 0 || n >= N) {                                                         \
                    o[i] = (T)0;                                                               \
                    continue;                                                                  \
                }                                                                              \
                const T* rp = rb + n * 3;                                                      \
                o[i] = pcops_dist2_checked_##SUF(qp[0], qp[1], qp[2], rp[0], rp[1], rp[2]);    \
            }                                                                                  \
        }                                                                                      \
    } while (0)

pcops_status pcops_neighbor_dist2_cpu(pcops_dtype dtype, const void* query, const void* ref,
                                      const void* idx, pcops_index_dtype idx_dtype, int64_t B,
                                      int64_t M, int64_t N, int64_t S, void* dist2) {
    if (B < 0 || M < 0 || N < 0 || S < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (idx_dtype != PCOPS_INDEX_INT64 && idx_dtype != PCOPS_INDEX_INT32)
        return PCOPS_ERROR_INVALID_VALUE;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    const int idx32 = idx_dtype == PCOPS_INDEX_INT32;
    const int64_t* cnt = NULL;
    int64_t* idx_w = NULL;
    if (B * M * S == 0) return PCOPS_SUCCESS;
    if (!query || !idx || !dist2 || (N > 0 && !ref)) return PCOPS_ERROR_INVALID_VALUE;
    const pcops_fpmode fpmode = pcops_fpmode_ieee(); /* cpu.h */
    if (dtype == PCOPS_FLOAT32)
        NEIGHBOR_DIST2_ROWS(float, f32);
    else
        NEIGHBOR_DIST2_ROWS(double, f64);
    pcops_fpmode_restore(fpmode);
    return PCOPS_SUCCESS;
}

pcops_status pcops_neighbor_dist2_count_cpu(pcops_dtype dtype, const void* query, const void* ref,
                                            int64_t* idx, const int64_t* count, int64_t B,
                                            int64_t M, int64_t N, int64_t S, void* dist2) {
    if (B < 0 || M < 0 || N < 0 || S < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    const int idx32 = 0;
    const int64_t* cnt = count;
    int64_t* idx_w = idx;
    if (B * M * S == 0) return PCOPS_SUCCESS;
    if (!query || !idx || !count || !dist2 || (N > 0 && !ref)) return PCOPS_ERROR_INVALID_VALUE;
    const pcops_fpmode fpmode = pcops_fpmode_ieee(); /* cpu.h */
    if (dtype == PCOPS_FLOAT32)
        NEIGHBOR_DIST2_ROWS(float, f32);
    else
        NEIGHBOR_DIST2_ROWS(double, f64);
    pcops_fpmode_restore(fpmode);
    return PCOPS_SUCCESS;
}
