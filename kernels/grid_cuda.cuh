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
 *  4. grid_start_kernel: start[key] = the first sorted position of every key in [0, B * C];
 *  5. grid_gather_kernel: the sorted refs as Point4 (x, y, z, -) with their indices.
 * The cells of cloud b are start[b * C + c] .. start[b * C + c + 1], c < grids[b].cells.
 *
 * order_queries() then sorts the query slots of every cloud by their cell in the same grid
 * (query_key_kernel + a second radix sort): the 32 queries of a warp are then neighbours in
 * space and walk nearly the same cells (less divergence, the cells' refs shared in L1). Cloud
 * b's slots keep the positions [b * M, (b + 1) * M) of the sorted order (key b * C + cell, the
 * invalid slots of a cloud in its last cell).
 */
#pragma once

#include <cub/device/device_radix_sort.cuh>

#include <cfloat>
#include <cstdint>

#include "common.h"
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
    int32_t* qkeys_in;   // [B * M] (order_queries only; M = 0: none)
    int32_t* qkeys_out;  // [B * M]
    int32_t* qvals_in;   // [B * M]
    int32_t* qvals_out;  // [B * M] the query index of each sorted slot of its cloud
    void* sort_temp;
    size_t sort_temp_bytes;
};

inline size_t align_up(size_t b) { return (b + 255) / 256 * 256; }

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

// Carves the scratch of B grids of N refs and C cells each (and, M > 0, the query order of
// B * M query slots) from `base` (nullptr: only counts); returns the bytes used.
template <typename T>
size_t carve(void* base, int64_t B, int64_t N, int64_t C, Scratch<T>* s, int64_t M = 0) {
    const int64_t items = B * N, qitems = B * M;
    size_t temp = sort_temp_bytes(items > 0 ? items : 1, key_bits(B * C));
    if (qitems > 0) {
        const size_t qt = sort_temp_bytes(qitems, key_bits(B * C));
        temp = qt > temp ? qt : temp;
    }
    const size_t parts[13] = {(size_t)B * sizeof(pcops_grid), (size_t)B * 7 * 8,
                              (size_t)(B * C + 1) * 4,
                              (size_t)items * 4, (size_t)items * 4, (size_t)items * 4,
                              (size_t)items * 4, (size_t)items * sizeof(Point4<T>),
                              (size_t)qitems * 4, (size_t)qitems * 4, (size_t)qitems * 4,
                              (size_t)qitems * 4, temp};
    char* p = static_cast<char*>(base);
    size_t off = 0;
    void* ptr[13];
    for (int i = 0; i < 13; ++i) {
        ptr[i] = p ? p + off : nullptr;
        off += align_up(parts[i]);
    }
    if (s) {
        s->grids = (pcops_grid*)ptr[0];
        s->box = (unsigned long long*)ptr[1];
        s->start = (int32_t*)ptr[2];
        s->keys_in = (int32_t*)ptr[3];
        s->keys_out = (int32_t*)ptr[4];
        s->vals_in = (int32_t*)ptr[5];
        s->vals_out = (int32_t*)ptr[6];
        s->pts = (Point4<T>*)ptr[7];
        s->qkeys_in = (int32_t*)ptr[8];
        s->qkeys_out = (int32_t*)ptr[9];
        s->qvals_in = (int32_t*)ptr[10];
        s->qvals_out = (int32_t*)ptr[11];
        s->sort_temp = ptr[12];
        s->sort_temp_bytes = temp;
    }
    return off;
}

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
    double v[6] = {INFINITY, INFINITY, INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const int64_t stride = (int64_t)gridDim.y * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; i < L; i += stride) {
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

// One thread per sorted position p in [0, B * N]: start[c] = p for every key c in
// (key[p - 1], key[p]] (key[-1] = -1, key[B * N] = B * C), so each of start[0 .. B * C] is
// written exactly once.
__global__ void grid_start_kernel(const int32_t* __restrict__ keys, int64_t items, int64_t last,
                                  int32_t* __restrict__ start) {
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (p > items) return;
    const int64_t prev = p == 0 ? -1 : keys[p - 1];
    const int64_t cur = p == items ? last : (keys[p] < last ? keys[p] : last);
    for (int64_t c = prev + 1; c <= cur; ++c) start[c] = (int32_t)p;
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
    grid_start_kernel<<<(unsigned)((items + 1 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        s.keys_out, items, B * C, s.start);
    err = cudaGetLastError();
    if (err != cudaSuccess || items == 0) return err;
    grid_gather_kernel<T><<<(unsigned)((items + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        ref, B, N, C, s.keys_out, s.vals_out, s.pts);
    return cudaGetLastError();
}

// One thread per query slot: key = b * C + its cell (a query outside the box: the nearest
// border cell), b * C + C - 1 for a slot without a valid finite query or in a cloud without
// refs; value = its index in the cloud.
template <typename T>
__global__ void query_key_kernel(const T* __restrict__ query,
                                 const int64_t* __restrict__ query_lengths, int64_t B, int64_t M,
                                 int64_t C, const pcops_grid* __restrict__ grids,
                                 int32_t* __restrict__ keys, int32_t* __restrict__ vals) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * M) return;
    const int64_t b = t / M, m = t % M;
    int64_t cell = C - 1;
    if (m < pcops_valid_length(query_lengths, b, M)) {
        const double x = query[3 * t], y = query[3 * t + 1], z = query[3 * t + 2];
        const pcops_grid g = grids[b];
        if (g.cells > 0 && pcops_grid_finite3(x, y, z)) cell = pcops_grid_cell(&g, x, y, z);
    }
    keys[t] = (int32_t)(b * C + cell);
    vals[t] = (int32_t)m;
}

// Sorts the query slots of every cloud by their cell in the grids built by build():
// s.qvals_out[b * M + j] is the query index of the j-th slot of cloud b. After build().
template <typename T>
cudaError_t order_queries(const T* query, const int64_t* query_lengths, int64_t B, int64_t M,
                          int64_t C, const Scratch<T>& s, cudaStream_t stream) {
    const int64_t items = B * M;
    if (items == 0) return cudaSuccess;
    constexpr int kThreads = 256;
    query_key_kernel<T><<<(unsigned)((items + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        query, query_lengths, B, M, C, s.grids, s.qkeys_in, s.qvals_in);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    size_t temp = s.sort_temp_bytes;
    return cub::DeviceRadixSort::SortPairs(s.sort_temp, temp, s.qkeys_in, s.qkeys_out,
                                           s.qvals_in, s.qvals_out, (int)items, 0,
                                           key_bits(B * C), stream);
}

}  // namespace
}  // namespace pcops_grid_cuda
