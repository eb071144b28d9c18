/*
 * neighbor_edges.c -- neighbour lists to COO edges, on the CPU (torch_cluster's radius / knn
 * return their neighbours as edge_index [2, E]).
 *
 * B = batch, M = queries per cloud, N = reference points per cloud, S = slots per query.
 *
 *   idx[B,M,S] int64, count[B,M]? -> edges[2,E] int64: one edge per slot (b,m,s) with
 *   0 <= idx[b,m,s] < N and, when count is given, s < count[b,m]; in (b,m,s) order;
 *   row = row_offset[b] + m (default b*M + m), col = col_offset[b] + idx (default b*N + idx).
 *
 * Two passes, since E sizes the output: pcops_neighbor_edges_count_cpu writes ends[r], the
 * number of edges of the rows r' <= r (r = b*M + m; E = ends[B*M - 1]); the caller allocates
 * edges, then pcops_neighbor_edges_write_cpu writes row r's edges from ends[r] - its count on.
 *
 * Work sharing: OpenMP over the rows (each row's edges go to its own range); the prefix sum
 * of the counts is serial. Small calls run on one thread.
 */
#include "cpu.h"
#include "pcops.h"

/* Below this many slots a call runs on one thread. */
#define NEIGHBOR_EDGES_PARALLEL_MIN 65536.0

/* Whether slot s of row r is an edge. */
static inline int edge_slot(const int64_t* PCOPS_RESTRICT idx, const int64_t* count, int64_t r,
                            int64_t s, int64_t N, int64_t S) {
    const int64_t n = idx[r * S + s];
    return n >= 0 && n < N && (!count || s < count[r]);
}

pcops_status pcops_neighbor_edges_count_cpu(const int64_t* idx, const int64_t* count, int64_t B,
                                            int64_t M, int64_t N, int64_t S, int64_t* ends) {
    if (B < 0 || M < 0 || N < 0 || S < 0) return PCOPS_ERROR_INVALID_VALUE;
    const int64_t R = B * M;
    if (R == 0) return PCOPS_SUCCESS;
    if (!ends || (S > 0 && !idx)) return PCOPS_ERROR_INVALID_VALUE;
    const int parallel = (double)R * (double)S >= NEIGHBOR_EDGES_PARALLEL_MIN;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < R; ++r) {
        int64_t c = 0;
        for (int64_t s = 0; s < S; ++s) c += edge_slot(idx, count, r, s, N, S);
        ends[r] = c;
    }
    for (int64_t r = 1; r < R; ++r) ends[r] += ends[r - 1];
    return PCOPS_SUCCESS;
}

pcops_status pcops_neighbor_edges_write_cpu(const int64_t* idx, const int64_t* count,
                                            const int64_t* row_offset, const int64_t* col_offset,
                                            int64_t B, int64_t M, int64_t N, int64_t S,
                                            const int64_t* ends, int64_t* edges) {
    if (B < 0 || M < 0 || N < 0 || S < 0) return PCOPS_ERROR_INVALID_VALUE;
    const int64_t R = B * M;
    if (R == 0) return PCOPS_SUCCESS;
    if (!ends) return PCOPS_ERROR_INVALID_VALUE;
    const int64_t E = ends[R - 1];
    if (E == 0) return PCOPS_SUCCESS;
    if (!idx || !edges) return PCOPS_ERROR_INVALID_VALUE;
    int64_t* PCOPS_RESTRICT rows = edges;
    int64_t* PCOPS_RESTRICT cols = edges + E;
    const int parallel = (double)R * (double)S >= NEIGHBOR_EDGES_PARALLEL_MIN;
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < R; ++r) {
        const int64_t b = r / M, m = r - b * M;
        const int64_t row = (row_offset ? row_offset[b] : b * M) + m;
        const int64_t col0 = col_offset ? col_offset[b] : b * N;
        int64_t e = r > 0 ? ends[r - 1] : 0;
        for (int64_t s = 0; s < S && e < ends[r]; ++s) {
            if (!edge_slot(idx, count, r, s, N, S)) continue;
            rows[e] = row;
            cols[e] = col0 + idx[r * S + s];
            ++e;
        }
    }
    return PCOPS_SUCCESS;
}
