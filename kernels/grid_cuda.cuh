/*
 * grid_cuda.cuh -- building the grids of B clouds on CUDA (kernels/grid.h), shared by knn.cu and
 * ball_query.cu. No host synchronisation: the cell budget C per cloud is fixed from the sizes
 * by the caller's plan, and the box, the cell size and the binning are computed on the device.
 *
 *  1. grid_box_kernel: one block per cloud reduces the box of the valid finite refs (double)
 *     and sets up the cloud's pcops_grid;
 *  2. grid_key_kernel: key = b * C + cell of every valid finite ref, B * C for the others
 *     (sorted to the end), value = its index in the cloud;
 *  3. cub::DeviceRadixSort::SortPairs on the keys (stable: index order inside a cell);
 *  4. grid_start_kernel: start[key] = the first sorted position of every key read later (a
 *     binary search per key);
 *  5. grid_gather_kernel: the sorted refs as Point4 (x, y, z, -) with their indices.
 * The cells of cloud b are start[b * C + c] .. start[b * C + c + 1], c < grids[b].cells.
 *
 * build_counting() (kNN) bins the refs and the queries together by a counting sort instead:
 * the queries in cell order, so that the 32 queries of a warp are neighbours in space and walk
 * nearly the same cells (less divergence, the cells' refs shared in L1). build_small() does
 * the same for clouds of at most 4096 refs and queries in one launch, a block per cloud (its
 * starts with a stride of C + 1).
 */
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <cfloat>
#include <cstdint>

#include "geometry.h"
#include "grid.h"

namespace pcops_grid_cuda {
namespace {  // internal linkage: knn.cu and ball_query.cu each hold their own copy

template <typename T>
struct alignas(4 * sizeof(T)) Point4 {
    T x, y, z, w;
};

// Device scratch of the grids of a call, carved from one workspace by carve().
template <typename T>
struct Scratch {
    pcops_grid* grids;   // [B]
    unsigned long long* box;  // [B * 7]: the box (6 order-preserving codes) and a block count
    int32_t* start;      // [B * C + 1]
    int32_t* keys_in;    // [B * N]
    int32_t* keys_out;   // [B * N]
    int32_t* vals_in;    // [B * N]
    int32_t* vals_out;   // [B * N] the ref index of each sorted position
    Point4<T>* pts;      // [B * N] the sorted refs
    void* sort_temp;
    size_t sort_temp_bytes;
};

inline size_t align_up(size_t b) { return (b + 255) / 256 * 256; }

// Lays n parts of the given byte sizes out from `base` (nullptr: only counts), each aligned:
// ptr[i] = the start of part i. Returns the bytes used.
inline size_t lay_out(void* base, const size_t* parts, int n, void** ptr) {
    char* p = static_cast<char*>(base);
    size_t off = 0;
    for (int i = 0; i < n; ++i) {
        ptr[i] = p ? p + off : nullptr;
        off += align_up(parts[i]);
    }
    return off;
}

inline int key_bits(int64_t keys) {  // bits of the largest key B * C
    int bits = 1;
    while (bits < 31 && ((int64_t)1 << bits) <= keys) ++bits;
    return bits;
}

// Bytes of cub's radix sort of `items` pairs of int32.
inline size_t sort_temp_bytes(int64_t items, int bits) {
    size_t bytes = 0;
    cub::DeviceRadixSort::SortPairs((void*)nullptr, bytes, (const int32_t*)nullptr,
                                    (int32_t*)nullptr, (const int32_t*)nullptr,
                                    (int32_t*)nullptr, (int)items, 0, bits, (cudaStream_t)0);
    return bytes;
}

// Carves the scratch of B grids of N refs and C cells each from `base` (nullptr: only
// counts); returns the bytes used.
template <typename T>
size_t carve(void* base, int64_t B, int64_t N, int64_t C, Scratch<T>* s) {
    const int64_t items = B * N;
    const size_t temp = sort_temp_bytes(items > 0 ? items : 1, key_bits(B * C));
    const size_t parts[9] = {(size_t)B * sizeof(pcops_grid), (size_t)B * 7 * 8,
                             (size_t)(B * C + 1) * 4, (size_t)items * 4, (size_t)items * 4,
                             (size_t)items * 4, (size_t)items * 4,
                             (size_t)items * sizeof(Point4<T>), temp};
    void* ptr[9];
    const size_t off = lay_out(base, parts, 9, ptr);
    if (s) {
        s->grids = (pcops_grid*)ptr[0];
        s->box = (unsigned long long*)ptr[1];
        s->start = (int32_t*)ptr[2];
        s->keys_in = (int32_t*)ptr[3];
        s->keys_out = (int32_t*)ptr[4];
        s->vals_in = (int32_t*)ptr[5];
        s->vals_out = (int32_t*)ptr[6];
        s->pts = (Point4<T>*)ptr[7];
        s->sort_temp = ptr[8];
        s->sort_temp_bytes = temp;
    }
    return off;
}

__device__ __forceinline__ double dmin(double a, double b) { return a < b ? a : b; }
__device__ __forceinline__ double dmax(double a, double b) { return a > b ? a : b; }

constexpr int kBoxThreads = 256;
constexpr int kBoxPointsPerThread = 16;

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

// A double as an unsigned code in the same order (min / max by integer atomics), and back.
__device__ __forceinline__ unsigned long long order_code(double x) {
    const unsigned long long u = (unsigned long long)__double_as_longlong(x);
    return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}
__device__ __forceinline__ double order_decode(unsigned long long c) {
    return __longlong_as_double((long long)((c >> 63) ? (c & 0x7fffffffffffffffull) : ~c));
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
    for (int o = 16; o > 0; o >>= 1) {
        for (int j = 0; j < 3; ++j) v[j] = dmin(v[j], __shfl_xor_sync(0xffffffffu, v[j], o));
        for (int j = 3; j < 6; ++j) v[j] = dmax(v[j], __shfl_xor_sync(0xffffffffu, v[j], o));
    }
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

// One thread per ref slot: its key (b * C + cell, or B * C) and value (its index).
template <typename T>
__global__ void grid_key_kernel(const T* __restrict__ ref, const int64_t* __restrict__ ref_lengths,
                                int64_t B, int64_t N, int64_t C,
                                const pcops_grid* __restrict__ grids, int32_t* __restrict__ keys,
                                int32_t* __restrict__ vals) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * N) return;
    const int64_t b = t / N, i = t % N;
    int64_t key = B * C;
    if (i < pcops_valid_length(ref_lengths, b, N)) {
        const double x = ref[3 * t], y = ref[3 * t + 1], z = ref[3 * t + 2];
        if (pcops_grid_finite3(x, y, z)) {
            const pcops_grid g = grids[b];
            key = b * C + pcops_grid_cell(&g, x, y, z);
        }
    }
    keys[t] = (int32_t)key;
    vals[t] = (int32_t)i;
}

// One thread per key c in [0, B * C]: start[c] = the first sorted position whose key is >= c
// (a lower bound in the ascending keys), written only where it is read: the cells 0 ..
// grids[b].cells of cloud b (the last one the end of the cloud's run) and B * C. A binary search
// per key keeps every thread's work at log2(items) loads, wherever the empty cells lie (one
// thread per sorted position filling the keys up to its own would write every key past the last
// cloud's last cell, up to B * C, alone: 3 ms at 1e6 refs).
__global__ void grid_start_kernel(const int32_t* __restrict__ keys, int64_t items, int64_t B,
                                  int64_t C, const pcops_grid* __restrict__ grids,
                                  int32_t* __restrict__ start) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c > B * C) return;
    if (c < B * C && c % C > (int64_t)grids[c / C].cells) return;  // never read
    int64_t lo = 0, hi = items;  // the answer lies in [lo, hi]
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if ((int64_t)keys[mid] < c) lo = mid + 1;
        else hi = mid;
    }
    start[c] = (int32_t)lo;
}

// One thread per sorted position: the ref itself, next to its neighbours in the cell.
template <typename T>
__global__ void grid_gather_kernel(const T* __restrict__ ref, int64_t B, int64_t N, int64_t C,
                                   const int32_t* __restrict__ keys,
                                   const int32_t* __restrict__ vals, Point4<T>* __restrict__ pts) {
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= B * N) return;
    const int64_t key = keys[p];
    if (key >= B * C) return;  // past the last cell: never read
    const int64_t b = key / C;
    const T* r = ref + (b * N + vals[p]) * 3;
    pts[p] = Point4<T>{r[0], r[1], r[2], T(0)};
}

// Builds the grids; every kernel on `stream`, nothing read back.
template <typename T>
cudaError_t build(const T* ref, const int64_t* ref_lengths, int64_t B, int64_t N, int64_t C,
                  double min_cell, const Scratch<T>& s, cudaStream_t stream) {
    cudaError_t err = cudaMemsetAsync(s.box, 0xff, (size_t)B * 7 * 8, stream);
    if (err != cudaSuccess) return err;
    int64_t box_blocks = (N + kBoxThreads * kBoxPointsPerThread - 1) /
                         (kBoxThreads * kBoxPointsPerThread);
    if (box_blocks < 1) box_blocks = 1;
    if (box_blocks > 1024) box_blocks = 1024;
    grid_box_kernel<T><<<dim3((unsigned)B, (unsigned)box_blocks), kBoxThreads, 0, stream>>>(
        ref, ref_lengths, N, C, min_cell, s.box, s.grids);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const int64_t items = B * N;
    constexpr int kThreads = 256;
    if (items > 0) {
        grid_key_kernel<T><<<(unsigned)((items + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
            ref, ref_lengths, B, N, C, s.grids, s.keys_in, s.vals_in);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
        size_t temp = s.sort_temp_bytes;
        err = cub::DeviceRadixSort::SortPairs(s.sort_temp, temp, s.keys_in, s.keys_out, s.vals_in,
                                              s.vals_out, (int)items, 0, key_bits(B * C), stream);
        if (err != cudaSuccess) return err;
    }
    const int64_t start_threads = B * C + 1;
    grid_start_kernel<<<(unsigned)((start_threads + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(s.keys_out, items, B, C, s.grids, s.start);
    err = cudaGetLastError();
    if (err != cudaSuccess || items == 0) return err;
    grid_gather_kernel<T><<<(unsigned)((items + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        ref, B, N, C, s.keys_out, s.vals_out, s.pts);
    return cudaGetLastError();
}

// ------------------------------------------------------------------------------------------
// The counting-sort build (kNN): refs and queries binned together, in four kernels and a scan.
// The order of the refs inside a cell (and of the queries) is that of the atomic counts, so it
// may change from call to call: the kNN lists compare full (dist2, idx) keys and do not depend
// on it (ball query, which stops inside a cell by index, keeps the stable radix-sort build).
//
//  counts [2 * B * C + 1]: refs per key b * C + cell (key B * C: refs without a cell), then
//           queries per key (a slot without a valid finite query: its cloud's last cell);
//  start  [2 * B * C + 1]: the exclusive sum: start[b * C + c] is the first sorted ref of the
//           cell, start[B * C] the end of the binned refs; start[B * C + 1 + key] - B * N the
//           first sorted query slot of the key, so cloud b's slots are [b * M, (b + 1) * M).
template <typename T>
struct CountScratch {
    pcops_grid* grids;        // [B]
    unsigned long long* box;  // [B * 7]
    int32_t* counts;          // [2 * B * C + 1]
    int32_t* start;           // [2 * B * C + 1]
    int32_t* keys;            // [B * N + B * M]
    int32_t* rank;            // [B * N + B * M] rank of the item in its key
    int32_t* ids;             // [B * N] the ref index of each sorted position
    int32_t* order;           // [B * M] the query index of each sorted slot of its cloud
    Point4<T>* pts;           // [B * N] the sorted refs
    void* scan_temp;
    size_t scan_temp_bytes;
};

inline size_t scan_temp_bytes(int64_t items) {
    size_t bytes = 0;
    cub::DeviceScan::ExclusiveSum((void*)nullptr, bytes, (const int32_t*)nullptr,
                                  (int32_t*)nullptr, (int)items, (cudaStream_t)0);
    return bytes;
}

// `scan`: whether the build scans the counts with cub (build_counting, order_queries); the
// one-block build does not, and skips cub's size query (host time on every call).
template <typename T>
size_t carve_counting(void* base, int64_t B, int64_t N, int64_t M, int64_t C,
                      CountScratch<T>* s, bool scan = true) {
    const int64_t keys = 2 * B * C + 1, items = B * N + B * M;
    const size_t temp = scan ? scan_temp_bytes(keys) : 0;
    const size_t parts[10] = {(size_t)B * sizeof(pcops_grid), (size_t)B * 7 * 8,
                              (size_t)keys * 4, (size_t)keys * 4, (size_t)items * 4,
                              (size_t)items * 4, (size_t)(B * N) * 4, (size_t)(B * M) * 4,
                              (size_t)(B * N) * sizeof(Point4<T>), temp};
    void* ptr[10];
    const size_t off = lay_out(base, parts, 10, ptr);
    if (s) {
        s->grids = (pcops_grid*)ptr[0];
        s->box = (unsigned long long*)ptr[1];
        s->counts = (int32_t*)ptr[2];
        s->start = (int32_t*)ptr[3];
        s->keys = (int32_t*)ptr[4];
        s->rank = (int32_t*)ptr[5];
        s->ids = (int32_t*)ptr[6];
        s->order = (int32_t*)ptr[7];
        s->pts = (Point4<T>*)ptr[8];
        s->scan_temp = ptr[9];
        s->scan_temp_bytes = temp;
    }
    return off;
}

// One thread per ref slot, then per query slot: its key and its rank among the key's items.
template <typename T>
__global__ void count_kernel(const T* __restrict__ ref, const int64_t* __restrict__ ref_lengths,
                             const T* __restrict__ query,
                             const int64_t* __restrict__ query_lengths, int64_t B, int64_t N,
                             int64_t M, int64_t C, const pcops_grid* __restrict__ grids,
                             int32_t* __restrict__ counts, int32_t* __restrict__ keys,
                             int32_t* __restrict__ rank) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * N + B * M) return;
    int64_t key;
    if (t < B * N) {
        const int64_t b = t / N, i = t % N;
        key = B * C;
        if (i < pcops_valid_length(ref_lengths, b, N)) {
            const double x = ref[3 * t], y = ref[3 * t + 1], z = ref[3 * t + 2];
            if (pcops_grid_finite3(x, y, z)) {
                const pcops_grid g = grids[b];
                key = b * C + pcops_grid_cell(&g, x, y, z);
            }
        }
    } else {
        const int64_t u = t - B * N, b = u / M, m = u % M;
        int64_t cell = C - 1;
        if (m < pcops_valid_length(query_lengths, b, M)) {
            const double x = query[3 * u], y = query[3 * u + 1], z = query[3 * u + 2];
            const pcops_grid g = grids[b];
            if (g.cells > 0 && pcops_grid_finite3(x, y, z)) cell = pcops_grid_cell(&g, x, y, z);
        }
        key = B * C + 1 + b * C + cell;
    }
    keys[t] = (int32_t)key;
    rank[t] = atomicAdd(counts + key, 1);
}

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

// One thread per ref slot, then per query slot: the binned ref (coordinates and index) at its
// sorted position, the query index at its sorted slot.
template <typename T>
__global__ void scatter_kernel(const T* __restrict__ ref, int64_t B, int64_t N, int64_t M,
                               int64_t C, const int32_t* __restrict__ keys,
                               const int32_t* __restrict__ rank,
                               const int32_t* __restrict__ start, Point4<T>* __restrict__ pts,
                               int32_t* __restrict__ ids, int32_t* __restrict__ order) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * N + B * M) return;
    const int64_t key = keys[t];
    if (t < B * N) {
        if (key >= B * C) return;  // no cell: never read
        const int64_t pos = (int64_t)start[key] + rank[t];
        const T* r = ref + t * 3;
        const int32_t i = (int32_t)(t % N);
        pts[pos] = Point4<T>{r[0], r[1], r[2], index_as<T>(i)};  // the index in w
        ids[pos] = i;
    } else {
        const int64_t slot = (int64_t)start[key] - B * N + rank[t];
        order[slot] = (int32_t)((t - B * N) % M);
    }
}

// Builds the grids and the query order; every kernel on `stream`, nothing read back.
template <typename T>
cudaError_t build_counting(const T* ref, const int64_t* ref_lengths, const T* query,
                           const int64_t* query_lengths, int64_t B, int64_t N, int64_t M,
                           int64_t C, const CountScratch<T>& s, cudaStream_t stream) {
    const int64_t keys = 2 * B * C + 1, items = B * N + B * M;
    cudaError_t err = cudaMemsetAsync(s.box, 0xff, (size_t)B * 7 * 8, stream);
    if (err == cudaSuccess) err = cudaMemsetAsync(s.counts, 0, (size_t)keys * 4, stream);
    if (err != cudaSuccess) return err;
    int64_t box_blocks = (N + kBoxThreads * kBoxPointsPerThread - 1) /
                         (kBoxThreads * kBoxPointsPerThread);
    if (box_blocks < 1) box_blocks = 1;
    if (box_blocks > 1024) box_blocks = 1024;
    grid_box_kernel<T><<<dim3((unsigned)B, (unsigned)box_blocks), kBoxThreads, 0, stream>>>(
        ref, ref_lengths, N, C, 0.0, s.box, s.grids);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    constexpr int kThreads = 256;
    const unsigned blocks = (unsigned)((items + kThreads - 1) / kThreads);
    if (items > 0) {
        count_kernel<T><<<blocks, kThreads, 0, stream>>>(ref, ref_lengths, query, query_lengths,
                                                         B, N, M, C, s.grids, s.counts, s.keys,
                                                         s.rank);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    size_t temp = s.scan_temp_bytes;
    err = cub::DeviceScan::ExclusiveSum(s.scan_temp, temp, s.counts, s.start, (int)keys, stream);
    if (err != cudaSuccess || items == 0) return err;
    scatter_kernel<T><<<blocks, kThreads, 0, stream>>>(ref, B, N, M, C, s.keys, s.rank, s.start,
                                                       s.pts, s.ids, s.order);
    return cudaGetLastError();
}

// ------------------------------------------------------------------------------------------
// The one-block build (kNN, small clouds): one block per cloud does build_counting's work in
// one launch -- the box, the grid, the counts of refs and queries per cell in shared memory,
// their scan and the scatter -- instead of two memsets, four kernels and a device scan (whose
// launches cost more host time than the GPU spends on a cloud of a few thousand points). The
// order inside a cell is again that of the atomics. Layout: cloud b's sorted refs at
// [b * N, b * N + binned), its query slots at [b * M, (b + 1) * M), and its cell starts at
// start[b * (C + 1) + c] for c in [0, C] (the extra entry ends the last cell whatever the
// cloud's count): the walk takes C + 1 as the stride of start (GridParams::C).
constexpr int kSmallBuildThreads = 1024;
constexpr int64_t kSmallBuildMaxCells = 4096;  // 2 C counts in 32 KB of shared memory
// Refs (and queries) a thread: clouds of at most 4096 refs and queries. H100, ms from an idle
// GPU against build_counting: B=16 M=N=4096 k=16 0.184 / 0.192, 32 x 1024 of 2048 0.137 / 0.152,
// 64 x 2048 0.263 / 0.277 (host time of the call 34-42 us against 54-77); at 8192 one block a
// cloud is the slower build (8 x 8192 0.201 / 0.189, 4 x 8192 k=8 0.115 / 0.098).
constexpr int kSmallBuildPer = 4;

inline bool small_build_ok(int64_t N, int64_t M, int64_t C) {
    return C <= kSmallBuildMaxCells && N <= kSmallBuildPer * kSmallBuildThreads &&
           M <= kSmallBuildPer * kSmallBuildThreads;
}

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
    // max are exact), then as doubles. The refs stay in registers for the scatter, which loaded
    // them again before (H100, K2: 22.4 -> 21.4 us; the float kernel has no spill, the double
    // one spills 32 bytes at the 64 registers of 1024 threads).
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
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int j = 0; j < 6; ++j) {
            const T u = __shfl_xor_sync(0xffffffffu, t[j], o);
            t[j] = j < 3 ? (u < t[j] ? u : t[j]) : (u > t[j] ? u : t[j]);
        }
    }
    if (lane == 0)
        for (int j = 0; j < 6; ++j) red_box[j][warp] = (double)t[j];
    for (int i = tid; i < 2 * C; i += nt) small_counts[i] = 0;
    __syncthreads();
    static_assert(kSmallBuildThreads == 1024, "warp 0 reduces one box per lane");
    if (warp == 0) {  // lane w takes warp w's box, then five shuffle levels
        double r[6];
        for (int j = 0; j < 6; ++j) r[j] = red_box[j][lane];
        for (int o = 16; o > 0; o >>= 1) {
            for (int j = 0; j < 3; ++j) r[j] = dmin(r[j], __shfl_xor_sync(0xffffffffu, r[j], o));
            for (int j = 3; j < 6; ++j) r[j] = dmax(r[j], __shfl_xor_sync(0xffffffffu, r[j], o));
        }
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

// The query order alone (ball query: its refs come from the stable build()): the query slots
// of every cloud by their cell in `grids`, with the counting-sort scratch of N = 0 refs
// (carve_counting(base, B, 0, M, C)). After build().
template <typename T>
cudaError_t order_queries(const T* query, const int64_t* query_lengths, int64_t B, int64_t M,
                          int64_t C, const pcops_grid* grids, const CountScratch<T>& s,
                          cudaStream_t stream) {
    const int64_t keys = 2 * B * C + 1, items = B * M;
    cudaError_t err = cudaMemsetAsync(s.counts, 0, (size_t)keys * 4, stream);
    if (err != cudaSuccess || items == 0) return err;
    constexpr int kThreads = 256;
    const unsigned blocks = (unsigned)((items + kThreads - 1) / kThreads);
    count_kernel<T><<<blocks, kThreads, 0, stream>>>((const T*)nullptr, nullptr, query,
                                                     query_lengths, B, 0, M, C, grids, s.counts,
                                                     s.keys, s.rank);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    size_t temp = s.scan_temp_bytes;
    err = cub::DeviceScan::ExclusiveSum(s.scan_temp, temp, s.counts, s.start, (int)keys, stream);
    if (err != cudaSuccess) return err;
    scatter_kernel<T><<<blocks, kThreads, 0, stream>>>((const T*)nullptr, B, 0, M, C, s.keys,
                                                       s.rank, s.start, s.pts, s.ids, s.order);
    return cudaGetLastError();
}

}  // namespace
}  // namespace pcops_grid_cuda
