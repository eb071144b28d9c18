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
 * order_queries() then sorts the query slots of every cloud by a Morton code of their cell
 * (query_key_kernel + a second radix sort), for the warp-cooperative searches: the 32 queries
 * of a warp are neighbours in space and share the cells they visit. Cloud b's slots keep the
 * positions [b * M, (b + 1) * M) of the sorted order (b is the key's top bits, the invalid
 * slots of a cloud sort to its end).
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

// Bits per axis of the Morton code of the query order: enough for about sqrt(C) cells per
// axis (a flat scan spreads its cells over two axes), at most 10, and the cloud number b in
// the key's top bits (the key stays below 2**31).
inline int morton_axis_bits(int64_t B, int64_t C) {
    int cbits = 0;
    while (cbits < 40 && ((int64_t)1 << cbits) < C) ++cbits;
    int d = (cbits + 1) / 2 + 1;
    const int bbits = B > 1 ? key_bits(B - 1) : 0;
    const int room = (31 - bbits) / 3;
    if (d > room) d = room;
    if (d > 10) d = 10;
    return d < 1 ? 1 : d;
}

// Bits of the query sort's keys b << 3d | morton.
inline int query_key_bits(int64_t B, int64_t C) {
    const int bbits = B > 1 ? key_bits(B - 1) : 0;
    return bbits + 3 * morton_axis_bits(B, C);
}

// Carves the scratch of B grids of N refs and C cells each (and, M > 0, the query order of
// B * M query slots) from `base` (nullptr: only counts); returns the bytes used.
template <typename T>
size_t carve(void* base, int64_t B, int64_t N, int64_t C, Scratch<T>* s, int64_t M = 0) {
    const int64_t items = B * N, qitems = B * M;
    size_t temp = sort_temp_bytes(items > 0 ? items : 1, key_bits(B * C));
    if (qitems > 0) {
        const size_t qt = sort_temp_bytes(qitems, query_key_bits(B, C));
        temp = qt > temp ? qt : temp;
    }
    const size_t parts[12] = {(size_t)B * sizeof(pcops_grid), (size_t)(B * C + 1) * 4,
                              (size_t)items * 4, (size_t)items * 4, (size_t)items * 4,
                              (size_t)items * 4, (size_t)items * sizeof(Point4<T>),
                              (size_t)qitems * 4, (size_t)qitems * 4, (size_t)qitems * 4,
                              (size_t)qitems * 4, temp};
    char* p = static_cast<char*>(base);
    size_t off = 0;
    void* ptr[12];
    for (int i = 0; i < 12; ++i) {
        ptr[i] = p ? p + off : nullptr;
        off += align_up(parts[i]);
    }
    if (s) {
        s->grids = (pcops_grid*)ptr[0];
        s->start = (int32_t*)ptr[1];
        s->keys_in = (int32_t*)ptr[2];
        s->keys_out = (int32_t*)ptr[3];
        s->vals_in = (int32_t*)ptr[4];
        s->vals_out = (int32_t*)ptr[5];
        s->pts = (Point4<T>*)ptr[6];
        s->qkeys_in = (int32_t*)ptr[7];
        s->qkeys_out = (int32_t*)ptr[8];
        s->qvals_in = (int32_t*)ptr[9];
        s->qvals_out = (int32_t*)ptr[10];
        s->sort_temp = ptr[11];
        s->sort_temp_bytes = temp;
    }
    return off;
}

__device__ __forceinline__ double dmin(double a, double b) { return a < b ? a : b; }
__device__ __forceinline__ double dmax(double a, double b) { return a > b ? a : b; }

constexpr int kBoxThreads = 512;

// One block per cloud: the box of its valid finite refs, then the grid.
template <typename T>
__global__ void __launch_bounds__(kBoxThreads)
grid_box_kernel(const T* __restrict__ ref, const int64_t* __restrict__ ref_lengths, int64_t N,
                int64_t C, double min_cell, pcops_grid* __restrict__ grids) {
    __shared__ double red[6][kBoxThreads / 32];
    __shared__ int any[kBoxThreads / 32];
    const int64_t b = blockIdx.x;
    const int64_t L = pcops_valid_length(ref_lengths, b, N);
    const T* cloud = ref + b * N * 3;
    double v[6] = {INFINITY, INFINITY, INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int found = 0;
    for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
        const double x = cloud[3 * i], y = cloud[3 * i + 1], z = cloud[3 * i + 2];
        if (!pcops_grid_finite3(x, y, z)) continue;
        found = 1;
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
        found |= __shfl_xor_sync(0xffffffffu, found, o);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        for (int j = 0; j < 6; ++j) red[j][warp] = v[j];
        any[warp] = found;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int warps = blockDim.x / 32;
        for (int w = 1; w < warps; ++w) {
            for (int j = 0; j < 3; ++j) red[j][0] = dmin(red[j][0], red[j][w]);
            for (int j = 3; j < 6; ++j) red[j][0] = dmax(red[j][0], red[j][w]);
            any[0] |= any[w];
        }
        pcops_grid g;
        if (any[0]) {
            const double lo[3] = {red[0][0], red[1][0], red[2][0]};
            const double hi[3] = {red[3][0], red[4][0], red[5][0]};
            pcops_grid_setup(&g, lo, hi, C, min_cell);
        } else {
            pcops_grid_set_empty(&g);
        }
        grids[b] = g;
    }
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
    grid_box_kernel<T><<<(unsigned)B, kBoxThreads, 0, stream>>>(ref, ref_lengths, N, C, min_cell,
                                                                 s.grids);
    cudaError_t err = cudaGetLastError();
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

// The d low bits of v spread to every third bit (v < 2**10).
__device__ __forceinline__ uint32_t spread3(uint32_t v) {
    v &= 0x3ffu;
    v = (v | (v << 16)) & 0x030000ffu;
    v = (v | (v << 8)) & 0x0300f00fu;
    v = (v | (v << 4)) & 0x030c30c3u;
    v = (v | (v << 2)) & 0x09249249u;
    return v;
}

// One thread per query slot: key = b << 3d | Morton code of its cell (each cell coordinate
// scaled to d bits), or b << 3d | (2**3d - 1) for a slot without a valid finite query or in a
// cloud without refs; value = its index in the cloud.
template <typename T>
__global__ void query_key_kernel(const T* __restrict__ query,
                                 const int64_t* __restrict__ query_lengths, int64_t B, int64_t M,
                                 int d, const pcops_grid* __restrict__ grids,
                                 int32_t* __restrict__ keys, int32_t* __restrict__ vals) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= B * M) return;
    const int64_t b = t / M, m = t % M;
    uint32_t code = (1u << (3 * d)) - 1u;
    if (m < pcops_valid_length(query_lengths, b, M)) {
        const double x = query[3 * t], y = query[3 * t + 1], z = query[3 * t + 2];
        const pcops_grid g = grids[b];
        if (g.cells > 0 && pcops_grid_finite3(x, y, z)) {
            const double q[3] = {x, y, z};
            uint32_t m3 = 0;
            for (int a = 0; a < 3; ++a) {
                int64_t c = pcops_grid_coord(&g, a, q[a]);
                if (g.dims[a] > (1 << d)) c = (c << d) / g.dims[a];
                m3 |= spread3((uint32_t)c) << a;
            }
            code = m3;
        }
    }
    keys[t] = (int32_t)(((uint32_t)b << (3 * d)) | code);
    vals[t] = (int32_t)m;
}

// Sorts the query slots of every cloud by the Morton code of their cell in the grids built by
// build(): s.qvals_out[b * M + j] is the query index of the j-th slot of cloud b. After build().
template <typename T>
cudaError_t order_queries(const T* query, const int64_t* query_lengths, int64_t B, int64_t M,
                          int64_t C, const Scratch<T>& s, cudaStream_t stream) {
    const int64_t items = B * M;
    if (items == 0) return cudaSuccess;
    constexpr int kThreads = 256;
    const int d = morton_axis_bits(B, C);
    query_key_kernel<T><<<(unsigned)((items + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        query, query_lengths, B, M, d, s.grids, s.qkeys_in, s.qvals_in);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    size_t temp = s.sort_temp_bytes;
    return cub::DeviceRadixSort::SortPairs(s.sort_temp, temp, s.qkeys_in, s.qkeys_out,
                                           s.qvals_in, s.qvals_out, (int)items, 0,
                                           query_key_bits(B, C), stream);
}

}  // namespace
}  // namespace pcops_grid_cuda
