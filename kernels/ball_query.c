/*
 * ball_query.c -- ball query on the CPU.
 *
 * B = batch, M = queries, N = reference points, S = nsample.
 * query[B,M,3], ref[B,N,3] -> idx[B,M,S] (int64), count[B,M] (int64).
 *
 * For each valid query (m < query_lengths[b]) the first S valid refs (n < ref_lengths[b]) in
 * index order whose squared distance d = (dx*dx + dy*dy) + dz*dz is < (T)radius2. Slots past
 * the number found repeat the first neighbour, so that grouping needs no mask; a query with
 * no neighbour, and every invalid query, gets -1 in every slot and count 0.
 *
 * Work sharing: OpenMP over the B*M queries (dynamic chunks: early exits make the work per
 * query uneven); calls of fewer than BQ_PARALLEL_MIN_PAIRS pairs stay on one thread. A query
 * scans its cloud in blocks of BQ_BLOCK refs: one vectorised pass computes the block's hits
 * and whether there is any, then, only for a block with a hit, a scalar pass appends the hits
 * in index order and stops as soon as S are found.
 */
#include "common.h"
#include "pcops.h"

/* Refs per block of the scan: the granularity of the early exit. */
#define BQ_BLOCK 64
/* Below this many (query, ref) pairs a call runs on one thread. */
#define BQ_PARALLEL_MIN_PAIRS 65536.0

#define T float
#define FN(name) name##_f32
#include "ball_query_cpu.inc"
#undef T
#undef FN

#define T double
#define FN(name) name##_f64
#include "ball_query_cpu.inc"
#undef T
#undef FN

pcops_status pcops_ball_query_cpu(pcops_dtype dtype, const void* query, const void* ref,
                                  const int64_t* query_lengths, const int64_t* ref_lengths,
                                  int64_t B, int64_t M, int64_t N, double radius2, int64_t S,
                                  int64_t* idx, int64_t* count) {
    if (B < 0 || M < 0 || N < 0 || S < 1) return PCOPS_ERROR_INVALID_VALUE;
    if (B == 0 || M == 0) return PCOPS_SUCCESS;
    if (!idx || !count || !query || (N > 0 && !ref)) return PCOPS_ERROR_INVALID_VALUE;
    switch (dtype) {
        case PCOPS_FLOAT32:
            ball_query_batch_f32((const float*)query, (const float*)ref, query_lengths,
                                 ref_lengths, B, M, N, (float)radius2, S, idx, count);
            return PCOPS_SUCCESS;
        case PCOPS_FLOAT64:
            ball_query_batch_f64((const double*)query, (const double*)ref, query_lengths,
                                 ref_lengths, B, M, N, radius2, S, idx, count);
            return PCOPS_SUCCESS;
        default:
            return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    }
}
