/*
 * ball_query.cu -- ball query on CUDA.
 *
 * B = batch, M = queries, N = reference points, S = nsample.
 * query[B,M,3], ref[B,N,3] -> idx[B,M,S] (int64), count[B,M] (int64).
 *
 * Same contract and arithmetic as ball_query.c: the first S valid refs in index order with
 * d = pcops_dist2(ref, query) < (T)radius2 (geometry.h: no FMA contraction), empty slots
 * repeating the first neighbour, -1 everywhere (count 0) for a query with no neighbour and for
 * an invalid query. CPU and CUDA return the same indices.
 *
 * Work distribution: a warp per query, a block of WARPS warps per WARPS consecutive queries of
 * one cloud. The block walks its cloud in tiles of THREADS refs, staged in shared memory (one
 * ref per thread, structure of arrays) so the refs are read from L2 once per block rather than
 * once per query. Each warp scans the tile 32 refs at a time: lane j tests ref j, a
 * __ballot_sync gathers the hits, and each hit's slot is the warp's count so far plus the
 * number of hits in lower lanes (popc of the ballot under the lane mask): hits are appended in
 * index order. A warp stops when it has S; the block stops loading tiles once no warp is left
 * scanning (__syncthreads_or), so a dense ball costs a tile or two, not the whole cloud.
 * Warp per query (rather than thread per query) keeps the GPU busy when there are few queries
 * and many refs (a single large scan becomes N/32 steps) and makes the early exit of a query
 * exact to 32 refs.
 *
 * The grid path (ball_query_grid_kernel; kernels/grid.h, grid_cuda.cuh): the refs of each cloud
 * binned into a uniform grid of cells of at least half the radius on the device (a
 * stable sort: index order inside a cell), the queries in cell order (a counting sort); one
 * thread per query visits the cells overlapping its ball and keeps the S smallest in-range
 * indices, in a sorted register list for S <= 64, else in a max-heap in its output row sorted
 * at the end (the refs of a cell are in index order, so a cell is left as soon as its indices
 * pass the largest kept one): the same first S in index order. The path is chosen by a plan
 * (pcops_ball_query_cuda_plan_make).
 */
#include <climits>
#include <cstdint>
#include <cstdlib>

#include "common.h"
#include "grid.h"
#include "grid_cuda.cuh"
#include "pcops.h"

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;  // also the tile length in refs
constexpr unsigned kFullMask = 0xffffffffu;

// geometry.h's squared distance (a - b, the CPU's bits), by type.
__device__ __forceinline__ float dist2(float ax, float ay, float az, float bx, float by, float bz) {
    return pcops_dist2_f32(ax, ay, az, bx, by, bz);
}
__device__ __forceinline__ double dist2(double ax, double ay, double az, double bx, double by,
                                        double bz) {
    return pcops_dist2_f64(ax, ay, az, bx, by, bz);
}

// ------------------------------------------------------------------------------------------
// CUDA kernels

template <typename T>
__global__ void __launch_bounds__(kThreads)
ball_query_kernel(const T* __restrict__ query, const T* __restrict__ ref,
                  const int64_t* __restrict__ query_lengths,
                  const int64_t* __restrict__ ref_lengths,
                  int64_t M, int64_t N, T radius2, int64_t S, int64_t blocks_per_cloud,
                  int64_t num_blocks, int64_t* __restrict__ idx, int64_t* __restrict__ count) {
    __shared__ T tile_x[kThreads], tile_y[kThreads], tile_z[kThreads];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const unsigned lower_lanes = (1u << lane) - 1u;

    // Grid-stride over blocks of queries; every branch below that contains a barrier depends
    // only on the block's cloud (b, L_ref) or on a block-wide vote, so all threads reach it.
    for (int64_t blk = blockIdx.x; blk < num_blocks; blk += gridDim.x) {
        const int64_t b = blk / blocks_per_cloud;
        const int64_t m = (blk - b * blocks_per_cloud) * kWarps + warp;
        const int64_t L_query = pcops_valid_length(query_lengths, b, M);
        const int64_t L_ref = pcops_valid_length(ref_lengths, b, N);
        const T* cloud = ref + b * N * 3;
        const bool in_range = m < M;  // a warp past the last query writes nothing
        bool scanning = in_range && m < L_query;
        T qx = T(0), qy = T(0), qz = T(0);
        if (scanning) {
            const T* q = query + (b * M + m) * 3;
            qx = q[0];
            qy = q[1];
            qz = q[2];
        }
        int64_t* out = idx + (b * M + m) * S;
        int64_t found = 0;     // warp-uniform
        int64_t first = -1;    // warp-uniform: the first neighbour, for the fill

        for (int64_t t0 = 0; t0 < L_ref; t0 += kThreads) {
            // Barrier: the previous tile is no longer read by anyone, and the block votes.
            if (!__syncthreads_or(scanning)) break;
            const int64_t n = t0 + threadIdx.x;
            if (n < L_ref) {
                tile_x[threadIdx.x] = cloud[3 * n + 0];
                tile_y[threadIdx.x] = cloud[3 * n + 1];
                tile_z[threadIdx.x] = cloud[3 * n + 2];
            }
            __syncthreads();
            if (!scanning) continue;
            const int tile_len = (int)(L_ref - t0 < kThreads ? L_ref - t0 : kThreads);
            for (int c = 0; c < tile_len; c += 32) {
                const int j = c + lane;
                bool hit = false;
                if (j < tile_len) {  // only entries written for this tile are read
                    const T d = dist2(tile_x[j], tile_y[j], tile_z[j], qx, qy, qz);
                    hit = d < radius2;                         // NaN is never a neighbour
                }
                const unsigned ballot = __ballot_sync(kFullMask, hit);
                if (ballot == 0u) continue;
                if (first < 0) first = t0 + c + (__ffs(ballot) - 1);
                if (hit) {
                    const int64_t slot = found + __popc(ballot & lower_lanes);
                    if (slot < S) out[slot] = t0 + j;
                }
                found += __popc(ballot);
                if (found >= S) {
                    found = S;
                    scanning = false;
                    break;
                }
            }
        }
        if (in_range) {
            for (int64_t s = found + lane; s < S; s += 32) out[s] = first;  // -1 if none
            if (lane == 0) count[b * M + m] = found;
        }
    }
}

// ------------------------------------------------------------------------------------------
// kernel launchers

template <typename T>
cudaError_t launch_ball_query(const T* query, const T* ref, const int64_t* query_lengths,
                              const int64_t* ref_lengths, int64_t B, int64_t M, int64_t N,
                              double radius2, int64_t S, int64_t* idx, int64_t* count,
                              cudaStream_t stream) {
    const int64_t blocks_per_cloud = (M + kWarps - 1) / kWarps;
    const int64_t num_blocks = B * blocks_per_cloud;
    const unsigned grid = (unsigned)(num_blocks < INT_MAX ? num_blocks : INT_MAX);
    ball_query_kernel<T><<<grid, kThreads, 0, stream>>>(query, ref, query_lengths, ref_lengths,
                                                        M, N, (T)radius2, S, blocks_per_cloud,
                                                        num_blocks, idx, count);
    return cudaGetLastError();
}

// ------------------------------------------------------------------------------------------
// the grid path

using pcops_grid_cuda::Point4;

__device__ __forceinline__ double sq(double x) { return x * x; }

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
                                          T r2, List& list) {
    const double q[3] = {qx, qy, qz};
    const double reach = sqrt((double)r2 / PCOPS_GRID_SHRINK) + g.margin;
    const double lim = (double)r2;
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
            while (xa <= xb && (byz + sq(pcops_grid_axis_gap(&g, 0, q[0], xa, xa))) *
                                       PCOPS_GRID_SHRINK >= lim)
                ++xa;
            while (xb > xa && (byz + sq(pcops_grid_axis_gap(&g, 0, q[0], xb, xb))) *
                                      PCOPS_GRID_SHRINK >= lim)
                --xb;
            if (xa > xb) continue;
            const int64_t row = ((int64_t)cz * g.dims[1] + cy) * g.dims[0];
            int32_t j0 = start[row + xa];
            for (int32_t cx = xa; cx <= xb; ++cx) {
                const int32_t j1 = start[row + cx + 1];
                for (int32_t j = j0; j < j1; ++j) {
                    const int32_t n = p.ids[j];
                    if ((int64_t)n > list.top()) break;  // the rest of the cell is larger
                    if (grid_dist2(qx, qy, qz, pts[j]) < r2) list.offer(n);
                }
                j0 = j1;
            }
        }
    }
}

// Blocks of kThreads an SM should hold: float lists of up to 32 indices in 85 registers (three
// blocks an SM), not the 117-119 ptxas takes unasked (two): H100, Q3 (1e5 queries, one wave of
// blocks either way), 1.07 -> 0.94 ms with cells of r / 3 (a few spilled bytes included).
template <typename T, int K>
struct GridMinBlocks {
    static constexpr int value = sizeof(T) == 4 && K >= 1 && K <= 32 ? 3 : 1;
};

// One thread per query (B * M threads), the queries in cell order; K > 0: S <= K, the list in
// registers; K = 0: a heap in the output row.
template <typename T, int K>
__global__ void __launch_bounds__(kThreads, GridMinBlocks<T, K>::value)
ball_query_grid_kernel(const T* __restrict__ query, BallGridParams p,
                       const Point4<T>* __restrict__ pts, T r2, int64_t* __restrict__ idx,
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
        if (active) ball_walk<T>(p, b, g, pts, qx, qy, qz, r2, list);
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
        if (active) ball_walk<T>(p, b, g, pts, qx, qy, qz, r2, list);
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

// The cell edge of the ball-query grid: at least half the radius. H100, Q3 (1e6 refs, r = 0.05,
// ~65 refs a radius cube), the whole call: 0.87 ms with r / 2, 0.91 with r / 2.5, 0.94 with
// r / 3, 1.18 with r / 4, 1.42 with r / 5 (smaller cells: more starts to load than refs
// skipped; a ball overlaps ~80 cells of r / 2). The scan of a cell stops at the first index
// above the list's largest.
double ball_min_cell(double radius2) { return sqrt(radius2) / 2.0; }

template <typename T>
cudaError_t launch_ball_query_grid(const pcops_ball_query_cuda_plan& plan, const T* query,
                                   const T* ref, const int64_t* query_lengths,
                                   const int64_t* ref_lengths, void* workspace, int64_t* idx,
                                   int64_t* count, cudaStream_t stream) {
    pcops_grid_cuda::Scratch<T> s;
    const size_t grid_bytes = pcops_grid_cuda::carve<T>(workspace, plan.B, plan.N, plan.cells, &s);
    pcops_grid_cuda::CountScratch<T> o;
    pcops_grid_cuda::carve_counting<T>(static_cast<char*>(workspace) + grid_bytes, plan.B, 0,
                                       plan.M, plan.cells, &o);
    cudaError_t err = pcops_grid_cuda::build<T>(ref, ref_lengths, plan.B, plan.N, plan.cells,
                                                ball_min_cell(plan.radius2), s, stream);
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
    if (S <= 8)
        ball_query_grid_kernel<T, 8><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    else if (S <= 16)
        ball_query_grid_kernel<T, 16><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    else if (S <= 32)
        ball_query_grid_kernel<T, 32><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    else if (S <= 64)
        ball_query_grid_kernel<T, 64><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    else
        ball_query_grid_kernel<T, 0><<<g, kThreads, 0, stream>>>(query, p, s.pts, r2, idx, count);
    return cudaGetLastError();
}

}  // namespace

extern "C" cudaError_t pcops_ball_query_cuda_plan_make(pcops_dtype dtype, int64_t B, int64_t M,
                                                       int64_t N, double radius2, int64_t S,
                                                       pcops_search_variant variant,
                                                       pcops_ball_query_cuda_plan* plan) {
    if (!plan) return cudaErrorInvalidValue;
    *plan = pcops_ball_query_cuda_plan{};
    if (dtype != PCOPS_FLOAT32 && dtype != PCOPS_FLOAT64) return cudaErrorInvalidValue;
    if (B < 0 || M < 0 || N < 0 || S < 1) return cudaErrorInvalidValue;
    plan->dtype = dtype;
    plan->B = B;
    plan->M = M;
    plan->N = N;
    plan->S = S;
    plan->radius2 = radius2;
    const int64_t cells = pcops_grid_budget(N, 1.0);
    const bool grid_ok = 2 * B * cells + 1 < INT_MAX && B * N < INT_MAX && B * M < INT_MAX;
    // AUTO, from the H100 (BENCHMARKS.md, stop 23; uniform clouds, ~S/2 and ~2S refs a ball,
    // S = 16, 32, 64): the warp-per-query brute force with its early exit wins up to N = 8192
    // (4096: 0.07-0.10 ms against 0.16-0.45), the grid from N = 16384 (0.18-0.32 against
    // 0.33-0.44, except 128 refs a ball at S = 64: 0.46 against 0.39) and by 2.2-8.5x at
    // N = 32768-65536.
    if (variant == PCOPS_SEARCH_AUTO) variant = N >= 16384 ? PCOPS_SEARCH_GRID : PCOPS_SEARCH_BRUTE;
    if (variant != PCOPS_SEARCH_GRID || !grid_ok) variant = PCOPS_SEARCH_BRUTE;
    plan->variant = variant;
    if (variant == PCOPS_SEARCH_GRID && B > 0 && M > 0) {
        plan->cells = cells;
        // the stable grid of the refs, then the counting sort of the queries (no refs)
        plan->workspace_bytes =
            dtype == PCOPS_FLOAT32
                ? pcops_grid_cuda::carve<float>(nullptr, B, N, cells, nullptr) +
                      pcops_grid_cuda::carve_counting<float>(nullptr, B, 0, M, cells, nullptr)
                : pcops_grid_cuda::carve<double>(nullptr, B, N, cells, nullptr) +
                      pcops_grid_cuda::carve_counting<double>(nullptr, B, 0, M, cells, nullptr);
    }
    return cudaSuccess;
}

extern "C" cudaError_t pcops_ball_query_cuda_run(const pcops_ball_query_cuda_plan* plan,
                                                 const void* query, const void* ref,
                                                 const int64_t* query_lengths,
                                                 const int64_t* ref_lengths, void* workspace,
                                                 int64_t* idx, int64_t* count,
                                                 cudaStream_t stream) {
    if (!plan) return cudaErrorInvalidValue;
    if (plan->variant != PCOPS_SEARCH_GRID)
        return pcops_ball_query_cuda(plan->dtype, query, ref, query_lengths, ref_lengths, plan->B,
                                     plan->M, plan->N, plan->radius2, plan->S, idx, count, stream);
    if (plan->B == 0 || plan->M == 0) return cudaSuccess;
    if (workspace == nullptr) return cudaErrorInvalidValue;
    return pcops_dispatch_float(plan->dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return launch_ball_query_grid(*plan, (const T*)query, (const T*)ref,
                                         query_lengths, ref_lengths, workspace, idx, count,
                                         stream);
    });
}


extern "C" cudaError_t pcops_ball_query_cuda(pcops_dtype dtype, const void* query,
                                             const void* ref, const int64_t* query_lengths,
                                             const int64_t* ref_lengths, int64_t B, int64_t M,
                                             int64_t N, double radius2, int64_t S, int64_t* idx,
                                             int64_t* count, cudaStream_t stream) {
    if (B < 0 || M < 0 || N < 0 || S < 1) return cudaErrorInvalidValue;
    if (B == 0 || M == 0) return cudaSuccess;
    return pcops_dispatch_float(dtype, stream, [&](auto zero) {
        using T = decltype(zero);
        return launch_ball_query((const T*)query, (const T*)ref, query_lengths,
                                    ref_lengths, B, M, N, radius2, S, idx, count, stream);
    });
}
