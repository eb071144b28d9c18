/*
 * grid/common.cuh -- what the CUDA grid paths of kNN and ball query share: the binned point
 * (Point4, the ref's index in its w slot), the sorted register list of a grid query, the trim
 * of a row of cells, the box of a cloud (grid_box_kernel: the first step of every build) and a
 * block-wide exclusive scan. The grid itself (cells, coordinates, bounds) is kernels/grid.h,
 * shared with the CPU; the builds are grid/build_sorted.cuh (ball query: refs in index order
 * inside a cell), grid/build_counting.cuh and grid/build_small.cuh (kNN: refs and queries binned
 * together). Included by kernels/knn.cu and kernels/ball_query.cu; each holds its own copy
 * (internal linkage).
 *
 * No host synchronisation anywhere in the builds: the cell budget C per cloud is fixed from the
 * sizes by the caller's plan; the box, the cell size and the binning are computed on the
 * device. The cells of cloud b are the runs start[b * C + c] .. start[b * C + c + 1] of the
 * binned refs, c < grids[b].cells.
 */
#pragma once

#include <cstdint>

#include "../geometry.h"
#include "../grid.h"
#include "../warp.cuh"

namespace pcops_grid_cuda {
namespace {  // internal linkage: knn.cu and ball_query.cu each hold their own copy

// A binned ref: its coordinates, and in w its index in the cloud (index_as / point_id), so that
// a scan loads one 16- or 32-byte point a ref.
template <typename T>
struct alignas(4 * sizeof(T)) Point4 {
    T x, y, z, w;
};

// A ref index stored in a Point4's w slot: its bits in a float, its value in a double.
template <typename T>
__device__ __forceinline__ T index_as(int32_t i);
template <>
__device__ __forceinline__ float index_as<float>(int32_t i) { return __int_as_float(i); }
template <>
__device__ __forceinline__ double index_as<double>(int32_t i) { return (double)i; }
// ... and back: the index stored in a Point4's w slot.
__device__ __forceinline__ int point_id(const Point4<float>& r) { return __float_as_int(r.w); }
__device__ __forceinline__ int point_id(const Point4<double>& r) { return (int)r.w; }

// Inserts x into the ascending register array v[0, K) (x < v[K - 1]; the largest drops out):
// slot s takes slot s-1's value if that one is larger than x, else x if its own is larger,
// else keeps its own -- straight-line selects, no branches. The register lists of the grid
// kernels (kNN's packed keys, ball query's indices) keep their entries this way.
template <typename V, int K>
__device__ __forceinline__ void insert_sorted(V (&v)[K], V x) {
#pragma unroll
    for (int s = K - 1; s > 0; --s) {
        const bool shift = v[s - 1] > x;
        const bool here = v[s] > x;
        v[s] = shift ? v[s - 1] : (here ? x : v[s]);
    }
    v[0] = v[0] > x ? x : v[0];
}

// Trims the cells [xa, xb] of a grid row at both ends to those that can still hold a neighbour
// of q: a cell is out when the lower bound of its squared distance from q (byz, the row's y
// and z part, plus the square of the x gap, times PCOPS_GRID_SHRINK) is >= lim (kStrict: the
// ball query's d < r2) or > lim (kNN: a ref at the k-th distance can still enter by its
// index). The gap grows away from q, so the cells between two kept ends are kept too; xa > xb
// when none is left.
template <bool kStrict>
__device__ __forceinline__ void trim_row(const pcops_grid* g, double qx, double byz, double lim,
                                         int32_t& xa, int32_t& xb) {
    auto out = [&](int32_t cx) {
        const double gx = pcops_grid_axis_gap(g, 0, qx, cx, cx);
        const double bound = (byz + gx * gx) * PCOPS_GRID_SHRINK;
        return kStrict ? bound >= lim : bound > lim;
    };
    while (xa <= xb && out(xa)) ++xa;
    while (xb > xa && out(xb)) --xb;
}

// ------------------------------------------------------------------------------------------
// The box of a cloud (every build starts with it)

__device__ __forceinline__ double dmin(double a, double b) { return a < b ? a : b; }
__device__ __forceinline__ double dmax(double a, double b) { return a > b ? a : b; }

constexpr int kBoxThreads = 256;
constexpr int kBoxPointsPerThread = 16;

// A double as an unsigned code in the same order (min / max by integer atomics), and back.
__device__ __forceinline__ unsigned long long order_code(double x) {
    const unsigned long long u = (unsigned long long)__double_as_longlong(x);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}
__device__ __forceinline__ double order_decode(unsigned long long c) {
    return __longlong_as_double((long long)((c >> 63) ? (c & 0x7fffffffffffffffull) : ~c));
}

// The box of six values a lane (mins in v[0..2], maxes in v[3..5]) over the warp, on every lane.
__device__ __forceinline__ void warp_box_reduce(double (&v)[6]) {
    pcops_warp::all_reduce_split(v, 3, [](double mine, double other) { return dmin(mine, other); },
                                 [](double mine, double other) { return dmax(mine, other); });
}

// The box of the finite points cloud[i], i = i0, i0 + step, ... < L, reduced over the warp
// (every lane gets it): mins in v[0..2], maxes in v[3..5]; +inf / -inf where the warp saw no
// finite point. Called by whole warps (shuffles).
template <typename T, typename I>
__device__ __forceinline__ void warp_box(const T* __restrict__ cloud, I i0, I L, I step,
                                         double (&v)[6]) {
    for (int j = 0; j < 3; ++j) {
        v[j] = INFINITY;
        v[j + 3] = -INFINITY;
    }
    for (I i = i0; i < L; i += step) {
        const double x = cloud[3 * i], y = cloud[3 * i + 1], z = cloud[3 * i + 2];
        if (!pcops_grid_finite3(x, y, z)) continue;
        v[0] = dmin(v[0], x);
        v[1] = dmin(v[1], y);
        v[2] = dmin(v[2], z);
        v[3] = dmax(v[3], x);
        v[4] = dmax(v[4], y);
        v[5] = dmax(v[5], z);
    }
    warp_box_reduce(v);
}

// Blocks (y) per cloud (x): each reduces the box of its slice of the valid finite refs into
// the cloud's 6 codes (mins, and maxes as complemented codes, all by atomicMin; the codes
// start all ones, so a cloud without finite refs keeps them); the last block of a cloud to
// finish (the 7th word counts them, from all ones) sets up its grid from the box.
template <typename T>
__global__ void __launch_bounds__(kBoxThreads)
grid_box_kernel(const T* __restrict__ ref, const int64_t* __restrict__ ref_lengths, int64_t N,
                int64_t C, double min_cell, unsigned long long* __restrict__ box,
                pcops_grid* __restrict__ grids) {
    __shared__ double red[6][kBoxThreads / 32];
    __shared__ bool last;
    const int64_t b = blockIdx.x;
    const int64_t L = pcops_valid_length(ref_lengths, b, N);
    const T* cloud = ref + b * N * 3;
    double v[6];
    warp_box(cloud, (int64_t)blockIdx.y * blockDim.x + threadIdx.x, L,
             (int64_t)gridDim.y * blockDim.x, v);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        for (int j = 0; j < 6; ++j) red[j][warp] = v[j];
    __syncthreads();
    unsigned long long* cb = box + 7 * b;
    if (threadIdx.x < 6) {
        const int j = threadIdx.x;
        double r = red[j][0];
        for (int w = 1; w < kBoxThreads / 32; ++w) r = j < 3 ? dmin(r, red[j][w]) : dmax(r, red[j][w]);
        if (r == r && r != (j < 3 ? INFINITY : -INFINITY)) {  // the slice had a finite ref
            const unsigned long long c = order_code(r);
            atomicMin(cb + j, j < 3 ? c : ~c);
        }
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // the count starts at all ones: the k-th block to get here reads k - 2
        const unsigned long long before = atomicAdd(cb + 6, 1ull);
        last = (long long)before == (long long)gridDim.y - 2;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    unsigned long long c[6];
    for (int j = 0; j < 6; ++j) c[j] = atomicAdd(cb + j, 0ull);  // a coherent read
    pcops_grid g;
    if (c[0] != ~0ull) {
        const double lo[3] = {order_decode(c[0]), order_decode(c[1]), order_decode(c[2])};
        const double hi[3] = {order_decode(~c[3]), order_decode(~c[4]), order_decode(~c[5])};
        pcops_grid_setup(&g, lo, hi, C, min_cell);
    } else {
        pcops_grid_set_empty(&g);
    }
    grids[b] = g;
}

// Launches grid_box_kernel for the B clouds of N refs: enough blocks a cloud for about
// kBoxThreads * kBoxPointsPerThread refs each, at most 1024. box must hold all ones (a memset
// on `stream` before).
template <typename T>
cudaError_t launch_box(const T* ref, const int64_t* ref_lengths, int64_t B, int64_t N, int64_t C,
                       double min_cell, unsigned long long* box, pcops_grid* grids,
                       cudaStream_t stream) {
    int64_t box_blocks = (N + kBoxThreads * kBoxPointsPerThread - 1) /
                         (kBoxThreads * kBoxPointsPerThread);
    if (box_blocks < 1) box_blocks = 1;
    if (box_blocks > 1024) box_blocks = 1024;
    grid_box_kernel<T><<<dim3((unsigned)B, (unsigned)box_blocks), kBoxThreads, 0, stream>>>(
        ref, ref_lengths, N, C, min_cell, box, grids);
    return cudaGetLastError();
}

// ------------------------------------------------------------------------------------------
// A block-wide scan (the one-block build's cell starts, ball query's query order)

// The exclusive prefix sum of v over the block's threads in thread order (and the block's
// total in *total); `red` holds 32 ints.
__device__ __forceinline__ int block_exclusive_scan(int v, int* red, int* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int incl = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += u;
    }
    if (lane == 31) red[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        const int nw = (int)(blockDim.x >> 5);
        int w = lane < nw ? red[lane] : 0;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, w, d);
            if (lane >= d) w += u;
        }
        red[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    const int before = warp > 0 ? red[warp - 1] : 0;
    *total = red[31];
    __syncthreads();  // red is reused by the caller
    return before + incl - v;
}

}  // namespace
}  // namespace pcops_grid_cuda
