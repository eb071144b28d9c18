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
 *
 * The grid path (pcops_ball_query_cpu_path; grid_cpu.inc, grid.h): cells of at least the
 * radius; a query visits the cells overlapping its ball and keeps the S smallest in-range
 * indices in a max-heap (the refs of a cell are in index order: a cell is left once its
 * indices pass the heap's largest), sorted at the end: the brute force's result, bit for bit.
 */
#include <math.h>

#include "cpu.h"
#include "grid.h"
#include "pcops.h"

/* Refs per block of the scan: the granularity of the early exit. */
#define BQ_BLOCK 64
/* Below this many (query, ref) pairs a call runs on one thread. */
#define BQ_PARALLEL_MIN_PAIRS 65536.0

/* The grid path keeps the S smallest indices of the in-range refs in a max-heap. */
static inline void bq_heap_push(int64_t* PCOPS_RESTRICT h, int64_t count, int64_t n) {
    int64_t i = count;
    while (i > 0) {
        const int64_t p = (i - 1) / 2;
        if (h[p] >= n) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = n;
}

static inline void bq_heap_sift_down(int64_t* PCOPS_RESTRICT h, int64_t count, int64_t i,
                                     int64_t n) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= count) break;
        if (c + 1 < count && h[c + 1] > h[c]) ++c;
        if (h[c] <= n) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = n;
}

#define T float
#define FN(name) name##_f32
#include "grid_cpu.inc"
#include "ball_query_cpu.inc"
#undef T
#undef FN

#define T double
#define FN(name) name##_f64
#include "grid_cpu.inc"
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
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    /* (float)radius2 is rounded here, in the caller's thread: in IEEE mode (cpu.h) */
    const pcops_fpmode fpmode = pcops_fpmode_ieee();
    if (dtype == PCOPS_FLOAT32)
        ball_query_batch_f32((const float*)query, (const float*)ref, query_lengths, ref_lengths,
                             B, M, N, (float)radius2, S, idx, count);
    else
        ball_query_batch_f64((const double*)query, (const double*)ref, query_lengths,
                             ref_lengths, B, M, N, radius2, S, idx, count);
    pcops_fpmode_restore(fpmode);
    return PCOPS_SUCCESS;
}

/* The grid path: cells of an edge of at least the radius times BQ_GRID_CELL_PER_RADIUS, at
 * most one cell per ref. The selector takes the grid from BQ_GRID_MIN_N refs per cloud. */
#define BQ_GRID_CELL_PER_RADIUS 1.0
#define BQ_GRID_MIN_N 512

static pcops_ball_query_path ball_query_cpu_resolve(int64_t M, int64_t N,
                                                   pcops_ball_query_path variant) {
    if (N > INT32_MAX - 1 || M > INT32_MAX - 1) return PCOPS_BALL_QUERY_BRUTE;
    if (variant == PCOPS_BALL_QUERY_GRID) return PCOPS_BALL_QUERY_GRID;
    if (variant != PCOPS_BALL_QUERY_AUTO) return PCOPS_BALL_QUERY_BRUTE;
    return N >= BQ_GRID_MIN_N ? PCOPS_BALL_QUERY_GRID : PCOPS_BALL_QUERY_BRUTE;
}

size_t pcops_ball_query_cpu_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                            double radius2, int64_t S,
                                            pcops_ball_query_path variant) {
    (void)radius2;
    if (B <= 0 || M <= 0 || N < 0 || S < 1) return 0;
    if (ball_query_cpu_resolve(M, N, variant) != PCOPS_BALL_QUERY_GRID) return 0;
    const int64_t budget = pcops_grid_budget(N, 1.0);
    /* the grids, then the query order (kernels/ball_query_cpu.inc) */
    return pcops_grid_carve(NULL, B, N, budget, pcops_dtype_size(dtype), NULL) +
           (size_t)(2 * B * M + B * (budget + 2)) * sizeof(int32_t);
}

pcops_status pcops_ball_query_cpu_path(pcops_dtype dtype, const void* query, const void* ref,
                                          const int64_t* query_lengths,
                                          const int64_t* ref_lengths, int64_t B, int64_t M,
                                          int64_t N, double radius2, int64_t S,
                                          pcops_ball_query_path variant, void* workspace,
                                          int64_t* idx, int64_t* count) {
    if (ball_query_cpu_resolve(M, N, variant) != PCOPS_BALL_QUERY_GRID || B <= 0 || M <= 0 || S < 1)
        return pcops_ball_query_cpu(dtype, query, ref, query_lengths, ref_lengths, B, M, N,
                                    radius2, S, idx, count);
    if (N < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (!idx || !count || !query || !workspace || (N > 0 && !ref))
        return PCOPS_ERROR_INVALID_VALUE;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    const int64_t budget = pcops_grid_budget(N, 1.0);
    const pcops_fpmode fpmode = pcops_fpmode_ieee(); /* cpu.h; (float)radius2 below */
    const double min_cell = sqrt(radius2) * BQ_GRID_CELL_PER_RADIUS;
    if (dtype == PCOPS_FLOAT32)
        ball_query_grid_batch_f32((const float*)query, (const float*)ref, query_lengths,
                                  ref_lengths, B, M, N, (float)radius2, S, budget, min_cell,
                                  workspace, idx, count);
    else
        ball_query_grid_batch_f64((const double*)query, (const double*)ref, query_lengths,
                                  ref_lengths, B, M, N, radius2, S, budget, min_cell, workspace,
                                  idx, count);
    pcops_fpmode_restore(fpmode);
    return PCOPS_SUCCESS;
}
