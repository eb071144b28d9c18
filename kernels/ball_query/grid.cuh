/*
 * ball_query/grid.cuh -- path "grid": the refs of each cloud binned into a uniform grid of cells
 * of at least half the radius on the device, the queries in cell order; a thread per query
 * visits the cells overlapping its ball and keeps the S smallest in-range indices.
 *
 * What it does: the stable build (grid/build_sorted.cuh: a radix sort, so the refs of a cell
 * stay in index order), then the queries' cell order (grid/build_counting.cuh, order_queries),
 * both on the device without host synchronisation (the cell budget C, one cell a ref, is the
 * plan's). One thread per query, the threads in the queries' cell order; ball_walk visits the
 * cells overlapping the ball -- a plane or a row beyond the radius skipped whole, a row's end
 * cells trimmed -- and keeps the S smallest in-range indices, in a sorted register list for
 * S <= 64 (IndexList), else in a max-heap in the output row, sorted at the end.
 *
 * When it wins: large clouds, above the pairs the split kernels handle well, and S > 64 on
 * clouds of more than about ten thousand refs (ball_query/plan.cuh).
 *
 * Invariants: the refs of a cell are in index order, so a cell is left as soon as its indices
 * pass the largest kept one; a cell is skipped only when the lower bound of its distance
 * (shrunk by PCOPS_GRID_SHRINK) is at least the radius: the same first S in index order as the
 * brute force.
 */
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "../grid.h"
#include "../grid/build_counting.cuh"
#include "../grid/build_sorted.cuh"
#include "common.cuh"

namespace {

// The cell edge of the grid: at least this times the radius (the scan of a cell stops at the
// first index above the list's largest; smaller cells load more starts than they skip refs).
// python benchmarks/tune.py ball_query: the grid rows, one build per value.
constexpr double kCellPerRadius = 0.5;

template <typename T>
__device__ __forceinline__ T grid_dist2(T qx, T qy, T qz, const Point4<T>& r) {
    return dist2(r.x, r.y, r.z, qx, qy, qz);
}

// Max-heap of indices in a query's output row.
__device__ __forceinline__ void index_heap_sift_down(int64_t* h, int64_t count, int64_t i,
                                                     int64_t n) {
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= count) break;
        int64_t hc = h[c];
        if (c + 1 < count) {
            const int64_t hr = h[c + 1];
            if (hr > hc) {
                ++c;
                hc = hr;
            }
        }
        if (hc <= n) break;
        h[i] = hc;
        i = c;
    }
    h[i] = n;
}

struct BallGridParams {
    const int64_t* query_lengths;
    int64_t B, M, C, S;
    const pcops_grid* grids;
    const int32_t* start;
    const int32_t* ids;
    const int32_t* order;  // [B * M] the query index of each sorted slot of its cloud
};

// The S smallest indices found so far, ascending, in registers (S <= K; the first K - S slots
// hold -1 and never move; empty slots INT_MAX).
template <int K>
struct IndexList {
    int32_t v[K];
    __device__ __forceinline__ void init(int64_t S) {
#pragma unroll
        for (int s = 0; s < K; ++s) v[s] = s < K - S ? -1 : INT_MAX;
    }
    __device__ __forceinline__ int64_t top() const { return v[K - 1] == INT_MAX ? LLONG_MAX : v[K - 1]; }
    __device__ __forceinline__ void offer(int32_t n) {  // n < v[K - 1], not in the list
        pcops_grid_cuda::insert_sorted(v, n);
    }
};

// The output row's max-heap (any S).
struct HeapIndexList {
    int64_t* out;
    int64_t S, found, topv;
    __device__ __forceinline__ int64_t top() const { return topv; }
    __device__ __forceinline__ void offer(int64_t n) {
        if (found < S) {  // push
            int64_t i = found;
            while (i > 0) {
                const int64_t par = (i - 1) / 2;
                const int64_t hp = out[par];
                if (hp >= n) break;
                out[i] = hp;
                i = par;
            }
            out[i] = n;
            if (++found == S) topv = out[0];
        } else {
            index_heap_sift_down(out, S, 0, n);
            topv = out[0];
        }
    }
};

// Visits the cells overlapping the ball of query q and offers its in-range refs to the list;
// a cell's refs are in index order, so a cell is left at the first index above the list's top.
// The bound of a cell is separable (gap_z^2 + gap_y^2 + gap_x^2): a plane or a row beyond the
// radius is skipped whole, a row's end cells beyond it are trimmed, and the cells left in a
// row are consecutive, so one cell's end is the next one's start.
template <typename T, typename List>
__device__ __forceinline__ void ball_walk(const BallGridParams& p, int64_t b, const pcops_grid& g,
                                          const Point4<T>* __restrict__ pts, T qx, T qy, T qz,
                                          T r2, double lim, T in, List& list) {
    const double q[3] = {qx, qy, qz};
    const double reach = sqrt((double)r2 / PCOPS_GRID_SHRINK) + g.margin;
    int32_t c0[3], c1[3];
    for (int a = 0; a < 3; ++a) {
        c0[a] = pcops_grid_coord(&g, a, q[a] - reach);
        c1[a] = pcops_grid_coord(&g, a, q[a] + reach);
    }
    const int32_t* start = p.start + b * p.C;
    for (int32_t cz = c0[2]; cz <= c1[2]; ++cz) {
        const double gz = pcops_grid_axis_gap(&g, 2, q[2], cz, cz);
        const double bz = gz * gz;
        if (bz * PCOPS_GRID_SHRINK >= lim) continue;
        for (int32_t cy = c0[1]; cy <= c1[1]; ++cy) {
            const double gy = pcops_grid_axis_gap(&g, 1, q[1], cy, cy);
            const double byz = bz + gy * gy;
            if (byz * PCOPS_GRID_SHRINK >= lim) continue;
            int32_t xa = c0[0], xb = c1[0];
            pcops_grid_cuda::trim_row<true>(&g, q[0], byz, lim, xa, xb);
            if (xa > xb) continue;
            const int64_t row = ((int64_t)cz * g.dims[1] + cy) * g.dims[0];
            int32_t j0 = start[row + xa];
            for (int32_t cx = xa; cx <= xb; ++cx) {
                const int32_t j1 = start[row + cx + 1];
                for (int32_t j = j0; j < j1; ++j) {
                    const int32_t n = p.ids[j];
                    if ((int64_t)n > list.top()) break;  // the rest of the cell is larger
                    if (grid_dist2(qx, qy, qz, pts[j]) <= in) list.offer(n);
                }
                j0 = j1;
            }
        }
    }
}

// Blocks of kThreads an SM should hold: float lists of up to 32 indices in 85 registers (three
// blocks an SM), not the 117-119 ptxas takes unasked (two); a few spilled bytes are cheaper than
// the lost occupancy.
template <typename T, int K>
struct GridMinBlocks {
    static constexpr int value = sizeof(T) == 4 && K >= 1 && K <= 32 ? 3 : 1;
};

// One thread per query (B * M threads), the queries in cell order; K > 0: S <= K, the list in
// registers; K = 0: a heap in the output row.
template <typename T, int K>
__global__ void __launch_bounds__(kThreads, GridMinBlocks<T, K>::value)
ball_query_grid_kernel(const T* __restrict__ query, BallGridParams p,
                       const Point4<T>* __restrict__ pts, T r2, double lim, T in,
                       int64_t* __restrict__ idx,
                       int64_t* __restrict__ count) {
    int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.B * p.M) return;
    const int64_t b = t / p.M;
    t = b * p.M + p.order[t];
    const int64_t m = t % p.M;
    int64_t* out = idx + t * p.S;
    const int64_t S = p.S;
    int64_t found = 0;
    const T qx = query[3 * t], qy = query[3 * t + 1], qz = query[3 * t + 2];
    const pcops_grid g = p.grids[b];
    const bool active = m < pcops_valid_length(p.query_lengths, b, p.M) && g.cells > 0 &&
                        pcops_grid_finite3(qx, qy, qz) && r2 > T(0);
    if constexpr (K > 0) {
        IndexList<K> list;
        list.init(S);
        if (active) ball_walk<T>(p, b, g, pts, qx, qy, qz, r2, lim, in, list);
        int64_t first = -1;
#pragma unroll
        for (int s = 0; s < K; ++s) {
            if (s >= K - S && list.v[s] != INT_MAX) {
                out[s - (K - S)] = list.v[s];
                if (found == 0) first = list.v[s];
                ++found;
            }
        }
        for (int64_t s = found; s < S; ++s) out[s] = first;
    } else {
        HeapIndexList list{out, S, 0, LLONG_MAX};
        if (active) ball_walk<T>(p, b, g, pts, qx, qy, qz, r2, lim, in, list);
        found = list.found;
        for (int64_t end = found - 1; end > 0; --end) {  // heapsort: ascending
            const int64_t n = out[end];
            out[end] = out[0];
            index_heap_sift_down(out, end, 0, n);
        }
        const int64_t fill = found > 0 ? out[0] : -1;
        for (int64_t s = found; s < S; ++s) out[s] = fill;
    }
    count[t] = found;
}

// ------------------------------------------------------------------------------------------
// kernel launchers

// The workspace of the grid path: the stable grid of the refs, then the counting-sort scratch
// of the query order (no refs) (a carver with base NULL only counts).
template <typename T>
void carve_ball_grid(pcops_carver* w, int64_t B, int64_t M, int64_t N, int64_t C,
                     pcops_grid_cuda::SortedScratch<T>* s, pcops_grid_cuda::CountScratch<T>* o) {
    pcops_grid_cuda::carve_sorted<T>(w, B, N, C, s);
    pcops_grid_cuda::carve_counting<T>(w, B, 0, M, C, o);
}

template <typename T>
cudaError_t launch_ball_query_grid(const pcops_ball_query_cuda_plan& plan, const T* query,
                                   const T* ref, const int64_t* query_lengths,
                                   const int64_t* ref_lengths, void* workspace, int64_t* idx,
                                   int64_t* count, cudaStream_t stream) {
    pcops_grid_cuda::SortedScratch<T> s;
    pcops_grid_cuda::CountScratch<T> o;
    pcops_carver w = pcops_carver_init(workspace);
    carve_ball_grid<T>(&w, plan.B, plan.M, plan.N, plan.cells, &s, &o);
    cudaError_t err =
        pcops_grid_cuda::build_sorted<T>(ref, ref_lengths, plan.B, plan.N, plan.cells,
                                         sqrt(plan.radius2) * kCellPerRadius, s, stream);
    if (err != cudaSuccess) return err;
    err = pcops_grid_cuda::order_queries<T>(query, query_lengths, plan.B, plan.M, plan.cells,
                                            s.grids, o, stream);
    if (err != cudaSuccess) return err;
    BallGridParams p{query_lengths, plan.B, plan.M, plan.cells, plan.S, s.grids, s.start,
                     s.vals_out, o.order};
    const int64_t blocks = (plan.B * plan.M + kThreads - 1) / kThreads;
    if (blocks > INT_MAX) return cudaErrorInvalidValue;
    const unsigned g = (unsigned)blocks;
    const int64_t S = plan.S;
    const T r2 = (T)plan.radius2;
    // the cells' limit (a cell is skipped when its bound >= lim: pcops_grid_ball_limit) and the
    // refs' (d <= in: ball_limit), the overflow rule's, as kernel arguments
    const double lim = pcops_grid_ball_limit((double)r2);
    const T in = ball_limit(r2);
    if (S <= 8)
        ball_query_grid_kernel<T, 8>
            <<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, lim, in, idx, count);
    else if (S <= 16)
        ball_query_grid_kernel<T, 16>
            <<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, lim, in, idx, count);
    else if (S <= 32)
        ball_query_grid_kernel<T, 32>
            <<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, lim, in, idx, count);
    else if (S <= 64)
        ball_query_grid_kernel<T, 64>
            <<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, lim, in, idx, count);
    else
        ball_query_grid_kernel<T, 0>
            <<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, lim, in, idx, count);
    return cudaGetLastError();
}

template <>
struct BallQueryPath<PCOPS_BALL_QUERY_GRID> {
    static constexpr bool kGrid = true;
    static bool takes(const BallQuerySizes&) { return true; }
    template <typename T>
    static cudaError_t launch(const pcops_ball_query_cuda_plan& plan, const BallQueryArgs<T>& a) {
        if (a.workspace == nullptr) return cudaErrorInvalidValue;
        return launch_ball_query_grid<T>(plan, a.query, a.ref, a.query_lengths, a.ref_lengths,
                                         a.workspace, a.idx, a.count, a.stream);
    }
};

}  // namespace
