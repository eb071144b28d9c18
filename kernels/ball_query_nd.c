/*
 * ball_query_nd.c -- ball query in any dimension D on the CPU (kernels/pcops.h,
 * pcops_ball_query_nd_cpu): query[B,M,D], ref[B,N,D] -> idx[B,M,S], count[B,M] and, in
 * ball_query_dist2's layout, dist2[B,M,S]; the CUDA kernel of kernels/ball_query_nd.cu returns
 * the same bits.
 *
 * The brute force of ball_query.c for D coordinates: a query scans the valid refs of its cloud
 * in index order and keeps the first S whose squared distance (knn_nd.h, knn_nd_l2: coordinate
 * order, no FMA; for D = 3 the bits of pcops_dist2) is < (T)radius2, stopping at the S-th.
 * The overflow rule (geometry.h, knn_nd_ruled): a finite pair's distance saturates at the
 * type's max (inside only when (T)radius2 is +inf), a non-finite point is never inside; the
 * coordinates are looked at only for a sum that is not <= max.
 *
 * Work sharing: OpenMP over the B*M queries (dynamic chunks: the early exit makes the work
 * uneven); small calls stay on one thread.
 */
#include <math.h>

#include "cpu.h"
#include "knn_nd.h"
#include "pcops.h"

/* Below this many (query, ref, coordinate) terms a call runs on one thread. */
#define BQ_ND_PARALLEL_MIN_TERMS 65536.0

#define PCOPS_CPU_TEMPLATE "ball_query_nd_cpu.inc"
#include "float_types_cpu.inc"

pcops_status pcops_ball_query_nd_cpu(pcops_dtype dtype, const void* query, const void* ref,
                                     const int64_t* query_lengths, const int64_t* ref_lengths,
                                     int64_t B, int64_t M, int64_t N, int64_t D, double radius2,
                                     int64_t S, int64_t* idx, int64_t* count, void* dist2) {
    if (B < 0 || M < 0 || N < 0 || D < 1 || S < 1) return PCOPS_ERROR_INVALID_VALUE;
    if (B == 0 || M == 0) return PCOPS_SUCCESS;
    if (!idx || !count || !query || (N > 0 && !ref)) return PCOPS_ERROR_INVALID_VALUE;
    switch (dtype) {
        case PCOPS_FLOAT32:
            ball_query_nd_batch_f32((const float*)query, (const float*)ref, query_lengths,
                                    ref_lengths, B, M, N, D, (float)radius2, S, idx, count,
                                    (float*)dist2);
            return PCOPS_SUCCESS;
        case PCOPS_FLOAT64:
            ball_query_nd_batch_f64((const double*)query, (const double*)ref, query_lengths,
                                    ref_lengths, B, M, N, D, radius2, S, idx, count,
                                    (double*)dist2);
            return PCOPS_SUCCESS;
        default:
            return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    }
}
