/*
 * knn/grid.cuh -- path "grid": the refs and queries of every cloud binned into a uniform grid on
 * the device; each query walks the cells in rings of growing distance and keeps its best k in a
 * register list (k <= kMaxRegisterK) or a max-heap in its output rows (any larger k). Also the
 * walk and the grid build that the other grid paths (knn/grid_batch.cuh, knn/grid_select.cuh)
 * reuse.
 *
 * What it does: the build (grid/build_counting.cuh, or grid/build_small.cuh for clouds of at
 * most 4096 refs and queries: one launch) bins refs and queries by one counting sort with a cell
 * budget fixed by the plan (knn/plan.cuh: a few refs a cell, more for long lists); no host
 * synchronisation. One thread per query, the threads in the queries' cell order (a warp's
 * queries are neighbours: they walk nearly the same cells). grid_walk visits the cells in rings
 * around the query's cell (kernels/knn_cpu.inc, knn_grid_query, is the same walk), a row of new
 * cells as one run of binned refs trimmed at both ends to the cells within the current k-th
 * distance, and stops when the k-th distance is below the bound of every unvisited cell.
 *
 * When it wins: large clouds (from about a thousand refs) with k well below N, where a query
 * visits a few cells instead of the whole cloud (knn/plan.cuh).
 *
 * Invariants: refs arrive in cell order, not index order, so the lists compare full
 * (dist2, idx) keys (float32: packed into one 64-bit key); a cell is skipped only when the
 * lower bound of its distance (shrunk by PCOPS_GRID_SHRINK) is above the k-th distance, so the
 * list ends with exactly the K smallest keys: the brute force's bits, whatever the order of
 * the refs inside a cell.
 */
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>

#include "../grid.h"
#include "../grid/build_counting.cuh"
#include "../grid/build_small.cuh"
#include "common.cuh"

namespace {

// ------------------------------------------------------------------------------------------
// The lists of a grid query

// The register list with full key compares (refs arrive in cell order, not index order).
template <typename T, int K>
struct GridRegisterList {
    RegisterList<T, K> l;
    __device__ __forceinline__ void init(int k) { l.init(k); }
    __device__ __forceinline__ bool full() const { return l.i[K - 1] >= 0; }
    __device__ __forceinline__ T threshold() const { return l.d[K - 1]; }
    // (dist, n) is kept when its key is below the largest kept key (dist < +inf). The compares
    // use & and | (no short circuit): the insertion is straight-line code without branches.
    __device__ __forceinline__ void offer(T dist, int n) {
        const T td = l.d[K - 1];
        if (!((dist < td) | ((dist == td) & (n < l.i[K - 1])))) return;
#pragma unroll
        for (int s = K - 1; s > 0; --s) {
            const bool shift = (l.d[s - 1] > dist) | ((l.d[s - 1] == dist) & (l.i[s - 1] > n));
            const bool here = (l.d[s] > dist) | ((l.d[s] == dist) & (l.i[s] > n));
            l.d[s] = shift ? l.d[s - 1] : (here ? dist : l.d[s]);
            l.i[s] = shift ? l.i[s - 1] : (here ? n : l.i[s]);
        }
        const bool here = (l.d[0] > dist) | ((l.d[0] == dist) & (l.i[0] > n));
        l.d[0] = here ? dist : l.d[0];
        l.i[0] = here ? n : l.i[0];
    }
    __device__ __forceinline__ void finish(T* out_d, int64_t* out_i, int k) const {
        l.write(out_d, out_i, k);
    }
};

// Writes the last k of an ascending packed-key list (float32 dist2 bits << 32 | index; all ones
// for an empty slot: +inf / -1) to a query's output rows.
template <int K>
__device__ __forceinline__ void write_keys(const uint64_t (&key)[K], float* out_d, int64_t* out_i,
                                           int k) {
#pragma unroll
    for (int s = 0; s < K; ++s) {
        if (s >= K - k) {
            const bool empty = key[s] == ~(uint64_t)0;
            out_d[s - (K - k)] = empty ? INFINITY : __uint_as_float((unsigned)(key[s] >> 32));
            out_i[s - (K - k)] = empty ? -1 : (int64_t)(uint32_t)key[s];
        }
    }
}

// The float32 list with each (dist2, idx) packed into one 64-bit key: dist2 >= 0 (or +inf)
// and its bits order as unsigned integers, so the key order is the (dist2, idx) order and a
// compare is one 64-bit integer compare. Padding slots (k < K) hold 0 (never above a key:
// they never move), empty slots ~0 (above every key).
template <int K>
struct GridKeyList {
    static constexpr uint64_t kEmpty = ~(uint64_t)0;
    uint64_t key[K];
    __device__ __forceinline__ void init(int k) {
#pragma unroll
        for (int s = 0; s < K; ++s) key[s] = s < K - k ? 0 : kEmpty;
    }
    __device__ __forceinline__ bool full() const { return key[K - 1] != kEmpty; }
    __device__ __forceinline__ float threshold() const {
        return full() ? __uint_as_float((unsigned)(key[K - 1] >> 32)) : INFINITY;
    }
    __device__ __forceinline__ void offer(float dist, int n) {
        const uint64_t kk = ((uint64_t)__float_as_uint(dist) << 32) | (unsigned)n;
        if (!(kk < key[K - 1]) || !(dist < INFINITY)) return;
        pcops_grid_cuda::insert_sorted(key, kk);
    }
    __device__ __forceinline__ void finish(float* out_d, int64_t* out_i, int k) const {
        write_keys(key, out_d, out_i, k);
    }
};

// The register list of a grid query: packed keys for float32, (dist2, idx) pairs for float64.
template <typename T, int K>
struct GridList {
    using type = GridRegisterList<T, K>;
};
template <int K>
struct GridList<float, K> {
    using type = GridKeyList<K>;
};

// The list of a query for k > kMaxRegisterK: a max-heap in its output rows (knn/common.cuh).
template <typename T>
struct GridHeapList {
    typename HeapTraits<T>::GlobalHeap heap;
    int64_t count, cap;
    T th;
    __device__ __forceinline__ bool full() const { return count == cap; }
    __device__ __forceinline__ T threshold() const { return th; }
    __device__ __forceinline__ void offer(T dist, int n) {
        if (!(dist <= th) || !(dist < T(INFINITY))) return;
        if ((count < cap || heap.top_above(dist, n)) && heap.keep(cap, &count, dist, n))
            th = heap.top_dist();
    }
    __device__ void finish(T* out_d, int64_t* out_i, int k) const {
        heap.finish(count, k, out_d, out_i);
    }
};

// ------------------------------------------------------------------------------------------
// The walk

struct GridParams {
    const int64_t* query_lengths;
    const int64_t* ref_lengths;
    int64_t B, M, N, C;
    int k;
    const pcops_grid* grids;
    const int32_t* start;  // [B * C + 1]
    const int32_t* ids;    // the ref index of each sorted position
};

// Offers the sorted refs [j, end) to the list, two a step with both loads issued before either
// is used (a ref's index travels in its w slot: one 16- or 32-byte load a ref).
template <typename T, typename List>
__device__ __forceinline__ void scan_run(const Point4<T>* __restrict__ pts, int32_t j,
                                         int32_t end, T qx, T qy, T qz, List& list) {
    for (; j + 1 < end; j += 2) {
        const Point4<T> r0 = pts[j], r1 = pts[j + 1];
        list.offer(finite_distance(qx, qy, qz, r0), point_id(r0));
        list.offer(finite_distance(qx, qy, qz, r1), point_id(r1));
    }
    if (j < end) {
        const Point4<T> r0 = pts[j];
        list.offer(finite_distance(qx, qy, qz, r0), point_id(r0));
    }
}

// The end of a ring of grid_walk: nothing to do for the lists of one thread (the grid select's
// buffer has its own overload).
template <typename List>
__device__ __forceinline__ void ring_done(List&) {}

// Visits the grid of cloud b around q in rings (kernels/knn_cpu.inc, knn_grid_query, is the
// same walk) and offers every ref of a visited cell to the list (scan_run).
template <typename T, typename List>
__device__ __forceinline__ void grid_walk(const GridParams& p, int64_t b, const Point4<T>* pts,
                                          T qx, T qy, T qz, List& list) {
    const pcops_grid g = p.grids[b];
    if (g.cells == 0 || !pcops_grid_finite3(qx, qy, qz)) return;
    const double q[3] = {qx, qy, qz};
    int32_t c[3];
    for (int a = 0; a < 3; ++a) c[a] = pcops_grid_coord(&g, a, q[a]);
    const int32_t rmax = pcops_grid_max_ring(&g, c);
    const int32_t dx = g.dims[0], dy = g.dims[1];
    const int32_t* start = p.start + b * p.C;
    for (int32_t r = 0; r <= rmax; ++r) {
        const int32_t z0 = max(c[2] - r, 0), z1 = min(c[2] + r, g.dims[2] - 1);
        const int32_t y0 = max(c[1] - r, 0), y1 = min(c[1] + r, dy - 1);
        const int32_t x0 = max(c[0] - r, 0), x1 = min(c[0] + r, dx - 1);
        // planes and rows with no new cell in the grid are stepped over (knn_cpu.inc)
        const bool xends = c[0] - r >= 0 || c[0] + r <= dx - 1;
        const bool yedges = c[1] - r >= 0 || c[1] + r <= dy - 1;
        for (int32_t cz = z0; cz <= z1; ++cz) {
            const bool zedge = cz == c[2] - r || cz == c[2] + r;
            if (!zedge && !xends && !yedges) {
                if (c[2] + r > z1) break; /* cz is strictly inside the shell */
                cz = c[2] + r - 1;
                continue;
            }
            const double gz = pcops_grid_axis_gap(&g, 2, q[2], cz, cz);
            const double bz = gz * gz;
            if (list.full() && bz * PCOPS_GRID_SHRINK > prune_limit(list.threshold())) continue;
            for (int32_t cy = y0; cy <= y1; ++cy) {
                const bool edge = zedge || cy == c[1] - r || cy == c[1] + r;
                if (!edge && !xends) {
                    if (c[1] + r > y1) break; /* cy is strictly inside the shell */
                    cy = c[1] + r - 1;
                    continue;
                }
                const double gy = pcops_grid_axis_gap(&g, 1, q[1], cy, cy);
                const double byz = bz + gy * gy;
                if (list.full() && byz * PCOPS_GRID_SHRINK > prune_limit(list.threshold()))
                    continue;
                const int64_t row = ((int64_t)cz * dy + cy) * dx;
                if (edge || r == 0) {
                    // every cell of the row is new: one contiguous run of sorted refs, less
                    // the cells at its ends beyond the k-th distance (the gap grows away from
                    // the query, so the cells between two kept ends are kept too)
                    int32_t xa = x0, xb = x1;
                    if (list.full())
                        pcops_grid_cuda::trim_row<false>(&g, q[0], byz,
                                                         prune_limit(list.threshold()), xa, xb);
                    if (xa <= xb) scan_run(pts, start[row + xa], start[row + xb + 1], qx, qy, qz, list);
                } else {
                    // the row's two end cells, c - r and c + r
                    for (int32_t cx = c[0] - r; cx <= c[0] + r; cx += 2 * r) {
                        if (cx < x0 || cx > x1) continue;
                        if (list.full()) {
                            const double gx = pcops_grid_axis_gap(&g, 0, q[0], cx, cx);
                            if ((byz + gx * gx) * PCOPS_GRID_SHRINK > prune_limit(list.threshold()))
                                continue;
                        }
                        scan_run(pts, start[row + cx], start[row + cx + 1], qx, qy, qz, list);
                    }
                }
            }
        }
        ring_done(list);
        if (list.full() && prune_limit(list.threshold()) < pcops_grid_ring_bound(&g, q, c, r))
            break;
    }
}

// ------------------------------------------------------------------------------------------
// CUDA kernels

// Blocks of kThreads an SM should hold for the grid kernel: the registers of 6 for k <= 16
// (85 a thread), fewer for longer lists.
template <int K>
struct GridMinBlocks {
    static constexpr int value = K >= 1 && K <= 16 ? 6 : 1;
};

// The query of grid thread t: its cloud b, its index m in the cloud and its flat index b * M + m
// (the threads take the queries in their cell order, build_counting's `order`: the queries of a
// warp are neighbours).
struct GridQuery {
    int64_t b, m, flat;
};
__device__ __forceinline__ GridQuery grid_query(const GridParams& p, const int32_t* order,
                                                int64_t t) {
    const int64_t b = t / p.M;
    const int64_t flat = b * p.M + order[t];
    return {b, flat % p.M, flat};
}

// One thread per query (B * M threads).
template <typename T, int K>
__global__ void __launch_bounds__(kThreads, GridMinBlocks<K>::value)
knn_grid_kernel(const T* __restrict__ query, GridParams p, const Point4<T>* __restrict__ pts,
                T* __restrict__ out_d, int64_t* __restrict__ out_i,
                const int32_t* __restrict__ order) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.B * p.M) return;
    const auto [b, m, flat] = grid_query(p, order, t);
    const int64_t row = flat * p.k;
    const T* q = query + flat * 3;
    if constexpr (K > 0) {
        typename GridList<T, K>::type list;
        list.init(p.k);
        if (m < pcops_valid_length(p.query_lengths, b, p.M))
            grid_walk<T>(p, b, pts, q[0], q[1], q[2], list);
        list.finish(out_d + row, out_i + row, p.k);
    } else {
        const int64_t L = pcops_valid_length(p.ref_lengths, b, p.N);
        GridHeapList<T> list{HeapTraits<T>::global(out_d, out_i, row), 0,
                            (int64_t)p.k < L ? (int64_t)p.k : L, T(INFINITY)};
        if (list.cap > 0 && m < pcops_valid_length(p.query_lengths, b, p.M))
            grid_walk<T>(p, b, pts, q[0], q[1], q[2], list);
        list.finish(out_d + row, out_i + row, p.k);
    }
}

// ------------------------------------------------------------------------------------------
// kernel launchers

// The scratch of the grid paths: the counting build's, with the cell starts at a stride of
// cells + 1 for the one-block build (a carver with base NULL only counts).
template <typename T>
void carve_grid(pcops_carver* w, const pcops_knn_cuda_plan& plan,
                pcops_grid_cuda::CountScratch<T>* s) {
    const int64_t stride = plan.small_build ? plan.cells + 1 : plan.cells;
    pcops_grid_cuda::carve_counting<T>(w, plan.B, plan.N, plan.M, stride, s, !plan.small_build);
}

// Builds the grids of a plan on the device (the one-block build where the plan says so) and
// the walk's parameters over them: *pts the binned refs, *order the queries in cell order.
template <typename T>
cudaError_t build_grid(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a, GridParams* p,
                       const Point4<T>** pts, const int32_t** order) {
    // the one-block build lays the cell starts out with a stride of cells + 1
    const int64_t stride = plan.small_build ? plan.cells + 1 : plan.cells;
    pcops_grid_cuda::CountScratch<T> s;
    pcops_carver w = pcops_carver_init(a.workspace);
    carve_grid<T>(&w, plan, &s);
    cudaError_t err =
        plan.small_build
            ? pcops_grid_cuda::build_small<T>(a.ref, a.ref_lengths, a.query, a.query_lengths,
                                              plan.B, plan.N, plan.M, plan.cells, s, a.stream)
            : pcops_grid_cuda::build_counting<T>(a.ref, a.ref_lengths, a.query, a.query_lengths,
                                                 plan.B, plan.N, plan.M, plan.cells, s, a.stream);
    if (err != cudaSuccess) return err;
    *p = GridParams{a.query_lengths, a.ref_lengths, plan.B, plan.M, plan.N, stride, (int)plan.K,
                    s.grids, s.start, s.ids};
    *pts = s.pts;
    *order = s.order;
    return cudaSuccess;
}

template <>
struct KnnPath<PCOPS_KNN_GRID> {
    static constexpr bool kGrid = true;
    static bool takes(const KnnSizes&) { return true; }
    template <typename T>
    static cudaError_t launch(const pcops_knn_cuda_plan& plan, const KnnArgs<T>& a) {
        GridParams p;
        const Point4<T>* pts;
        const int32_t* order;
        cudaError_t err = build_grid<T>(plan, a, &p, &pts, &order);
        if (err != cudaSuccess) return err;
        const int64_t blocks = (plan.B * plan.M + kThreads - 1) / kThreads;
        if (blocks > INT_MAX) return cudaErrorInvalidValue;
        const unsigned g = (unsigned)blocks;
        if (plan.K > kMaxRegisterK) {
            knn_grid_kernel<T, 0><<<g, kThreads, 0, a.stream>>>(a.query, p, pts, a.dist2, a.idx,
                                                                 order);
            return cudaGetLastError();
        }
        return with_register_bucket(plan.K, [&](auto bucket) {
            constexpr int K = decltype(bucket)::value;
            knn_grid_kernel<T, K><<<g, kThreads, 0, a.stream>>>(a.query, p, pts, a.dist2, a.idx,
                                                                 order);
            return cudaGetLastError();
        });
    }
};

}  // namespace
