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

/* The CPU plan. Eligibility: the brute force takes every input; the grid path needs cloud
 * indices that fit int32. Preference (AUTO): the grid for clouds of at least BQ_GRID_MIN_N
 * refs, the brute force below. The grid's cells have an edge of at least the radius times
 * BQ_GRID_CELL_PER_RADIUS, at most BQ_GRID_CELLS_PER_REF cells a ref. Each constant is
 * re-measured by the command on its line (one build per value for the cells): */
#define BQ_GRID_MIN_N 512            /* python benchmarks/tune.py ball_query --device cpu */
#define BQ_GRID_CELL_PER_RADIUS 1.0  /* python benchmarks/tune.py ball_query --device cpu */
#define BQ_GRID_CELLS_PER_REF 1.0    /* python benchmarks/tune.py ball_query --device cpu */

/* The path that runs for a requested one (*path: BRUTE or GRID): AUTO by size; a forced path
 * that is not a CPU path or cannot take the sizes is PCOPS_ERROR_INVALID_VALUE, never a
 * substitute. */
static pcops_status ball_query_cpu_plan(int64_t M, int64_t N, pcops_ball_query_path requested,
                                        pcops_ball_query_path* path) {
    const int grid_takes = N <= INT32_MAX - 1 && M <= INT32_MAX - 1;
    switch (requested) {
        case PCOPS_BALL_QUERY_AUTO:
            *path = grid_takes && N >= BQ_GRID_MIN_N ? PCOPS_BALL_QUERY_GRID
                                                     : PCOPS_BALL_QUERY_BRUTE;
            return PCOPS_SUCCESS;
        case PCOPS_BALL_QUERY_BRUTE:
            *path = PCOPS_BALL_QUERY_BRUTE;
            return PCOPS_SUCCESS;
        case PCOPS_BALL_QUERY_GRID:
            *path = PCOPS_BALL_QUERY_GRID;
            return grid_takes ? PCOPS_SUCCESS : PCOPS_ERROR_INVALID_VALUE;
        default:
            return PCOPS_ERROR_INVALID_VALUE;
    }
}

size_t pcops_ball_query_cpu_workspace_bytes(pcops_dtype dtype, int64_t B, int64_t M, int64_t N,
                                            double radius2, int64_t S,
                                            pcops_ball_query_path requested) {
    (void)radius2;
    pcops_ball_query_path path;
    if (B <= 0 || M <= 0 || N < 0 || S < 1) return 0;
    if (ball_query_cpu_plan(M, N, requested, &path) != PCOPS_SUCCESS ||
        path != PCOPS_BALL_QUERY_GRID)
        return 0;
    /* the grids and the query order, carved by ball_query_cpu.inc with the same function */
    pcops_grid_scratch s;
    pcops_carver w = pcops_carver_init(NULL);
    pcops_grid_carve(&w, B, M, N, pcops_grid_budget(N, BQ_GRID_CELLS_PER_REF),
                     pcops_dtype_size(dtype), &s);
    return pcops_carver_bytes(&w);
}

pcops_status pcops_ball_query_cpu_path(pcops_dtype dtype, const void* query, const void* ref,
                                          const int64_t* query_lengths,
                                          const int64_t* ref_lengths, int64_t B, int64_t M,
                                          int64_t N, double radius2, int64_t S,
                                          pcops_ball_query_path requested, void* workspace,
                                          int64_t* idx, int64_t* count) {
    pcops_ball_query_path path;
    const pcops_status planned = ball_query_cpu_plan(M, N, requested, &path);
    if (planned != PCOPS_SUCCESS) return planned;
    if (path != PCOPS_BALL_QUERY_GRID || B <= 0 || M <= 0 || S < 1)
        return pcops_ball_query_cpu(dtype, query, ref, query_lengths, ref_lengths, B, M, N,
                                    radius2, S, idx, count);
    if (N < 0) return PCOPS_ERROR_INVALID_VALUE;
    if (!idx || !count || !query || !workspace || (N > 0 && !ref))
        return PCOPS_ERROR_INVALID_VALUE;
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return PCOPS_ERROR_UNSUPPORTED_DTYPE;
    const int64_t budget = pcops_grid_budget(N, BQ_GRID_CELLS_PER_REF);
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
