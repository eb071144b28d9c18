/*
 * grid/build_small.cuh -- the one-block grid build (kNN, small clouds): one block per cloud does
 * build_counting's work (grid/build_counting.cuh) in one launch -- the box, the grid, the counts
 * of refs and queries per cell in shared memory, their scan and the scatter -- instead of two
 * memsets, four kernels and a device scan, whose launches cost more host time than the GPU
 * spends on a cloud of a few thousand points. The order inside a cell is again that of the
 * atomics (the kNN lists do not depend on it).
 *
 * Layout: cloud b's sorted refs at [b * N, b * N + binned), its query slots at
 * [b * M, (b + 1) * M), and its cell starts at start[b * (C + 1) + c] for c in [0, C] (the extra
 * entry ends the last cell whatever the cloud's count): the walk takes C + 1 as the stride of
 * start (kNN's GridParams::C). The scratch is build_counting's, carved without the scan's
 * temporary storage (carve_counting(..., scan = false)).
 */
#pragma once

#include <cstdint>

#include "build_counting.cuh"

namespace pcops_grid_cuda {
namespace {

constexpr int kSmallBuildThreads = 1024;
constexpr int64_t kSmallBuildMaxCells = 4096;  // 2 C counts in 32 KB of shared memory
// Refs (and queries) a thread, in registers: clouds of at most 4096 refs and queries. Beyond
// that one block a cloud is the slower build anyway (kNN's grid against grid_baseline, the
// general build: python benchmarks/tune.py knn).
constexpr int kSmallBuildPer = 4;

inline bool small_build_ok(int64_t N, int64_t M, int64_t C) {
    return C <= kSmallBuildMaxCells && N <= kSmallBuildPer * kSmallBuildThreads &&
           M <= kSmallBuildPer * kSmallBuildThreads;
}

template <typename T>
__global__ void __launch_bounds__(kSmallBuildThreads)
build_small_kernel(const T* __restrict__ ref, const int64_t* __restrict__ ref_lengths,
                   const T* __restrict__ query, const int64_t* __restrict__ query_lengths,
                   int N, int M, int C, pcops_grid* __restrict__ grids,
                   int32_t* __restrict__ start, int32_t* __restrict__ ids,
                   int32_t* __restrict__ order, Point4<T>* __restrict__ pts) {
    extern __shared__ int32_t small_counts[];  // [2 C]: refs, then queries, per cell
    __shared__ double red_box[6][kSmallBuildThreads / 32];
    __shared__ int red[32];
    __shared__ pcops_grid gs;
    const int b = blockIdx.x;
    const int L = (int)pcops_valid_length(ref_lengths, b, N);
    const int Lq = (int)pcops_valid_length(query_lengths, b, M);
    const T* cloud = ref + (int64_t)b * N * 3;
    const T* qcloud = query + (int64_t)b * M * 3;
    const int tid = threadIdx.x, nt = kSmallBuildThreads;  // the launch's block size
    const int lane = tid & 31, warp = tid >> 5;

    // The box of the valid finite refs, as grid_box_kernel, from the refs a thread bins (item j
    // of a thread is tid + j * nt, at most kSmallBuildPer of each kind): reduced in T (min and
    // max are exact), then as doubles. The refs stay in registers for the scatter (one load of
    // each; the double kernel spills 32 bytes at the 64 registers of 1024 threads, the float one
    // nothing).
    T rx[kSmallBuildPer], ry[kSmallBuildPer], rz[kSmallBuildPer];
    T t[6] = {T(INFINITY), T(INFINITY), T(INFINITY), T(-INFINITY), T(-INFINITY), T(-INFINITY)};
#pragma unroll
    for (int j = 0; j < kSmallBuildPer; ++j) {
        const int i = tid + j * nt;
        rx[j] = ry[j] = rz[j] = T(NAN);  // past L: no cell
        if (i < L) {
            rx[j] = cloud[3 * i];
            ry[j] = cloud[3 * i + 1];
            rz[j] = cloud[3 * i + 2];
        }
    }
#pragma unroll
    for (int j = 0; j < kSmallBuildPer; ++j) {
        if (!pcops_grid_finite3(rx[j], ry[j], rz[j])) continue;
        t[0] = rx[j] < t[0] ? rx[j] : t[0];
        t[1] = ry[j] < t[1] ? ry[j] : t[1];
        t[2] = rz[j] < t[2] ? rz[j] : t[2];
        t[3] = rx[j] > t[3] ? rx[j] : t[3];
        t[4] = ry[j] > t[4] ? ry[j] : t[4];
        t[5] = rz[j] > t[5] ? rz[j] : t[5];
    }
    pcops_warp::all_reduce_split(t, 3, [](T mine, T u) { return u < mine ? u : mine; },
                                 [](T mine, T u) { return u > mine ? u : mine; });
    if (lane == 0)
        for (int j = 0; j < 6; ++j) red_box[j][warp] = (double)t[j];
    for (int i = tid; i < 2 * C; i += nt) small_counts[i] = 0;
    __syncthreads();
    static_assert(kSmallBuildThreads == 1024, "warp 0 reduces one box per lane");
    if (warp == 0) {  // lane w takes warp w's box, then five shuffle levels
        double r[6];
        for (int j = 0; j < 6; ++j) r[j] = red_box[j][lane];
        warp_box_reduce(r);
        if (lane == 0) {
            pcops_grid g;
            if (r[0] <= r[3]) {  // a finite ref
                const double lo[3] = {r[0], r[1], r[2]}, hi[3] = {r[3], r[4], r[5]};
                pcops_grid_setup(&g, lo, hi, C, 0.0);
            } else {
                pcops_grid_set_empty(&g);
            }
            gs = g;
            grids[b] = g;
        }
    }
    __syncthreads();
    const pcops_grid g = gs;

    // counts per cell: refs without a cell are left out; a query slot without a valid finite
    // query goes to the last cell (as build_counting)
    // Item j of a thread is tid + j * nt (at most kSmallBuildPer of each kind); its cell stays
    // in a register for the scatter.
    int ref_cell[kSmallBuildPer], query_cell[kSmallBuildPer];
#pragma unroll
    for (int j = 0; j < kSmallBuildPer; ++j) {
        int c = -1;  // past L (NaN) or not finite: no cell
        if (pcops_grid_finite3(rx[j], ry[j], rz[j]))
            c = (int)pcops_grid_cell(&g, rx[j], ry[j], rz[j]);
        ref_cell[j] = c;
        if (c >= 0) atomicAdd(small_counts + c, 1);
    }
#pragma unroll
    for (int j = 0; j < kSmallBuildPer; ++j) {
        const int m = tid + j * nt;
        int c = C - 1;
        if (m < Lq && g.cells > 0) {
            const double x = qcloud[3 * m], y = qcloud[3 * m + 1], z = qcloud[3 * m + 2];
            if (pcops_grid_finite3(x, y, z)) c = (int)pcops_grid_cell(&g, x, y, z);
        }
        query_cell[j] = c;
        if (m < M) atomicAdd(small_counts + C + c, 1);
    }
    __syncthreads();

    // exclusive scan of the 2 C counts, a contiguous segment a thread
    const int per = (2 * C + nt - 1) / nt;
    const int s0 = min(tid * per, 2 * C), s1 = min(s0 + per, 2 * C);
    int sum = 0;
    for (int i = s0; i < s1; ++i) sum += small_counts[i];
    int total;
    int run = block_exclusive_scan(sum, red, &total);
    for (int i = s0; i < s1; ++i) {
        const int cnt = small_counts[i];
        small_counts[i] = run;
        run += cnt;
    }
    __syncthreads();
    const int binned = small_counts[C];  // refs with a cell (the queries' part starts here)
    int32_t* st = start + (int64_t)b * (C + 1);
    for (int c = tid; c < C; c += nt) st[c] = b * N + small_counts[c];
    if (tid == 0) st[C] = b * N + binned;
    __syncthreads();  // every start read before the cursors move

    // scatter: the cursors are the starts; the queries' relative to their part
#pragma unroll
    for (int j = 0; j < kSmallBuildPer; ++j) {
        const int i = tid + j * nt, c = ref_cell[j];
        if (c < 0) continue;  // past L, or no cell
        const int pos = b * N + atomicAdd(small_counts + c, 1);
        pts[pos] = Point4<T>{rx[j], ry[j], rz[j], index_as<T>(i)};
        ids[pos] = i;
    }
#pragma unroll
    for (int j = 0; j < kSmallBuildPer; ++j) {
        const int m = tid + j * nt;
        if (m >= M) continue;
        const int slot = atomicAdd(small_counts + C + query_cell[j], 1) - binned;
        order[(int64_t)b * M + slot] = m;
    }
}

template <typename T>
cudaError_t build_small(const T* ref, const int64_t* ref_lengths, const T* query,
                        const int64_t* query_lengths, int64_t B, int64_t N, int64_t M, int64_t C,
                        const CountScratch<T>& s, cudaStream_t stream) {
    if (!small_build_ok(N, M, C) || B > INT_MAX || B * N > INT_MAX) return cudaErrorInvalidValue;
    if (B == 0) return cudaSuccess;
    build_small_kernel<T><<<(unsigned)B, kSmallBuildThreads, 2 * C * sizeof(int32_t), stream>>>(
        ref, ref_lengths, query, query_lengths, (int)N, (int)M, (int)C, s.grids, s.start, s.ids,
        s.order, s.pts);
    return cudaGetLastError();
}

}  // namespace
}  // namespace pcops_grid_cuda
