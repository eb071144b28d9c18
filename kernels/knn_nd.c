/*
 * knn_nd.c -- k nearest neighbours in any dimension D on the CPU (kernels/pcops.h,
 * pcops_knn_nd_cpu): query[B,M,D], ref[B,N,D] -> dist[B,M,K], idx[B,M,K] (int64), for the
 * metrics L2 (squared), L1 and COSINE (kernels/knn_nd.h: the distance of a pair, the same bits
 * as the CUDA kernel of kernels/knn_nd.cu).
 *
 * Brute force. The refs of a cloud are visited in tiles of KNN_ND_TILE refs, and a tile's
 * coordinates in slices of KNN_ND_DSLICE coordinates: a slice is transposed once into a
 * buffer on the stack (coordinate-major, so the loop over the tile's refs vectorises) and
 * serves a block of up to KNN_ND_QBLOCK queries, each of which carries its tile's partial sums
 * from slice to slice. Every ref's sum thus runs over d = 0 .. D-1 in order whatever D is, and
 * the stack holds at most one slice (32 KiB for float64) and the partial sums, for any D.
 *
 * Distances follow geometry.h's overflow rule (knn_nd.h, knn_nd_ruled): a pair of finite
 * points never gets +inf (an overflow saturates at the type's largest value), a point with a
 * non-finite coordinate is never a neighbour. A query's finiteness is looked at once; a ref's
 * once per tile for the cosine, and for L2 / L1 only where a sum is above the maximum.
 *
 * After the last slice of a tile the query's distances go, in ref index order, into its
 * selection list, which lives in its output rows (no workspace): a sorted list with insertion
 * while at most KNN_ND_SORTED_MAX neighbours are kept, geometry.h's max-heap on (dist, idx)
 * above, heapsorted at the end. A ref enters only when its distance is strictly below the
 * current K-th (the list's last entry or the heap's root, +inf until full), so a ruled-out
 * ref (+inf) never enters and a later ref never displaces an equal earlier one: the result
 * is the K smallest keys (dist, idx), the CUDA kernel's.
 *
 * Work sharing: OpenMP over (cloud, block of queries), schedule(dynamic); every thread runs its
 * share in IEEE mode (cpu.h, pcops_fpmode_ieee).
 */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu.h"
#include "knn_nd.h"
#include "pcops.h"

/* Refs per tile: the width of the vectorised loop, and of the partial sums of a query. */
#define KNN_ND_TILE 64
/* Coordinates per slice: a slice of the tile (KNN_ND_TILE x KNN_ND_DSLICE) stays in L1. */
#define KNN_ND_DSLICE 64
/* Queries sharing one transposed slice. */
#define KNN_ND_QBLOCK 16
/* Kept neighbours up to which a sorted list with insertion is used; a heap above. */
#define KNN_ND_SORTED_MAX 32

/* Queries per block: qblock, halved (down to 1) while there are too few blocks to keep every
 * thread busy. */
static int64_t knn_nd_query_block(int64_t B, int64_t M, int64_t qblock) {
#ifdef _OPENMP
    const int64_t threads = omp_get_max_threads();
#else
    const int64_t threads = 1;
#endif
    while (qblock > 1 && B * ((M + qblock - 1) / qblock) < 4 * threads) qblock /= 2;
    return qblock;
}

#define PCOPS_CPU_TEMPLATE "knn_nd_cpu.inc"
#include "float_types_cpu.inc"

#include "knn_nd_blocked_cpu.inc"

/* The CPU plan of kNN in any dimension. Eligibility: the brute force takes every input; the
 * blocked path (knn_nd_blocked_cpu.inc) float32 L2 with N < 2^32, where it is built. Preference: the blocked
 * path from D = KNN_NDB_MIN_D, where its register blocking beats the brute force's loop. A
 * forced path that cannot take the inputs is PCOPS_ERROR_INVALID_VALUE, never a substitute. */
/* Smallest D at which AUTO takes the blocked path (python benchmarks/tune.py knn --device cpu). */
#define KNN_NDB_MIN_D 2
static pcops_status knn_nd_cpu_plan(pcops_dtype dtype, int64_t N, int64_t D,
                                    pcops_knn_metric metric, pcops_knn_path requested,
                                    pcops_knn_path* path) {
#ifdef KNN_NDB_BUILT
    /* its lists hold packed keys: ref indices below 2^32 */
    const int blocked_takes =
        dtype == PCOPS_FLOAT32 && metric == PCOPS_KNN_L2 && N <= (int64_t)UINT32_MAX;
#else
    const int blocked_takes = 0;
#endif
    switch (requested) {
        case PCOPS_KNN_AUTO:
            *path = blocked_takes && D >= KNN_NDB_MIN_D ? PCOPS_KNN_BRUTE_BLOCKED
                                                        : PCOPS_KNN_BRUTE;
            return PCOPS_SUCCESS;
        case PCOPS_KNN_BRUTE:
            *path = PCOPS_KNN_BRUTE;
            return PCOPS_SUCCESS;
        case PCOPS_KNN_BRUTE_BLOCKED:
            *path = requested;
            return blocked_takes ? PCOPS_SUCCESS : PCOPS_ERROR_INVALID_VALUE;
        default:
            return PCOPS_ERROR_INVALID_VALUE;
    }
}

pcops_status pcops_knn_nd_cpu(pcops_dtype dtype, const void* query, const void* ref,
                              const int64_t* query_lengths, const int64_t* ref_lengths,
                              int64_t B, int64_t M, int64_t N, int64_t D, int64_t K,
                              pcops_knn_metric metric, pcops_knn_path requested, void* dist,
                              int64_t* idx) {
    if (B < 0 || M < 0 || N < 0 || D < 1 || K < 1) return PCOPS_ERROR_INVALID_VALUE;
    if (metric != PCOPS_KNN_L2 && metric != PCOPS_KNN_L1 && metric != PCOPS_KNN_COSINE)
        return PCOPS_ERROR_INVALID_VALUE;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    pcops_knn_path path;
    const pcops_status planned = knn_nd_cpu_plan(dtype, N, D, metric, requested, &path);
    if (planned != PCOPS_SUCCESS) return planned;
    if (B == 0 || M == 0) return PCOPS_SUCCESS;
    if (!query || !dist || !idx || (N > 0 && !ref)) return PCOPS_ERROR_INVALID_VALUE;
#ifdef KNN_NDB_BUILT
    if (path == PCOPS_KNN_BRUTE_BLOCKED) {
        knn_ndb_batch((const float*)query, (const float*)ref, query_lengths, ref_lengths, B, M,
                      N, D, K, (float*)dist, idx);
        return PCOPS_SUCCESS;
    }
#endif
    if (dtype == PCOPS_FLOAT32)
        knn_nd_batch_f32((const float*)query, (const float*)ref, query_lengths, ref_lengths, B,
                         M, N, D, K, metric, (float*)dist, idx);
    else
        knn_nd_batch_f64((const double*)query, (const double*)ref, query_lengths, ref_lengths,
                         B, M, N, D, K, metric, (double*)dist, idx);
    return PCOPS_SUCCESS;
}
